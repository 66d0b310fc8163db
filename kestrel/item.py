"""
The queued item value and the conversions of client expiry times.

Times inside the domain are epoch milliseconds (ints); C{clock.seconds()}
gives epoch seconds as a float.
"""

from __future__ import annotations

from typing import final

#: The add time of the last item made (see L{QItem}); always an C{int}.
_last_add_time_ms = 0


@final
class QItem:
    """
    One queued item: its payload, when it was added, when it expires, and the
    xid of the open read holding it (0 when it is not open).

    Items made one after another often have the same add time (adds in the
    same millisecond, a journal's items at replay): an item whose add time
    equals the last item's keeps that item's C{int} object rather than its
    own, which saves 32 bytes of each such item held in memory. Only the
    object is shared: the add time kept equals the one given.

    @ivar expiry_ms: absolute epoch ms, or 0 for "never expires".
    """

    __slots__ = ("add_time_ms", "expiry_ms", "data", "xid")

    def __init__(self, data: bytes, add_time_ms: int, expiry_ms: int = 0, xid: int = 0) -> None:
        global _last_add_time_ms
        last = _last_add_time_ms  # (read once: the value kept is the one compared)
        if add_time_ms == last:
            add_time_ms = last
        elif type(add_time_ms) is int:
            _last_add_time_ms = add_time_ms
        self.data = data
        self.add_time_ms = add_time_ms
        self.expiry_ms = expiry_ms
        self.xid = xid

    def __repr__(self) -> str:
        return (f"QItem({self.data[:32]!r}{'...' if len(self.data) > 32 else ''}, "
                f"add_time_ms={self.add_time_ms}, expiry_ms={self.expiry_ms}, xid={self.xid})")

    def same_as(self, other: QItem) -> bool:
        """Whether C{other} has this item's payload and times (its xid aside)."""
        return (self.data == other.data and self.add_time_ms == other.add_time_ms
                and self.expiry_ms == other.expiry_ms)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QItem):
            return NotImplemented
        return (self.data == other.data and self.add_time_ms == other.add_time_ms
                and self.expiry_ms == other.expiry_ms and self.xid == other.xid)

    __hash__ = None  # type: ignore[assignment]


#: memcache treats expiry values below this many seconds as relative to now.
MEMCACHE_RELATIVE_LIMIT = 1_000_000


def memcache_expiry_ms(exptime: int, now_ms: int) -> int:
    """
    Convert a memcache C{exptime} (seconds) into absolute epoch ms (0 = never).

    0 means never; below 1,000,000 it is relative to now (negative values are
    therefore already expired); otherwise it is absolute epoch seconds.
    """
    if exptime == 0:
        return 0
    if exptime < MEMCACHE_RELATIVE_LIMIT:
        return now_ms + exptime * 1000
    return exptime * 1000


def relative_expiry_ms(expiry_msec: int, now_ms: int) -> int:
    """
    Convert a relative expiry in milliseconds (thrift, text) into absolute epoch ms.

    0 means never (txkestrel's choice for text too, see decisions).
    """
    if expiry_msec == 0:
        return 0
    return now_ms + expiry_msec
