"""Domain exceptions shared by the queue core and every protocol."""

from __future__ import annotations


class KestrelError(Exception):
    """Base class of every error txkestrel raises on purpose."""


class InvalidQueueName(KestrelError, ValueError):
    """A queue name that may never name a queue (path characters, empty, too long, ...)."""


class AvailabilityError(KestrelError):
    """
    The server's status (or a connection limit) forbids this operation now.

    Memcache answers C{SERVER_ERROR} and disconnects; text answers
    C{-Server not available for operation <op>}.
    """

    def __init__(self, op: str) -> None:
        super().__init__(f"Server not available for operation {op}")
        self.op = op


class TooManyOpenReads(KestrelError):
    """The session already holds C{max_open_transactions} open reads on the queue."""


class UnknownStatus(KestrelError, ValueError):
    """A status name that is not one of up, readonly, quiescent, writeavoid."""


class ForbiddenStatus(KestrelError, ValueError):
    """A status that may not be set by a client (C{down})."""


class ConfigError(KestrelError, ValueError):
    """
    A config file with problems; C{problems} lists every one of them.

    Each problem names the key (and line, when known).
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class ShuttingDown(KestrelError):
    """The queue collection is stopping and refuses new work."""


class ControlRefused(KestrelError):
    """
    A control command (shutdown, reload, flush_all, a status change) sent to
    a client port while C{control_commands} is C{admin_only}.
    """

    def __init__(self, command: str) -> None:
        super().__init__(f"{command} is disabled on this port (control_commands: admin_only); "
                         "use the admin port")
        self.command = command


class JournalUnavailable(KestrelError):  # noqa: N818 - a reply, not a bug
    """
    A queue's journal could not be written: the operation was refused and
    changed nothing; the queue takes no adds until its journal works again.

    Memcache answers C{SERVER_ERROR <message>}, text C{-<message>}, thrift
    an C{INTERNAL_ERROR} exception with the message.
    """

    def __init__(self, queue: str, reason: str) -> None:
        super().__init__(f"queue {queue} is read-only: its journal cannot be written "
                         f"({reason}); try again later")
        self.queue = queue
        self.reason = reason


class QueueLoading(JournalUnavailable):
    """
    A command that cannot wait (flush, delete, flush_expired, flush_all) was
    asked of a queue whose journal is still being replayed at startup; it
    changed nothing. Answered as L{JournalUnavailable} is (memcache
    C{SERVER_ERROR <message>}, text C{-<message>}, thrift an exception), and
    the connection lives on.
    """

    def __init__(self, queue: str, command: str = "", others: int = 0) -> None:
        refused = f"; {command} refused" if command else ""
        if others:
            message = (f"queue {queue} and {others} other(s) are still loading their "
                       f"journals{refused}; try again once they are loaded")
        else:
            message = (f"queue {queue} is still loading its journal{refused}; "
                       "try again once it is loaded")
        KestrelError.__init__(self, message)
        self.queue = queue
        self.reason = "loading"


class TooManyQueues(JournalUnavailable):
    """
    A request would have created a queue past C{max_queues} or past the
    file descriptors queues may hold (L{kestrel.limits}); nothing was
    created, and the queues that exist work on. Answered as
    L{JournalUnavailable} is (memcache C{SERVER_ERROR <message>}, text
    C{-<message>}, thrift an exception); the connection lives on.
    """

    def __init__(self, queue: str, reason: str) -> None:
        KestrelError.__init__(self, f"queue {queue} not created: {reason}")
        self.queue = queue
        self.reason = reason
