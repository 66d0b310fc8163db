"""
The analysis against a truth workload: real servers, real clients, every figure checked.

Two server processes. Server A has an archive and small journal limits (its
journals rotate, pack and rewrite); clients talk memcache and thrift:
items that expire and are swept into an C{expire_to_queue}, a fanout, reliable
reads confirmed, aborted and left open by a client that disconnects, a stuck
queue nobody reads, and a queue drained without adds, one read at a time; A
is killed with SIGKILL and restarted half-way. Server B has no archive: a
queue is emptied and rewritten in place, then added to. The folders are
copied while the servers run (as an operator would, with C{cp -a}), and both
engines analyse the copies.

Each figure is compared with what the clients did: exactly, or, where the
journal cannot know (the time of a record that carries none, whether an add
of an undated snapshot was a client's), as a bound that must hold.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
from tests.analytics.test_real_servers import Memcache  # noqa: E402
from tests.wire.conftest import KestrelProcess  # noqa: E402

pytestmark = pytest.mark.slow

LIMITS = {"max_memory_size": "4KiB", "default_journal_size": "8KiB",
          "max_journal_size": "24KiB", "sync_journal": "5ms", "durable_acks": True}


def _now_ms() -> int:
    return int(time.time() * 1000)


class Truth:
    """What the clients did, per queue, as the servers acknowledged it."""

    def __init__(self) -> None:
        self.q: dict[str, dict[str, int]] = {}

    def __getitem__(self, queue: str) -> dict[str, int]:
        return self.q.setdefault(queue, dict(enqueued=0, dequeued=0, opened=0, confirmed=0,
                                             aborted=0, bytes_enqueued=0, expired=0))


def _set(c: Memcache, truth: Truth, queue: str, data: bytes, exptime: int = 0) -> None:
    c.sock.sendall(b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode(), exptime, len(data), data))
    assert c._line() == b"STORED"  # noqa: SLF001 - the test client's own reader
    truth[queue]["enqueued"] += 1
    truth[queue]["bytes_enqueued"] += len(data)


def _wait_for_expiry(c: Memcache, queue: str, deadline: float) -> None:
    """Wait until the server's sweep has emptied C{queue} (asked through a peek)."""
    while time.monotonic() < deadline:
        if c.get(f"{queue}/peek") is None:
            return
        time.sleep(0.1)
    raise AssertionError(f"{queue} did not expire")


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from kestrel.client.blocking import BlockingClient

    root_a = Path(tmp_path_factory.mktemp("truth_a"))
    root_b = Path(tmp_path_factory.mktemp("truth_b"))
    a = KestrelProcess(root_a, ("memcache", "thrift"), {
        "archive_path": str(root_a / "archive"), "expiration_timer_frequency": 0.2,
        "default": LIMITS,
        "queues": {"exp": {"expire_to_queue": "expdead"},
                   "texp": {"expire_to_queue": "expdead"}}})
    b = KestrelProcess(root_b, ("memcache",), {
        "default": {"max_memory_size": "1MiB", "default_journal_size": "8KiB",
                    "sync_journal": "5ms", "durable_acks": True}})
    truth_a, truth_b = Truth(), Truth()
    times: dict[str, int] = {}
    copies = Path(tmp_path_factory.mktemp("copies"))
    try:
        a.start()
        b.start()
        c = Memcache(a)
        # a stuck queue: one item, never read
        times["stuck_before"] = _now_ms()
        _set(c, truth_a, "stuck", b"old")
        times["stuck_after"] = _now_ms()
        # expiry: 20 memcache items and 15 thrift items with a 1 s expiry, swept into expdead
        for i in range(20):
            _set(c, truth_a, "exp", b"e%d" % i, exptime=1)
        thrift = BlockingClient(servers=[a.address("thrift")], protocol="thrift")
        try:
            stored = thrift.put("texp", [b"t%d" % i for i in range(15)], expiry=1.0)
            assert len(stored) == 15
        finally:
            thrift.close()
        truth_a["texp"]["enqueued"] += 15
        truth_a["texp"]["bytes_enqueued"] += sum(len(b"t%d" % i) for i in range(15))
        # a fanout: the child exists before the adds, so each add lands in both
        assert c.get("fan+x") is None
        for i in range(10):
            _set(c, truth_a, "fan", b"f%d" % i)
            truth_a["fan+x"]["enqueued"] += 1
            truth_a["fan+x"]["bytes_enqueued"] += len(b"f%d" % i)
        for _ in range(4):
            assert c.get("fan+x") is not None
            truth_a["fan+x"]["dequeued"] += 1
        # reliable reads: confirmed, aborted, and one left open by a client that goes away
        for i in range(10):
            _set(c, truth_a, "rel", b"r%d" % i * 20)
        for i in range(7):
            assert c.get("rel/open") is not None
            truth_a["rel"]["opened"] += 1
            if i < 4:
                c.get("rel/close")
                truth_a["rel"]["confirmed"] += 1
                truth_a["rel"]["dequeued"] += 1
            else:
                c.get("rel/abort")
                truth_a["rel"]["aborted"] += 1
        other = Memcache(a)
        assert other.get("rel/open") is not None
        other.close()  # the server aborts the open read
        truth_a["rel"]["opened"] += 1
        truth_a["rel"]["aborted"] += 1
        # a busy queue, read behind, rotated, packed into the archive
        rng = random.Random(26)
        for _ in range(500):
            if rng.random() < 0.55:
                _set(c, truth_a, "bulk", bytes(rng.randrange(256) for _ in range(200)))
            elif c.get("bulk") is not None:
                truth_a["bulk"]["dequeued"] += 1
        # a queue drained without adds: 40 items, then one read every 50 ms
        for i in range(40):
            _set(c, truth_a, "drain", b"d%d" % i)
        times["drain_added"] = _now_ms()
        time.sleep(1.0)
        for _ in range(40):
            times.setdefault("drain_first_get", _now_ms())
            assert c.get("drain") is not None
            truth_a["drain"]["dequeued"] += 1
            times["drain_last_get_sent"] = _now_ms()
            time.sleep(0.05)
        times["drain_last_get"] = _now_ms()
        deadline = time.monotonic() + 10
        _wait_for_expiry(c, "exp", deadline)
        _wait_for_expiry(c, "texp", deadline)
        for queue, n in (("exp", 20), ("texp", 15)):
            truth_a[queue]["expired"] += n
            truth_a[queue]["dequeued"] += n  # each expiry is a REMOVE
            truth_a["expdead"]["enqueued"] += n
        truth_a["expdead"]["bytes_enqueued"] += (sum(len(b"e%d" % i) for i in range(20))
                                                 + sum(len(b"t%d" % i) for i in range(15)))
        c.close()
        # SIGKILL and restart: nothing acknowledged may be lost or counted twice
        time.sleep(0.05)
        a.kill()
        a.start()
        c = Memcache(a)
        for i in range(5):
            _set(c, truth_a, "rel", b"after%d" % i)
        times["a_last_op_sent"] = _now_ms()
        assert c.get("rel") is not None
        truth_a["rel"]["dequeued"] += 1
        # server B, no archive: a queue emptied (its journal rewritten in place), then added to
        cb = Memcache(b)
        for _ in range(26):
            _set(cb, truth_b, "rw", b"x" * 300)
        for _ in range(26):
            assert cb.get("rw") is not None
            truth_b["rw"]["dequeued"] += 1
        for _ in range(11):
            _set(cb, truth_b, "rw", b"y" * 100)
        cb.close()
        times["last_op"] = _now_ms()
        c.close()
        time.sleep(0.1)  # past the 5 ms sync period
        # copied while running, times kept (cp -a)
        for name, server in (("a", a), ("b", b)):
            shutil.copytree(server.queue_path, copies / name / "live")
        archived = [p.name for p in (root_a / "archive").iterdir()]
        assert any(n.startswith("bulk.") for n in archived), archived
        shutil.copytree(root_a / "archive", copies / "a" / "archive")
        times["copied"] = _now_ms()
    finally:
        for s in (a, b):
            if s.running:
                with contextlib.suppress(Exception):
                    s.stop()
    return {"a": truth_a, "b": truth_b, "times": times, "copies": copies}


def _analyse_local(workload: dict, out: Path) -> dict:
    from kestrel.analytics.local import run_local

    copies = workload["copies"]
    return run_local([("a", str(copies / "a" / "live")), ("b", str(copies / "b" / "live"))],
                     str(out), archives=[("a", str(copies / "a" / "archive"))])


@pytest.fixture(scope="module")
def local(workload: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = Path(tmp_path_factory.mktemp("truth_out"))
    return {"summary": _analyse_local(workload, out), "out": out}


def test_traffic_is_what_the_clients_did(workload: dict, local: dict) -> None:
    """Per queue, live + archive: every count exact; expiries were REMOVEs; the expired
    items arrived in expdead; the fanout child got every add; the abort of a disconnect."""
    servers = local["summary"]["servers"]
    for queue, want in workload["a"].q.items():
        t = servers["a"][queue]["traffic"]
        for k in ("dequeued", "opened", "confirmed", "aborted"):
            assert t[k] == want[k], (queue, k, t[k], want[k])
        assert t["enqueued"] <= want["enqueued"] <= t["enqueued"] + t["enqueued_uncertain"], \
            (queue, t)
        if t["enqueued"] == want["enqueued"]:
            assert t["bytes_enqueued"] == want["bytes_enqueued"], queue
        assert t["history_compacted"] is False, queue


def test_expired_items_are_counted_when_the_sweep_removed_them(workload: dict,
                                                               local: dict) -> None:
    """The sweep's REMOVEs follow an add made before the expiry: they are still dated past it
    (their upper bound), so every expired item counts, over memcache and thrift."""
    servers = local["summary"]["servers"]
    for queue in ("exp", "texp"):
        e = servers["a"][queue]["expiry"]
        want = workload["a"][queue]["expired"]
        assert e["expired_removed"] == want, (queue, e)
        assert e["expired_removed_min"] <= want
        assert e["with_expiry"] == workload["a"][queue]["enqueued"]
    for queue in ("drain", "rel", "fan", "stuck"):
        assert servers["a"][queue]["expiry"]["expired_removed"] == 0, queue


def test_adds_after_an_in_place_rewrite_are_within_the_uncertain_bound(workload: dict,
                                                                       local: dict) -> None:
    """Server B rewrote its emptied queue in place (no archive); the 11 adds after it are
    counted as traffic or as uncertain, never silently as re-emitted items; the state is
    exact and the compaction is said."""
    q = local["summary"]["servers"]["b"]["rw"]
    t = q["traffic"]
    assert t["history_compacted"] is True
    assert t["enqueued"] <= 11 <= t["enqueued"] + t["enqueued_uncertain"], t
    assert q["state"]["items_left"] == 11 and q["state"]["bytes_left"] == 1100


def test_a_stuck_queue_shows_its_true_age_and_is_charted(workload: dict, local: dict) -> None:
    """The stuck queue's oldest item is as old as the server's last record says (not its own
    last record), and the report charts it."""
    times = workload["times"]
    st = local["summary"]["servers"]["a"]["stuck"]["state"]
    assert st["items_left"] == 1
    low = times["a_last_op_sent"] - times["stuck_after"]
    high = times["copied"] - times["stuck_before"] + 50
    assert low <= st["oldest_item_age_ms"] <= high, (st, times)
    page = (local["out"] / "report.html").read_text()
    assert "<h3>a / stuck (oldest item left:" in page


def test_a_drain_without_adds_is_dated_by_its_reads(workload: dict, local: dict) -> None:
    """40 reads after the last add: the window ends at (not before) the last read, the waits'
    upper bounds are not below the true waits, their lower bounds not above."""
    times = workload["times"]
    q = local["summary"]["servers"]["a"]["drain"]
    t = q["traffic"]
    assert times["drain_last_get_sent"] <= t["to_ms"] <= times["copied"] + 50, (t, times)
    waits = q["time_in_queue_ms"]
    # the last item waited at least from the last add to the last read
    assert waits["ub_max"] >= times["drain_last_get_sent"] - times["drain_added"]
    assert waits["lb_max"] <= times["drain_last_get"] - times["stuck_before"]
    flow = _flow(local["out"], "a", "drain")
    assert int(flow["dequeued"].sum()) == 40
    assert int(flow["last_ms"].max()) == t["to_ms"]


def _flow(out: Path, server: str, queue: str) -> object:
    import pyarrow.parquet as pq

    flow = pq.read_table(out / "flow").to_pandas()
    return flow[(flow["server"] == server) & (flow["queue"] == queue)]


def test_state_is_what_the_clients_left(workload: dict, local: dict) -> None:
    """items_left and bytes_left per queue: adds minus what was taken, expired or confirmed."""
    servers = local["summary"]["servers"]
    for queue, want in workload["a"].q.items():
        st = servers["a"][queue]["state"]
        left = want["enqueued"] - want["dequeued"]
        assert st["items_left"] == left, (queue, st, want)
        assert st["open_reads"] == 0


@pytest.mark.spark
def test_spark_engines_agree_with_the_local_engine(workload: dict, local: dict, spark: object,
                                                   tmp_path: Path) -> None:
    """The Spark job, with whole-queue tasks and with binaryFile DataFrames, writes the same
    summary as the local engine on the truth workload."""
    from kestrel.analytics.job import run

    copies = workload["copies"]
    inputs = [("a", str(copies / "a" / "live")), ("b", str(copies / "b" / "live"))]
    archives = [("a", str(copies / "a" / "archive"))]
    want = json.loads(json.dumps(local["summary"]))
    for reader in ("auto", "binaryfile"):
        got = run(spark, inputs, str(tmp_path / reader), archives=archives, reader=reader,
                  report=False)
        got = json.loads(json.dumps(got))
        assert got["servers"] == want["servers"], reader
