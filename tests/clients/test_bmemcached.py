"""python-binary-memcached (memcache's binary protocol) against a real server."""

from __future__ import annotations

from collections.abc import Iterator

import bmemcached
import pytest

from tests.clients.matrix import (
    LONG_WAIT_MS,
    LibraryClientAdapter,
    operation_params,
    run_operation,
)
from tests.wire.conftest import KestrelProcess

#: Socket timeout (s), longer than every /t= wait of the scenarios.
TIMEOUT = LONG_WAIT_MS / 1000 + 5


class BmemcachedAdapter(LibraryClientAdapter):
    """
    bmemcached's C{Client}: binary Get, Set, Delete, Flush, Stat; raw data,
    since Kestrel keeps no client flags.
    """

    name = "python-binary-memcached"
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call",
    }
    flush = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.client = bmemcached.Client([servers[0].address()], socket_timeout=TIMEOUT,
                                        raw_data=True)

    def stats(self, queue: str) -> int:
        [stats] = self.client.stats().values()
        return int(stats[f"queue_{queue}_items"])


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[BmemcachedAdapter]:
    adapter = BmemcachedAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(BmemcachedAdapter))
def test_bmemcached(client: BmemcachedAdapter, op: str) -> None:
    """Each matrix operation through python-binary-memcached, checked on the server's counters."""
    run_operation(client, op, "bmc")
