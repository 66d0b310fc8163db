"""
PyPI's meta-memcache (meta protocol: C{ms}/C{mg}/C{md}) against a real
server, through its C{CacheClient} with a pool of one connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from meta_memcache import (
    BaseSerializer,
    CacheClient,
    Key,
    ServerAddress,
    connection_pool_factory_builder,
)
from meta_memcache.base.base_serializer import EncodedValue

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess

#: Socket timeouts (s): the default is 1 s, shorter than a long /t= wait.
TIMEOUT = 10.0
_NO_CALL = "no way to send a command the client does not know"


class BytesSerializer(BaseSerializer):
    """
    Items as the bytes they are: a queue keeps no client flags, so
    meta-memcache's default serializer would read every item back as C{str}.
    """

    def serialize(self, key: Key, value: Any) -> EncodedValue:
        assert isinstance(value, bytes)
        return EncodedValue(data=value, encoding_id=0)

    def unserialize(self, data: Any, encoding_id: int) -> bytes:
        return bytes(data)


class MetaMemcacheAdapter(MemcacheAdapter):
    """C{CacheClient.cache_client_from_servers}, one connection, 10 s timeouts."""

    name = "meta-memcache (meta protocol)"
    unsupported = {
        "stats": "no stats call",
        "flush": _NO_CALL,
        "flush_all": "no flush_all call",
        "version": "no version call",
    }
    stats = None
    flush = None
    flush_all = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        pools = connection_pool_factory_builder(initial_pool_size=1, max_pool_size=1,
                                                connection_timeout=TIMEOUT,
                                                recv_timeout=TIMEOUT)
        self.client = CacheClient.cache_client_from_servers(
            servers=[ServerAddress(servers[0].host, servers[0].memcache_port)],
            connection_pool_factory_fn=pools, serializer=BytesSerializer())

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(Key(key))

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(Key(queue), data, ttl=0) is True

    def delete(self, queue: str) -> None:
        assert self.client.delete(Key(queue)) is True


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[MetaMemcacheAdapter]:
    yield MetaMemcacheAdapter([server])


@pytest.mark.parametrize("op", operation_params(MetaMemcacheAdapter))
def test_meta_memcache(client: MetaMemcacheAdapter, op: str) -> None:
    """Each matrix operation through meta-memcache, checked on the server's counters."""
    run_operation(client, op, "metamc")
