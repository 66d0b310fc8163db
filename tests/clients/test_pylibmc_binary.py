"""pylibmc (libmemcached) with binary=True against a real server, operation by operation."""

from __future__ import annotations

from collections.abc import Iterator

import pylibmc
import pytest

from tests.clients.matrix import MemcacheAdapter, operation_params, run_operation
from tests.clients.test_pylibmc import BEHAVIORS
from tests.wire.conftest import KestrelProcess


class PylibmcBinaryAdapter(MemcacheAdapter):
    """pylibmc's C{Client} over the binary protocol."""

    name = "pylibmc (binary)"
    unsupported = {
        "flush": "no way to send a command the client does not know",
        "version": "no version call (get_stats() shows the server's version)",
        "stats": "get_stats() keeps only libmemcached's fixed set of memcached stats "
                 "(curr_items, ...), not the per-queue ones",
    }
    flush = None
    version = None
    stats = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        super().__init__(servers)
        self.client = pylibmc.Client([servers[0].address()], binary=True, behaviors=BEHAVIORS)

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(queue, data) is True

    def delete(self, queue: str) -> None:
        assert self.client.delete(queue) is True

    def flush_all(self) -> None:
        assert self.client.flush_all() is True

    def shutdown(self) -> None:
        self.client.disconnect_all()


@pytest.fixture(scope="module")
def client(server: KestrelProcess) -> Iterator[PylibmcBinaryAdapter]:
    adapter = PylibmcBinaryAdapter([server])
    yield adapter
    adapter.shutdown()


@pytest.mark.parametrize("op", operation_params(PylibmcBinaryAdapter))
def test_pylibmc_binary(client: PylibmcBinaryAdapter, op: str) -> None:
    """Each matrix operation through pylibmc's binary protocol, checked on the server's counters."""
    run_operation(client, op, "lmcb")


def test_get_multi_and_server_version(client: PylibmcBinaryAdapter,
                                      server: KestrelProcess) -> None:
    """get_multi (GetKQ ... Noop) takes one item per queue; stats carry the one version."""
    client.set("lmcb_m1", b"a")
    client.set("lmcb_m2", b"b")
    assert client.client.get_multi(["lmcb_m1", "lmcb_m2", "lmcb_none"]) == {
        "lmcb_m1": b"a", "lmcb_m2": b"b"}
    [(_, stats)] = client.client.get_stats()
    assert stats["version"] == b"1.1.0"
