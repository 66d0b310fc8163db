"""
QueueInfo: the counters of one queue at a moment, as thrift's C{peek}
reports them (read through L{kestrel.collection.QueueCollection.queue_info}).
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["QueueInfo"]


@attrs.frozen
class QueueInfo:
    """The counters of one queue at a moment, as thrift's C{peek} reports them."""

    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int

    @classmethod
    def of(cls, queue: Any) -> QueueInfo:
        """The counters of C{queue} (a L{kestrel.queue.PersistentQueue}) now."""
        return cls(items=queue.length, bytes=queue.bytes, journal_bytes=queue.logsize,
                   age=queue.age, waiters=queue.waiter_count,
                   open_transactions=queue.open_read_count)
