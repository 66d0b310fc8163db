"""kestrel-analyze without the [analytics] extra says so in one line instead of a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _analyze(*args: str, hide: str = "") -> subprocess.CompletedProcess[str]:
    """Run kestrel-analyze ARGS in a Python where the module C{hide} cannot be imported."""
    code = (f"import sys\nif {hide!r}: sys.modules[{hide!r}] = None\n"
            "from kestrel.analytics.cli import main\nsys.exit(main())")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("module", ["numpy", "pyspark"])
def test_missing_extra_is_one_line(module: str, tmp_path: Path) -> None:
    """A missing analytics dependency: one stderr line naming it and the fix; status 1."""
    result = _analyze(str(tmp_path), "--out", str(tmp_path / "out"), hide=module)
    assert result.returncode == 1
    assert result.stderr == (f"kestrel-analyze: the analytics extra is not installed "
                             f"(missing: {module}); pip install 'txkestrel[analytics]'\n")


def test_help_works_without_the_extra() -> None:
    """--help needs none of the analytics dependencies."""
    result = _analyze("--help", hide="pyspark")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: kestrel-analyze ")
