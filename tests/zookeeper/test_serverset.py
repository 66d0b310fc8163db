"""ServerSetPublisher against a real ZooKeeper: joins, status changes, restarts, shutdown."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from twisted.internet.task import Clock
from twisted.internet.threads import blockingCallFromThread
from twisted.logger import formatEvent, globalLogPublisher

from kestrel.serverset import (
    AdvertiseError,
    InterfaceAddress,
    Membership,
    ServerSetPublisher,
    external_address,
    interface_addresses,
    member_data,
    read_membership,
    reconnect_delay,
    write_membership,
)
from kestrel.status import ServerStatus, Status
from tests.zookeeper.conftest import START_TIMEOUT, ZooKeeperServer

ENDPOINTS = {"memcache": ("0.0.0.0", 22133), "thrift": ("0.0.0.0", 2229),
             "text": ("0.0.0.0", 2222)}
ETH = InterfaceAddress("eth0", "192.0.2.7", False, False)
LO = InterfaceAddress("lo", "127.0.0.1", True, False)


def interfaces() -> list[InterfaceAddress]:
    return [LO, ETH]


# -- pure parts


def test_loopback_is_refused() -> None:
    """A listener on a loopback address cannot be advertised."""
    for host in ("127.0.0.1", "::1", "localhost"):
        with pytest.raises(AdvertiseError, match="cannot advertise loopback host via zookeeper"):
            external_address(host, interfaces)


def test_wildcard_is_replaced_by_an_interface_address() -> None:
    """0.0.0.0 and :: become the first non-loopback, non-link-local interface address."""
    link_local = InterfaceAddress("eth1", "169.254.3.4", False, False)
    assert external_address("0.0.0.0", lambda: [LO, link_local, ETH]) == "192.0.2.7"
    assert external_address("::", lambda: [LO, ETH]) == "192.0.2.7"
    p2p = InterfaceAddress("tun0", "169.254.9.9", False, True)
    assert external_address("0.0.0.0", lambda: [LO, p2p, ETH]) == "169.254.9.9"
    assert external_address("198.51.100.1", lambda: []) == "198.51.100.1"
    with pytest.raises(AdvertiseError, match="no acceptable network interfaces"):
        external_address("0.0.0.0", lambda: [LO, link_local])


def test_interface_addresses_finds_this_machines_addresses() -> None:
    """The kernel's interface list includes loopback, flagged as such."""
    found = interface_addresses()
    assert any(a.loopback and a.address.startswith("127.") for a in found)
    assert all(not a.loopback for a in found if not a.address.startswith("127."))


def test_membership_table() -> None:
    """Read and write set values follow the server status as in Kestrel 2.4."""
    table = {s: (read_membership(s), write_membership(s)) for s in Status}
    alive, dead = Membership.ALIVE, Membership.DEAD
    assert table == {Status.UP: (alive, alive), Status.WRITE_AVOID: (alive, dead),
                     Status.READ_ONLY: (alive, dead), Status.QUIESCENT: (dead, dead),
                     Status.DOWN: (dead, dead)}


def test_member_data_is_serverset_json() -> None:
    """Member data is Twitter's ServerSet JSON."""
    data = member_data(("192.0.2.7", 22133), {"memcache": ("192.0.2.7", 22133),
                                              "text": ("192.0.2.7", 2222)}, Membership.DEAD)
    assert json.loads(data) == {
        "serviceEndpoint": {"host": "192.0.2.7", "port": 22133},
        "additionalEndpoints": {"memcache": {"host": "192.0.2.7", "port": 22133},
                                "text": {"host": "192.0.2.7", "port": 2222}},
        "status": "DEAD",
    }


def test_main_endpoint_prefers_memcache_then_thrift() -> None:
    """The service endpoint is memcache's, else thrift's, else text's."""
    status = ServerStatus(Clock(), None, "up")
    pub = ServerSetPublisher("h:1", "/k", status,
                             {"text": ("0.0.0.0", 1), "thrift": ("0.0.0.0", 2)},
                             None, interfaces=interfaces)
    assert pub.main_endpoint == ("192.0.2.7", 2)
    with pytest.raises(AdvertiseError):
        ServerSetPublisher("h:1", "/k", status, {"memcache": ("127.0.0.1", 1)}, None)


@pytest.mark.parametrize("session_timeout", [1.0, 2.0, 4.0, 10.0, 30.0])
def test_reconnect_delay_leaves_time_to_keep_the_session(session_timeout: float) -> None:
    """
    Even the longest retry pause, jitter included, is under half the session
    timeout, so a publisher reconnects to a returning ZooKeeper in time.
    """
    longest = reconnect_delay(session_timeout) * 1.4  # kazoo's maximum jitter
    assert 0 < longest < session_timeout / 2
    assert reconnect_delay(session_timeout) <= 2.0


# -- against a real ZooKeeper

needs_zookeeper = pytest.mark.zookeeper


def members(client: KazooClient, kind: str, prefix: str = "/kestrel") -> dict[str, dict[str, Any]]:
    path = f"{prefix}/{kind}"
    if client.exists(path) is None:
        return {}
    return {child: json.loads(client.get(f"{path}/{child}")[0])
            for child in sorted(client.get_children(path))}


def statuses(client: KazooClient) -> tuple[list[str], list[str]]:
    return ([m["status"] for m in members(client, "read").values()],
            [m["status"] for m in members(client, "write").values()])


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def publish(zookeeper: ZooKeeperServer, running_reactor: Any) -> Iterator[
        tuple[ServerSetPublisher, ServerStatus, Callable[..., Any]]]:
    status = ServerStatus(running_reactor, None, "up")
    pub = ServerSetPublisher(zookeeper.hosts, "/kestrel", status, ENDPOINTS, running_reactor,
                             session_timeout=4.0)

    def call(f: Callable[..., Any], *args: Any) -> Any:
        return blockingCallFromThread(running_reactor, f, *args)

    call(pub.startService)
    call(pub.flush)
    yield pub, status, call
    if pub.running:
        call(pub.stopService)


@needs_zookeeper
def test_joins_both_sets_alive(publish: Any, observer: KazooClient) -> None:
    """At start the server is a member of both sets, ALIVE, with all three endpoints."""
    pub, _, _ = publish
    read, write = members(observer, "read"), members(observer, "write")
    assert len(read) == len(write) == 1
    (name, data), = read.items()
    assert name.startswith("member_")
    host = pub.main_endpoint[0]
    assert host not in ("0.0.0.0", "127.0.0.1")
    assert data == {"serviceEndpoint": {"host": host, "port": 22133},
                    "additionalEndpoints": {"memcache": {"host": host, "port": 22133},
                                            "thrift": {"host": host, "port": 2229},
                                            "text": {"host": host, "port": 2222}},
                    "status": "ALIVE"}
    path = f"/kestrel/read/{name}"
    assert observer.exists(path).ephemeralOwner != 0
    # The read set is joined before the write set.
    read_zxid = observer.exists(path).czxid
    write_zxid = observer.exists(f"/kestrel/write/{next(iter(write))}").czxid
    assert read_zxid < write_zxid


@needs_zookeeper
def test_follows_status_changes_in_kestrels_order(publish: Any, observer: KazooClient) -> None:
    """Stricter: write set then read set; looser: read then write; DEAD to ALIVE re-joins."""
    _, status, call = publish
    first_read = next(iter(members(observer, "read")))
    first_write = next(iter(members(observer, "write")))

    call(status.set_status, "readonly")
    call(publish[0].flush)
    assert statuses(observer) == (["ALIVE"], ["DEAD"])
    assert next(iter(members(observer, "write"))) == first_write  # updated in place

    call(status.set_status, "writeavoid")  # looser, but both sets keep their values
    call(publish[0].flush)
    write_stat = observer.exists(f"/kestrel/write/{first_write}")
    assert write_stat.version == 1
    assert statuses(observer) == (["ALIVE"], ["DEAD"])

    call(status.set_status, "up")
    call(publish[0].flush)
    assert statuses(observer) == (["ALIVE"], ["ALIVE"])
    new_write = next(iter(members(observer, "write")))
    assert new_write != first_write  # DEAD -> ALIVE is a new membership
    assert next(iter(members(observer, "read"))) == first_read

    call(status.set_status, "quiescent")
    call(publish[0].flush)
    assert statuses(observer) == (["DEAD"], ["DEAD"])
    read_stat = observer.exists(f"/kestrel/read/{first_read}")
    write_stat = observer.exists(f"/kestrel/write/{new_write}")
    assert write_stat.mzxid < read_stat.mzxid  # stricter: write set first

    call(status.set_status, "up")
    call(publish[0].flush)
    assert statuses(observer) == (["ALIVE"], ["ALIVE"])
    read_now, write_now = members(observer, "read"), members(observer, "write")
    read_czxid = observer.exists(f"/kestrel/read/{next(iter(read_now))}").czxid
    write_czxid = observer.exists(f"/kestrel/write/{next(iter(write_now))}").czxid
    assert read_czxid < write_czxid  # looser: read set first


@needs_zookeeper
def test_shutdown_marks_dead_then_leaves(publish: Any, observer: KazooClient) -> None:
    """stopService sets both memberships DEAD, then removes them."""
    pub, _, call = publish
    write_path = f"/kestrel/write/{next(iter(members(observer, 'write')))}"
    seen: list[Any] = []
    changed = threading.Event()

    @observer.DataWatch(write_path)
    def watch(data: bytes | None, stat: Any) -> None:
        seen.append(None if data is None else json.loads(data)["status"])
        if data is None:
            changed.set()

    call(pub.stopService)
    assert changed.wait(10)
    assert seen == ["ALIVE", "DEAD", None]
    assert members(observer, "read") == members(observer, "write") == {}


@needs_zookeeper
def test_rejoins_after_zookeeper_restart_and_session_loss(
        publish: Any, observer: KazooClient, zookeeper: ZooKeeperServer) -> None:
    """After a ZooKeeper restart that costs the session, both members are created again."""
    pub, status, call = publish
    call(status.set_status, "readonly")
    call(pub.flush)
    before = (set(members(observer, "read")), set(members(observer, "write")))
    observer.stop()
    zookeeper.stop()
    zookeeper.start()
    observer.start(timeout=START_TIMEOUT)
    wait_for(lambda: pub._client is not None and pub._client.connected)
    # Expire the publisher's session the standard way: close it from another client.
    thief = zookeeper.client(client_id=pub._client.client_id)
    thief.stop()
    thief.close()

    def rejoined() -> bool:
        now = (set(members(observer, "read")), set(members(observer, "write")))
        return (statuses(observer) == (["ALIVE"], ["DEAD"])
                and not now[0] & before[0] and not now[1] & before[1])

    wait_for(rejoined)
    call(status.set_status, "up")
    call(pub.flush)
    assert statuses(observer) == (["ALIVE"], ["ALIVE"])


@needs_zookeeper
def test_survives_a_short_zookeeper_outage(publish: Any, observer: KazooClient,
                                           zookeeper: ZooKeeperServer) -> None:
    """
    A restart that keeps the data keeps the session: once the publisher is
    connected again it holds the same session and the same member znodes,
    exactly one per set, ALIVE.
    """
    pub, _, _ = publish
    client = pub._client
    session = client.client_id[0]
    before = (set(members(observer, "read")), set(members(observer, "write")))
    states: list[str] = []
    client.add_listener(lambda state: states.append(str(state)))
    observer.stop()
    zookeeper.stop()
    zookeeper.start()
    observer.start(timeout=START_TIMEOUT)
    # The server answered the reconnection: the session is renewed or gone for good.
    wait_for(lambda: "SUSPENDED" in states and states[-1] != "SUSPENDED")
    assert states[-1] == "CONNECTED"
    assert pub._client is client and client.client_id[0] == session
    wait_for(lambda: statuses(observer) == (["ALIVE"], ["ALIVE"]))
    assert (set(members(observer, "read")), set(members(observer, "write"))) == before


@needs_zookeeper
def test_start_while_zookeeper_is_down_joins_later(zookeeper: ZooKeeperServer,
                                                   running_reactor: Any) -> None:
    """A server started while ZooKeeper is away joins both sets once it is reachable."""
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    zookeeper.stop()
    status = ServerStatus(running_reactor, None, "writeavoid")
    pub = ServerSetPublisher(zookeeper.hosts, "/svc", status, ENDPOINTS, running_reactor,
                             session_timeout=1.0)
    started = time.monotonic()
    blockingCallFromThread(running_reactor, pub.startService)
    assert time.monotonic() - started < 1.0  # the reactor never waits for ZooKeeper
    try:
        # Meanwhile the reactor keeps running timers while the worker waits for ZooKeeper.
        fired = threading.Event()
        running_reactor.callFromThread(running_reactor.callLater, 0.05, fired.set)
        assert fired.wait(2)
        zookeeper.start()
        client = zookeeper.client()
        try:
            wait_for(lambda: (
                [m["status"] for m in members(client, "read", "/svc").values()],
                [m["status"] for m in members(client, "write", "/svc").values()],
            ) == (["ALIVE"], ["DEAD"]))
        finally:
            client.stop()
            client.close()
    finally:
        blockingCallFromThread(running_reactor, pub.stopService)
        globalLogPublisher.removeObserver(events.append)
    texts = [formatEvent(e) for e in events]
    assert any(t.startswith("kazoo: ") for t in texts)  # kazoo's warnings reach our log
