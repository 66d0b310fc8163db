"""python-memcached against a real server, operation by operation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.clients.shadowed import python_memcached as memcache
from tests.wire.conftest import KestrelProcess

#: Socket timeout (s): python-memcached's default is 3 s, shorter than a long /t= wait;
#: a get cut short by it marks the server dead and returns None for an item already taken.
SOCKET_TIMEOUT = 10


class PythonMemcachedAdapter(MemcacheAdapter):
    """python-memcached's C{Client} with a socket timeout longer than every /t=."""

    name = "python-memcached"
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call (get_stats() shows the server's version)",
    }
    flush = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.client = memcache.Client([servers[0].address()], socket_timeout=SOCKET_TIMEOUT,
                                      dead_retry=0)

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(queue, data)

    def stats(self, queue: str) -> int:
        [(_, stats)] = self.client.get_stats()
        return int(stats[f"queue_{queue}_items"])

    def delete(self, queue: str) -> None:
        assert self.client.delete(queue) == 1

    def flush_all(self) -> None:
        self.client.flush_all()

    def shutdown(self) -> None:
        self.client.disconnect_all()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[PythonMemcachedAdapter]:
    adapter = PythonMemcachedAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(PythonMemcachedAdapter))
def test_python_memcached(client: PythonMemcachedAdapter, op: str) -> None:
    """Each matrix operation through python-memcached, checked on the server's counters."""
    run_operation(client, op, "pm")
