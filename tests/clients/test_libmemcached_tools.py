"""
libmemcached's command-line tools (Debian's libmemcached-tools) against a
real server: memccp, memccat, memcrm, memcstat, memcping, memcflush.

Each tool run is a connection of its own, so an open read cannot outlive
the run that opened it: reliable reads are out of the tools' reach.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

TOOLS = ("memccp", "memccat", "memcrm", "memcstat", "memcping", "memcflush")
_ONE_CONNECTION = "each tool run is a connection of its own: an open read goes back to the " \
                  "queue when the tool exits"


class LibmemcachedToolsAdapter(MemcacheAdapter):
    """The tools, each run with C{--servers=<host:port>}."""

    name = "libmemcached tools"
    unsupported = {
        "open": _ONE_CONNECTION,
        "close": _ONE_CONNECTION,
        "close_open": _ONE_CONNECTION,
        "abort": _ONE_CONNECTION,
        "flush": "no tool sends a command libmemcached does not know",
    }
    open = None
    close = None
    close_open = None
    abort = None
    flush = None

    def __init__(self, servers: list[KestrelProcess], folder: Path) -> None:
        super().__init__(servers)
        self.folder = folder
        self.servers_option = f"--servers={servers[0].address()}"

    def tool(self, name: str, *args: str, ok: tuple[int, ...] = (0,)) -> str:
        """Run a tool; return what it printed (its exit status must be in C{ok})."""
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed (Debian package libmemcached-tools)")
        done = subprocess.run([found, self.servers_option, *args], capture_output=True,
                              timeout=30, check=False)
        assert done.returncode in ok, (name, args, done.returncode, done.stderr)
        return (done.stdout + done.stderr).decode("latin-1")

    def fetch(self, key: str) -> bytes | None:
        found = shutil.which("memccat")
        if found is None:
            pytest.skip("memccat is not installed (Debian package libmemcached-tools)")
        done = subprocess.run([found, self.servers_option, key], capture_output=True,
                              timeout=30, check=False)
        if done.returncode != 0:  # memccat exits with 1 for a key it did not find
            assert b"NOT FOUND" in done.stderr.upper() or not done.stdout, done.stderr
            return None
        assert done.stdout.endswith(b"\n")  # memccat ends the value with a newline
        return done.stdout[:-1]

    def set(self, queue: str, data: bytes) -> None:
        # memccp stores a file under its name
        path = self.folder / queue
        path.write_bytes(data)
        self.tool("memccp", str(path))

    def stats(self, queue: str) -> int:
        for line in self.tool("memcstat").splitlines():
            name, _, value = line.strip().partition(": ")
            if name == f"queue_{queue}_items":
                return int(value)
        raise AssertionError(f"memcstat shows no queue_{queue}_items")

    def delete(self, queue: str) -> None:
        self.tool("memcrm", queue)

    def flush_all(self) -> None:
        self.tool("memcflush")

    def version(self) -> str:
        self.tool("memcping")
        # memcstat --server-version prints "<host>:<port> <version>" (on stderr)
        [line] = self.tool("memcstat", "--server-version").splitlines()
        address, version = line.split()
        assert address == self.servers_option.partition("=")[2]
        return version


@pytest.fixture(scope="module")
def tools(server: KestrelProcess, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LibmemcachedToolsAdapter]:
    yield LibmemcachedToolsAdapter([server], tmp_path_factory.mktemp("memccp"))


@pytest.mark.parametrize("op", operation_params(LibmemcachedToolsAdapter))
def test_libmemcached_tools(tools: LibmemcachedToolsAdapter, op: str) -> None:
    """Each matrix operation through the tools, checked on the server's counters."""
    run_operation(tools, op, "tools")


def test_open_read_of_a_tool_goes_back(tools: LibmemcachedToolsAdapter,
                                       server: KestrelProcess) -> None:
    """`memccat q/open` shows the head item, which the server returns when the tool exits."""
    from tests.clients.matrix import Check

    q = Check(tools, "tools_open_back")
    q.seed(b"one", b"two")
    assert tools.fetch(f"{q.queue}/open") == b"one"
    assert tools.fetch(f"{q.queue}/t=2000") == b"one"
    q.expect(1)


def test_binary_protocol(tools: LibmemcachedToolsAdapter) -> None:
    """`memccat --binary` reads an item over the binary protocol (a binary Get dequeues)."""
    from tests.clients.matrix import Check

    q = Check(tools, "tools_binary")
    q.seed(b"one", b"two")
    assert tools.tool("memccat", "--binary", q.queue) == "one\n"
    q.expect(1)
