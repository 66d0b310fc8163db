"""
Startup against a real server process: the ports open at once and a small
queue answers while a big journal still replays; requests for the big queue
wait for it (or end at their own deadline), commands that cannot wait are
refused with a protocol error, and once it is loaded the big queue answers
its right first item.

That the big queue was still loading when the small one answered is read
from the server's C{queues_loading} stat, not guessed from timings: loading
only ever ends, so a stat of 1 after a reply means the big queue was loading
when that reply was made.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory

from kestrel.journal import records as rec
from tests.wire import conftest
from tests.wire.conftest import ROOT, KestrelProcess, LineClient

#: Items in the big journal: enough that its replay takes far longer than the
#: few requests made meanwhile (about a second of replay on a fast machine).
BIG_ITEMS = 1_000_000
FIRST = b"first-item-of-big"
ADD_MS = 1_700_000_000_000

client_thrift = thriftpy2.load(str(ROOT / "thrift" / "kestrel.thrift"),
                               module_name="kestrel_startup_thrift")


def write_journals(server: KestrelProcess) -> None:
    """A big journal (FIRST, then BIG_ITEMS - 1 others) and a small one, as a restart finds them."""
    server.queue_path.mkdir(parents=True, exist_ok=True)
    other = rec.encode_add(b"x" * 16, ADD_MS)
    with open(server.queue_path / "big", "wb") as f:
        f.write(rec.encode_add(FIRST, ADD_MS))
        f.write(other * (BIG_ITEMS - 1))
    (server.queue_path / "small").write_bytes(
        rec.encode_add(b"small-1", ADD_MS) + rec.encode_add(b"small-2", ADD_MS))


@pytest.fixture
def loading_server(kestrel_factory: Callable[..., KestrelProcess],
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[KestrelProcess]:
    """A server started on the journals, handed over as soon as it listens."""
    server = kestrel_factory(protocols=("memcache", "text", "thrift", "admin"), start=False)
    write_journals(server)
    monkeypatch.setattr(conftest, "READY", "kestrel listening")
    server.start()
    yield server
    server.stop()


def memcache(server: KestrelProcess) -> LineClient:
    return LineClient(server.connect("memcache", timeout=60))


def queues_loading(client: LineClient) -> int:
    client.send(b"stats\r\n")
    stats = dict(line.split()[1:3] for line in client.until(b"END\r\n").decode().splitlines()
                 if line.startswith("STAT "))
    return int(stats["queues_loading"])


def ready(server: KestrelProcess) -> tuple[int, str]:
    url = f"http://{server.host}:{server.ports['admin']}/ready"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_small_queue_answers_while_big_queue_replays(loading_server: KestrelProcess) -> None:
    server = loading_server
    client = memcache(server)
    client.send(b"get small\r\n")
    assert client.until(b"END\r\n") == b"VALUE small 0 7\r\nsmall-1\r\nEND\r\n"
    assert queues_loading(client) == 1  # the big queue was loading when small answered

    # What a client sees of the loading queue meanwhile.
    client.send(b"get big/t=50\r\n")
    assert client.line() == b"END\r\n"  # its own deadline, the queue still loading
    client.send(b"flush big\r\n")
    reply = client.line()
    assert reply.startswith(b"SERVER_ERROR queue big is still loading its journal")
    client.send(b"delete big\r\n")
    assert client.line().startswith(b"SERVER_ERROR queue big is still loading its journal")
    client.send(b"set small 0 0 3\r\nnew\r\n")
    assert client.line() == b"STORED\r\n"  # the connection lives on
    text = LineClient(server.connect("text", timeout=60))
    text.send(b"flush big\n")
    assert text.line().startswith(b"-queue big is still loading its journal")
    text.send(b"peek small\n")
    assert text.line() == b":small-2\n"
    thrift = make_client(client_thrift.Kestrel, server.host, server.ports["thrift"],
                         trans_factory=TFramedTransportFactory(),
                         proto_factory=TBinaryProtocolFactory(), timeout=60000)
    try:
        assert thrift.get("big", 1, 50, 0) == []
        with pytest.raises(TApplicationException, match="queue big is still loading"):
            thrift.delete_queue("big")
        status, body = ready(server)
        assert status == 503 and "big" in body
        assert queues_loading(client) == 1  # every reply above was made while big loaded

        # A get with no deadline waits for the replay and is then served as usual.
        client.send(b"get big\r\n")
        assert client.until(b"END\r\n") == b"VALUE big 0 %d\r\n%s\r\nEND\r\n" % (
            len(FIRST), FIRST)
        assert queues_loading(client) == 0
        assert ready(server) == (200, "ready\n")
        client.send(b"get small\r\n")
        assert client.until(b"END\r\n") == b"VALUE small 0 7\r\nsmall-2\r\nEND\r\n"
        assert [item.data for item in thrift.get("big", 2, 0, 0)] == [b"x" * 16] * 2
    finally:
        thrift.close()
        text.close()
        client.close()
    assert "kestrel ready" in server.new_log()


def test_stop_during_replay_keeps_every_item(loading_server: KestrelProcess,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while the big journal replays: a clean, quick stop; nothing is lost."""
    server = loading_server
    client = memcache(server)
    client.send(b"get small\r\n")
    assert client.until(b"END\r\n").startswith(b"VALUE small")
    assert queues_loading(client) == 1
    client.close()
    before = (server.queue_path / "big").stat().st_size
    assert server.stop(timeout=10) == 0
    assert "not loaded" in server.new_log()
    assert (server.queue_path / "big").stat().st_size == before

    monkeypatch.setattr(conftest, "READY", "kestrel ready")
    server.start()
    client = memcache(server)
    try:
        client.send(b"get big\r\n")
        assert client.until(b"END\r\n") == b"VALUE big 0 %d\r\n%s\r\nEND\r\n" % (
            len(FIRST), FIRST)
        client.send(b"stats\r\n")
        stats = client.until(b"END\r\n")
        assert b"STAT queue_big_items %d\r\n" % (BIG_ITEMS - 1) in stats
        assert b"STAT queue_small_items 1\r\n" in stats
    finally:
        client.close()
