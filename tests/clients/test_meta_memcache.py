"""
meta-memcache (memcached's meta commands: ms, mg, md) against a real server,
operation by operation.

Kestrel stores no client flags (every item reads back with flags 0), so the
client gets a serializer that keeps values as raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from meta_memcache import CacheClient, Key, ServerAddress, connection_pool_factory_builder
from meta_memcache.base.base_serializer import BaseSerializer, EncodedValue

from tests.clients.matrix import LONG_WAIT_MS, MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: Socket timeouts (s), longer than every /t= wait of the scenarios.
TIMEOUT = LONG_WAIT_MS / 1000 + 5


class RawBytes(BaseSerializer):
    """Values are bytes, stored and read as they are (flags 0)."""

    def serialize(self, key: Key, value: Any) -> EncodedValue:
        assert isinstance(value, bytes)
        return EncodedValue(data=value, encoding_id=0)

    def unserialize(self, data: Any, encoding_id: int) -> Any:
        return bytes(data)


class MetaMemcacheAdapter(MemcacheAdapter):
    """meta-memcache's C{CacheClient}: ms to set, mg to fetch, md to delete."""

    name = "meta-memcache"
    unsupported = {
        "stats": "no stats call (meta commands only)",
        "flush": "no way to send a command the client does not know",
        "flush_all": "no flush_all call (meta commands only)",
        "version": "no version call (meta commands only)",
    }
    stats = None
    flush = None
    flush_all = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        pool = connection_pool_factory_builder(connection_timeout=TIMEOUT, recv_timeout=TIMEOUT)
        address = ServerAddress(host=servers[0].host, port=servers[0].memcache_port)
        self.client = CacheClient.cache_client_from_servers(
            servers=[address], connection_pool_factory_fn=pool, serializer=RawBytes())

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(Key(key))

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(Key(queue), data, ttl=0) is True

    def delete(self, queue: str) -> None:
        assert self.client.delete(Key(queue)) is True


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[MetaMemcacheAdapter]:
    adapter = MetaMemcacheAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(MetaMemcacheAdapter))
def test_meta_memcache(client: MetaMemcacheAdapter, op: str) -> None:
    """Each matrix operation through meta-memcache, checked on the server's counters."""
    run_operation(client, op, "meta")


def test_large_value_and_expiry(client: MetaMemcacheAdapter) -> None:
    """A 1 MB value goes through ms/mg whole; an expiry (T) is honoured by the server."""
    data = bytes(range(256)) * 4096
    client.set("meta_big", data)
    assert client.fetch("meta_big") == data
    assert client.client.set(Key("meta_ttl"), b"x", ttl=3600) is True
    assert client.fetch("meta_ttl") == b"x"
