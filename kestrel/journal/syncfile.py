"""
PeriodicSyncFile: an append-only file whose writes reach the OS at once and
become durable under a sync policy, with group commit.

This is the only place where journal writes meet C{os.write} and C{fsync}.
It mirrors Kestrel's C{PeriodicSyncFile} with one change: every write returns
a Deferred that fires when the write is durable, and one fsync covers every
write that was pending when it started (group commit).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

RunInThread = Callable[[Callable[[], Any]], Deferred[Any]]
"""Runs a blocking callable off the reactor thread; its Deferred fires on the reactor thread."""


class SyncFileClosedError(OSError):
    """A write or sync was asked of a L{PeriodicSyncFile} that is closed."""


class PeriodicSyncFile:
    """
    An append-only file that makes its writes durable under C{sync_policy}.

    C{sync_policy} is C{None} (never fsync on write: a write's Deferred fires
    at once), C{0.0} (fsync as soon as possible after every write) or a
    period in seconds (a write is fsynced within that period). One fsync
    covers every write made before it started; writes made while an fsync
    runs wait for the next one. An fsync error fails the Deferred of every
    write it covered, and is logged.

    With C{run_in_thread} set, fsync runs off the reactor thread; with
    C{None} it runs inline (what unit tests under C{task.Clock} use).

    @ivar position: the size of the file in bytes (every byte written).
    """

    _log = Logger()

    def __init__(self, path: str, clock: IReactorTime, sync_policy: float | None, *,
                 fsync: Callable[[int], None] = os.fsync,
                 run_in_thread: RunInThread | None = None) -> None:
        self.path = path
        self._clock = clock
        self._policy = sync_policy
        self._fsync = fsync
        self._run_in_thread = run_in_thread
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.position: int = os.fstat(self._fd).st_size
        # Deferreds of writes that no running fsync covers yet.
        self._pending: list[Deferred[None]] = []
        self._syncing = False
        self._sync_again = False
        self._timer: IDelayedCall | None = None
        self._closed = False
        self._close_waiter: Deferred[None] | None = None
        self._close_error: Failure | None = None

    @property
    def closed(self) -> bool:
        """Whether L{close} was called."""
        return self._closed

    def fileno(self) -> int:
        """Return the OS file descriptor (valid until the file is closed)."""
        return self._fd

    def write(self, data: bytes) -> Deferred[None]:
        """
        Append C{data} to the file now, and return a Deferred that fires when it is durable.

        The bytes are in the OS (visible to readers) before this returns.
        If the OS refuses the write, the file is cut back to its previous
        size and the Deferred fails with the C{OSError}.
        """
        if self._closed:
            return fail(SyncFileClosedError(f"{self.path} is closed"))
        fd = self._fd
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as e:
            self._cut_back()
            self._log.error("Write to {path} failed: {error}", path=self.path, error=e)
            return fail(e)
        self.position += written
        policy = self._policy
        if policy is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._pending.append(d)
        if policy <= 0.0:
            if not self._syncing:
                self._start_sync()
            else:
                self._sync_again = True
        elif self._timer is None:
            self._timer = self._clock.callLater(policy, self._timer_fired)
        return d

    def _cut_back(self) -> None:
        """Drop any partial write beyond C{position} so the file ends at a record boundary."""
        try:
            os.ftruncate(self._fd, self.position)
        except OSError as e:
            self._log.error("Could not cut {path} back to {position}: {error}",
                            path=self.path, position=self.position, error=e)

    def sync(self) -> Deferred[None]:
        """
        Force an fsync now; the Deferred fires when an fsync that started after this call ends.

        It fails if that fsync fails, or if the file is closed.
        """
        if self._closed:
            return fail(SyncFileClosedError(f"{self.path} is closed"))
        d: Deferred[None] = Deferred()
        self._pending.append(d)
        if self._syncing:
            self._sync_again = True
        else:
            self._start_sync()
        return d

    def _timer_fired(self) -> None:
        self._timer = None
        if self._syncing:
            self._sync_again = True
        elif self._pending:
            self._start_sync()

    def _start_sync(self) -> None:
        """Start one fsync covering every pending write."""
        covered = self._pending
        self._pending = []
        self._syncing = True
        self._sync_again = False
        fd = self._fd
        if self._run_in_thread is None:
            try:
                self._fsync(fd)
            except Exception:
                self._sync_done(Failure(), covered)
            else:
                self._sync_done(None, covered)
        else:
            d = self._run_in_thread(lambda: self._fsync(fd))
            d.addBoth(self._sync_done, covered)

    def _sync_done(self, result: object, covered: list[Deferred[None]]) -> None:
        self._syncing = False
        if isinstance(result, Failure):
            self._log.error("fsync of {path} failed ({count} writes failed): {error}",
                            path=self.path, count=len(covered), error=result.value)
            for d in covered:
                d.errback(result)
        else:
            for d in covered:
                d.callback(None)
        if self._close_waiter is not None:
            self._finish_close()
        elif (not self._syncing and self._pending
              and (self._sync_again or (self._policy is not None and self._policy <= 0.0))):
            # (A callback above may have written and started the next fsync already.)
            self._start_sync()

    def close(self) -> Deferred[None]:
        """
        Fsync and close the file; the Deferred fires once the descriptor is closed.

        The final fsync runs inline, so every byte written is durable when
        this returns (the Deferred fails if that fsync fails). Pending writes'
        Deferreds fire with it. Closing twice is harmless.
        """
        if self._closed:
            return succeed(None) if self._close_waiter is None else self._chain_close()
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        covered = self._pending
        self._pending = []
        error: Failure | None = None
        try:
            self._fsync(self._fd)
        except Exception:
            error = Failure()
            self._log.error("fsync of {path} failed at close ({count} writes failed): {error}",
                            path=self.path, count=len(covered), error=error.value)
        for d in covered:
            if error is None:
                d.callback(None)
            else:
                d.errback(error)
        self._close_error = error
        if self._syncing:
            # An fsync runs in a thread on this descriptor: close it when that ends.
            self._close_waiter = Deferred()
            return self._chain_close()
        os.close(self._fd)
        return succeed(None) if error is None else fail(error)

    def _chain_close(self) -> Deferred[None]:
        assert self._close_waiter is not None
        d: Deferred[None] = Deferred()

        def relay(result: object) -> object:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(None)
            return result

        self._close_waiter.addBoth(relay)
        return d

    def _finish_close(self) -> None:
        waiter = self._close_waiter
        assert waiter is not None
        os.close(self._fd)
        self._close_waiter = None
        if self._close_error is None:
            waiter.callback(None)
        else:
            waiter.errback(self._close_error)
            waiter.addErrback(lambda f: None)
