"""
HeldReads: the items one session has handed to replies that may not have
reached the client yet.

A plain read (memcache C{get}, thrift C{get} without C{auto_abort_msec})
removes its item for good only once the reply carrying it is in the kernel:
until then the item is an open read of the queue, held here. Once the
protocol has written the replies (L{HeldReads.written}) and the transport has
handed every byte of them to the kernel (at once, or later:
L{HeldReads.drained}), each held item is confirmed. If the connection is
lost first, the session returns them to the head of their queues
(L{HeldReads.take_all}). It knows nothing of sockets: the protocol says
what the transport did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kestrel.collection import QueueCollection

__all__ = ["HeldReads"]


class HeldReads:
    """
    One session's held reads, as C{(queue name, xid)} pairs, in two stages:
    L{pending} (taken for a reply not yet written) and unsent (written, but
    maybe still in the transport's buffer).

    @ivar pending: the reads whose reply is not written yet, oldest first;
        protocols test it (a cheap list) before calling L{written}.
    """

    __slots__ = ("_collection", "pending", "_unsent")

    def __init__(self, collection: QueueCollection) -> None:
        self._collection = collection
        self.pending: list[tuple[str, int]] = []
        self._unsent: list[tuple[str, int]] = []

    def __len__(self) -> int:
        return len(self.pending) + len(self._unsent)

    def hold(self, name: str, xid: int) -> None:
        """Open read C{xid} of C{name} goes into the next reply written."""
        self.pending.append((name, xid))

    def written(self, in_kernel: bool) -> bool:
        """
        The replies carrying every pending read are written. With
        C{in_kernel} (nothing of them or before them is left in the
        transport's buffer) every held read is confirmed now and this
        returns false. Otherwise they wait, and this returns true: the
        protocol must call L{drained} once the transport's buffer is empty.
        """
        pending = self.pending
        if in_kernel:
            self._confirm(pending)
            pending.clear()
            if self._unsent:
                self._confirm(self._unsent)
                self._unsent.clear()
            return False
        self._unsent.extend(pending)
        pending.clear()
        return True

    def drained(self) -> None:
        """Every byte written so far is in the kernel: confirm the written reads."""
        if self._unsent:
            unsent, self._unsent = self._unsent, []
            self._confirm(unsent)

    def put_back_pending(self) -> int:
        """
        The reply that was to carry the pending reads will not be sent: return
        them to the head of their queues (the newest first); return how many.
        """
        pending, self.pending = self.pending, []
        unremove = self._collection.unremove
        for name, xid in reversed(pending):
            unremove(name, xid)
        return len(pending)

    def take_all(self) -> list[tuple[str, int]]:
        """Forget every held read and return them (the session puts them back)."""
        taken = self._unsent + self.pending
        self._unsent = []
        self.pending = []
        return taken

    def _confirm(self, reads: list[tuple[str, int]]) -> None:
        confirm = self._collection.confirm_remove
        for name, xid in reads:
            confirm(name, xid)
