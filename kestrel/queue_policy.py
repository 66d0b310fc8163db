"""
When a queue compacts its journal: Kestrel's rotate/rewrite rules as one pure function.

A queue asks L{compaction_step} after each add and remove, with the sizes
of its journal and of its contents; the answer says whether to rewrite the
journal from memory, whether rewrites then pause for
C{min_journal_compact_delay}, and whether to rotate. Nothing here touches a
file or a clock: C{tests/unit/test_queue_policy.py} checks the rules as a table.

Kestrel has two policies. The aggressive one (the default) rewrites an
empty queue whose journal reached C{default_journal_size}. The one of
C{disable_aggressive_rewrites} takes a break after rewriting an empty queue
whose journal stays large (KEST-366) and rewrites an empty queue before it
rotates. Their middle rule is the same: a journal over C{max_journal_size}
whose queue fits in memory is rewritten, then rewrites pause.
"""

from __future__ import annotations

import enum

import attrs

from kestrel.config import QueueConfig


class Pause(enum.Enum):
    """Whether rewrites pause for C{min_journal_compact_delay} after a rewrite."""

    NEVER = "never"
    ALWAYS = "always"
    #: Only if the rewritten journal is still at least half of C{default_journal_size}.
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
    return (size < cfg.default_journal_size and size <= cfg.max_memory_size
            and size + archived <= cfg.max_journal_size)


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
    if (rewrites and (aggressive or allow_rewrites)
            and size >= cfg.default_journal_size and length == 0):
        return Compaction(rewrite=True,
                          pause=Pause.NEVER if aggressive else Pause.IF_STILL_LARGE)
    if (rewrites and allow_rewrites and size + archived > cfg.max_journal_size
            and data_bytes < cfg.max_memory_size):
        return Compaction(rewrite=True, pause=Pause.ALWAYS)
    if size > cfg.max_memory_size:
        return Compaction(rewrite=rewrites and not aggressive and length == 0, rotate=True)
    return None


def rotation_checkpoint(cfg: QueueConfig, size: int, archived: int) -> bool:
    """Whether a rotation sets a checkpoint: the files together exceed C{max_journal_size}."""
    return size + archived > cfg.max_journal_size
