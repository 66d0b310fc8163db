"""
Go's gomemcache (Debian's golang-github-bradfitz-gomemcache-dev, built with
Debian's golang-go, without modules) against a real server.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.driver import HERE, DriverAdapter, require, require_file
from tests.clients.matrix import operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: Where Debian installs Go libraries (a GOPATH).
GOPATH = Path("/usr/share/gocode")


class GomemcacheAdapter(DriverAdapter):
    """C{memcache.New} with C{Timeout} longer than every /t= (the default is 100 ms)."""

    name = "Go gomemcache"
    unsupported = {
        "stats": "no stats call",
        "version": "no version call",
        "flush": "no way to send a command the client does not know",
    }
    stats = None
    version = None
    flush = None

    def argv(self, workdir: Path) -> list[str]:
        go = require("go", "golang-go")
        require_file(GOPATH / "src/github.com/bradfitz/gomemcache/memcache",
                     "golang-github-bradfitz-gomemcache-dev")
        binary = workdir / "driver"
        env = dict(os.environ, GOPATH=str(GOPATH), GO111MODULE="off",
                   GOCACHE=str(workdir / "go-cache"), GOFLAGS="")
        done = subprocess.run([go, "build", "-o", str(binary), str(HERE / "go" / "driver.go")],
                              env=env, capture_output=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr.decode()
        return [str(binary)]


@pytest.fixture(scope="module")
def client(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[GomemcacheAdapter]:
    adapter = GomemcacheAdapter([server], tmp_path_factory.mktemp("go"))
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(GomemcacheAdapter))
def test_gomemcache(client: GomemcacheAdapter, op: str) -> None:
    """Each matrix operation through gomemcache, checked on the server's counters."""
    run_operation(client, op, "go")
