"""
The short run of the crash and fault harness (what CI runs): two kill -9
cycles per variant, every variant but the full disk (which mounts a tmpfs and
runs with C{python -m tests.chaos --full-disk}; see docs/reliability.md).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from tests.chaos.harness import DEFAULT_VARIANTS, VARIANTS, failures, run_variant

CYCLES = int(os.environ.get("KESTREL_CHAOS_CYCLES", "2"))


@pytest.mark.parametrize("name", DEFAULT_VARIANTS)
def test_nothing_acknowledged_is_lost_across_kills(name: str, tmp_path: Path) -> None:
    """Every acknowledged item comes back, at most once more per crash; none reappears."""
    verdict = run_variant(VARIANTS[name], CYCLES, tmp_path, seed=zlib.crc32(name.encode()),
                          progress=lambda line: None, load_seconds=(0.5, 1.5))
    assert verdict["acknowledged"] > 0, verdict
    assert verdict["vanish_items"] > 0, verdict
    assert failures(verdict) == [], verdict
