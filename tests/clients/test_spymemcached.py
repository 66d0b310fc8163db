"""
Java's spymemcached (Debian's libspymemcached-java, compiled with Debian's
default-jdk-headless) against a real server, with its text and its binary
connection factories.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, DriverError, require, require_file
from tests.clients.matrix import LONG_WAIT_MS, Check, counters, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

JAR = Path("/usr/share/java/spymemcached.jar")


class SpymemcachedAdapter(DriverAdapter):
    """C{MemcachedClient}, text protocol, operation timeout longer than every /t=."""

    name = "Java spymemcached"
    mode = "text"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def argv(self, workdir: Path) -> list[str]:
        javac = require("javac", "default-jdk-headless")
        java = require("java", "default-jdk-headless")
        require_file(JAR, "libspymemcached-java")
        classes = workdir / "classes"
        if not (classes / "Driver.class").exists():
            done = subprocess.run([javac, "-cp", str(JAR), "-d", str(classes),
                                   str(HERE / "java" / "Driver.java")],
                                  capture_output=True, timeout=300, check=False)
            assert done.returncode == 0, done.stderr.decode()
        return [java, "-cp", f"{JAR}:{classes}", "Driver", self.mode]


class SpymemcachedBinaryAdapter(SpymemcachedAdapter):
    """The same client with C{ConnectionFactoryBuilder.Protocol.BINARY}."""

    name = "Java spymemcached (binary protocol)"
    mode = "binary"


class SpymemcachedDefaultTimeoutAdapter(SpymemcachedAdapter):
    """The text client with its default operation timeout (2.5 s)."""

    name = "Java spymemcached (default timeout)"
    mode = "text+default-timeout"


@pytest.fixture(scope="module", params=[SpymemcachedAdapter, SpymemcachedBinaryAdapter],
                ids=["text", "binary"])
def client(request: pytest.FixtureRequest, server: KestrelProcess,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpymemcachedAdapter]:
    adapter = request.param([server], tmp_path_factory.mktemp("java"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(SpymemcachedAdapter))
def test_spymemcached(client: SpymemcachedAdapter, op: str) -> None:
    """Each matrix operation through spymemcached, checked on the server's counters."""
    run_operation(client, op, f"spy_{client.mode}")


def test_default_timeout_loses_a_late_item(server: KestrelProcess,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """
    With its default 2.5 s operation timeout, spymemcached gives up on a
    C{get q/t=5000} and keeps the connection; the server answers the wait
    when an item arrives, on that connection, and the client drops the
    reply: the item has left the queue and reached no one. docs/clients.md
    says to raise the timeout above the longest /t= wait.
    """
    adapter = SpymemcachedDefaultTimeoutAdapter([server], tmp_path_factory.mktemp("java"))
    try:
        q = Check(adapter, "spy_default_timeout")
        late = threading.Timer(3.5, q.seed, (b"late",))
        late.start()
        try:
            with pytest.raises(DriverError, match="Timeout"):
                adapter.blocking_get(q.queue, LONG_WAIT_MS)
        finally:
            late.join()
        deadline = time.monotonic() + 10
        while counters(server, q.queue) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        q.expect(0)
        assert adapter.get(q.queue) is None
    finally:
        adapter.shutdown()
