"""The admin HTTP interface of a real server process, with a real HTTP client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock

from kestrel.admin import prometheus_text, stats_report
from kestrel.config import parse_config
from kestrel.server import KestrelServer
from tests.wire.conftest import KestrelProcess, LineClient

PERCENTILE_KEYS = {"count", "minimum", "maximum", "average", "p50", "p90", "p95", "p99",
                   "p999", "p9999"}


def http(server: KestrelProcess, path: str, method: str = "GET",
         data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """One request; an empty body is sent as none (no form content type)."""
    url = f"http://{server.host}:{server.ports['admin']}{path}"
    request = urllib.request.Request(url, data=data or None, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read(), reply.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def memcache(server: KestrelProcess, *commands: bytes) -> list[bytes]:
    client = LineClient(server.connect())
    replies = []
    try:
        for command in commands:
            client.send(command)
            replies.append(client.until(b"END\r\n") if command.startswith(b"get")
                           else client.line())
    finally:
        client.close()
    return replies


@pytest.fixture(scope="module")
def admin(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"aliases": {"both": ["jobs"]}})
    memcache(server, b"set jobs 0 0 5\r\nhello\r\n", b"set jobs 0 0 3\r\nabc\r\n",
             b"set other 0 0 1\r\nx\r\n", b"get jobs\r\n", b"get empty\r\n",
             b"set both 0 0 2\r\nhi\r\n")
    return server


def test_ping(admin: KestrelProcess) -> None:
    """GET /ping answers pong."""
    assert http(admin, "/ping")[:2] == (200, b"pong\n")


def test_stats_json_has_ostrichs_shape(admin: KestrelProcess) -> None:
    """/stats.json holds counters, gauges, labels and metrics, with per-queue q/<name>/ names."""
    code, body, ctype = http(admin, "/stats.json")
    assert code == 200 and ctype == "application/json"
    doc = json.loads(body)
    assert set(doc) == {"counters", "gauges", "labels", "metrics"}
    counters, gauges = doc["counters"], doc["gauges"]
    assert counters["cmd_set"] == 4
    assert counters["get_hits"] == 1 and counters["get_misses"] == 1
    assert counters["q/jobs/put_items"] == 3
    assert counters["q/jobs/put_bytes"] == 10
    assert counters["q/jobs/get_items_hit"] == 1
    assert counters["q/both/put_items"] == 1  # the alias
    assert gauges["q/jobs/items"] == 2 and gauges["q/jobs/bytes"] == 5
    assert gauges["q/other/items"] == 1
    assert gauges["q/jobs/max_items"] == 2**31 - 1
    assert gauges["q/jobs/journal_size"] > 0
    for name in ("mem_items", "mem_bytes", "age_msec", "waiters", "open_transactions",
                 "create_time", "max_bytes"):
        assert f"q/jobs/{name}" in gauges
    assert gauges["items"] == 3 and gauges["status/readable"] == 1.0
    assert doc["labels"]["status"] == "Up" and doc["labels"]["version"]
    for name in ("set_latency_usec", "fsync_delay_usec", "delivery_latency_msec"):
        assert set(doc["metrics"][name]) == PERCENTILE_KEYS


def test_prometheus_metrics_parse(admin: KestrelProcess) -> None:
    """/metrics is valid Prometheus text with per-queue series and an fsync histogram."""
    code, body, ctype = http(admin, "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("kestrel_queue_items", (("queue", "jobs"),))] == 2
    assert samples[("kestrel_queue_bytes", (("queue", "jobs"),))] == 5
    assert samples[("kestrel_queue_adds_total", (("queue", "jobs"),))] == 3
    assert samples[("kestrel_queue_removes_total", (("queue", "jobs"),))] == 1
    assert samples[("kestrel_queue_open_transactions", (("queue", "jobs"),))] == 0
    assert samples[("kestrel_queue_expirations_total", (("queue", "other"),))] == 0
    assert families["kestrel_fsync_delay_seconds"].type == "histogram"
    assert ("kestrel_fsync_delay_seconds_bucket", (("le", "+Inf"),)) in samples
    assert samples[("kestrel_status", (("status", "Up"),))] == 1


def test_status_get_and_post(admin: KestrelProcess) -> None:
    """POST /status sets the status (reads still work in ReadOnly, writes do not); GET reports."""
    assert http(admin, "/status")[:2] == (200, b"UP\n")
    assert http(admin, "/status?status=readonly", "POST", b"")[:2] == (200, b"READONLY\n")
    assert http(admin, "/status")[1] == b"READONLY\n"
    assert memcache(admin, b"get other\r\n") == [b"VALUE other 0 1\r\nx\r\nEND\r\n"]
    code, body, _ = http(admin, "/status?status=bogus", "POST", b"")
    assert code == 400 and b"bogus" in body
    assert http(admin, "/status?status=down", "POST", b"")[0] == 400
    assert http(admin, "/status", "POST", b"")[0] == 400
    assert http(admin, "/status?status=up", "POST", b"")[:2] == (200, b"UP\n")
    assert memcache(admin, b"set other 0 0 1\r\ny\r\n") == [b"STORED\r\n"]


def test_commands_are_post_only(admin: KestrelProcess) -> None:
    """GET on a command path is refused with 405; unknown paths are 404."""
    for path in ("/quiesce", "/reload", "/shutdown"):
        assert http(admin, path)[0] == 405
    assert http(admin, "/nope")[0] == 404


def test_quiesce_and_reload(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """POST /quiesce refuses reads and writes; /reload applies a good file, rejects a bad one."""
    server = kestrel_factory(protocols=("memcache", "admin"))
    assert http(server, "/quiesce", "POST", b"")[:2] == (200, b"QUIESCENT\n")
    assert memcache(server, b"status\r\n") == [b"QUIESCENT\r\n"]
    assert http(server, "/status?status=up", "POST", b"")[0] == 200

    server.write_config({"aliases": {"fresh": ["jobs"]}})
    assert http(server, "/reload", "POST", b"")[:2] == (200, b"Reloaded config.\n")
    assert memcache(server, b"set fresh 0 0 1\r\nz\r\n") == [b"STORED\r\n"]
    assert json.loads(http(server, "/stats.json")[1])["counters"]["q/fresh/put_items"] == 1

    server.config_path.write_text("default: {max_items: [not a number]}\n")
    code, body, _ = http(server, "/reload", "POST", b"")
    assert code == 400 and b"max_items" in body
    assert http(server, "/ping")[1] == b"pong\n"  # and it lives on


def test_shutdown_stops_the_server(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """POST /shutdown answers, then the server exits cleanly."""
    server = kestrel_factory(protocols=("memcache", "admin"))
    memcache(server, b"set kept 0 0 4\r\nsafe\r\n")
    assert http(server, "/shutdown", "POST", b"")[:2] == (200, b"Shutting down.\n")
    assert server.wait_exit() == 0
    server.start()
    assert memcache(server, b"get kept\r\n") == [b"VALUE kept 0 4\r\nsafe\r\nEND\r\n"]


# -- report builders on an in-process server with recorded latencies


@pytest.fixture
def live_server(tmp_path: Path) -> Any:
    clock = Clock()
    clock.advance(1_767_225_600)
    config = parse_config(f"queue_path: {tmp_path / 'q'}\nstatus_file: {tmp_path / 'st'}\n")
    server = KestrelServer.from_config(config, clock)
    server.collection.startService()
    yield server
    server.collection.stopService()


def test_reports_include_recorded_latencies(live_server: Any) -> None:
    """Recorded fsync delays appear in /stats.json percentiles and the Prometheus histogram."""
    metrics = live_server.metrics
    for usec in (200, 400, 800, 3000, 120_000):
        metrics.fsync_delay_usec.add(usec)
    live_server.collection.add("jobs", b"abc")
    metrics.queue("jobs").set_latency_usec.add(50)
    metrics.queue("gone").set_latency_usec.add(50)

    report = stats_report(live_server)
    fsync = report["metrics"]["fsync_delay_usec"]
    assert (fsync["count"], fsync["minimum"], fsync["maximum"]) == (5, 200, 120_000)
    assert 700 <= fsync["p50"] <= 900
    assert report["metrics"]["q/jobs/set_latency_usec"]["count"] == 1
    assert "q/gone/set_latency_usec" not in report["metrics"]  # not a live queue

    families = {f.name: f for f in
                text_string_to_metric_families(prometheus_text(live_server).decode())}
    buckets = {s.labels["le"]: s.value
               for s in families["kestrel_fsync_delay_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets["0.00025"] == 1
    assert buckets["0.001"] == 3
    assert buckets["0.005"] == 4
    assert buckets["0.25"] == buckets["+Inf"] == 5
    total = [s.value for s in families["kestrel_fsync_delay_seconds"].samples
             if s.name.endswith("_sum")][0]
    assert total == pytest.approx(0.1244)


# -- latency metrics recorded by real traffic


def test_real_traffic_records_latencies(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    After sets, hits, misses, a timed-out blocking get and fsynced writes on a
    real server, /stats.json and /metrics report non-zero latency distributions.
    """
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"queues": {"synced": {"sync_journal": "always"}}})
    memcache(server, b"set jobs 0 0 5\r\nhello\r\n", b"set synced 0 0 2\r\nok\r\n",
             b"get jobs\r\n", b"get jobs\r\n", b"get jobs/t=20\r\n", b"get synced\r\n")

    code, body, _ = http(server, "/stats.json")
    assert code == 200
    metrics = json.loads(body)["metrics"]
    for name in ("set_latency_usec", "q/jobs/set_latency_usec", "q/synced/set_latency_usec"):
        assert metrics[name]["count"] >= 1 and metrics[name]["maximum"] > 0, name
    assert metrics["get_hit_latency_usec"]["count"] == 2
    assert metrics["get_hit_latency_usec"]["maximum"] > 0
    assert metrics["get_miss_latency_usec"]["count"] == 1
    assert metrics["delivery_latency_msec"]["count"] == 2
    assert metrics["q/jobs/delivery_latency_msec"]["count"] == 1
    timeout = metrics["get_timeout_msec"]
    assert timeout["count"] == 1 and timeout["minimum"] >= 20
    assert metrics["fsync_delay_usec"]["count"] >= 1
    assert metrics["fsync_delay_usec"]["maximum"] > 0
    assert metrics["item_fsync_delay_usec"]["count"] >= 1

    code, body, _ = http(server, "/metrics")
    assert code == 200
    samples = {s.name: s.value for family in text_string_to_metric_families(body.decode())
               for s in family.samples if not s.labels.get("le")}
    for base in ("set_latency", "get_hit_latency", "get_miss_latency", "delivery_latency",
                 "get_timeout", "fsync_delay", "item_fsync_delay"):
        assert samples[f"kestrel_{base}_seconds_count"] >= 1, base
    assert samples["kestrel_set_latency_seconds_sum"] > 0
    assert samples["kestrel_fsync_delay_seconds_sum"] > 0
    assert samples["kestrel_get_timeout_seconds_sum"] >= 0.02


# -- per-queue journal and size metrics recorded by real traffic


def test_journal_maintenance_metrics(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    With a small max_memory_size, sets rotate the journal and drop the queue
    to read-behind, and gets refill it: /stats.json reports non-zero
    q/<name>/journal_rotation_usec and fill_readbehind_usec, and the
    request_size and queue_size distributions of the traffic.
    """
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"default": {"max_memory_size": 1024}})
    payload = b"p" * 200
    memcache(server, *[b"set big 0 0 200\r\n" + payload + b"\r\n"] * 20)
    replies = memcache(server, *[b"get big\r\n"] * 20)
    assert replies == [b"VALUE big 0 200\r\n" + payload + b"\r\nEND\r\n"] * 20

    code, body, _ = http(server, "/stats.json")
    assert code == 200
    doc = json.loads(body)
    rotations = doc["counters"]["q/big/journal_rotations"]
    assert rotations >= 1
    metrics = doc["metrics"]
    rotation = metrics["q/big/journal_rotation_usec"]
    assert rotation["count"] == rotations and rotation["maximum"] > 0
    fill = metrics["q/big/fill_readbehind_usec"]
    assert fill["count"] >= 1 and fill["maximum"] > 0
    request = metrics["q/big/request_size"]
    assert (request["count"], request["minimum"], request["maximum"]) == (20, 200, 200)
    assert metrics["q/big/queue_size"]["count"] == 40
    assert metrics["q/big/queue_size"]["maximum"] <= 1024 // 200 + 1  # memory stays bounded
    for name in ("journal_rewrite_usec", "tx_map_size", "tx_expire_list_size"):
        assert set(metrics[f"q/big/{name}"]) == PERCENTILE_KEYS


def test_deleted_queue_metrics_are_gone(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """A client delete drops q/<name>/ metrics; the queue set again starts afresh."""
    server = kestrel_factory(protocols=("memcache", "admin"))
    memcache(server, b"set doomed 0 0 3\r\nabc\r\n", b"set doomed 0 0 3\r\ndef\r\n")
    metrics = json.loads(http(server, "/stats.json")[1])["metrics"]
    assert metrics["q/doomed/request_size"]["count"] == 2
    assert memcache(server, b"delete doomed\r\n") == [b"DELETED\r\n"]
    metrics = json.loads(http(server, "/stats.json")[1])["metrics"]
    assert not [name for name in metrics if name.startswith("q/doomed/")]
    memcache(server, b"set doomed 0 0 1\r\nx\r\n")
    metrics = json.loads(http(server, "/stats.json")[1])["metrics"]
    assert metrics["q/doomed/request_size"]["count"] == 1
    assert metrics["q/doomed/set_latency_usec"]["count"] == 1


def test_report_records_agree_with_dump_stats(live_server: Any) -> None:
    """The typed queue and server records carry the numbers DUMP_STATS and STATS print."""
    import attrs

    from kestrel.stats import QueueReport, ServerReport

    collection = live_server.collection
    for data in (b"one", b"three"):
        collection.add("jobs", data)
    collection.queue("jobs").remove(open_read=True)
    live_server.reload()  # no config file: the config is kept
    (queue,) = live_server.queue_reports()
    assert isinstance(queue, QueueReport)
    dumped = dict(live_server.dump_stats(["jobs"])[0][1])
    assert (queue.name, queue.items, queue.bytes, queue.open_transactions) == ("jobs", 1, 5, 1)
    assert str(queue.mem_items) == dumped["mem_items"]
    assert str(queue.waiters) == dumped["waiters"]
    assert str(queue.age_ms) == dumped["age"]
    assert queue.journal_bytes >= int(dumped["logsize"]) > 0
    assert queue.counters["put_items"] == 2 and queue.counters["transactions"] == 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        queue.items = 0  # type: ignore[misc]
    state = live_server.server_report()
    assert isinstance(state, ServerReport)
    entries = dict(live_server.stats_entries())
    assert (str(state.items), str(state.bytes)) == (entries["curr_items"], entries["bytes"])
    assert state.status == "Up" and state.readable == state.writeable == 1
    assert live_server.stats_text().startswith("STAT uptime ")
    assert live_server.dump_config_text(["jobs"]).startswith("queue 'jobs' {\r\n  max_items=")
