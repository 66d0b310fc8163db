"""
The current file's writer: a L{PeriodicSyncFile} when the journal is open, or
the one L{ClosedWriter} standing in for it when it is not.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from kestrel.journal.syncfile import PeriodicSyncFile, Waiter


class JournalNotOpenError(RuntimeError):
    """A write was asked of a journal that has not been replayed (opened) yet."""


def _no_op(failure: Failure | None = None) -> None:
    return None


def ignore_failure(failure: Failure) -> None:
    """Swallow a failure that the syncfile has logged already (an errback)."""
    return None


class ClosedWriter:
    """
    The writer of a journal that has no open current file: before its
    replay opens one, and after a recovery gave it up. It has the members of
    L{PeriodicSyncFile} that the journal uses: a write fails with
    L{JournalNotOpenError}; everything else does nothing.
    """

    position = 0
    durable_position = 0
    closed = True
    failed: OSError | None = None

    def write(self, data: bytes) -> Deferred[None]:
        """Fail: nothing can be written before the journal is replayed."""
        return fail(JournalNotOpenError("journal written before replay() opened it"))

    def write_unseen(self, data: bytes, waiter: Waiter | None = None) -> Deferred[None] | None:
        """Fail, as L{write} (telling C{waiter}, if given, instead)."""
        if waiter is None:
            return self.write(data)
        waiter.errback(Failure(JournalNotOpenError("journal written before replay() opened it")))
        return None

    def flush(self) -> bool:
        """Nothing is held back: nothing to flush."""
        return True

    def sync(self) -> Deferred[None]:
        """Nothing to make durable: fire at once."""
        return succeed(None)

    def close(self) -> Deferred[None]:
        """Already closed: fire at once."""
        return succeed(None)

    def close_deferring(self) -> tuple[Deferred[None], Callable[..., None]]:
        """Already closed: a fired Deferred, and no acknowledgement to fire."""
        return succeed(None), _no_op

    def abandon(self, error: Exception) -> Deferred[None]:
        """Already closed: fire at once."""
        return succeed(None)

    def hand_over(self) -> int | None:
        """No descriptor to hand over."""
        return None

    def fileno(self) -> int:
        """There is no descriptor: raise L{JournalNotOpenError}."""
        raise JournalNotOpenError("the journal has no open current file")


#: The writer of every journal with no open current file (it holds no state).
CLOSED_WRITER = ClosedWriter()

Writer = PeriodicSyncFile | ClosedWriter
"""The current file's writer: open, or the L{ClosedWriter}."""
