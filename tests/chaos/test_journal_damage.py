"""
Replay of a real multi-file journal (rotations, a pack, open reads) cut or
bit-flipped at every byte offset of every file (L{tests.chaos.journal_damage}).
"""

from __future__ import annotations

import pytest

from kestrel.journal import records as rec
from tests.chaos.journal_damage import Case, run


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Case], dict[str, set[int]]]:
    work = tmp_path_factory.mktemp("damage")
    all_cases = run(work)
    boundaries = {}
    for path in (work / "journal").iterdir():
        data = path.read_bytes()
        decoded = rec.decode_prefix(data)
        assert decoded.problem is None
        boundaries[path.name] = {*decoded.offsets, len(data)}
    return all_cases, boundaries


def test_every_offset_of_every_file_was_replayed(cases) -> None:
    """The journal has rotated files and the current one; each byte was cut and flipped."""
    all_cases, boundaries = cases
    assert len(boundaries) >= 4 and "q" in boundaries
    assert len(all_cases) == 2 * sum(max(b) for b in boundaries.values())


def test_a_cut_inside_a_record_logs_exactly_one_warning(cases) -> None:
    """A cut between records is a shorter journal; one inside a record is one warning."""
    all_cases, boundaries = cases
    for case in all_cases:
        if case.how == "cut":
            expected = 0 if case.offset in boundaries[case.file] else 1
            assert case.warnings == expected, case


def test_detected_damage_in_a_rotated_file_never_brings_a_consumed_item_back(cases) -> None:
    """What replay keeps after damage in a rotated file is a subset of the live items."""
    all_cases, _ = cases
    detected = [c for c in all_cases if c.file != "q" and c.warnings]
    assert detected
    assert [c for c in detected if c.resurrected] == []
