"""emcache (asyncio) against a real server, operation by operation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import emcache
import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: emcache's per-operation timeout (s); its default of 1 s is shorter than a long /t= wait.
TIMEOUT = 10.0


class EmcacheAdapter(MemcacheAdapter):
    """
    emcache's client with one connection per server that is never purged (an
    open read belongs to the connection that opened it, and goes back to the
    queue when that connection closes) and a long operation timeout, driven on
    an event loop of its own.
    """

    name = "emcache"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.loop = asyncio.new_event_loop()
        address = emcache.MemcachedHostAddress(servers[0].host, servers[0].memcache_port)
        self.client = self.run(emcache.create_client([address], timeout=TIMEOUT,
                                                       max_connections=1,
                                                       purge_unused_connections_after=None))
        [self.node] = self.client.cluster_managment().nodes()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def fetch(self, key: str) -> bytes | None:
        item = self.run(self.client.get(key.encode()))
        return None if item is None else item.value

    def set(self, queue: str, data: bytes) -> None:
        self.run(self.client.set(queue.encode(), data))  # raises unless STORED

    def stats(self, queue: str) -> int:
        return int(self.run(self.client.stats(self.node))[f"queue_{queue}_items"])

    def delete(self, queue: str) -> None:
        self.run(self.client.delete(queue.encode()))  # raises unless DELETED or NOT_FOUND

    def flush_all(self) -> None:
        self.run(self.client.flush_all(self.node))

    def version(self) -> str:
        return self.run(self.client.version(self.node))

    def shutdown(self) -> None:
        self.run(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[EmcacheAdapter]:
    adapter = EmcacheAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(EmcacheAdapter))
def test_emcache(client: EmcacheAdapter, op: str) -> None:
    """Each matrix operation through emcache, checked on the server's counters."""
    run_operation(client, op, "em")
