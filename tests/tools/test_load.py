"""kestrel-load: a short run of every load test against a real server process."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import pytest

from kestrel.tools import load
from tests.wire.conftest import KestrelProcess, LineClient

LATENCY = r"latency in usec: count=\d+ min=\d+ p50=\d+ p90=\d+ p99=\d+ p999=\d+ max=\d+"


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    return kestrel_factory(protocols=("memcache", "thrift"),
                           config={"max_open_transactions": 100})


def run(server: KestrelProcess, *argv: str, thrift: bool = False) -> tuple[int, list[str]]:
    out = io.StringIO()
    port = server.ports["thrift" if thrift else "memcache"]
    status = load.main([*argv, "-h", server.host, "-p", str(port)], out)
    return status, out.getvalue().splitlines()


def queue_stats(server: KestrelProcess, queue: str) -> dict[str, int]:
    client = LineClient(server.connect())
    client.send(b"stats\r\n")
    text = client.until(b"END\r\n").decode()
    client.close()
    prefix = f"STAT queue_{queue}_"
    return {line[len(prefix):].split()[0]: int(line.split()[2])
            for line in text.splitlines() if line.startswith(prefix)
            and line.split()[2].isdigit()}


def put(server: KestrelProcess, queue: str, data: bytes) -> None:
    client = LineClient(server.connect())
    client.send(b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data))
    assert client.line() == b"STORED\r\n"
    client.close()


def test_flood(server: KestrelProcess) -> None:
    """flood moves every item through the queue and prints Kestrel's lines plus latencies."""
    put(server, "fl", b"left over")  # flushed first
    status, lines = run(server, "flood", "-n", "300", "-q", "fl", "-P", "10")
    assert status == 0, lines
    assert lines[:4] == [
        "Flushing queues first.",
        "prefill: 10 items of 1kB",
        "flood: producers=1 each sending 300 items (in chunks of 1) of 1kB to fl",
        "flood: consumers=1 each reading 300 items (in chunks of 1) from fl",
    ]
    assert re.fullmatch(r"Finished in \d+ msec \(\d+\.\d usec/put throughput\)\.", lines[4])
    assert re.fullmatch(r"Consumer\(s\) spun \d+ times in misses\.", lines[5])
    assert re.fullmatch("put " + LATENCY, lines[6]) and "count=300 " in lines[6]
    assert re.fullmatch("get " + LATENCY, lines[7])
    assert queue_stats(server, "fl")["items"] == 10  # the prefill is left


def test_flood_rollup_memcache_and_thrift(server: KestrelProcess) -> None:
    """With -r, memcache uses monitor + confirm and thrift multi-item put/get; all items arrive."""
    status, lines = run(server, "flood", "-n", "200", "-r", "8", "-R", "2", "-C", "2", "-B",
                        "-q", "flr")
    assert status == 0, lines
    assert lines[1] == "flood: producers=2 each sending 104 items (in chunks of 8) of 1kB to flr"
    assert lines[2] == "flood: consumers=2 each reading 104 items (in chunks of 8) from flr"
    stats = queue_stats(server, "flr")
    assert stats["items"] == 0 and stats["open_transactions"] == 0
    status, lines = run(server, "flood", "-n", "100", "-r", "10", "--thrift", "-q", "flt",
                        thrift=True)
    assert status == 0, lines
    assert queue_stats(server, "flt")["items"] == 0


def test_put_many(server: KestrelProcess) -> None:
    """put-many puts n/c items per client into each queue, and -g gets them all back."""
    status, lines = run(server, "put-many", "-n", "100", "-c", "4", "-b", "300", "-Q", "2",
                        "-q", "pm")
    assert status == 0, lines
    assert lines[1] == ("Put 100 items of 300 bytes in bursts of 1 to "
                        f"{server.host}:{server.memcache_port} in 2 queues named pm "
                        "using 4 clients.")
    assert re.fullmatch(r"Distribution in usec: min=\d+ max=\d+ p50=\d+ p75=\d+ p90=\d+ "
                        r"p95=\d+ p99=\d+ p999=\d+ p9999=\d+", lines[3])
    assert queue_stats(server, "pm0")["items"] == queue_stats(server, "pm1")["items"] == 50
    assert queue_stats(server, "pm0")["bytes"] == 50 * 300
    status, lines = run(server, "put-many", "-n", "100", "-c", "4", "-r", "5", "-g", "-q", "pmg",
                        "--thrift", thrift=True)
    assert status == 0, lines
    assert lines[4].startswith("Get 100 items of 1024 bytes in batches of 5 from")
    assert queue_stats(server, "pmg")["items"] == 0


def test_many_clients_with_kills(server: KestrelProcess) -> None:
    """many-clients: every item is received exactly once even when readers are killed."""
    status, lines = run(server, "many-clients", "-n", "12", "-s", "5", "-c", "6", "-k", "25",
                        "-q", "mc", "-M")
    assert status == 0, lines
    assert lines[0] == (f"many-clients: 12 items to {server.host} using 6 clients, "
                        "kill rate 25%, at 5 msec/item")
    monitored = [line for line in lines if line.startswith("mc: ")]
    assert monitored, lines  # -M: at least one stats line during the >= 1 s run
    assert re.fullmatch(r"mc: items=\d+ total_items=\d+ \(\d+\) bytes=\d+ mem_items=\d+ "
                        r"mem_bytes=\d+ journal_bytes=\d+", monitored[0])
    rest = [line for line in lines if not line.startswith("mc: ")]
    assert re.fullmatch(r"Received 12 items in \d+ msec\.", rest[2])
    assert re.fullmatch("set " + LATENCY, rest[3])
    stats = queue_stats(server, "mc")
    assert stats["items"] == 0 and stats["open_transactions"] == 0


def test_packing_checks_order(server: KestrelProcess) -> None:
    """packing reads every item back in order across cycles."""
    status, lines = run(server, "packing", "-n", "40", "-c", "2", "-t", "0.05", "-q", "pk")
    assert status == 0, lines
    assert lines[:4] == ["packing: 40 items of 1kB with 0.05 second pauses",
                         "Flushing queues first.", "Wrote 40 items starting at 0.", "cycle: 1"]
    assert lines[4] == "Wrote 40 items starting at 40."
    assert re.fullmatch(r"Read 40 items in \d+ msec\. Consumer spun \d+ times in misses\.",
                        lines[5])
    assert queue_stats(server, "pk")["items"] == 0
    status, lines = run(server, "packing", "-n", "20", "-c", "1", "-t", "0", "-q", "pkt",
                        "--thrift", thrift=True)
    assert status == 0, lines


def test_packing_detects_an_out_of_order_item(server: KestrelProcess) -> None:
    """An item the test did not write (here left in the queue with -F) fails the run."""
    put(server, "pkbad", b"intruder")
    status, lines = run(server, "packing", "-n", "5", "-c", "0", "-F", "-q", "pkbad")
    assert status == 1
    assert lines[-1].startswith("Unexpected item at 0: expected b'0xxxx")
    assert "intruder" in lines[-1]


def test_leaky_reader(server: KestrelProcess) -> None:
    """leaky-reader drops some confirms; auto-abort redelivers them and all complete."""
    status, lines = run(server, "leaky-reader", "-n", "40", "-d", "0.2", "-a", "100", "-t", "2",
                        "-q", "lr", thrift=True)
    assert status == 0, lines
    assert lines[:2] == ["leaky-reader: 2 threads each sending 40 items through lr",
                         "Flushing queues first."]
    assert re.fullmatch(r"Finished in \d+ msec \(\d+\.\d usec/put throughput\)\.", lines[2])
    assert lines[3] == "Completed all reads"
    stats = queue_stats(server, "lr")
    assert stats["items"] == 0 and stats["open_transactions"] == 0


def test_unreachable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that refuses connections is reported, exit status 1."""
    from kestrel.tools.load import clients

    monkeypatch.setattr(clients, "CONNECT_PATIENCE", 0.1)
    out = io.StringIO()
    from tests.support import free_port
    port = free_port()
    assert load.main(["flood", "-n", "1", "-h", "127.0.0.1", "-p", str(port)], out) == 1
    assert f"Cannot connect to 127.0.0.1:{port}" in out.getvalue()


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists Kestrel's flags with defaults; a bad flag exits 1."""
    with pytest.raises(SystemExit) as done:
        load.main(["flood", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for flag in ("-n ITEMS", "-k KILOBYTES", "-q NAME", "-P ITEMS", "-R THREADS", "-C THREADS",
                 "-r ITEMS", "-h HOSTNAME", "-p PORT", "-B", "--thrift", "-F", "-M"):
        assert flag in text
    assert "(default: 10000)" in text
    with pytest.raises(SystemExit) as done:
        load.main(["flood", "-Z"])
    assert done.value.code == 1
