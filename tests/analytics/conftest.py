"""
Fixtures for the analytics tests: one Spark session for the whole test run.

Spark tests (marked C{spark}) are skipped with a reason when pyspark, pyarrow
or Java is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator

import pytest


def _missing() -> str | None:
    for module in ("pyspark", "pyarrow", "pandas", "numpy"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not importable (pip install '.[analytics]')"
    if shutil.which("java") is None:
        return "java is not on PATH (Spark needs Java 17 or 21)"
    return None


MISSING = _missing()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The one local Spark session of the test run (2 cores, no UI, loopback only)."""
    if MISSING:
        pytest.skip(MISSING)
    from kestrel.analytics.cli import make_session

    session = make_session("local[2]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g",
    }, app_name="kestrel-analyze-tests")
    yield session
    session.stop()
