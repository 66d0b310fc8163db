"""A real server process publishing itself in a real ZooKeeper."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.wire.conftest import KestrelProcess, LineClient, start_on_free_ports
from tests.zookeeper.conftest import ZooKeeperServer

pytestmark = pytest.mark.zookeeper


def snapshot(client: KazooClient, prefix: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in ("read", "write"):
        path = f"{prefix}/{kind}"
        children = client.get_children(path) if client.exists(path) else []
        found[kind] = [json.loads(client.get(f"{path}/{c}")[0]) for c in sorted(children)]
    return found


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def zk_config(zookeeper: ZooKeeperServer, prefix: str) -> dict[str, Any]:
    return {"zookeeper": {"host": "127.0.0.1", "port": zookeeper.port, "path_prefix": prefix,
                          "session_timeout": "2s"}}


def test_server_publishes_follows_status_and_leaves(
        zookeeper: ZooKeeperServer, observer: KazooClient, tmp_path: Any) -> None:
    """The server joins with its bound ports, follows `status` commands, and leaves on SIGTERM."""
    server = KestrelProcess(tmp_path / "k", ("memcache", "thrift", "text"),
                            config=zk_config(zookeeper, "/svc/kestrel"), host="0.0.0.0")
    start_on_free_ports(server)
    try:
        eventually(lambda: [m["status"] for m in snapshot(observer, "/svc/kestrel")["write"]]
                   == ["ALIVE"])
        member = snapshot(observer, "/svc/kestrel")["read"][0]
        host = member["serviceEndpoint"]["host"]
        assert host not in ("0.0.0.0", "127.0.0.1")
        assert member["serviceEndpoint"] == {"host": host, "port": server.ports["memcache"]}
        assert member["additionalEndpoints"] == {
            name: {"host": host, "port": server.ports[name]}
            for name in ("memcache", "thrift", "text")}

        client = LineClient(server.connect())
        client.send(b"status readonly\r\n")
        assert client.line() == b"END\r\n"
        client.close()
        eventually(lambda: [[m["status"] for m in ms] for ms in
                            snapshot(observer, "/svc/kestrel").values()] == [["ALIVE"], ["DEAD"]])
    finally:
        assert server.stop() == 0
    assert snapshot(observer, "/svc/kestrel") == {"read": [], "write": []}


def test_loopback_listener_refuses_to_start(
        zookeeper: ZooKeeperServer, tmp_path: Any) -> None:
    """A server listening on loopback only cannot be advertised: it does not start."""
    server = KestrelProcess(tmp_path / "k", ("memcache",), config=zk_config(zookeeper, "/lo"))
    with pytest.raises(RuntimeError):
        server.start(timeout=15)
    server.kill()
    assert "cannot advertise loopback host via zookeeper" in server.log()
