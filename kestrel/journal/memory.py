"""
MemoryJournal: the journal interface with nothing on disk.

It implements C{keep_journal: false} and serves the queue-model tests. It
keeps the records it was asked to write in C{records}, so tests can assert
what a queue would have journaled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred, succeed

from kestrel.item import QItem
from kestrel.journal import records as rec
from kestrel.journal.interface import FailureHandler

if TYPE_CHECKING:
    from kestrel.journal.pack import Checkpoint
    from kestrel.journal.syncfile import Waiter


class MemoryJournal:
    """
    A journal that writes nothing durable: every write is "durable" at once
    (nothing to wait for: it returns C{None}) and never fails (an
    L{kestrel.journal.interface.IJournal}).

    @ivar records: every record written, in order (only if C{keep_records}).
    """

    in_read_behind = False
    is_replaying = False
    maintaining = False
    packing = False
    size = 0
    archived_size = 0
    checkpoint = None

    def __init__(self, keep_records: bool = False) -> None:
        self.keep_records = keep_records
        self.records: list[rec.Record] = []
        self.closed = False
        #: Never called: nothing here can fail.
        self.on_failure: FailureHandler | None = None
        #: Never called: nothing is replayed.
        self.on_skipped_adds: Callable[[int, int], None] | None = None

    def _write(self, record: Callable[[], rec.Record]) -> None:
        if self.keep_records:
            self.records.append(record())

    def replay(self, apply: Callable[[rec.Record], None],
               reset: Callable[[], None] | None = None) -> None:
        """Replay nothing: a memory journal starts empty."""

    def replay_steps(self, apply: Callable[[rec.Record], None],
                     reset: Callable[[], None] | None = None,
                     slice_bytes: int | None = None) -> Iterator[int]:
        """Replay nothing, in no steps: a memory journal starts empty."""
        return iter(())

    def add(self, item: QItem) -> None:
        """Record an add."""
        return self._write(lambda: rec.Add(item.data, item.add_time_ms, item.expiry_ms))

    def add_unseen(self, item: QItem, waiter: Waiter | None = None) -> None:
        """Record an add (nothing is held: as L{add}); C{waiter}, if given, is told at once."""
        self.add(item)
        if waiter is not None:
            waiter.callback(None)

    def continue_(self, xid: int, item: QItem) -> None:
        """Record a confirm of C{xid} plus an add."""
        return self._write(lambda: rec.Continue(xid, item.data, item.add_time_ms, item.expiry_ms))

    def remove(self) -> None:
        """Record a remove of the head."""
        return self._write(lambda: rec.REMOVE)

    def remove_tentative(self, xid: int) -> None:
        """Record an open read."""
        return self._write(lambda: rec.RemoveTentativeXid(xid))

    def unremove(self, xid: int) -> None:
        """Record an aborted read."""
        return self._write(lambda: rec.Unremove(xid))

    def confirm_remove(self, xid: int) -> None:
        """Record a confirmed read."""
        return self._write(lambda: rec.ConfirmRemove(xid))

    def writes_now(self) -> bool:
        """Always true: a memory journal has no write batches."""
        return True

    def after_written(self, f: Callable[..., object], *args: object) -> None:
        """Call C{f(*args)} at once: a memory journal has no write batches."""
        f(*args)

    def recover(self, kind: str, error: Exception) -> Deferred[int]:
        """Nothing to cut back: fire with 0 bytes kept."""
        return succeed(0)

    def probe(self, xid_counter: int) -> Deferred[None]:
        """Always writable: fire at once."""
        return succeed(None)

    def rotate(self, reserved_items: Iterable[QItem], set_checkpoint: bool) -> None:
        """Do nothing: there is no file to rotate."""

    def rewrite(self, reserved_items: Iterable[QItem], items: Iterable[QItem],
                xid_counter: int = 0) -> None:
        """Do nothing: there is no file to compact."""

    def start_pack(self, checkpoint: Checkpoint, open_items: Iterable[QItem],
                   queue_items: Iterable[QItem], xid_counter: int = 0) -> None:
        """Never called: a memory journal never sets a checkpoint."""
        raise RuntimeError("a memory journal has no checkpoint to pack")

    def start_read_behind(self) -> None:
        """Never called: a memory journal keeps every item in memory."""
        raise RuntimeError("a memory journal has no read-behind")

    def fill_read_behind(self, got_item: Callable[[QItem], None],
                         got_checkpoint: Callable[[Checkpoint], None],
                         durable_only: bool = False) -> bool:
        """Never called: a memory journal is never in read-behind."""
        raise RuntimeError("a memory journal has no read-behind")

    def close(self) -> Deferred[None]:
        """Close: nothing to flush."""
        self.closed = True
        return succeed(None)

    def erase(self) -> None:
        """Forget the recorded records."""
        self.records.clear()
