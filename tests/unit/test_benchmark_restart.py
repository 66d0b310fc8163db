"""
benchmarks/restart.py: a restart on a written journal, timed to the first
item served, on the interpreter asked for.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import restart
from tests.unit.test_benchmark_cost import _noting_python


def test_a_restart_serves_the_journal_written_on_the_interpreter_asked_for(
        tmp_path: Path) -> None:
    """
    One run starts the server on C{python} over a journal of 20 items and
    returns once it served the first; the journal is put back as written.
    """
    python, starts = _noting_python(tmp_path, "python")
    (tmp_path / "queues").mkdir()
    journal = tmp_path / "queues" / "restart"
    size = restart.write_journal(journal, 20, 100)
    written = journal.read_bytes()
    elapsed, cpu, rss, small_elapsed, loading, peeks, counted = restart.one_run(
        tmp_path, "restart", "128MiB", 60.0, python=python)
    assert 0 < elapsed < 60 and cpu > 0 and rss > 0
    assert math.isnan(small_elapsed) and loading == -1 and peeks == [] and counted == 0
    assert journal.read_bytes() == written and len(written) == size
    lines = starts.read_text().splitlines()
    assert len(lines) == 1 and "-m twisted --log-format=text kestrel --config" in lines[0]
