"""
ExpirySweeps: how the collection discards expired items and expired queues.

L{kestrel.collection.QueueCollection} derives from it: C{flush_expired}
(the C{flush_expired} command), the C{max_queue_age} sweep of empty queues,
and the timer (C{expiration_timer_frequency}) that runs both.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from kestrel.config import ServerConfig
from kestrel.errors import QueueLoading
from kestrel.loading import LoadingQueue
from kestrel.queue import PersistentQueue
from kestrel.stats import ServerStats


class ExpirySweeps:
    """
    The expiry half of the collection.

    Promises: a sweep creates no queue, counts each expired queue in
    C{queue_expires}, and a failed sweep is logged and leaves the timer running.
    """

    _log = Logger()

    # The collection's parts a sweep works on (set by the collection).
    config: ServerConfig
    stats: ServerStats
    _clock: IReactorTime
    _queues: dict[str, PersistentQueue]
    _stopping: bool
    _expiration: LoopingCall | None

    @property
    def _loading(self) -> dict[str, LoadingQueue]:
        raise NotImplementedError

    def _check_running(self) -> None:
        raise NotImplementedError

    def queue_names(self, include_aliases: bool = True) -> list[str]:
        """The names of every queue (and alias), as the collection lists them."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Delete queue C{name}, as the collection does."""
        raise NotImplementedError

    def _start_expiration(self) -> None:
        frequency = self.config.expiration_timer_frequency
        if frequency:
            self._expiration = LoopingCall(self._expiration_tick)
            self._expiration.clock = self._clock
            self._expiration.start(frequency, now=False).addErrback(
                lambda f: self._log.failure("expiration timer stopped", f))

    def flush_expired(self, name: str) -> int:
        """Discard the expired items at the head of C{name} (no creation); return how many."""
        self._check_running()
        queue = self._queues.get(name)
        if queue is None:
            if name in self._loading:
                raise QueueLoading(name, "flush_expired")
            return 0
        flushed = queue.discard_expired()
        if flushed:
            self._log.info("Queue {queue} flushed of {count} expired item(s)",
                           queue=name, count=flushed)
        return flushed

    def flush_all_expired(self) -> int:
        """Run L{flush_expired} on every queue; return the total."""
        return sum(self.flush_expired(name) for name in self.queue_names(include_aliases=False))

    def is_ready_for_expiration(self, name: str) -> bool:
        """
        Whether queue C{name} is empty and older than its C{max_queue_age}.

        The age counts from the creation of the queue object (server start for
        queues found on disk), as Kestrel.
        """
        queue = self._queues.get(name)
        if queue is None:
            return False
        max_age = queue.config.max_queue_age
        return (max_age is not None and queue.length == 0
                and self._clock.seconds() > queue.create_time + max_age)

    def delete_expired_queues(self) -> int:
        """Delete every queue ready for expiration (L{is_ready_for_expiration}); return how many."""
        count = 0
        for name in self.queue_names(include_aliases=False):
            if self.is_ready_for_expiration(name):
                self.delete(name)
                self.stats.queue_expires += 1
                self._log.info("Expired queue {queue}", queue=name)
                count += 1
        return count

    def _expiration_tick(self) -> None:
        if self._stopping:
            return
        try:
            self.flush_all_expired()
            self.delete_expired_queues()
        except Exception:
            self._log.failure("Expiration sweep failed")
