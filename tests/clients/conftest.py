"""
Client-matrix fixtures: real server processes (memcache and thrift
listeners) shared by one test module, started as the wire tests start them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.wire.conftest import KestrelProcess, kestrel_factory  # noqa: F401 - a fixture

#: Every server of the matrix allows this many open reads per queue and connection.
MAX_OPEN_TRANSACTIONS = 10


@pytest.fixture(scope="module")
def start_servers(kestrel_factory: Callable[..., KestrelProcess]  # noqa: F811 - imported fixture
                  ) -> Callable[..., list[KestrelProcess]]:
    """Start C{n} servers (memcache and thrift listeners); all stop at the end of the module."""

    def start(n: int = 1, **config: Any) -> list[KestrelProcess]:
        return [kestrel_factory(("memcache", "thrift"),
                                {"max_open_transactions": MAX_OPEN_TRANSACTIONS, **config})
                for _ in range(n)]

    return start


@pytest.fixture(scope="module")
def server(start_servers: Callable[..., list[KestrelProcess]]) -> KestrelProcess:
    """One server for the module."""
    return start_servers(1)[0]
