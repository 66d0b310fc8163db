"""
PyPI's `memcache` (a meta-protocol client: C{ms}/C{mg}/C{md}) against a
real server. Its package is named C{memcache}, like python-memcached's
module, and wins the import when both are installed (see
L{tests.clients.shadowed}).
"""

from __future__ import annotations

from collections.abc import Iterator

import memcache
import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.wire.conftest import KestrelProcess


class MemcachePypiAdapter(MemcacheAdapter):
    """C{memcache.Memcache((host, port), pool_size=1)}: one connection, no socket timeout."""

    name = "memcache (PyPI; meta protocol)"
    unsupported = {
        "stats": "no stats call",
        "flush": "no way to send a command the client does not know",
        "version": "no version call",
    }
    stats = None
    flush = None
    version = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        if not hasattr(memcache, "Memcache"):
            pytest.skip(f"`import memcache` finds python-memcached ({memcache.__file__}), not "
                        "PyPI's memcache package: pip install memcache")
        self.client = memcache.Memcache((servers[0].host, servers[0].memcache_port),
                                        pool_size=1)

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        self.client.set(queue, data)  # returns nothing: the scenario checks the server's count

    def delete(self, queue: str) -> None:
        self.client.delete(queue)

    def flush_all(self) -> None:
        self.client.flush_all()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[MemcachePypiAdapter]:
    yield MemcachePypiAdapter([server])


@pytest.mark.parametrize("op", operation_params(MemcachePypiAdapter))
def test_memcache_pypi(client: MemcachePypiAdapter, op: str) -> None:
    """Each matrix operation through PyPI's memcache, checked on the server's counters."""
    run_operation(client, op, "pypimc")
