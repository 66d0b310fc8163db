"""
When a queue compacts its journal: Kestrel's rotate/rewrite rules as one
pure function, and the L{Compactor} that carries them out.

L{compaction_step} is asked after each add and remove, with the sizes of
the journal and of the queue's contents; the answer says whether to rewrite
the journal from memory, whether rewrites may then pause for
C{min_journal_compact_delay}, and whether to rotate; L{rewrite_pauses} says,
from the size of what the rewrite kept, whether they do. Neither touches a
file or a clock: C{tests/unit/test_queue_policy.py} checks the rules as
tables and properties.

Kestrel has two policies. The aggressive one (the default) rewrites an
empty queue whose journal reached C{default_journal_size}. The one of
C{disable_aggressive_rewrites} takes a break after rewriting an empty queue
whose journal stays large (KEST-366) and rewrites an empty queue before it
rotates. Their middle rule is the same: a journal over C{max_journal_size}
whose queue fits in memory is rewritten, then rewrites pause.

Kestrel's rewrite leaves one file, and its C{journal.size} then counts the
open reads it kept. Here a rewrite of a queue with open reads leaves them in
a pack, a rotated file (C{archived}): so the second policy measures the
journal as C{size + archived} when it decides to rewrite an empty queue,
and the size of what a rewrite keeps (L{kestrel.journal.pack.compact_size})
when it decides to take a break. See docs/journal.md, "When a queue
compacts its journal, and when it backs off".
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from kestrel.config import QueueConfig
from kestrel.item import QItem
from kestrel.journal.interface import IJournal
from kestrel.journal.pack import compact_size
from kestrel.queue_health import reason_of
from kestrel.queue_observer import QueueObserver

#: More than any record's bytes beyond its item's data (an ADDX header is 21).
RECORD_MARGIN = 64


def upkeep_from(config: QueueConfig, adding: bool = False) -> int:
    """
    The journal size (current and rotated files) below which no compaction
    is due under C{config}: while the journal, with C{RECORD_MARGIN} more,
    stays below it, L{Compactor.check} returns at once, and an operation
    need not call it.

    C{adding}: the size for an add to a queue that holds items already:
    C{default_journal_size} asks for nothing then (a rewrite at that size
    is for an empty queue, and the remove that empties it checks).
    """
    limit = min(config.max_memory_size, config.max_journal_size)
    return limit if adding else min(limit, config.default_journal_size)


class Pause(enum.Enum):
    """Whether rewrites pause for C{min_journal_compact_delay} after a rewrite."""

    NEVER = "never"
    ALWAYS = "always"
    #: Only if the rewritten journal is still at least half of
    #: C{default_journal_size} (L{rewrite_pauses}).
    IF_STILL_LARGE = "if-still-large"


@attrs.frozen
class Compaction:
    """
    What to do to a journal that outgrew a limit, in this order.

    @ivar rewrite: rewrite the journal from memory (open reads and items).
    @ivar pause: after that rewrite, whether rewrites pause (L{Pause}).
    @ivar rotate: then start a new current file if the current one is still
        over C{max_memory_size} (see L{rotation_checkpoint}).
    """

    rewrite: bool = False
    pause: Pause = Pause.NEVER
    rotate: bool = False


def within_limits(cfg: QueueConfig, size: int, archived: int) -> bool:
    """Whether a journal of C{size} current and C{archived} rotated bytes needs nothing."""
    total = size + archived
    return ((total if cfg.disable_aggressive_rewrites else size) < cfg.default_journal_size
            and size <= cfg.max_memory_size and total <= cfg.max_journal_size)


def compaction_step(cfg: QueueConfig, *, size: int, archived: int, length: int,
                    data_bytes: int, allow_rewrites: bool,
                    packing: bool) -> Compaction | None:
    """
    Kestrel's C{checkRotateJournal}: what a queue does to its journal now.

    @param size: bytes in the current journal file.
    @param archived: bytes in the rotated files.
    @param length: items in the queue (memory and read-behind).
    @param data_bytes: payload bytes in the queue.
    @param allow_rewrites: false while rewrites pause (L{Pause}).
    @param packing: a pack is being written: no rewrite starts now.
    @return: the step, or C{None} when nothing is to be done.
    """
    if within_limits(cfg, size, archived):
        return None
    aggressive = not cfg.disable_aggressive_rewrites
    rewrites = not packing
    # (an empty queue's journal: the current file under the aggressive
    # policy, which never pauses; every file under the other, as Kestrel's
    # one rewritten file still holds the open reads that our pack holds)
    if (rewrites and (aggressive or allow_rewrites) and length == 0
            and (size if aggressive else size + archived) >= cfg.default_journal_size):
        return Compaction(rewrite=True,
                          pause=Pause.NEVER if aggressive else Pause.IF_STILL_LARGE)
    if (rewrites and allow_rewrites and size + archived > cfg.max_journal_size
            and data_bytes < cfg.max_memory_size):
        return Compaction(rewrite=True, pause=Pause.ALWAYS)
    if size > cfg.max_memory_size:
        return Compaction(rewrite=rewrites and not aggressive and length == 0, rotate=True)
    return None


def rewrite_pauses(cfg: QueueConfig, pause: Pause, kept: int) -> bool:
    """
    Whether rewrites pause for C{min_journal_compact_delay} after a rewrite
    of step C{pause} whose journal then holds C{kept} bytes (SAVE_XID, the
    open reads and the queued items: L{kestrel.journal.pack.compact_size}).

    C{IF_STILL_LARGE} pauses when C{kept} is at least half of
    C{default_journal_size}: the rewrite could not shrink the journal much,
    so another one soon would not either. Nothing pauses without a delay.
    """
    if pause is Pause.NEVER or cfg.min_journal_compact_delay is None:
        return False
    return pause is Pause.ALWAYS or kept >= cfg.default_journal_size // 2


def rotation_checkpoint(cfg: QueueConfig, size: int, archived: int) -> bool:
    """Whether a rotation sets a checkpoint: the files together exceed C{max_journal_size}."""
    return size + archived > cfg.max_journal_size


class CompactionHost(Protocol):
    """What a L{Compactor} reads of its queue."""

    name: str
    journal: IJournal
    observer: QueueObserver | None
    length: int
    bytes: int

    @property
    def config(self) -> QueueConfig:
        """The queue's settings now."""
        ...

    @property
    def xid_counter(self) -> int:
        """The last xid handed out (a rewrite saves it)."""
        ...

    @property
    def compacts(self) -> bool:
        """Whether the journal may be compacted now (its writes work)."""
        ...

    @property
    def unsynced_count(self) -> int:
        """How many items memory holds unseen until their fsync (L{kestrel.unsynced})."""
        ...

    def open_items(self) -> list[QItem]:
        """The open reads' items, most recently opened first."""
        ...

    def memory_items(self) -> Sequence[QItem]:
        """The queued items held in memory, head first."""
        ...


class Compactor:
    """
    Rewrites and rotates one queue's journal when L{compaction_step} says so.

    Promises: never a rewrite while some items are only on disk (it would
    lose them) or wait unseen for their fsync (it would keep them), never
    a rotation or rewrite inside another or while the journal's own
    maintenance runs in a thread, and a rewrite or rotation
    that fails (a full disk, say) leaves the files as they were: it is
    logged and tried again on a later operation. C{rewrites} and
    C{rotations} count what was done.
    """

    _log = Logger()

    def __init__(self, host: CompactionHost, clock: IReactorTime) -> None:
        self._host = host
        self._clock = clock
        self._allow_rewrites = True
        self._pause_timer: IDelayedCall | None = None
        self._running = False
        #: Journal rewrites done (Kestrel's C{journal_rewrites}).
        self.rewrites = 0
        #: Journal rotations done (Kestrel's C{journal_rotations}).
        self.rotations = 0
        #: A rewrite was skipped for items waiting unseen for their fsync.
        self.rewrite_owed = False

    def check(self) -> None:
        """Compact the journal if it outgrew a limit (Kestrel's C{checkRotateJournal})."""
        host = self._host
        journal = host.journal
        cfg = host.config
        size = journal.size
        total = size + journal.archived_size
        # (within_limits, inlined: the common case, checked first: it runs per operation)
        if size <= cfg.max_memory_size and total <= cfg.max_journal_size and (
                (total if cfg.disable_aggressive_rewrites else size) < cfg.default_journal_size
                or host.length):
            # (within every limit; or past default_journal_size only, with
            # items queued: compaction_step would find nothing to do either)
            return
        if not host.compacts or self._running or journal.maintaining:
            # (an acknowledgement fired by a rotation or rewrite in progress
            # led here, or a rotation's fsyncs still run in a thread: that
            # one finishes first; the next operation checks again)
            return
        step = compaction_step(cfg, size=journal.size, archived=journal.archived_size,
                               length=host.length, data_bytes=host.bytes,
                               allow_rewrites=self._allow_rewrites, packing=journal.packing)
        if step is None:
            return
        self._running = True
        try:
            self._carry_out(step)
        except OSError as e:
            self._log.error("Journal maintenance of {queue} failed: {error}; the journal "
                            "stays as it was", queue=host.name, error=reason_of(e))
        finally:
            self._running = False

    def _carry_out(self, step: Compaction) -> None:
        """A rewrite (and its pause), then a rotation if the file is still large."""
        host = self._host
        cfg = host.config
        journal = host.journal
        if step.rewrite and host.unsynced_count:
            # Items wait unseen for their fsync: a rewrite holding them would
            # keep them even if it failed. The queue asks again once they are
            # shown (no rotation meanwhile: the rewrite is what is due).
            self.rewrite_owed = True
            return
        if step.rewrite:
            if step.pause is Pause.ALWAYS:
                self._log.info("Rewriting journal of {queue} ({bytes} bytes queued)",
                               queue=host.name, bytes=host.bytes)
            # (what the rewrite keeps, counted before it: a rewrite through
            # a pack writes the pack in a thread, and the files only shrink
            # once it is in place)
            kept = compact_size(host.open_items(), host.length, host.bytes)
            self.rewrite()
            if rewrite_pauses(cfg, step.pause, kept):
                self._pause_rewrites(cfg.min_journal_compact_delay)
        if step.rotate and journal.size > cfg.max_memory_size:
            self._log.info("Rotating journal of {queue}", queue=host.name)
            self._rotate(rotation_checkpoint(cfg, journal.size, journal.archived_size))

    def rewrite(self) -> None:
        """Rewrite the journal from memory (the open reads and the queued items)."""
        host = self._host
        items = host.memory_items()
        if host.unsynced_count:
            self.rewrite_owed = True  # (as in _carry_out)
            return
        if len(items) != host.length:
            # Some items are only on disk (read-behind): a rewrite from memory would lose them.
            self._log.warn("Not rewriting journal of {queue}: {missing} items are not in memory",
                           queue=host.name, missing=host.length - len(items))
            return
        observer = host.observer
        started = self._clock.seconds() if observer is not None else 0.0
        host.journal.rewrite(host.open_items(), list(items), xid_counter=host.xid_counter)
        self.rewrites += 1
        if observer is not None:
            observer.journal_rewritten(self._clock.seconds() - started)

    def _rotate(self, set_checkpoint: bool) -> None:
        host = self._host
        observer = host.observer
        started = self._clock.seconds() if observer is not None else 0.0
        host.journal.rotate(host.open_items(), set_checkpoint)
        self.rotations += 1
        if observer is not None:
            observer.journal_rotated(self._clock.seconds() - started)

    def _pause_rewrites(self, delay: float | None) -> None:
        if delay is None:  # (rewrite_pauses said no)
            return
        self._allow_rewrites = False
        self.close()
        self._pause_timer = self._clock.callLater(delay, self._resume_rewrites)

    def _resume_rewrites(self) -> None:
        self._pause_timer = None
        self._allow_rewrites = True

    def close(self) -> None:
        """Stop the pause timer (the queue closes)."""
        timer, self._pause_timer = self._pause_timer, None
        if timer is not None and timer.active():
            timer.cancel()
