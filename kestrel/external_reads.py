"""
ExternalReads: thrift's process-wide table of open reads, by external id.

Thrift open reads (a C{get} with C{auto_abort_msec}) outlive the connection
that opened them: any connection may confirm or abort them by id, and each
has an auto-abort timer (Kestrel's C{ThriftPendingReads}). The table
belongs to the server; sessions open reads in it and are told when one of
theirs closes. It knows nothing of sockets.
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

__all__ = ["ExternalReads", "ReadCloser", "ReadOpener"]


class ReadOpener(Protocol):
    """The session that opened an external read: told when one of its reads closes."""

    def external_closed(self, name: str) -> None:
        """One of this session's external reads on queue C{name} was confirmed or aborted."""

    def external_reopened(self, name: str) -> None:
        """A confirm of one of this session's external reads on C{name} failed: open again."""


class ReadCloser(Protocol):
    """What confirms or aborts an open read on its queue (the collection)."""

    def confirm_read(self, name: str, xid: int) -> Deferred[None] | None:
        """
        Confirm open read C{xid} of queue C{name}: its item is gone for good.
        On a queue acking durably, a Deferred of the confirm's durability
        (failing: the read is open again); otherwise C{None}.
        """

    def unremove(self, name: str, xid: int) -> None:
        """Abort open read C{xid} of queue C{name}: its item goes back to the head."""


class _ExternalRead:
    """One thrift open read: its queue, its queue xid, its opener, its auto-abort timer."""

    __slots__ = ("name", "xid", "session", "timer", "seconds")

    def __init__(self, name: str, xid: int, session: ReadOpener) -> None:
        self.name = name
        self.xid = xid
        self.session = session
        self.timer: IDelayedCall | None = None
        self.seconds = 0.0


class ExternalReads:
    """
    Thrift's process-wide table of open reads, keyed by external id.

    Ids start at 1 and are never reused in the process; any connection may
    confirm or abort any id (Kestrel's C{ThriftPendingReads}). An id stays
    open after its connection ends, until confirmed, aborted, or its
    auto-abort timer fires.
    """

    _log = Logger()

    def __init__(self, collection: ReadCloser, clock: IReactorTime) -> None:
        self._collection = collection
        self._clock = clock
        self._reads: dict[int, _ExternalRead] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._reads)

    def __contains__(self, external_id: object) -> bool:
        return external_id in self._reads

    def open(self, name: str, xid: int, session: ReadOpener) -> int:
        """Record open read C{xid} of queue C{name}; return its new external id."""
        external_id = self._next_id
        self._next_id += 1
        self._reads[external_id] = _ExternalRead(name, xid, session)
        return external_id

    def set_timer(self, external_id: int, seconds: float) -> None:
        """Abort C{external_id} after C{seconds} unless it is closed first."""
        read = self._reads.get(external_id)
        if read is not None:
            read.seconds = seconds
            read.timer = self._clock.callLater(seconds, self._auto_abort, external_id)

    def _auto_abort(self, external_id: int) -> None:
        read = self._reads.get(external_id)
        if read is not None:
            read.timer = None
            self._log.debug("Auto-abort of read {id} on {queue}", id=external_id, queue=read.name)
            self.close(external_id, confirm=False)

    def close(self, external_id: int, confirm: bool) -> bool | Deferred[bool]:
        """
        Confirm (or abort) C{external_id} on the queue it was opened on.

        Returns whether the id was open; an unknown id is ignored. A confirm
        on a queue acking durably returns a Deferred firing C{True} once it is
        durable; if it fails, the id is open again (its auto-abort timer
        restarted) and the Deferred fails.
        """
        read = self._reads.pop(external_id, None)
        if read is None:
            return False
        if read.timer is not None and read.timer.active():
            read.timer.cancel()
        read.session.external_closed(read.name)
        if confirm:
            done = self._collection.confirm_read(read.name, read.xid)
            if done is not None:
                return done.addCallbacks(lambda _: True, self._confirm_failed,
                                         errbackArgs=(external_id, read))
        else:
            self._collection.unremove(read.name, read.xid)
        return True

    def _confirm_failed(self, failure: Failure, external_id: int, read: _ExternalRead) -> Failure:
        """A durable confirm of C{external_id} failed: the id is open (and retryable) again."""
        self._reads[external_id] = read
        read.session.external_reopened(read.name)
        if read.seconds:
            read.timer = self._clock.callLater(read.seconds, self._auto_abort, external_id)
        return failure
