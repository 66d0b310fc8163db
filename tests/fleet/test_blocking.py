"""The blocking facade against real server processes (memcache and thrift), no Twisted code."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kestrel.client import AllServersFailed
from kestrel.client.blocking import BlockingClient
from tests.wire.conftest import KestrelProcess, kestrel_factory  # noqa: F401 - fixture


@pytest.mark.parametrize("protocol", ["memcache", "thrift"])
def test_blocking_client_round_trip(kestrel_factory: Callable[..., KestrelProcess],  # noqa: F811
                                    protocol: str) -> None:
    servers = [kestrel_factory(protocols=("memcache", "thrift")) for _ in range(2)]
    client = BlockingClient(servers=[s.address(protocol) for s in servers], protocol=protocol)
    try:
        stored = client.put(f"b_{protocol}", [b"%d" % i for i in range(20)])
        assert len(stored) == 20
        handle = client.read(f"b_{protocol}", timeout=1.0)
        assert handle is not None and handle.server in stored
        handle.abort()
        got = []
        while (handle := client.read(f"b_{protocol}", timeout=0.2)) is not None:
            got.append(handle.data)
            handle.confirm()
        assert sorted(got) == sorted(b"%d" % i for i in range(20))
        assert client.get(f"b_{protocol}") is None
    finally:
        client.close()


def test_blocking_client_reports_a_dead_fleet(kestrel_factory: Callable[..., KestrelProcess]  # noqa: F811
                                              ) -> None:
    server = kestrel_factory(start=False)
    client = BlockingClient(servers=[server.address()], connect_timeout=1.0)
    try:
        with pytest.raises(AllServersFailed, match="refused"):
            client.put("q", b"x")
        with pytest.raises(AllServersFailed):
            client.read("q")
    finally:
        client.close()
