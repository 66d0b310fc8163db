"""
IJournal: everything a L{kestrel.queue.PersistentQueue} asks of its journal.

Two classes implement it: L{kestrel.journal.journal.FileJournal} (the
journal files on disk) and L{kestrel.journal.memory.MemoryJournal}
(C{keep_journal: false}, and the queue-model tests). A queue holds an
C{IJournal} and touches nothing else of it; the contract tests
(C{tests/unit/test_journal_contract.py}) run the same behaviour against both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from twisted.internet.defer import Deferred

from kestrel.item import QItem
from kestrel.journal import records as rec

if TYPE_CHECKING:
    from kestrel.journal.pack import Checkpoint
    from kestrel.journal.syncfile import Waiter


#: Told C{(kind, error)} when a write or fsync fails; C{kind} is C{"write"} or C{"fsync"}.
FailureHandler = Callable[[str, OSError], None]


class IJournal(Protocol):
    """
    The journal of one queue, as the queue uses it.

    Writes (L{add} .. L{confirm_remove}) append one record each and return a
    Deferred that fires when the record is durable under the journal's sync
    policy (at once for a journal that syncs nothing), or fails with the
    C{OSError} of the write or fsync that lost it. A write or fsync failure
    is also reported, once, to L{on_failure}; the queue then calls
    L{recover}, L{replay} again and, until writes succeed, L{probe}.

    @ivar size: bytes in the current journal file (Kestrel's C{logsize}).
    @ivar archived_size: bytes in the rotated (older) journal files.
    @ivar on_failure: called when a write or fsync fails (set by the queue).
    @ivar on_skipped_adds: told C{(items, data_bytes)} for runs of adds that
        replay skipped without decoding them, because they lie beyond memory
        and read-behind reads them later (set by the queue).
    """

    size: int
    archived_size: int
    on_failure: FailureHandler | None
    on_skipped_adds: Callable[[int, int], None] | None

    @property
    def maintaining(self) -> bool:
        """Whether journal maintenance still runs in a thread (no rotation or rewrite starts)."""
        ...

    @property
    def packing(self) -> bool:
        """Whether a pack is being written or put in place in a thread (no rewrite starts)."""
        ...

    @property
    def in_read_behind(self) -> bool:
        """Whether some items are read back from the journal instead of kept in memory."""
        ...

    # -- load

    def replay(self, apply: Callable[[rec.Record], None],
               reset: Callable[[], None] | None = None) -> None:
        """
        Call C{apply} with every record, oldest first, then open the journal
        for writing. C{reset} is called when damage makes what was applied so
        far untrustworthy: the caller forgets it and replay goes on.
        """
        ...

    def replay_steps(self, apply: Callable[[rec.Record], None],
                     reset: Callable[[], None] | None = None,
                     slice_bytes: int | None = None) -> Iterator[int]:
        """
        L{replay} a slice at a time: a generator pausing (yielding the offset
        reached) after about every C{slice_bytes} bytes of journal read, and
        between files. Exhausted, the journal is open as after L{replay};
        closed before its end, it leaves the journal unopened and its files
        as they were (the journal must then be closed, not written).
        """
        ...

    def erase(self) -> None:
        """Erase (or archive) every journal file: the journal is empty."""
        ...

    def close(self) -> Deferred[None]:
        """Flush and close; fires when every write before is settled."""
        ...

    # -- writes: each returns a Deferred that fires when its record is durable
    # (failing if its write or fsync fails), or None when there is nothing to
    # wait for (no sync policy, the record in the OS or in the open batch)

    def add(self, item: QItem) -> Deferred[None] | None:
        """Journal an add of C{item}."""
        ...

    def add_unseen(self, item: QItem, waiter: Waiter | None = None) -> Deferred[None] | None:
        """
        Journal an add of C{item} that no reader sees before the returned
        Deferred fires (a durable add): the record may reach the OS only at
        the end of the reactor turn, just before the fsync covering it.
        With a C{waiter} it is told instead (L{Waiter}: possibly before
        this returns) and C{None} is returned.
        """
        ...

    def continue_(self, xid: int, item: QItem) -> Deferred[None] | None:
        """Journal a confirm of open read C{xid} together with an add of C{item}."""
        ...

    def remove(self) -> Deferred[None] | None:
        """Journal a remove of the head item."""
        ...

    def remove_tentative(self, xid: int) -> Deferred[None] | None:
        """Journal an open read of the head item under C{xid}."""
        ...

    def unremove(self, xid: int) -> Deferred[None] | None:
        """Journal an aborted open read C{xid}."""
        ...

    def confirm_remove(self, xid: int) -> Deferred[None] | None:
        """Journal a confirmed open read C{xid}."""
        ...

    def writes_now(self) -> bool:
        """
        Whether no write batch holds records back: a record written now is in
        the OS (or refused) when its write returns, and L{after_written} calls
        at once.
        """
        ...

    def after_written(self, f: Callable[..., object], *args: object) -> None:
        """
        Call C{f(*args)} once every record written so far is in the OS (or
        was refused, and reported to L{on_failure}), outside any open write
        batch: at once when no batch holds records back, else right after
        the batch's flush. A result for another connection leaves this way,
        so that its records never travel in this connection's batch.
        """
        ...

    # -- failure

    def recover(self, kind: str, error: Exception) -> Deferred[int]:
        """
        After a failed write or fsync, cut the journal back to what it surely
        holds; fires with the bytes kept, fails if the cut-back fails.
        """
        ...

    def probe(self, xid_counter: int) -> Deferred[None]:
        """Write and sync a harmless record; fires if the journal can be written again."""
        ...

    # -- maintenance

    def rotate(self, reserved_items: Iterable[QItem], set_checkpoint: bool) -> None:
        """Start a new current file (keeping the open reads); maybe set a checkpoint."""
        ...

    def rewrite(self, reserved_items: Iterable[QItem], items: Iterable[QItem],
                xid_counter: int = 0) -> None:
        """Replace every file by one holding just the open reads and C{items}."""
        ...

    def start_pack(self, checkpoint: Checkpoint, open_items: Iterable[QItem],
                   queue_items: Iterable[QItem], xid_counter: int = 0) -> None:
        """Pack the files before C{checkpoint} (handed to C{fill_read_behind}'s callback)."""
        ...

    def start_read_behind(self) -> None:
        """Keep further adds on disk only: open the read-behind reader."""
        ...

    def fill_read_behind(self, got_item: Callable[[QItem], None],
                         got_checkpoint: Callable[[Checkpoint], None],
                         durable_only: bool = False) -> bool:
        """
        Read the next item back (C{got_item}); report a checkpoint passed
        (C{got_checkpoint}). With C{durable_only}, read nothing an fsync has
        not made durable: return C{False} when the reader waits for one.
        """
        ...
