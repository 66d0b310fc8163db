"""
Kestrel's rotate/rewrite rules (L{kestrel.queue_policy.compaction_step}) as a table.

Limits in every row: C{default_journal_size} 100, C{max_memory_size} 200,
C{max_journal_size} 1000. Columns: the policy (aggressive, Kestrel's
default, or C{disable_aggressive_rewrites}), the current file's size, the
rotated files' size, the items and payload bytes queued, whether rewrites
are paused, whether a pack runs; then the expected step.
"""

from __future__ import annotations

import pytest

from kestrel.config import QueueConfig
from kestrel.queue_policy import Compaction, Pause, compaction_step, rotation_checkpoint

LIMITS = dict(default_journal_size=100, max_memory_size=200, max_journal_size=1000)

AGGRESSIVE = QueueConfig(**LIMITS)
GENTLE = QueueConfig(disable_aggressive_rewrites=True, **LIMITS)

REWRITE = Compaction(rewrite=True)
REWRITE_THEN_PAUSE = Compaction(rewrite=True, pause=Pause.ALWAYS)
REWRITE_PAUSE_IF_LARGE = Compaction(rewrite=True, pause=Pause.IF_STILL_LARGE)
ROTATE = Compaction(rotate=True)
REWRITE_THEN_ROTATE = Compaction(rewrite=True, rotate=True)

# (config, size, archived, length, bytes, rewrites allowed, packing) -> step
TABLE = [
    # within every limit: nothing
    (AGGRESSIVE, 99, 0, 0, 0, True, False, None),
    (AGGRESSIVE, 99, 901, 5, 50, True, False, None),
    # an empty queue whose file reached default_journal_size is rewritten ...
    (AGGRESSIVE, 100, 0, 0, 0, True, False, REWRITE),
    # ... even while rewrites pause, under the aggressive policy only
    (AGGRESSIVE, 100, 0, 0, 0, False, False, REWRITE),
    (GENTLE, 100, 0, 0, 0, True, False, REWRITE_PAUSE_IF_LARGE),
    (GENTLE, 100, 0, 0, 0, False, False, None),
    # not while a pack is written
    (AGGRESSIVE, 150, 0, 0, 0, True, True, None),
    # a queue with items, its file over default but within memory: nothing
    (AGGRESSIVE, 150, 0, 3, 30, True, False, None),
    # the files over max_journal_size while the queue fits in memory: rewrite, then pause
    (AGGRESSIVE, 150, 900, 3, 30, True, False, REWRITE_THEN_PAUSE),
    (GENTLE, 150, 900, 3, 30, True, False, REWRITE_THEN_PAUSE),
    # ... unless rewrites pause or a pack runs, or the queue does not fit in memory
    (AGGRESSIVE, 150, 900, 3, 30, False, False, None),
    (AGGRESSIVE, 150, 900, 3, 30, True, True, None),
    (AGGRESSIVE, 150, 900, 30, 300, True, False, None),
    # the current file over max_memory_size: rotate
    (AGGRESSIVE, 201, 0, 30, 300, True, False, ROTATE),
    (AGGRESSIVE, 201, 900, 30, 300, True, False, ROTATE),
    (GENTLE, 201, 0, 30, 300, True, False, ROTATE),
    # ... the gentle policy rewrites an empty queue first (the aggressive one did above)
    (GENTLE, 201, 0, 0, 0, False, False, REWRITE_THEN_ROTATE),
    (GENTLE, 201, 0, 0, 0, False, True, ROTATE),
    (AGGRESSIVE, 201, 0, 0, 0, True, True, ROTATE),
]


@pytest.mark.parametrize(("cfg", "size", "archived", "length", "data_bytes", "allow",
                          "packing", "expected"), TABLE)
def test_compaction_step(cfg: QueueConfig, size: int, archived: int, length: int,
                         data_bytes: int, allow: bool, packing: bool,
                         expected: Compaction | None) -> None:
    """Each row: what Kestrel's checkRotateJournal does in that state."""
    assert compaction_step(cfg, size=size, archived=archived, length=length,
                           data_bytes=data_bytes, allow_rewrites=allow,
                           packing=packing) == expected


@pytest.mark.parametrize(("size", "archived", "checkpoint"),
                         [(201, 0, False), (201, 799, False), (201, 800, True)])
def test_a_rotation_sets_a_checkpoint_past_max_journal_size(size: int, archived: int,
                                                           checkpoint: bool) -> None:
    """A rotation sets a checkpoint once the files together exceed max_journal_size."""
    assert rotation_checkpoint(AGGRESSIVE, size, archived) is checkpoint
