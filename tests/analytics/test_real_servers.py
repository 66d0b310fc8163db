"""
The analysis of journals written by real server processes, against a client-side log.

Two servers run as processes with small journal and memory limits and an
archive folder, so that their queues rotate, read behind, pack and rewrite;
one is killed with SIGKILL and restarted half-way. Clients talk memcache and
log every operation the server acknowledged. The live + archive recipe must
give exactly the client traffic per queue, the live folders alone must say
that history was compacted, and the state must be what the clients left.
The one-process engine runs the analysis (its tables equal the Spark job's,
see test_job_spark.py).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
from tests.wire.conftest import KestrelProcess, start_on_free_ports  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = {
    "archive_path": None,  # set per server
    "default": {"max_memory_size": "4KiB", "default_journal_size": "8KiB",
                "max_journal_size": "24KiB", "min_journal_compact_delay": None,
                "sync_journal": "5ms", "durable_acks": True},
}


class Log:
    """What the clients did, as the servers acknowledged it, per (server, queue)."""

    def __init__(self) -> None:
        self.q: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict(
            enqueued=0, dequeued=0, opened=0, confirmed=0, aborted=0, bytes_enqueued=0,
            bytes_out=0))


class Memcache:
    """A minimal blocking memcache client (Kestrel's reply keys omit the /open suffixes)."""

    def __init__(self, server: KestrelProcess) -> None:
        self.sock = server.connect("memcache", timeout=30)
        self.buf = b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "server closed the connection"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "server closed the connection"
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def set(self, key: str, data: bytes, noreply: bool = False) -> bool:
        self.sock.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(data), data))
        return self._line() == b"STORED"

    def get(self, key: str) -> bytes | None:
        self.sock.sendall(b"get %s\r\n" % key.encode())
        line = self._line()
        if line == b"END":
            return None
        assert line.startswith(b"VALUE "), line
        data = self._exactly(int(line.split()[3]) + 2)[:-2]
        assert self._line() == b"END"
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _client(server: KestrelProcess) -> Memcache:
    return Memcache(server)


def _work(server: KestrelProcess, name: str, log: Log, rng: random.Random, steps: int) -> None:
    """Drive three queues: a backlog read behind (packs), a churning one (rewrites), and
    a stuck one nobody reads; every open read is closed or aborted before returning."""
    c = _client(server)
    try:
        for _ in range(steps):
            queue = rng.choice(["backlog", "backlog", "churn", "churn", "stuck"])
            q = log.q[(name, queue)]
            r = rng.random()
            add_p = {"backlog": 0.55, "churn": 0.5, "stuck": 1.0}[queue]
            if r < add_p:
                data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 50, 200, 400])))
                if queue == "stuck" and q["enqueued"] >= 5:
                    continue
                assert c.set(queue, data, noreply=False)
                q["enqueued"] += 1
                q["bytes_enqueued"] += len(data)
            elif r < add_p + (1 - add_p) / 2:
                got = c.get(queue)
                if got is not None:
                    q["dequeued"] += 1
                    q["bytes_out"] += len(got)
            else:
                got = c.get(f"{queue}/open")
                if got is None:
                    continue
                q["opened"] += 1
                if rng.random() < 0.7:
                    c.get(f"{queue}/close")
                    q["confirmed"] += 1
                    q["dequeued"] += 1
                    q["bytes_out"] += len(got)
                else:
                    c.get(f"{queue}/abort")
                    q["aborted"] += 1
    finally:
        c.close()


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    rng = random.Random(16)
    log = Log()
    servers = {}
    for name in ("k1", "k2"):
        root = Path(tmp_path_factory.mktemp(name))
        config = {**CONFIG, "archive_path": str(root / "archive")}
        servers[name] = KestrelProcess(root, ("memcache",), config)
    try:
        for s in servers.values():
            start_on_free_ports(s)
        for name, s in servers.items():
            _work(s, name, log, rng, 700)
        servers["k1"].kill()  # SIGKILL: no clean close
        servers["k1"].start()
        for name, s in servers.items():
            _work(s, name, log, rng, 700)
    finally:
        for s in servers.values():
            if s.running:
                s.stop()
    return {"log": log, "servers": servers}


@pytest.fixture(scope="module")
def analysed(workload: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from kestrel.analytics.local import run_local

    servers = workload["servers"]
    live = [(n, str(s.queue_path)) for n, s in servers.items()]
    archives = [(n, str(s.root / "archive")) for n, s in servers.items()]
    recipe = run_local(live, str(tmp_path_factory.mktemp("recipe")), archives=archives)
    alone = run_local(live, str(tmp_path_factory.mktemp("alone")), report=False)
    return {"recipe": recipe, "alone": alone}


def test_the_workload_rotated_packed_and_rewrote(workload: dict) -> None:
    """The servers really compacted: packs and rewrites moved files into the archives."""
    for s in workload["servers"].values():
        archived = os.listdir(s.root / "archive")
        assert len([n for n in archived if n.startswith("backlog.")]) >= 3, archived
        assert any(n.startswith("churn.") for n in archived), archived


def test_live_plus_archive_traffic_equals_the_client_log(workload: dict,
                                                         analysed: dict) -> None:
    """Per queue, enqueued, dequeued, opened, confirmed, aborted and bytes are exactly what
    the clients did, once each, although packs and rewrites re-emitted items and fillers."""
    servers = analysed["recipe"]["servers"]
    compacted = 0
    for (server, queue), want in workload["log"].q.items():
        got = servers[server][queue]
        for k in ("dequeued", "opened", "confirmed", "aborted"):
            assert got["traffic"][k] == want[k], (server, queue, k)
        # an add that triggers a rewrite follows its snapshot with an earlier add time: it
        # cannot be told from the re-emitted items, and the summary says how many may hide
        missed = want["enqueued"] - got["traffic"]["enqueued"]
        assert 0 <= missed <= got["traffic"]["enqueued_uncertain"], (server, queue)
        if missed == 0:
            assert got["traffic"]["bytes_enqueued"] == want["bytes_enqueued"]
        assert got["traffic"]["history_compacted"] is False, (server, queue)
        compacted += got["snapshot"]["records"] > 0
    assert compacted >= 2  # snapshots were there, and were not counted as traffic


def test_state_is_what_the_clients_left(workload: dict, analysed: dict) -> None:
    """items_left and bytes_left are the clients' adds minus what they took, per queue."""
    for mode in ("recipe", "alone"):
        servers = analysed[mode]["servers"]
        for (server, queue), want in workload["log"].q.items():
            st = servers[server][queue]["state"]
            assert st["items_left"] == want["enqueued"] - want["dequeued"], (mode, queue)
            assert st["bytes_left"] == want["bytes_enqueued"] - want["bytes_out"], (mode, queue)
            assert st["open_reads"] == 0
    stuck = analysed["recipe"]["servers"]["k1"]["stuck"]["state"]
    assert stuck["oldest_item_age_ms"] > 0


def test_live_folders_alone_say_history_was_compacted(workload: dict, analysed: dict) -> None:
    """Without the archive, a packed queue's traffic covers only the window after its oldest
    snapshot, and the summary says so; it never counts more than the clients did."""
    servers = analysed["alone"]["servers"]
    flagged = 0
    for (server, queue), want in workload["log"].q.items():
        t = servers[server][queue]["traffic"]
        for k in ("enqueued", "dequeued", "opened", "confirmed", "aborted"):
            assert t[k] <= want[k], (server, queue, k)
        if t["history_compacted"]:
            flagged += 1
            assert t["compacted_before_ms"] == t["from_ms"]
        else:
            assert 0 <= want["enqueued"] - t["enqueued"] <= t["enqueued_uncertain"]
    assert flagged >= 2
