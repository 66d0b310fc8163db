"""
LoadingQueue: what a queue is, to clients, while its journal replays at startup.

At startup the server listens at once and replays the journals one queue
after another (L{kestrel.collection.QueueCollection.start_loading}). A queue
still replaying is not in the collection's table of queues: the requests that
miss that table find its L{LoadingQueue} instead, which holds them (adds,
reads, peeks) as Deferreds, in arrival order, and makes them of the real
queue as soon as it is ready. A read with a deadline answers "no item" at
its deadline if the queue is still loading. It knows nothing of sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

__all__ = ["LoadingQueue"]


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

    def add(self, data: bytes, expiry_ms: int = 0) -> Deferred[bool]:
        """Add C{data} once the queue is ready; fires with the queue's answer."""
        return self._hold(lambda queue: queue.add(data, expiry_ms), None, False)

    def wait_remove(self, deadline: float | None,
                    open_read: bool = False) -> Deferred[Any]:
        """
        Remove the head item once the queue is ready, waiting for one until
        C{deadline} (clock seconds; C{None}: as long as the queue loads, then
        no wait); fires with C{None} at the deadline if the queue still loads.
        """
        return self._hold(lambda queue: queue.wait_remove(deadline, open_read), deadline, True)

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
