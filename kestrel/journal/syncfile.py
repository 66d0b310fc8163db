"""
PeriodicSyncFile: an append-only file whose writes reach the OS at once and
become durable under a sync policy, with group commit.

This is the only place where journal writes meet C{os.write} and C{fsync}.
It mirrors Kestrel's C{PeriodicSyncFile} with one change: a write that waits
for an fsync returns a Deferred that fires when the write is durable, and one
fsync covers every write that was pending when it started (group commit). A
file that never fsyncs on write (policy C{never}) has nothing to wait for: its
writes return C{None}, so the hot path of such a queue makes no Deferred.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.journal.runner import RunInThread, SyncTurn, run_inline

if TYPE_CHECKING:
    from kestrel.journal.batch import WriteCoalescer

__all__ = ["ErrorObserver", "FsyncObserver", "PeriodicSyncFile", "RunInThread",
           "SyncFileClosedError", "Waiter"]

ErrorObserver = Callable[[str, OSError], None]
"""
Told of every failed write or fsync of a journal file: C{(kind, error)} with
C{kind} C{"write"} or C{"fsync"}, after the file was cut back and the
Deferreds concerned failed.
"""

FsyncObserver = Callable[[float, Sequence[float]], None]
"""
Told of every successful fsync of a journal file: C{(seconds, write_delays)}.

C{seconds} is how long the fsync took (clock seconds, from its start until
its result reached the reactor thread); C{write_delays} holds, for each
write the fsync made durable, the seconds from that write until then (its
length is the number of writes covered, possibly 0 for a bare L{sync}).
"""


class Waiter(Protocol):
    """
    What is told when a write is durable or not: a Deferred, or any object
    with its two methods (L{PeriodicSyncFile.write_unseen} takes one, so
    that a durable add's answer needs no Deferred). Each waiter is told
    once: C{callback(None)} once the write is durable, or C{errback(failure)}
    if its write or fsync failed. Neither may raise.
    """

    def callback(self, result: None) -> object:
        """The write is durable."""

    def errback(self, fail: Failure) -> object:
        """The write or its fsync failed with C{fail}."""


def _nothing(failure: Failure | None = None) -> None:
    return None


class SyncFileClosedError(OSError):
    """A write or sync was asked of a L{PeriodicSyncFile} that is closed."""


class PeriodicSyncFile:
    """
    An append-only file that makes its writes durable under C{sync_policy}.

    C{sync_policy} is C{None} (never fsync on write: a write that reached
    the OS returns C{None}, nothing to wait for), C{0.0} (fsync as soon as
    possible after every write) or a period in seconds (a write is fsynced
    within that period). One fsync
    covers every write made before it started; writes made while an fsync
    runs wait for the next one. An fsync error fails the Deferred of every
    write it covered, and is logged.

    Every fsync but the one of L{close} runs through C{run_in_thread} (a
    L{kestrel.journal.runner.RunInThread}): the server's thread pool, or the
    default L{kestrel.journal.runner.InlineRunner}, which runs it at once
    (what unit tests under C{task.Clock} and offline tools use).

    With a C{coalescer}, writes made while its batch is open are held in
    memory and reach the OS in one C{os.write} at L{flush} (which the
    coalescer calls); every other operation (L{sync}, L{close}, a write
    outside a batch) flushes first, so bytes always reach the file in order.

    With an C{on_fsync} observer (see L{FsyncObserver}), every successful
    fsync, the one at L{close} included, is reported to it; each write then
    also notes its clock time. Without one, nothing is timed.

    With C{fd}, the file is that descriptor, already open on C{path} for
    appending (O_APPEND), instead of one this opens.

    With a C{turn} (a L{SyncTurn}), under policy 0.0 the fsync that a write
    asks for starts at the end of the current reactor turn instead of at
    once: one fsync then covers every write of the turn, whichever
    connections made them. (With an inline C{run_in_thread} that fsync runs
    on the reactor thread, which waits for it: the reactor-turn fsync.)
    With a C{turn} under policy 0.0 or a period, L{write_unseen} holds a
    record that nobody may see before it is durable (a durable add) until
    the end of the turn: every such record of the turn reaches the OS in one
    C{os.write} (under 0.0 right before the turn's fsync; under a period the
    timer's fsync covers them). Any other write, L{sync}, L{flush},
    L{close} and L{abandon} first settle what is held, so bytes always
    reach the file in order.

    @ivar position: the size of the file in bytes (every byte written).
    """

    # (slots, not a __dict__: as for a queue (kestrel.queue), whose journal
    # writes through its file per request)
    __slots__ = (
        "_batched", "_clock", "_close_error", "_close_waiter", "_closed", "_coalescer",
        "_covered_times", "_fd", "_fsync", "_held", "_held_size", "_held_times",
        "_held_waiters", "_late", "_on_error", "_on_fsync", "_os_write", "_pending",
        "_pending_times", "_policy", "_run_in_thread", "_sync_again", "_sync_queued",
        "_sync_started", "_sync_target", "_syncing", "_timer", "_turn", "_turn_fsync",
        "durable_position", "failed", "path", "position")

    _log = Logger()

    def __init__(self, path: str, clock: IReactorTime, sync_policy: float | None, *,
                 fsync: Callable[[int], None] = os.fsync,
                 run_in_thread: RunInThread = run_inline,
                 coalescer: WriteCoalescer | None = None,
                 on_fsync: FsyncObserver | None = None,
                 on_error: ErrorObserver | None = None,
                 write: Callable[[int, bytes], int] = os.write, mode: int = 0o600,
                 fd: int | None = None, turn: SyncTurn | None = None) -> None:
        self.path = path
        self._os_write = write
        self._clock = clock
        self._policy = sync_policy
        self._fsync = fsync
        self._run_in_thread = run_in_thread
        # O_NOFOLLOW: a symbolic link planted in the queue folder is never written through.
        self._fd = fd if fd is not None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)
        self.position: int = os.fstat(self._fd).st_size
        #: Bytes known durable: the file's size at open, then what each
        #: successful fsync covered.
        self.durable_position: int = self.position
        self._sync_target = self.position
        self._on_error = on_error
        #: Set by the first failed write or fsync (and by L{abandon}).
        self.failed: OSError | None = None
        # Waiters (Deferreds, mostly) of writes that no running fsync covers yet.
        self._pending: list[Waiter] = []
        self._syncing = False
        self._sync_again = False
        self._timer: IDelayedCall | None = None
        self._closed = False
        self._close_waiter: Deferred[None] | None = None
        self._close_error: Failure | None = None
        self._coalescer = coalescer
        # Bytes held back by the coalescer's batch (or by write_unseen), and
        # the waiters of those writes that wait to be durable.
        self._held: list[bytes] = []
        self._held_size = 0
        self._held_waiters: list[Waiter] = []
        self._on_fsync = on_fsync
        # With an observer: the clock time of every write in _pending (in
        # order), of every held write, and of those the running fsync covers.
        self._pending_times: list[float] = []
        self._held_times: list[float] = []
        self._covered_times: list[float] = []
        self._sync_started = 0.0
        self._turn = turn
        # Whether a start of the fsync waits for the end of the turn.
        self._sync_queued = False
        # Whether write_unseen holds records until the end of the turn.
        self._late = turn is not None and sync_policy is not None
        # Whether the turn starts the fsyncs (policy 0.0; a period's timer does otherwise).
        self._turn_fsync = self._late and sync_policy is not None and sync_policy <= 0.0
        # Whether the coalescer's open batch will flush this file (it holds back bytes).
        self._batched = False

    @property
    def closed(self) -> bool:
        """Whether L{close} was called."""
        return self._closed

    def fileno(self) -> int:
        """Return the OS file descriptor (valid until the file is closed)."""
        return self._fd

    def write(self, data: bytes) -> Deferred[None] | None:
        """
        Append C{data} to the file now; return a Deferred that fires when it
        is durable, or C{None} when there is nothing to wait for (no sync
        policy: the file promises no more than the OS holding the bytes).

        The bytes are in the OS (visible to readers) before this returns,
        unless the coalescer's batch holds them until its flush (see
        L{flush}). If the OS refuses the write, the file is cut back to its
        previous size and a failed Deferred (the C{OSError}) is returned.
        """
        if self._closed:
            return fail(SyncFileClosedError(f"{self.path} is closed"))
        coalescer = self._coalescer
        if coalescer is not None and coalescer.depth:
            return self._hold(coalescer, data)
        if self._held:
            error = self._flush()
            if error is not None:
                # (refused too: written after the refused records, it would
                # be the one record of the turn the cut-back keeps, and a
                # reader it was for would never hear of it)
                return fail(error)
        fd = self._fd
        # (called as a local, which CPython 3.11 specializes; a function held
        # by an instance and called as a method is not)
        os_write = self._os_write
        try:
            written = os_write(fd, data)
            while written < len(data):
                written += os_write(fd, data[written:])
        except OSError as e:
            self._cut_back()
            self._log.error("Write to {path} failed: {error}", path=self.path, error=e)
            self._report_error("write", e)
            return fail(e)
        self.position += written
        policy = self._policy
        if policy is None:
            return None
        d: Deferred[None] = Deferred()
        self._pending.append(d)
        if self._on_fsync is not None:
            self._pending_times.append(self._clock.seconds())
        if policy <= 0.0:
            self._sync_soon()
        elif self._timer is None:
            self._timer = self._clock.callLater(policy, self._timer_fired)
        return d

    def write_unseen(self, data: bytes, waiter: Waiter | None = None) -> Deferred[None] | None:
        """
        Append C{data}, a record nobody may see before it is durable; return
        what L{write} returns (a Deferred that fires when it is durable).

        With a C{turn} (under policy 0.0 or a period), the bytes are held in
        memory until the end of the reactor turn (or until anything else
        needs the file first) and reach the OS there in one C{os.write} with
        every record held in the turn (under 0.0 right before the turn's
        fsync); if the OS refuses that write, the file is cut back to where
        it stood before them and every one of their Deferreds fails.
        Otherwise (C{never}, or no C{turn}) it is L{write}.

        With a C{waiter}, it is told instead (see L{Waiter}) and C{None} is
        returned: no Deferred is made. It may be told before this returns:
        a write refused at once, or one with nothing to wait for (C{never}).
        """
        if not self._late or self._closed:
            d = self.write(data)
            if waiter is None:
                return d
            if d is None:
                waiter.callback(None)
            else:
                d.addCallbacks(waiter.callback, waiter.errback)
            return None
        self._held.append(data)
        self._held_size += len(data)
        self.position += len(data)
        if waiter is None:
            waiter = d = Deferred()
        else:
            d = None
        self._held_waiters.append(waiter)
        if self._on_fsync is not None:
            self._held_times.append(self._clock.seconds())
        if not self._sync_queued:
            self._sync_at_turn_end()
        if not self._turn_fsync and self._timer is None:
            # (a period: fsynced within it of this call, as a write would be)
            period = self._policy
            assert period is not None
            self._timer = self._clock.callLater(period, self._timer_fired)
        return d

    def _hold(self, coalescer: WriteCoalescer, data: bytes) -> Deferred[None] | None:
        """Keep C{data} for the coalescer's flush; return as L{write} does."""
        if not self._batched:
            self._batched = True
            coalescer.hold(self)
        self._held.append(data)
        self._held_size += len(data)
        self.position += len(data)
        if self._policy is None:
            return None
        d: Deferred[None] = Deferred()
        self._held_waiters.append(d)
        if self._on_fsync is not None:
            self._held_times.append(self._clock.seconds())
        return d

    def flush(self) -> bool:
        """
        Write the bytes held back (by the coalescer, or by L{write_unseen})
        to the OS now; whether they got there.

        On an OS error the file is cut back to where it stood before them,
        the error is logged, and the Deferreds of those writes that wait to
        be durable fail. Under C{sync_policy} 0.0 a successful flush starts
        the fsync that covers it.
        """
        return self._flush() is None

    def _flush(self) -> OSError | None:
        """L{flush}: C{None} if the held bytes got there, else the OS error."""
        if not self._held:
            return None
        waiting = bool(self._held_waiters)
        error = self._write_held()
        if error is not None:
            return error
        policy = self._policy
        if waiting and policy is not None:
            if policy <= 0.0:
                self._sync_soon()
            elif self._timer is None:
                self._timer = self._clock.callLater(policy, self._timer_fired)
        return None

    def _write_held(self) -> OSError | None:
        """
        Write the held bytes in one C{os.write}; their waiting Deferreds
        join the pending writes. C{None} if they got there, else the OS
        error (the file cut back, logged, those Deferreds failed, the error
        reported).
        """
        held = self._held
        size = self._held_size
        waiters = self._held_waiters
        times = self._held_times
        self._held = []
        self._held_size = 0
        self._held_waiters = []
        self._batched = False
        if times:
            self._held_times = []
        data = held[0] if len(held) == 1 else b"".join(held)
        fd = self._fd
        start = self.position - size
        try:
            written = self._os_write(fd, data)
            while written < size:
                written += self._os_write(fd, data[written:])
        except OSError as e:
            self.position = start
            self._cut_back()
            self._log.error("Write of {count} held-back records to {path} failed: {error}",
                            count=len(held), path=self.path, error=e)
            failure = Failure(e)
            if self._coalescer is not None:
                self._coalescer.held_write_failed()
            for d in waiters:
                d.errback(failure)
            self._report_error("write", e)
            return e
        if waiters:
            self._pending.extend(waiters)
            if times:
                self._pending_times.extend(times)
        return None

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
        if self._held:
            self.flush()
        d: Deferred[None] = Deferred()
        self._pending.append(d)
        if self._syncing:
            self._sync_again = True
        else:
            self._start_sync()
        return d

    def _timer_fired(self) -> None:
        self._timer = None
        if self._held:
            self._write_held()  # (its writes join the fsync started below)
        if self._syncing:
            self._sync_again = True
        elif self._pending:
            self._start_sync()

    def _sync_soon(self) -> None:
        """
        Have the pending writes fsynced as soon as the policy allows: after
        the running fsync, at the end of the reactor turn (with a C{turn}
        under policy 0.0), or now.
        """
        if self._syncing:
            self._sync_again = True
        elif not self._turn_fsync:
            self._start_sync()
        elif not self._sync_queued:
            self._sync_at_turn_end()

    def _sync_at_turn_end(self) -> None:
        """
        Once the turn's events are done, have the turn write the held
        records and (under 0.0) start the fsync of the pending writes.
        """
        assert self._turn is not None
        self._sync_queued = True
        self._turn.call(self._turn_ended)

    def _turn_ended(self) -> None:
        self._sync_queued = False
        if self._closed:
            return  # close or abandon settled every pending write
        if not self._turn_fsync:
            self.flush()  # (a period: the turn's held records; its timer fsyncs them)
            return
        if self._held:
            # The turn's held records, in one write right before its fsync
            # (what a failed write's errbacks hold wait for the next turn).
            self._write_held()
            if self._closed:
                return
        if self._syncing:
            self._sync_again = True
        elif self._pending:
            self._start_sync()

    def _start_sync(self) -> None:
        """Start one fsync covering every pending write."""
        covered = self._pending
        self._pending = []
        if self._on_fsync is not None:
            self._covered_times = self._pending_times
            self._pending_times = []
            self._sync_started = self._clock.seconds()
        self._syncing = True
        self._sync_again = False
        self._sync_target = self.position
        fd = self._fd
        d = self._run_in_thread(lambda: self._fsync(fd))
        d.addBoth(self._sync_done, covered)

    def _sync_done(self, result: object, covered: list[Waiter]) -> None:
        # Writes made by the callbacks below (writers acknowledged, writing
        # again) all join the next fsync, which starts once every callback
        # ran: this is what makes one fsync cover a whole group of writers.
        try:
            if isinstance(result, Failure):
                self._log.error("fsync of {path} failed ({count} writes failed): {error}",
                                path=self.path, count=len(covered), error=result.value)
                for d in covered:
                    d.errback(result)
                error = result.value
                if isinstance(error, OSError):
                    self._report_error("fsync", error)
                else:
                    self._report_error("fsync", OSError(str(error)))
            else:
                if self._sync_target > self.durable_position:
                    self.durable_position = self._sync_target
                if self._on_fsync is not None:
                    self._report_fsync(self._sync_started, self._covered_times)
                for d in covered:
                    d.callback(None)
        finally:
            self._syncing = False
            self._covered_times = []
        if self._close_waiter is not None:
            self._finish_close()
        elif (not self._syncing and self._pending
              and (self._sync_again or (self._policy is not None and self._policy <= 0.0))):
            # (A callback above may have written and started the next fsync already.)
            self._sync_soon()

    def close(self) -> Deferred[None]:
        """
        Fsync and close the file; the Deferred fires once the descriptor is closed.

        The final fsync runs inline, so every byte written is durable when
        this returns (the Deferred fails if that fsync fails). Pending writes'
        Deferreds fire with it. Closing twice is harmless.
        """
        done, fire = self.close_deferring()
        fire()
        return done

    def hand_over(self) -> int | None:
        """
        Close this file without an fsync and return its descriptor, which the
        caller then owns (and closes); or return C{None} and do nothing if a
        write still waits to be durable, bytes are held back or an fsync runs
        (then L{close} it). Under the C{None} policy only an explicit L{sync}
        leaves anything waiting.
        """
        if self._closed or self._pending or self._held or self._syncing:
            return None
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        return self._fd

    def close_deferring(self) -> tuple[Deferred[None], Callable[..., None]]:
        """
        Like L{close}, but the Deferreds of the writes that the final fsync
        covered fire only when the returned function is called; called with
        a L{Failure}, it fails them with it instead (the caller found their
        durability in doubt after all).

        A journal that swaps files (rotation, rewrite) calls it once the new
        file is in place, so that whatever those acknowledgements set off
        (more writes, more rotations) never sees the old file half closed.
        """
        if self._closed:
            closed = succeed(None) if self._close_waiter is None else self._chain_close()
            return closed, _nothing
        if self._held:
            self.flush()
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        covered = self._pending
        self._pending = []
        times = self._pending_times
        self._pending_times = []
        started = self._clock.seconds() if self._on_fsync is not None else 0.0
        error: Failure | None = None
        try:
            self._fsync(self._fd)
        except Exception:
            error = Failure()
            self._log.error("fsync of {path} failed at close ({count} writes failed): {error}",
                            path=self.path, count=len(covered), error=error.value)
            if isinstance(error.value, OSError):
                self._report_error("fsync", error.value)
        else:
            self.durable_position = self.position
            if self._on_fsync is not None:
                self._report_fsync(started, times)
        def fire(failure: Failure | None = None) -> None:
            outcome = error if failure is None else failure
            for d in covered:
                if outcome is None:
                    d.callback(None)
                else:
                    d.errback(outcome)

        self._close_error = error
        if self._syncing:
            # An fsync runs in a thread on this descriptor: close it when that ends.
            self._close_waiter = Deferred()
            return self._chain_close(), fire
        os.close(self._fd)
        return (succeed(None) if error is None else fail(error)), fire

    def _report_error(self, kind: str, error: OSError) -> None:
        """Remember the first failure and tell the error observer (if any) of this one."""
        if self.failed is None:
            self.failed = error
        observer = self._on_error
        if observer is not None:
            try:
                observer(kind, error)
            except Exception:
                self._log.failure("error observer of {path} failed", path=self.path)

    def abandon(self, error: Exception) -> Deferred[None]:
        """
        Give the file up after a failure, without a final fsync.

        Every write not yet durable (held back, or waiting for an fsync that
        has not started) fails with C{error}; an fsync already running ends
        as it ends. The descriptor is closed once that fsync is over; the
        Deferred fires then. L{durable_position} is final when it fires.
        """
        if self._closed:
            return succeed(None) if self._close_waiter is None else self._chain_close()
        self._closed = True
        if self.failed is None and isinstance(error, OSError):
            self.failed = error
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        waiting = [*self._held_waiters, *self._pending]
        self.position -= self._held_size
        self._held, self._held_size, self._held_waiters, self._held_times = [], 0, [], []
        self._batched = False
        self._pending, self._pending_times = [], []
        failure = Failure(error)
        for d in waiting:
            d.errback(failure)
        if self._syncing:
            self._close_waiter = Deferred()
            return self._chain_close()
        os.close(self._fd)
        return succeed(None)

    def _report_fsync(self, started: float, write_times: list[float]) -> None:
        """Tell the observer of an fsync that began at C{started} and just ended."""
        observer = self._on_fsync
        assert observer is not None
        now = self._clock.seconds()
        try:
            observer(now - started, [now - t for t in write_times])
        except Exception:
            self._log.failure("fsync observer of {path} failed", path=self.path)

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
