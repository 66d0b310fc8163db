"""python-binary-memcached (C{bmemcached}; binary protocol) against a real server."""

from __future__ import annotations

from collections.abc import Iterator

import bmemcached
import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: Socket timeout (s): the default is 3 s, shorter than a long /t= wait.
SOCKET_TIMEOUT = 10


class BmemcachedAdapter(MemcacheAdapter):
    """
    C{bmemcached.Client} on one server, C{raw_data=True} (a queue keeps no
    flags), socket timeout longer than every /t=.
    """

    name = "python-binary-memcached (binary protocol)"
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call (stats() shows the server's version)",
    }
    flush = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.address = servers[0].address()
        self.client = bmemcached.Client([self.address], socket_timeout=SOCKET_TIMEOUT,
                                        raw_data=True)

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(queue, data) is True

    def stats(self, queue: str) -> int:
        return int(self.client.stats()[self.address][f"queue_{queue}_items"])

    def delete(self, queue: str) -> None:
        assert self.client.delete(queue) is True

    def flush_all(self) -> None:
        assert self.client.flush_all() is True

    def shutdown(self) -> None:
        self.client.disconnect_all()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[BmemcachedAdapter]:
    adapter = BmemcachedAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(BmemcachedAdapter))
def test_bmemcached(client: BmemcachedAdapter, op: str) -> None:
    """Each matrix operation through python-binary-memcached, checked on the server's counters."""
    run_operation(client, op, "bmc")
