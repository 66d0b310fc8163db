"""
Shared test configuration: hypothesis profiles and basic fixtures.

Set KESTREL_HYPOTHESIS_PROFILE=ci (as .ci/run does) for derandomized runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from twisted.internet.task import Clock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kestrel.reactor import install_unless_chosen  # noqa: E402

# In-process tests that use the global reactor run on the server's own
# (kestrel/reactor.py), as `twistd kestrel` does.
install_unless_chosen()

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("KESTREL_HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def clock() -> Clock:
    """A fake clock that starts at a realistic epoch time (2026-01-01)."""
    c = Clock()
    c.advance(1_767_225_600.0)
    return c


#: The module of Twisted's reactor-builder tests, which must run before anything
#: starts the global reactor (see L{pytest_collection_modifyitems}).
REACTOR_BUILDER_TESTS = "tests.unit.test_reactor"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """
    Run Twisted's reactor-builder tests (L{REACTOR_BUILDER_TESTS}) first.

    Each of them points the global reactor at a fresh one by swapping its
    C{__dict__} (C{twisted.internet.test.reactormixins.buildReactor}). A
    global reactor already running in a thread (the blocking fleet client's,
    the ZooKeeper fixtures') would go on running on the fresh reactor's state,
    stop with it, and leave every later test that needs it without one.
    """
    def builder(item: pytest.Item) -> bool:
        module = getattr(item, "module", None)
        return module is not None and module.__name__ == REACTOR_BUILDER_TESTS

    first = [item for item in items if builder(item)]
    if first:
        items[:] = first + [item for item in items if not builder(item)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """
    With KESTREL_REQUIRE_ALL=1 (as .ci/run sets), a skipped test fails the run.

    Tests skip when a real component is missing (ZooKeeper, Java for Spark,
    Debian's thrift compiler); in CI that means an install step is broken,
    which must not pass silently.
    """
    if not os.environ.get("KESTREL_REQUIRE_ALL") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(
            f"KESTREL_REQUIRE_ALL: {len(skipped)} test(s) skipped; every component must be "
            "installed here", red=True)
        session.exitstatus = 1
