"""aiomcache (asyncio) against a real server, operation by operation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiomcache
import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess


class AiomcacheAdapter(MemcacheAdapter):
    """
    aiomcache's C{Client} with a pool of one connection, driven on an event
    loop of its own: an open read belongs to the connection that opened it,
    and with a larger pool the /close may go out on another connection.
    """

    name = "aiomcache"
    unsupported = {"flush": "no way to send a command the client does not know"}
    flush = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.loop = asyncio.new_event_loop()
        self.client = aiomcache.Client(servers[0].host, servers[0].memcache_port, pool_size=1)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def fetch(self, key: str) -> bytes | None:
        return self.run(self.client.get(key.encode()))

    def set(self, queue: str, data: bytes) -> None:
        assert self.run(self.client.set(queue.encode(), data)) is True

    def stats(self, queue: str) -> int:
        return int(self.run(self.client.stats())[f"queue_{queue}_items".encode()])

    def delete(self, queue: str) -> None:
        assert self.run(self.client.delete(queue.encode())) is True

    def flush_all(self) -> None:
        self.run(self.client.flush_all())

    def version(self) -> str:
        return bytes(self.run(self.client.version())).decode()

    def shutdown(self) -> None:
        self.run(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[AiomcacheAdapter]:
    adapter = AiomcacheAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(AiomcacheAdapter))
def test_aiomcache(client: AiomcacheAdapter, op: str) -> None:
    """Each matrix operation through aiomcache, checked on the server's counters."""
    run_operation(client, op, "aio")
