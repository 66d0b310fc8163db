"""
ThriftReads: the part of a client session that serves thrift's reads.

Thrift's C{get} collects items as open reads with process-wide external ids
(L{kestrel.external_reads.ExternalReads}), or holds them until the reply is in
the kernel; C{confirm} and C{abort} close those ids from any connection.
L{kestrel.session.ClientSession} inherits it; it knows nothing of sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.item import QItem

if TYPE_CHECKING:
    from kestrel.collection import QueueCollection
    from kestrel.external_reads import ExternalReads
    from kestrel.held_reads import HeldReads
    from kestrel.stats import ServerStats


class _Host(Protocol):
    """What thrift's reads need of the server: its table of external reads."""

    external_reads: ExternalReads


class ThriftReads:
    """
    Thrift's reads of one session: C{get} with or without auto-abort,
    C{confirm} and C{abort} by external id. Mixed into the session, whose
    checks, counters and monitor loop it uses.
    """

    _log = Logger()
    server: _Host
    _collection: QueueCollection
    _stats: ServerStats
    _external_counts: dict[str, int]
    held_reads: HeldReads
    finished: bool
    input_closed: bool

    if TYPE_CHECKING:  # (the session's, which mixes this in)
        def _check_reads(self, op: str) -> None: ...

        def _monitor(self, name: str, deadline: float | None, max_items: int,
                     open_read: bool, got_item: Callable[[QItem, int], None],
                     record: Callable[[str, int], int | None] | None) -> Deferred[None]: ...

    def get_items(self, name: str, max_items: int, deadline: float | None,
                  auto_abort_ms: int) -> Deferred[list[tuple[int, QItem]]]:
        """
        Thrift C{get}: collect up to C{max_items} items of C{name}, waiting
        until C{deadline} for more; fire with C{(external_id, item)} pairs.

        With C{auto_abort_ms > 0} every item is an open read with a new
        process-wide external id, aborted after C{auto_abort_ms} unless
        confirmed or aborted first (from any connection); otherwise items are
        held (L{held_reads}) until the protocol has the reply in the kernel,
        then removed for good; their id is 0. C{max_items == 0} gives [].
        """
        self._check_reads("monitorUntil")
        if max_items == 0:
            return succeed([])
        self._stats.cmd_monitor += 1
        open_read = auto_abort_ms > 0
        # A get that removes for good holds what it collects as open reads
        # until its reply is in the kernel: if the client goes away first,
        # they go back to the head instead of into a reply nobody reads.
        holding = not open_read
        items: list[tuple[int, QItem]] = []
        d = self._monitor(name, deadline, max_items, open_read or holding,
                          lambda item, external: items.append((external, item)),
                          self._add_external_read if open_read else None)

        def finished(_: object) -> list[tuple[int, QItem]]:
            if open_read:
                table = self.server.external_reads
                for external, _item in items:
                    table.set_timer(external, auto_abort_ms / 1000.0)
            elif holding:
                collection = self._collection
                if self.finished or self.input_closed:
                    for _external, item in reversed(items):
                        collection.unremove(name, item.xid)
                    self._log.debug("thrift get on {queue} cut by a close: {n} items put back",
                                    queue=name, n=len(items))
                    return []
                self.held_reads.pending.extend((name, item.xid) for _external, item in items)
            return items

        def failed(failure: Failure) -> Failure:
            for external, item in reversed(items):  # (the client gets the error, not them)
                if open_read:  # (it never learns these ids: no timer, nobody to close them)
                    self.server.external_reads.close(external, confirm=False)
                else:
                    self._collection.unremove(name, item.xid)
            return failure
        return d.addCallbacks(finished, failed)

    def _add_external_read(self, name: str, xid: int) -> int:
        self._external_counts[name] = self._external_counts.get(name, 0) + 1
        return self.server.external_reads.open(name, xid, self)

    def external_closed(self, name: str) -> None:
        """One of this session's external reads on queue C{name} was confirmed or aborted."""
        count = self._external_counts.get(name, 0)
        if count > 1:
            self._external_counts[name] = count - 1
        else:
            self._external_counts.pop(name, None)

    def external_reopened(self, name: str) -> None:
        """A confirm of one of this session's external reads on C{name} failed: open again."""
        self._external_counts[name] = self._external_counts.get(name, 0) + 1

    def confirm_ids(self, name: str, ids: Iterable[int]) -> int | Deferred[int]:
        """
        Thrift C{confirm}: confirm every open external id of C{ids}; return how many.

        Each id is confirmed on the queue it was opened on, whoever opened it;
        C{name} is not used to find it. Unknown ids are ignored. If a queue
        acks durably, a Deferred of the count once those confirms are durable;
        if one is refused or lost it fails (L{kestrel.errors.JournalUnavailable})
        and the ids it concerns are open again.
        """
        table = self.server.external_reads
        closed = [table.close(external_id, confirm=True) for external_id in set(ids)]
        count = sum(1 for done in closed if done)
        waits = [done for done in closed if isinstance(done, Deferred)]
        if not waits:
            return count
        return DeferredList(waits, fireOnOneErrback=True, consumeErrors=True).addCallbacks(
            lambda _: count, lambda f: f.value.subFailure)

    def abort_ids(self, name: str, ids: Iterable[int]) -> int:
        """
        Thrift C{abort}: like L{confirm_ids}, but the items go back to their queue's head.

        Higher ids go back first, so that of the items aborted together the one
        handed out first is delivered first again.
        """
        table = self.server.external_reads
        return sum(1 for external_id in sorted(set(ids), reverse=True)
                   if table.close(external_id, confirm=False))
