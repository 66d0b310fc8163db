"""
Startup replay: L{JournalLoader} replays the journals found at startup, and
L{LoadingQueue} is what a queue is, to clients, while its journal replays.

At startup the server listens at once and replays the journals one queue
after another (L{kestrel.collection.QueueCollection.start_loading}). A queue
still replaying is not in the collection's table of queues: the requests that
miss that table find its L{LoadingQueue} instead, which holds them (adds,
reads, peeks) as Deferreds, in arrival order, and makes them of the real
queue as soon as it is ready. A read with a deadline answers "no item" at
its deadline if the queue is still loading. It knows nothing of sockets.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.errors import ShuttingDown
from kestrel.journal.journal import FileJournal
from kestrel.names import validate_queue_name

__all__ = ["REPLAY_PROGRESS_INTERVAL", "JournalLoader", "LoadingQueue"]


class _Held:
    """One request held until its queue is ready: C{result} fires with the queue's answer."""

    __slots__ = ("_owner", "_op", "is_read", "result", "_timer", "_inner")

    def __init__(self, owner: LoadingQueue, op: Callable[[Any], Deferred[Any]],
                 deadline: float | None, is_read: bool) -> None:
        self._owner = owner
        self._op = op
        self.is_read = is_read
        self._inner: Deferred[Any] | None = None
        self._timer: IDelayedCall | None = None
        self.result: Deferred[Any] = Deferred(self._cancel)
        if deadline is not None:
            clock = owner.clock
            self._timer = clock.callLater(max(0.0, deadline - clock.seconds()), self._expire)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _expire(self) -> None:
        """The read's deadline came while the queue still loads: "no item"."""
        self._timer = None
        self._owner._forget(self)
        self.result.callback(None)

    def _cancel(self, _: Deferred[Any]) -> None:
        """The client withdrew: leave the line (or cancel the real queue's wait)."""
        self._stop_timer()
        if self._inner is not None:
            self._inner.cancel()
        else:
            self._owner._forget(self)

    def run(self, queue: Any) -> None:
        """Make the request of the ready C{queue}; its answer becomes C{result}'s."""
        self._stop_timer()
        try:
            inner = self._op(queue)
        except Exception:
            self.result.errback(Failure())
            return
        self._inner = inner
        inner.addCallbacks(self.result.callback, self.result.errback)

    def abandon(self, error: Exception) -> None:
        """The queue will not be ready (shutdown): a read gets "no item", an add C{error}."""
        self._stop_timer()
        if self.is_read:
            self.result.callback(None)
        else:
            self.result.errback(error)


class LoadingQueue:
    """
    Stands in for queue C{name} while its journal replays: L{add},
    L{wait_remove} and L{wait_peek} answer Deferreds that fire with what the
    real queue answers once L{ready} hands it over (the requests are made of
    it in the order they came); a read whose deadline comes first answers
    C{None}. Cancelling a Deferred withdraws its request.

    @ivar journal_bytes: the bytes of journal the queue has on disk.
    """

    def __init__(self, name: str, clock: IReactorTime, journal_bytes: int = 0) -> None:
        self.name = name
        self.clock = clock
        self.journal_bytes = journal_bytes
        self._held: dict[_Held, None] = {}

    @property
    def held_count(self) -> int:
        """How many requests wait for this queue."""
        return len(self._held)

    def _hold(self, op: Callable[[Any], Deferred[Any]], deadline: float | None,
              is_read: bool) -> Deferred[Any]:
        held = _Held(self, op, deadline, is_read)
        self._held[held] = None
        return held.result

    def _forget(self, held: _Held) -> None:
        self._held.pop(held, None)

    def offer(self, data: bytes, expiry_ms: int = 0, then: object = None) -> Deferred[bool]:
        """
        Add C{data} once the queue is ready: a Deferred of the queue's
        answer (as L{PersistentQueue.offer}'s, always given later here, so
        never through C{then}).
        """
        return self._hold(lambda queue: queue.add(data, expiry_ms), None, False)

    def wait_remove(self, deadline: float | None,
                    open_read: bool = False) -> Deferred[Any]:
        """
        Remove the head item once the queue is ready, waiting for one until
        C{deadline} (clock seconds; C{None}: as long as the queue loads, then
        no wait); fires with C{None} at the deadline if the queue still loads.
        """
        return self._hold(lambda queue: queue.wait_remove(deadline, open_read), deadline, True)

    def take(self, deadline: float | None, open_read: bool = False) -> Deferred[Any]:
        """As L{wait_remove}: a queue that loads answers nothing at once."""
        return self.wait_remove(deadline, open_read)

    def wait_peek(self, deadline: float | None) -> Deferred[Any]:
        """As L{wait_remove}, but the item stays in the queue."""
        return self._hold(lambda queue: queue.wait_peek(deadline), deadline, True)

    def ready(self, queue: Any) -> None:
        """The queue is loaded: make every held request of it, first come first."""
        held, self._held = self._held, {}
        for request in held:
            request.run(queue)

    def abandon(self, error: Exception) -> None:
        """The queue will never be ready here: reads answer C{None}, adds fail with C{error}."""
        held, self._held = self._held, {}
        for request in held:
            request.abandon(error)


#: Seconds between two "still replaying" progress lines at startup.
REPLAY_PROGRESS_INTERVAL = 5.0

#: Seconds of replay work done in one reactor turn while the server already serves.
REPLAY_SLICE_SECONDS = 0.005

#: Journal bytes replayed between two looks at the time (a slice is one or more of these).
REPLAY_STEP_BYTES = 64 * 1024


class JournalLoader:
    """
    Replays the journals found in the queue directory at startup, one queue
    after another, smallest journal first, for a queue collection.

    It needs three things of the collection: C{build(name)} makes the queue
    object over its journal (not replayed yet), C{register(name, queue)}
    serves a replayed queue, and C{close(name, queue)} closes one whose
    replay stopped. Until its replay is done a queue is in L{loading}, as
    the L{LoadingQueue} that holds its requests.

    L{run_all} replays everything before it returns; L{start} replays in
    slices of about C{slice_seconds} of work (measured with C{timer}), a
    reactor turn every C{pause} clock seconds, looking at the time every
    C{step_bytes} of journal. Progress is logged per queue (items, bytes,
    seconds) and, during a long startup, every L{REPLAY_PROGRESS_INTERVAL}
    seconds. While it replays, the garbage collector is off (replay makes
    long-lived objects only); once L{start}'s replay is done (at once if
    there was nothing to replay), every object alive is frozen out of the
    collector's reach (C{gc.freeze}).

    @ivar loading: the queues still loading, by name, in replay order.
    """

    _log = Logger()

    def __init__(self, path: str, clock: IReactorTime, *,
                 build: Callable[[str], Any],
                 register: Callable[[str, Any], None],
                 close: Callable[[str, Any], object],
                 slice_seconds: float = REPLAY_SLICE_SECONDS,
                 step_bytes: int = REPLAY_STEP_BYTES,
                 pause: float = 0.0,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self._path = path
        self._clock = clock
        self._build = build
        self._register = register
        self._close = close
        self._slice_seconds = slice_seconds
        self._step_bytes = step_bytes
        self._pause = pause
        self._timer = timer
        self.loading: dict[str, LoadingQueue] = {}
        # The queue being replayed now (name, queue, its steps, start time); the ones after it.
        self._replaying: tuple[str, Any, Generator[int, None, None], float] | None = None
        self._order: deque[str] = deque()
        self._waiters: list[Deferred[None]] = []
        self._failure: Failure | None = None
        self._call: IDelayedCall | None = None
        self._stopped = False
        self._background = False
        self._totals = [0, 0]  # items, bytes replayed so far
        self._done = self._count = 0  # queues replayed, queues to replay
        self._started = self._progress_at = 0.0
        self._gc_was_enabled: bool | None = None

    @property
    def busy(self) -> bool:
        """Whether some queue is still to be replayed (or being replayed)."""
        return bool(self.loading) or self._replaying is not None

    def begin(self) -> list[str]:
        """
        List the queues to replay (those with journal files now, smallest
        first; a file whose name is no queue name is ignored): each becomes
        loading. Returns their names.
        """
        sizes = FileJournal.queue_sizes_in(self._path)
        names = []
        for name in sorted(sizes):
            try:
                validate_queue_name(name)
            except ValueError as e:
                self._log.warn("Ignoring journal file {name!r} in {path}: {reason}",
                               name=name, path=self._path, reason=str(e))
                continue
            names.append(name)
        names.sort(key=lambda n: sizes[n])
        if not names:
            return names
        self._gc_was_enabled = gc.isenabled()
        # Replay makes long-lived objects only (see FileJournal.replay).
        gc.disable()
        self._started = self._progress_at = self._clock.seconds()
        self._log.info("Replaying {count} queue(s) from {path}", count=len(names), path=self._path)
        for name in names:
            self.loading[name] = LoadingQueue(name, self._clock, sizes[name])
        self._order.extend(names)
        self._count = len(names)
        return names

    def run_all(self) -> None:
        """Replay every journal listed by L{begin} now; raise what stopped one."""
        while self._slice(None):
            pass
        if self._failure is not None:
            self._failure.raiseException()

    def start(self) -> Deferred[None]:
        """Replay the journals listed by L{begin} turn by turn; L{when_loaded}'s Deferred."""
        self._background = True
        if self._order:
            self._call = self._clock.callLater(self._pause, self._turn)
        else:
            self._finish()
        return self.when_loaded()

    def when_loaded(self) -> Deferred[None]:
        """
        A Deferred firing once every queue listed is loaded (at once if none
        is loading), or failing with the error that stopped the replay of a
        journal (or with what L{stop} was given).
        """
        if self._failure is not None:
            return fail(self._failure)
        if not self.busy:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d

    def stop(self, error: Exception) -> None:
        """
        Stop replaying for good (the collection stops): journals stay as they
        are, held requests end (see L{LoadingQueue.abandon}), L{when_loaded}
        fails with C{error}.
        """
        self._stopped = True
        if not self.busy:
            return
        self._log.info("Stopping with {count} queue(s) not loaded; their journals are "
                       "left as they are", count=len(self.loading))
        self._abandon(error)
        self._restore_gc()
        self._fail_waiters(Failure(error))

    def _turn(self) -> None:
        """One reactor turn's slice of replay; the next turn is scheduled if work remains."""
        self._call = None
        if self._stopped:
            return
        if self._slice(self._slice_seconds):
            self._log_progress(self._clock.seconds())
            self._call = self._clock.callLater(self._pause, self._turn)

    def _slice(self, seconds: float | None) -> bool:
        """Replay for about C{seconds} (C{None}: to the end); return whether work remains."""
        timer = self._timer
        until = None if seconds is None else timer() + seconds
        while True:
            current = self._replaying
            if current is None:
                if not self._order:
                    self._finish()
                    return False
                name = self._order.popleft()
                try:
                    queue = self._build(name)
                    steps = queue.setup_steps(self._step_bytes)
                except Exception:
                    self._failed(name, None, Failure())
                    return False
                current = self._replaying = (name, queue, steps, self._clock.seconds())
            name, queue, steps, started = current
            try:
                next(steps)
            except StopIteration:
                self._replaying = None
                self._loaded(name, queue, started)
                if not self._order:
                    self._finish()
                    return False
            except Exception:
                self._replaying = None
                self._failed(name, queue, Failure())
                return False
            if until is not None and timer() >= until:
                return True

    def _loaded(self, name: str, queue: Any, started: float) -> None:
        """Queue C{name} is replayed: it serves from now on, and its held requests run."""
        loading = self.loading.pop(name)
        self._register(name, queue)
        now = self._clock.seconds()
        totals = self._totals
        totals[0] += queue.length
        totals[1] += queue.bytes
        self._log.info("Replayed queue {queue}: {items} items, {bytes} bytes "
                       "in {seconds:.3f} s", queue=name, items=queue.length,
                       bytes=queue.bytes, seconds=now - started)
        self._done += 1
        self._log_progress(now)
        loading.ready(queue)

    def _log_progress(self, now: float) -> None:
        """Log where the replay is, at most every L{REPLAY_PROGRESS_INTERVAL} seconds."""
        if now - self._progress_at < REPLAY_PROGRESS_INTERVAL:
            return
        self._progress_at = now
        totals = self._totals
        current = self._replaying
        self._log.info("Replay progress: {done}/{count} queues, {items} items, "
                       "{bytes} bytes, {seconds:.1f} s; still replaying: {left} queue(s)"
                       "{current}", done=self._done, count=self._count,
                       items=totals[0], bytes=totals[1], seconds=now - self._started,
                       left=len(self.loading),
                       current="" if current is None else f", now {current[0]}")

    def _failed(self, name: str, queue: Any, failure: Failure) -> None:
        """A journal could not be replayed: as before, the server does not start."""
        self._log.failure("Replaying queue {queue} failed", failure, queue=name)
        self._failure = failure
        if queue is not None:
            self._close(name, queue)
        self._abandon(ShuttingDown(f"queue {name} could not be loaded"))
        self._restore_gc()
        self._fail_waiters(failure)

    def _fail_waiters(self, failure: Failure) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(failure)

    def _finish(self) -> None:
        if self._gc_was_enabled is not None:
            totals = self._totals
            self._log.info("Replay finished: {count} queues, {items} items, {bytes} bytes "
                           "in {seconds:.3f} s", count=self._done, items=totals[0],
                           bytes=totals[1], seconds=self._clock.seconds() - self._started)
        self._restore_gc(freeze=self._background)
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _restore_gc(self, freeze: bool = False) -> None:
        """
        Turn the garbage collector back on if replay turned it off; with
        C{freeze}, first move every object alive out of its reach
        (C{gc.freeze}), whether or not anything was replayed: the replayed
        items, and what the server made to start (modules, classes, the
        queues), are long-lived. The collector's first pass over replayed
        items would hold the reactor for tens of ms, and each full pass
        after it would walk all of them again for nothing (3.6% of a durable
        set's instructions, with a server started empty: docs/performance.md).
        """
        if freeze:
            gc.freeze()
        if self._gc_was_enabled:
            gc.enable()
        self._gc_was_enabled = None

    def _abandon(self, error: Exception) -> None:
        """Stop replaying: journals stay as they are; held requests end (see LoadingQueue)."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        current, self._replaying = self._replaying, None
        if current is not None:
            name, queue, steps, _ = current
            self._log.info("Replay of queue {queue} stopped before its end", queue=name)
            steps.close()
            self._close(name, queue)
        self._order.clear()
        loading, self.loading = self.loading, {}
        for held in loading.values():
            held.abandon(error)
