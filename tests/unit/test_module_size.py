"""No module of kestrel/ is longer than 700 lines (one module, one idea)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 700


def line_counts() -> dict[str, int]:
    """Lines of every Python module of kestrel/, by path relative to the repository."""
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
            for p in sorted((ROOT / "kestrel").rglob("*.py"))}


def test_no_module_over_the_limit() -> None:
    """Every module of kestrel/ has at most LIMIT lines."""
    assert {path: n for path, n in line_counts().items() if n > LIMIT} == {}
