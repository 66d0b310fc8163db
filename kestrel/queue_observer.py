"""
QueueObserver: what a queue reports about itself to whoever measures it.

The server's per-queue metrics (L{kestrel.metrics}) implement it; a queue
built without an observer measures nothing.
"""

from __future__ import annotations

from typing import Protocol


class Recorder(Protocol):
    """A distribution values are added to (a metrics histogram)."""

    def add(self, value: float) -> object:
        """Record C{value}; cheap, and never raises."""


class QueueObserver(Protocol):
    """
    What a queue reports about itself when observed (Kestrel's per-queue metrics).

    Every method is called synchronously from the queue's own operation and
    must be cheap and must not raise. A queue built without an observer
    reads no clock and calls nothing for them. Durations are clock seconds.
    """

    @property
    def set_latency_usec(self) -> Recorder:
        """
        Where a durable add's microseconds, from the queue's offer until its
        producer was answered after its fsync, are added (Kestrel's
        C{set_latency_usec}; adds answered at once are recorded by the
        caller of C{offer}).
        """

    def journal_rewritten(self, seconds: float) -> None:
        """A journal rewrite (compaction) took C{seconds}."""

    def journal_rotated(self, seconds: float) -> None:
        """A journal rotation took C{seconds}."""

    def read_behind_filled(self, seconds: float) -> None:
        """A read-behind refill (reading items back from the journal) took C{seconds}."""

    def item_added(self, size: int, queue_size: int) -> None:
        """A client add of C{size} payload bytes was stored; C{queue_size} items are in memory."""

    def item_removed(self, queue_size: int) -> None:
        """An item was removed for a reader; C{queue_size} items remain in memory."""

    def open_reads_changed(self, open_reads: int, expiring: int) -> None:
        """
        The table of open reads changed (opened, confirmed, aborted, continued):
        it holds C{open_reads}, C{expiring} of them under C{open_transaction_timeout}.
        """
