"""
ZooKeeper discovery against real servers: `zookeeper.advertise_host` lets a
fleet on one machine publish itself, and the client follows the read and
write sets live.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kestrel.client import KestrelClient, ZooKeeperServers
from kestrel.config import ZooKeeperConfig, parse_config
from kestrel.serverset import AdvertiseError, ServerSetPublisher
from kestrel.status import ServerStatus
from tests.fleet.conftest import PREFIX, ZooKeeperServer, eventually, on_reactor, set_status
from tests.wire.conftest import KestrelProcess

pytestmark = pytest.mark.zookeeper


def test_advertise_host_config_and_loopback_rule() -> None:
    """An explicit advertise_host is used as given, loopback too; a derived one refuses it."""
    config = parse_config("zookeeper: {host: zk, path_prefix: /k, advertise_host: 127.0.0.1}\n")
    assert config.zookeeper == ZooKeeperConfig(host="zk", path_prefix="/k",
                                               advertise_host="127.0.0.1")
    status = ServerStatus(object(), None, "up")  # type: ignore[arg-type]
    explicit = ServerSetPublisher.from_config(config.zookeeper, status,
                                              {"memcache": ("127.0.0.1", 22133),
                                               "thrift": ("0.0.0.0", 2229)}, object())
    assert explicit.endpoints == {"memcache": ("127.0.0.1", 22133), "thrift": ("127.0.0.1", 2229)}
    with pytest.raises(AdvertiseError, match="loopback"):
        ServerSetPublisher.from_config(ZooKeeperConfig(host="zk", path_prefix="/k"), status,
                                       {"memcache": ("127.0.0.1", 22133)}, object())


def test_client_follows_membership_and_status(
        zookeeper: ZooKeeperServer, fleet_factory: Callable[..., KestrelProcess],
        running_reactor: Any) -> None:
    one, two = fleet_factory(), fleet_factory()
    servers = on_reactor(running_reactor, lambda: ZooKeeperServers(
        zookeeper.hosts, PREFIX, running_reactor, session_timeout=3.0))
    client = on_reactor(running_reactor, lambda: KestrelClient(servers, reactor=running_reactor))
    try:
        both = sorted([one.address(), two.address()])
        eventually(lambda: servers.read == both and servers.write == both, what="both join")
        puts = [on_reactor(running_reactor, client.put, "q", b"%d" % i)[0] for i in range(30)]
        assert set(puts) == set(both)

        set_status(one, "readonly")
        eventually(lambda: servers.write == [two.address()], what="one leaves the write set")
        assert servers.read == both
        assert {on_reactor(running_reactor, client.put, "q", b"x")[0] for _ in range(10)} \
            == {two.address()}
        set_status(one, "up")
        eventually(lambda: servers.write == both, what="one is back in the write set")

        two.stop()
        eventually(lambda: servers.read == servers.write == [one.address()], what="two leaves")
        got = [on_reactor(running_reactor, client.get, "q") for _ in range(40)]
        assert None in got  # two's items are out of reach while it is away
        two.start()
        eventually(lambda: servers.read == both, what="two rejoins")
        got = [on_reactor(running_reactor, client.get, "q", 0.5) for _ in range(40)]
        assert sum(1 for g in got if g is not None) > 0
    finally:
        on_reactor(running_reactor, client.close)


def test_load_tool_finds_the_fleet_in_zookeeper(
        zookeeper: ZooKeeperServer, fleet_factory: Callable[..., KestrelProcess]) -> None:
    import io

    from kestrel.tools import load

    servers = [fleet_factory(), fleet_factory()]
    eventually(lambda: len(zookeeper_members(zookeeper)) == 2, what="both published")
    out = io.StringIO()
    status = load.main(["fleet", "--zookeeper", f"{zookeeper.hosts}{PREFIX}", "-n", "200",
                        "-q", "zkload"], out)
    text = out.getvalue()
    assert status == 0, text
    write_line = next(line for line in text.splitlines() if line.startswith("fleet: write set"))
    for server in servers:
        assert server.address() in write_line


def zookeeper_members(zookeeper: ZooKeeperServer) -> list[str]:
    client = zookeeper.client()
    try:
        path = f"{PREFIX}/write"
        return client.get_children(path) if client.exists(path) else []
    finally:
        client.stop()
        client.close()


def test_thrift_client_follows_the_thrift_endpoints(
        zookeeper: ZooKeeperServer, fleet_factory: Callable[..., KestrelProcess],
        running_reactor: Any) -> None:
    servers = [fleet_factory(("memcache", "thrift")) for _ in range(2)]
    found = on_reactor(running_reactor, lambda: ZooKeeperServers(
        zookeeper.hosts, PREFIX, running_reactor, endpoint="thrift"))
    client = on_reactor(running_reactor, lambda: KestrelClient(
        found, reactor=running_reactor, protocol="thrift"))
    try:
        thrift = sorted(s.address("thrift") for s in servers)
        eventually(lambda: found.write == thrift, what="thrift endpoints")
        stored = {on_reactor(running_reactor, client.put, "tq", b"%d" % i)[0] for i in range(20)}
        assert stored == set(thrift)
        handle = on_reactor(running_reactor, client.read, "tq", 1.0)
        assert handle.xid > 0
        on_reactor(running_reactor, handle.confirm)
    finally:
        on_reactor(running_reactor, client.close)
