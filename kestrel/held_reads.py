"""
HeldReads: the items one session has handed to replies that may not have
reached the client yet.

A plain read (memcache C{get}, thrift C{get} without C{auto_abort_msec})
removes its item for good only once the reply carrying it is in the kernel:
until then the item is an open read of the queue, held here. A read whose
reply is written before anything else runs (a lone memcache C{get}) holds
the item itself, still at the head of its queue (L{HeldReads.peek_for_reply}):
taking it then costs what a plain remove costs. Once the protocol has
written the replies (L{HeldReads.written}) and the transport has handed
every byte of them to the kernel (at once, or later: L{HeldReads.drained}),
each held item is removed for good. If the connection is
lost first, the session returns them to the head of their queues
(L{HeldReads.take_all}). It knows nothing of sockets: the protocol says
what the transport did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from kestrel.errors import KestrelError

if TYPE_CHECKING:
    from kestrel.collection import QueueCollection
    from kestrel.item import QItem
    from kestrel.queue import PersistentQueue

_log = Logger()

__all__ = ["HeldReads"]


class HeldReads:
    """
    One session's held reads, as C{(queue name, xid)} pairs, in two stages:
    L{pending} (taken for a reply not yet written; or C{(queue, item)}
    for an item left at the head) and unsent (written, but maybe still in
    the transport's buffer).

    @ivar pending: the reads whose reply is not written yet, oldest first;
        protocols test it (a cheap list) before calling L{written}.
    """

    __slots__ = ("_collection", "pending", "_unsent", "_peeked", "_depth")

    def __init__(self, collection: QueueCollection) -> None:
        self._collection = collection
        self.pending: list[tuple[Any, Any]] = []  # ((name, xid) or (queue, item))
        self._unsent: list[tuple[str, int]] = []
        self._peeked = False  # (whether pending holds a peeked item)
        self._depth: dict[str, int] = {}  # (when _peeked: how many per queue)

    def __len__(self) -> int:
        return len(self.pending) + len(self._unsent)

    def hold(self, name: str, xid: int) -> None:
        """Open read C{xid} of C{name} goes into the next reply written."""
        self.pending.append((name, xid))

    def peek_for_reply(self, name: str, holding: bool = True) -> QItem | None:
        """
        For a plain read (C{holding}) whose reply the protocol writes at the
        end of the pass serving it, before any other connection runs: the
        first item of queue C{name} not already held so, left in place and
        held for that reply (L{written} takes it, as a plain remove once the
        reply is in the kernel). C{None} when that cannot be promised: no
        such queue served, no such item in memory, open reads on it (their
        time-out could move the head), readers blocked on it (a wake-up
        after the pass's journal flush could take the head), an expiry or a
        C{max_age} (a sweep could drop it). A held item counts as a hit.

        Any other read of the pass (C{holding} false, or no item held) first
        takes the items held so as open reads (L{open_peeked}), so that what
        it removes, or looks at, is what follows them.
        """
        if holding:
            collection = self._collection
            queue = collection.served_queues.get(name)  # (None once shutting down)
            if queue is not None:
                depth = self._depth
                index = depth.get(name, 0) if self._peeked else 0
                item = queue.plain_head(index)  # (a failed journal: None; the remove reports it)
                if item is not None:
                    queue.get_items_hit += 1
                    collection.stats.get_hits += 1
                    self.pending.append((queue, item))
                    if not self._peeked:
                        self._peeked = True
                        depth.clear()
                    depth[name] = index + 1
                    return item
        if self._peeked:
            self.open_peeked()
        return None

    def open_peeked(self) -> None:
        """Take the items held in place (L{peek_for_reply}) as open reads, oldest first."""
        if self._peeked:
            self._peeked = False
            self._take_peeked(False)

    def _take(self, queue: PersistentQueue, item: QItem, in_kernel: bool) -> int | None:
        """
        The reply carrying C{item} (from L{peek_for_reply}) is written: take
        it from the head of C{queue}, for good if the reply is C{in_kernel},
        else as an open read whose xid is returned. If C{item} is no longer
        the head, nothing is taken (the client may get it again).
        """
        try:
            if in_kernel and queue.remove(False, item) is item:  # (the usual case)
                return None
            if queue.is_closed or queue.peek() is not item:
                _log.info("Queue {queue}: an item replied to a plain read is not at the "
                          "head any more; it stays queued", queue=queue.name)
                return None
            # The head is still the item, but a plain remove could not keep it in
            # place (open reads, an expiry, max_age): take it as an open read, which
            # remove() may find gone (timed out, swept) and then hands back another.
            taken = queue.remove(open_read=True)
        except KestrelError as e:  # (its journal failed: the item stays queued)
            _log.warn("Queue {queue}: an item replied to a plain read stays queued: {error}",
                      queue=queue.name, error=str(e))
            return None
        queue.transactions -= 1  # (held for a reply: no client transaction)
        collection = self._collection
        if taken is not item:
            if taken is not None:  # (an open read: back to the head)
                collection.unremove(queue.name, taken.xid)
            return None
        if in_kernel:
            collection.confirm_remove(queue.name, taken.xid)
            return None
        return taken.xid

    def written(self, in_kernel: bool) -> bool:
        """
        The replies carrying every pending read are written. With
        C{in_kernel} (nothing of them or before them is left in the
        transport's buffer) every held read is confirmed now and this
        returns false. Otherwise they wait, and this returns true: the
        protocol must call L{drained} once the transport's buffer is empty.
        """
        if self._peeked:
            self._peeked = False
            pending = self.pending
            if in_kernel and len(pending) == 1 and not self._unsent:
                # The usual case (a lone get): take the item for good, nothing else.
                queue, item = pending.pop()
                self._take(queue, item, True)
                return False
            pending = self._take_peeked(in_kernel)
        else:
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

    def _take_peeked(self, in_kernel: bool) -> list[tuple[str, int]]:
        """Take the peeked items of L{pending} from their queues; the open reads remain."""
        take = self._take
        reads: list[tuple[str, int]] = []
        for name, entry in self.pending:
            if entry.__class__ is int:
                reads.append((name, entry))
            else:  # (a peeked item: name is its queue)
                xid = take(name, entry, in_kernel)
                if xid is not None:
                    reads.append((name.name, xid))
        self.pending = reads
        return reads

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
        pending, self.pending = self._reads(self.pending), []
        self._peeked = False
        unremove = self._collection.unremove
        for name, xid in reversed(pending):
            unremove(name, xid)
        return len(pending)

    def take_all(self) -> list[tuple[str, int]]:
        """
        Forget every held read and return the open ones (the session puts
        them back); a peeked item is still at its queue's head.
        """
        taken = self._unsent + self._reads(self.pending)
        self._peeked = False
        self._unsent = []
        self.pending = []
        return taken

    @staticmethod
    def _reads(entries: list[Any]) -> list[tuple[str, int]]:
        """The open reads of C{entries} (peeked items left out)."""
        return [(name, entry) for name, entry in entries if entry.__class__ is int]

    def _confirm(self, reads: list[tuple[str, int]]) -> None:
        confirm = self._collection.confirm_remove
        for name, xid in reads:
            confirm(name, xid)
