"""
QueueReplay: how a queue loads itself from its journal.

L{kestrel.queue.PersistentQueue} derives from it: L{QueueReplay.setup}
replays the journal's records into memory (each record type an event of
L{QueueEvents}, applied here), then aborts every read the journal leaves
open. The reload after a journal failure (L{QueueReplay.reload}) replays
through the same events, then makes again what clients were told and the
journal lacks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.events import QueueEvents
from kestrel.journal.interface import IJournal
from kestrel.open_reads import OpenReads
from kestrel.queue_health import ABORT, CONFIRM, OPEN, REMOVE, Unsettled
from kestrel.read_behind import ReadBehind
from kestrel.unsynced import Unsynced


class QueueReplay(QueueEvents):
    """
    The journal-replay half of a queue: L{setup} and the events a replayed record sets off.

    Promises: after L{setup}, memory holds what the journal's records say,
    in their order, and no read is left open.
    """

    _log = Logger()

    # The queue's parts replay works on (set by the queue).
    name: str
    journal: IJournal
    length: int
    bytes: int
    memory_bytes: int
    _config: QueueConfig
    _items: deque[QItem]
    _reads: OpenReads
    _records: Unsettled
    _read_behind: ReadBehind
    _replaying: bool
    _replay_apply: Callable[[rec.Record], None]
    _unsynced: Unsynced
    _clock: IReactorTime
    total_items: int
    put_items: int
    put_bytes: int

    def _store(self, item: QItem, unseen: bool = False, observed: bool = True) -> int:
        raise NotImplementedError

    def _pop_head(self) -> QItem | None:
        raise NotImplementedError

    def _return_to_head(self, xid: int) -> None:
        raise NotImplementedError

    def _open_reads_changed(self) -> None:
        raise NotImplementedError

    def setup(self) -> None:
        """
        Load the queue from its journal: every record applied in order, then
        every read still open aborted (UNREMOVE journaled, descending xid),
        so that those items stand at the head in ascending-xid order. With
        C{keep_journal: false} the journal is erased instead.
        """
        for _ in self.setup_steps():
            pass

    def setup_steps(self, slice_bytes: int | None = None) -> Generator[int, None, None]:
        """
        L{setup} in steps: a generator pausing after about every C{slice_bytes}
        bytes of journal read (see C{FileJournal.replay_steps}). Closed before
        its end, it leaves the journal files as they were; the queue must then
        be closed (not graceful), never served.
        """
        self.length = 0
        self.bytes = 0
        if not self._config.keep_journal:
            self.journal.erase()
            return
        self._log.info("Replaying transaction journal for {queue}", queue=self.name)
        self._reads.xid_counter = 0
        self._replaying = True
        # (Sliced replay is FileJournal's; setup() replays through replay() as always.)
        replay_steps = getattr(self.journal, "replay_steps", None)
        try:
            if replay_steps is None or slice_bytes is None:
                self.journal.replay(self._replay_apply, self._forget_replayed)
            else:
                yield from replay_steps(self._replay_apply, self._forget_replayed, slice_bytes)
        finally:
            self._replaying = False
        for xid in [item.xid for item in self._reads.newest_first()]:
            self._records.write(self.journal.unremove, xid, note=(ABORT, xid, None))
            self._return_to_head(xid)
        self._log.info(
            "Replayed {queue}: {items} items, {bytes} bytes, xid={xid}",
            queue=self.name, items=self.length, bytes=self.bytes, xid=self._reads.xid_counter)

    # (the QueueEvents a replayed journal record sets off)

    def added(self, item: QItem, xid: int) -> None:
        """Replay: store the item at the tail (an ADD_XID's xid means nothing now)."""
        self._store(item, observed=False)
        # (start_if_full's own size test, first: a call per replayed item costs more)
        if self.bytes >= self._config.max_memory_size:
            self._read_behind.start_if_full(keep_head=False)

    def removed(self) -> None:
        """Replay: drop the head item."""
        self._pop_head()

    def opened(self, xid: int | None) -> None:
        """Replay: open the head item under C{xid} (a Kestrel 1.x open: the next xid)."""
        reads = self._reads
        if xid is None:
            xid = reads.next_xid()
        else:
            # Never lower the counter: a rewritten journal's SAVE_XID may be
            # above the xids of the opens that follow it.
            reads.saw_xid(xid)
        item = self._pop_head()
        if item is None:
            self._log.warn("Journal of {queue} opens xid {xid} on an empty queue; ignored",
                           queue=self.name, xid=xid)
            return
        reads.open(item, xid)

    def unremoved(self, xid: int) -> None:
        """Replay: put open read C{xid}'s item back at the head."""
        self._return_to_head(xid)

    def confirmed(self, xid: int) -> None:
        """Replay: forget open read C{xid}."""
        self._reads.pop(xid)

    def xid_saved(self, xid: int) -> None:
        """Replay: set the xid counter."""
        self._reads.xid_counter = xid

    def reload(self) -> None:
        """
        Rebuild the items and open reads from the journal (just cut back to
        what it surely holds), keeping counters, waiters and xids handed out;
        then make again, in order, what clients were told and the journal
        lacks (L{Unsettled}): closes of reads it still holds open, and opens
        whose item reached a reader and is back at the head.
        """
        owed = self._records.take()
        reads = self._reads
        before_since = reads.clear()
        xid_before = reads.xid_counter
        counters = (self.total_items, self.put_items, self.put_bytes)
        self._items.clear()  # (in place: Unsynced appends to this deque)
        self._unsynced.drop()  # (the journal holds them only if they became durable)
        self.length = self.bytes = self.memory_bytes = 0
        reads.xid_counter = 0
        self._replaying = True
        try:
            self.journal.replay(self._replay_apply, self._forget_replayed)
        except BaseException:
            self._records.restore(owed)
            raise
        finally:
            self._replaying = False
            (self.total_items, self.put_items, self.put_bytes) = counters
            # Never hand out an xid twice: a client may hold one the journal lost.
            reads.saw_xid(xid_before)
        now = self._clock.seconds()
        replayed = reads.items()
        reads.clear()
        for item in replayed:  # (opened when they were, for the timeout)
            reads.open(item, item.xid, before_since.get(item.xid, now))
        for what, xid, key, handed in owed:
            if what == OPEN or what == REMOVE:
                items = self._items
                if (handed and xid not in reads and items and isinstance(key, QItem)
                        and items[0].same_as(key)):
                    self._take_again(what, xid, before_since.get(xid, now))
            elif xid in reads:
                if what == CONFIRM:
                    reads.pop(xid)
                    self._records.write(self.journal.confirm_remove, xid,
                                        note=(CONFIRM, xid, None))
                else:
                    self._return_to_head(xid)
                    self._records.write(self.journal.unremove, xid, note=(ABORT, xid, None))
        self._log.info("Reloaded {queue} from its journal: {items} items, {open} open reads",
                       queue=self.name, items=self.length, open=len(reads))
        self._open_reads_changed()
        reads.timeout = self._config.open_transaction_timeout

    def _take_again(self, what: int, xid: int, since: float) -> None:
        """Take the head item again (removed, or opened under C{xid}): its record was cut."""
        item = self._pop_head()
        assert item is not None
        if what == REMOVE:
            self._records.write(self.journal.remove, note=(REMOVE, 0, item), handed=True)
            return
        self._reads.open(item, xid, since)
        self._records.write(self.journal.remove_tentative, xid,
                            note=(OPEN, xid, item), handed=True)

    def _forget_replayed(self) -> None:
        """Replay found a damaged rotated file: forget what came before (see FileJournal.replay)."""
        self._items.clear()  # (in place: Unsynced appends to this deque)
        self._reads.clear()
        self.length = self.bytes = self.memory_bytes = 0
