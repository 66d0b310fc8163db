"""
Over real sockets, with real clients: under C{sync_journal: always} a close
or confirm whose fsync fails (strace EIO on the queue's journal) gets the
protocol's error reply, the read stays the client's, and a retry once the
journal recovered confirms it: the item never comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.clients import MemcacheClient, ProtocolError, TextClient, ThriftClient
from tests.chaos.harness import PROTOCOLS, ChaosServer
from tests.faults.inject import Strace, ptrace_unavailable

FSYNCS = ("fsync", "fdatasync")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ChaosServer]:
    why = ptrace_unavailable()
    if why is not None:
        pytest.skip(why)
    s = ChaosServer(tmp_path / "s", PROTOCOLS, config={
        "client_timeout": None, "default": {"sync_journal": "always"}})
    s.start()
    yield s
    s.stop()


def retried(attempt: Callable[[], object], seconds: float = 10.0) -> object:
    """C{attempt()}, tried again while it is refused (the journal recovering)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return attempt()
        except ProtocolError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fsync_fault(server: ChaosServer, queue: str) -> Strace:
    assert server.proc is not None
    return Strace(server.proc.pid, [server.queue_path / queue], FSYNCS, "EIO")


def left(server: ChaosServer, queue: str) -> list[bytes]:
    """Every item still in C{queue}, read and confirmed."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    out = []
    while (got := client.get(queue, "/open")) is not None:
        out.append(got)
        assert client.get(queue, "/close") is None
    client.close()
    return out


def test_memcache_close_whose_fsync_fails(server: ChaosServer) -> None:
    """get q/close: SERVER_ERROR while it cannot be made durable; the retry confirms it."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    assert client.set("q", b"one") and client.set("q", b"two")
    assert client.get("q", "/open") == b"one"
    with fsync_fault(server, "q") as fault, pytest.raises(ProtocolError, match="SERVER_ERROR"):
        client.get("q", "/close/open")
    assert fault.injected >= 1
    assert retried(lambda: client.get("q", "/close/open")) == b"two"
    assert client.get("q", "/close") is None
    client.close()
    assert left(server, "q") == []


def test_text_confirm_whose_fsync_fails(server: ChaosServer) -> None:
    """confirm q 1: the text error reply; the read stays open and the retry confirms it."""
    client = TextClient(server.host, server.ports["text"])
    assert client.put("t", [b"one", b"two"]) == 2
    assert client.get("t") == b"one"
    with fsync_fault(server, "t") as fault, pytest.raises(ProtocolError, match="^-"):
        client.confirm("t", 1)
    assert fault.injected >= 1
    retried(lambda: client.confirm("t", 1))
    client.close()
    assert left(server, "t") == [b"two"]


def test_thrift_confirm_whose_fsync_fails(server: ChaosServer) -> None:
    """confirm(q, ids): an application error; the id stays open and the retry counts it."""
    client = ThriftClient(server.host, server.ports["thrift"])
    assert client.put("h", [b"one", b"two"]) == 2
    [(xid, data)] = client.get("h", 1, 0, 60_000)
    assert data == b"one"
    with fsync_fault(server, "h") as fault, pytest.raises(Exception, match="(?i)journal"):
        client.confirm("h", {xid})
    assert fault.injected >= 1
    assert retried(lambda: client.confirm("h", {xid})) == 1
    client.close()
    assert left(server, "h") == [b"two"]
