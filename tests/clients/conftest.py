"""
Client-matrix fixtures: real server processes (memcache and thrift
listeners) shared by one test module, started as the wire tests start them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.wire.conftest import KestrelProcess

#: Every server of the matrix allows this many open reads per queue and connection.
MAX_OPEN_TRANSACTIONS = 10


@pytest.fixture(scope="module")
def start_servers(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[[int], list[KestrelProcess]]]:
    """Start C{n} servers (memcache and thrift listeners); all stop at the end of the module."""
    made: list[KestrelProcess] = []

    def start(n: int = 1, **config: Any) -> list[KestrelProcess]:
        servers = []
        for _ in range(n):
            server = KestrelProcess(tmp_path_factory.mktemp("kestrel"), ("memcache", "thrift"),
                                    {"max_open_transactions": MAX_OPEN_TRANSACTIONS, **config})
            made.append(server)
            server.start()
            servers.append(server)
        return servers

    yield start
    for server in made:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture(scope="module")
def server(start_servers: Callable[..., list[KestrelProcess]]) -> KestrelProcess:
    """One server for the module."""
    return start_servers(1)[0]
