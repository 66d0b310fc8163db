"""
Kestrel's rotate/rewrite rules (L{kestrel.queue_policy.compaction_step}) as
a table, and the back-off after a rewrite (L{kestrel.queue_policy.rewrite_pauses})
as a table and properties.

Limits in every row: C{default_journal_size} 100, C{max_memory_size} 200,
C{max_journal_size} 1000. Columns: the policy (aggressive, Kestrel's
default, or C{disable_aggressive_rewrites}), the current file's size, the
rotated files' size, the items and payload bytes queued, whether rewrites
are paused, whether a pack runs; then the expected step.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.config import QueueConfig
from kestrel.queue_policy import (
    RECORD_MARGIN,
    Compaction,
    Pause,
    compaction_step,
    rewrite_pauses,
    rotation_checkpoint,
    upkeep_from,
)

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
    # the gentle policy counts the rotated files too (a rewrite's pack holds
    # the open reads that Kestrel's one rewritten file holds) ...
    (GENTLE, 20, 80, 0, 0, True, False, REWRITE_PAUSE_IF_LARGE),
    (GENTLE, 20, 79, 0, 0, True, False, None),
    (GENTLE, 20, 80, 0, 0, False, False, None),
    (GENTLE, 20, 80, 1, 10, True, False, None),
    # ... the aggressive one, which never pauses, only the current file
    (AGGRESSIVE, 20, 80, 0, 0, True, False, None),
    (AGGRESSIVE, 20, 900, 0, 0, False, False, None),
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


# (config, step's pause, bytes the rewrite kept) -> whether rewrites pause
PAUSES = [
    (AGGRESSIVE, Pause.NEVER, 10_000, False),
    (AGGRESSIVE, Pause.ALWAYS, 5, True),
    # half of default_journal_size (100) kept: the rewrite could not shrink it enough
    (GENTLE, Pause.IF_STILL_LARGE, 49, False),
    (GENTLE, Pause.IF_STILL_LARGE, 50, True),
    (GENTLE, Pause.IF_STILL_LARGE, 230, True),
    # without a delay nothing pauses (Kestrel's None: no limit)
    (attrs.evolve(GENTLE, min_journal_compact_delay=None), Pause.IF_STILL_LARGE, 230, False),
    (attrs.evolve(GENTLE, min_journal_compact_delay=None), Pause.ALWAYS, 5, False),
]


@pytest.mark.parametrize(("cfg", "pause", "kept", "expected"), PAUSES)
def test_rewrite_pauses(cfg: QueueConfig, pause: Pause, kept: int, expected: bool) -> None:
    """Each row: whether rewrites pause after a rewrite that kept that many bytes."""
    assert rewrite_pauses(cfg, pause, kept) is expected


HUGE = 1 << 40


@given(default=st.integers(1, 10_000), kept=st.integers(5, 30_000),
       written=st.integers(0, 30_000))
def test_gentle_rewrite_of_an_empty_queue_backs_off_or_is_not_repeated(
        default: int, kept: int, written: int) -> None:
    """
    Without aggressive rewrites, a rewrite of an empty queue that kept C{kept}
    bytes (its pack, C{archived}) either pauses rewrites or leaves a journal
    that is not rewritten again before another half of C{default_journal_size}
    is written; while rewrites pause, none happens however large the journal
    is; once they resume, a journal still at C{default_journal_size} is
    rewritten (Kestrel resumes on the delay alone).
    """
    cfg = QueueConfig(disable_aggressive_rewrites=True, default_journal_size=default,
                      max_memory_size=HUGE, max_journal_size=HUGE,
                      min_journal_compact_delay=10.0)
    step = compaction_step(cfg, size=0, archived=kept, length=0, data_bytes=0,
                           allow_rewrites=True, packing=False)
    paused = rewrite_pauses(cfg, Pause.IF_STILL_LARGE, kept)

    def next_step(allow: bool) -> Compaction | None:
        return compaction_step(cfg, size=written, archived=kept, length=0, data_bytes=0,
                               allow_rewrites=allow, packing=False)

    if paused:
        assert next_step(False) is None
    else:
        # the rewrite left less than half of default_journal_size
        assert step is None
        if 2 * written < default:
            assert next_step(True) is None
    resumed = next_step(True)
    assert (resumed is not None and resumed.rewrite) is (written + kept >= default)


@given(kept=st.integers(5, 30_000), written=st.integers(0, 30_000))
def test_aggressive_rewrite_never_pauses_and_counts_the_current_file(
        kept: int, written: int) -> None:
    """The aggressive policy rewrites an empty queue by its current file alone, never pausing."""
    cfg = QueueConfig(default_journal_size=100, max_memory_size=HUGE, max_journal_size=HUGE,
                      min_journal_compact_delay=10.0)
    step = compaction_step(cfg, size=written, archived=kept, length=0, data_bytes=0,
                           allow_rewrites=False, packing=False)
    assert (step is not None and step.rewrite) is (written >= 100)
    assert step is None or not rewrite_pauses(cfg, step.pause, kept)


@given(gentle=st.booleans(), size=st.integers(0, 3000), archived=st.integers(0, 3000),
       length=st.integers(0, 50), data_bytes=st.integers(0, 3000), allow=st.booleans(),
       packing=st.booleans())
def test_below_upkeep_from_no_step_is_skipped(gentle: bool, size: int, archived: int,
                                             length: int, data_bytes: int, allow: bool,
                                             packing: bool) -> None:
    """
    An operation may skip the compaction check only where it would find
    nothing: below C{upkeep_from} always; below the higher size for an add
    whenever the queue holds an item (an add checks before storing its own).
    """
    cfg = GENTLE if gentle else AGGRESSIVE
    step = compaction_step(cfg, size=size, archived=archived, length=length,
                           data_bytes=data_bytes, allow_rewrites=allow, packing=packing)
    if size + archived + RECORD_MARGIN < upkeep_from(cfg):
        assert step is None
    if length and size + archived + RECORD_MARGIN < upkeep_from(cfg, adding=True):
        assert step is None
    assert upkeep_from(cfg) == 100 and upkeep_from(cfg, adding=True) == 200
