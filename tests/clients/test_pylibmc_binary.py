"""pylibmc (libmemcached) with binary=True against a real server, operation by operation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clients.matrix import operation_params, run_operation
from tests.clients.test_pylibmc import PylibmcAdapter
from tests.wire.conftest import KestrelProcess


class PylibmcBinaryAdapter(PylibmcAdapter):
    """pylibmc's C{Client} over the binary protocol (the same calls as over text)."""

    name = "pylibmc (binary)"
    binary = True


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
