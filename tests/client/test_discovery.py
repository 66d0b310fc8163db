"""Server sets: static lists, address parsing, ServerSet JSON members, membership changes."""

from __future__ import annotations

import json
import random

import pytest

from kestrel.client import KestrelClient, NoServers, RequestTimeout
from kestrel.client.discovery import (
    ServerSet,
    StaticServers,
    member_address,
    parse_servers,
    parse_zookeeper,
)
from kestrel.serverset import Membership, member_data
from tests.client.conftest import Net, resolved


def test_member_address_reads_what_the_server_publishes() -> None:
    data = member_data(("192.0.2.2", 22133), {"memcache": ("192.0.2.2", 22133),
                                               "thrift": ("192.0.2.2", 2229)}, Membership.ALIVE)
    assert member_address(data) == "192.0.2.2:22133"
    assert member_address(data, "thrift") == "192.0.2.2:2229"
    assert member_address(data, "text") is None
    dead = member_data(("192.0.2.2", 22133), {"memcache": ("192.0.2.2", 22133)}, Membership.DEAD)
    assert member_address(dead) is None
    assert member_address(b"not json") is None
    v6 = json.dumps({"serviceEndpoint": {"host": "::1", "port": 1}, "status": "ALIVE"}).encode()
    assert member_address(v6) == "[::1]:1"


def test_parsers() -> None:
    assert parse_servers("a:1, b:2,") == ["a:1", "b:2"]
    with pytest.raises(ValueError):
        parse_servers("a")
    assert parse_zookeeper("zk1:2181,zk2:2181/kestrel/prod/") == ("zk1:2181,zk2:2181",
                                                                  "/kestrel/prod")
    with pytest.raises(ValueError):
        parse_zookeeper("zk1:2181")


def test_static_set_is_known_at_once() -> None:
    s = StaticServers(["b:1", "a:1"])
    assert s.read == s.write == ["a:1", "b:1"]
    assert resolved(s.ready()) is None


def test_client_waits_for_the_first_membership_and_follows_changes(net: Net) -> None:
    for name in ("a:1", "b:1"):
        net.add(name)
    servers = ServerSet()
    client = KestrelClient(servers, reactor=net.clock, connector=net.connector(),
                           rand=random.Random(1))
    d = client.put("q", b"x")
    net.run(1.0)
    assert not d.called
    servers.update(["a:1", "b:1"], ["b:1"])  # a is read-only: in the read set only
    net.pump()
    assert resolved(d) == ["b:1"]
    for _ in range(10):
        d = client.put("q", b"y")
        net.pump()
        assert resolved(d) == ["b:1"]
    servers.update(["a:1"], [])
    d = client.put("q", b"z")
    net.pump()
    with pytest.raises(NoServers):
        resolved(d)
    assert client.pool.idle_count("b:1") == 0  # b left: its connections were closed


def test_no_membership_in_time_is_a_timeout(net: Net) -> None:
    client = KestrelClient(ServerSet(), reactor=net.clock, connector=net.connector(),
                           discovery_timeout=2.0)
    d = client.read("q")
    net.run(2.1)
    with pytest.raises(RequestTimeout, match="membership"):
        resolved(d)
