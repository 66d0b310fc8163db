"""
Fixtures for the fleet tests: real server processes publishing themselves in a
real ZooKeeper (the fixtures of C{tests/zookeeper/conftest.py}) with
C{advertise_host: 127.0.0.1}, and the global reactor running in a thread for
the client under test.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.threads import blockingCallFromThread

from tests.wire.conftest import KestrelProcess, LineClient, start_on_free_ports
from tests.zookeeper.conftest import (  # noqa: F401 - fixtures used by this directory
    ZooKeeperServer,
    observer,
    running_reactor,
    zookeeper,
)

PREFIX = "/fleet"


def fleet_config(zk: ZooKeeperServer, prefix: str = PREFIX, **extra: Any) -> dict[str, Any]:
    """The config of a fleet member: ZooKeeper publishing of 127.0.0.1 as given."""
    return {"zookeeper": {"host": "127.0.0.1", "port": zk.port, "path_prefix": prefix,
                          "session_timeout": "2s", "advertise_host": "127.0.0.1"},
            **extra}


@pytest.fixture
def fleet_factory(zookeeper: ZooKeeperServer, tmp_path: Path  # noqa: F811 - the imported fixture
                  ) -> Iterator[Callable[..., KestrelProcess]]:
    """Start fleet members (`fleet_factory(protocols, **extra_config)`); all stop at the end."""
    made: list[KestrelProcess] = []

    def make(protocols: tuple[str, ...] = ("memcache",), **extra: Any) -> KestrelProcess:
        server = KestrelProcess(tmp_path / f"k{len(made)}", protocols,
                                config=fleet_config(zookeeper, **extra))
        made.append(server)
        start_on_free_ports(server)
        return server

    yield make
    for server in made:
        with contextlib.suppress(Exception):
            server.stop()


def set_status(server: KestrelProcess, status: str) -> None:
    """Change a server's status with the memcache C{status} command."""
    client = LineClient(server.connect())
    client.send(f"status {status}\r\n".encode())
    assert client.line() == b"END\r\n"
    client.close()


def on_reactor(reactor: Any, f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run C{f} on the reactor thread and wait for its (Deferred) result."""
    return blockingCallFromThread(reactor, f, *args, **kwargs)


def eventually(check: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Wait (polling) until C{check()} holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not reached in {timeout}s: {what}"
        time.sleep(0.05)
