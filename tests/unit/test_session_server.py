"""KestrelServer: the context of sessions (reload, shutdown requests, sessions, limits)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.config import load_config
from kestrel.errors import ConfigError
from kestrel.server import KestrelServer
from kestrel.status import Status


def write_config(tmp_path: Path, extra: str = "") -> Path:
    """Write a config file for a server under C{tmp_path}; return its path."""
    path = tmp_path / "kestrel.yaml"
    path.write_text(f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
                    f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
                    "expiration_timer_frequency: null\n" + extra)
    return path


@contextmanager
def started_from(path: Path, clock: Clock) -> Iterator[KestrelServer]:
    """A server built from the config file at C{path}, started, and stopped on leaving."""
    server = KestrelServer.from_config(load_config(path), clock)
    server.collection.startService()
    try:
        yield server
    finally:
        server.collection.stopService()


@pytest.fixture
def file_server(tmp_path: Path, clock: Clock):
    """A started server built from a config file it can reload."""
    path = write_config(tmp_path, "queues:\n  starship: {max_items: 100}\n")
    server = KestrelServer.from_config(load_config(path), clock, config_path=path)
    server.collection.startService()
    yield server, path
    if server.collection.running:
        server.collection.stopService()


def test_reload_rereads_the_file(file_server, tmp_path: Path) -> None:
    """reload() applies the file's new default, queues and aliases to existing queues."""
    server, path = file_server
    server.collection.queue("starship")
    server.collection.queue("weather_updates")
    write_config(tmp_path, "default: {max_items: 9999}\nqueues:\n  starship: {max_items: 50}\n"
                           "aliases:\n  wx: [weather_updates]\nmax_open_transactions: 7\n")
    server.reload()
    assert server.collection.queue("starship").config.max_items == 50
    assert server.collection.queue("weather_updates").config.max_items == 9999
    assert server.collection.alias_names() == ["wx"]
    assert server.config.default.max_items == 9999
    # server-level settings need a restart
    assert server.config.max_open_transactions == 1
    assert server.max_open_transactions == 1


def test_reload_warns_about_server_keys_needing_restart(file_server, tmp_path: Path) -> None:
    """
    A reload whose file changes server-level keys logs one warning naming
    exactly those keys, in field order; the keys keep their old values.
    """
    server, _ = file_server
    write_config(tmp_path, "max_open_transactions: 7\nmemcache_port: 1234\n")
    with capturedLogs() as events:
        server.reload()
    warnings = [e for e in events if e["log_level"] == LogLevel.warn]
    assert [e["keys"] for e in warnings] == ["memcache_port, max_open_transactions"]
    assert "need a restart" in warnings[0]["log_format"]
    assert (server.config.memcache_port, server.config.max_open_transactions) == (22133, 1)


def test_reload_of_queue_settings_only_warns_nothing(file_server, tmp_path: Path) -> None:
    """A reload that changes only default, queues and aliases logs no restart warning."""
    server, _ = file_server
    write_config(tmp_path, "default: {max_items: 5}\n")
    with capturedLogs() as events:
        server.reload()
    assert [e for e in events if e["log_level"] == LogLevel.warn] == []
    assert server.config.default.max_items == 5


def test_broken_reload_keeps_old_config(file_server, tmp_path: Path) -> None:
    """A broken file raises ConfigError naming the problem; nothing changes."""
    server, path = file_server
    server.collection.queue("starship")
    old = server.config
    path.write_text("queues:\n  starship: {max_items: lots}\n")
    with pytest.raises(ConfigError) as e:
        server.reload()
    assert "max_items" in str(e.value)
    assert server.config is old
    assert server.collection.queue("starship").config.max_items == 100


def test_missing_file_on_reload_is_a_config_error(file_server) -> None:
    """A config file that vanished is reported as a ConfigError naming the path."""
    server, path = file_server
    path.unlink()
    with pytest.raises(ConfigError) as e:
        server.reload()
    assert str(path) in str(e.value)


def test_request_shutdown_calls_the_service_layer(file_server) -> None:
    """request_shutdown() calls the callback the service layer set (and is harmless without)."""
    server, _ = file_server
    server.request_shutdown()  # no callback yet: only logged
    calls: list[str] = []
    server.shutdown_callback = lambda: calls.append("stop")
    server.request_shutdown()
    assert calls == ["stop"]


def test_sessions_get_distinct_ids_and_are_counted(file_server) -> None:
    """Each session has its own id; connections are counted while alive."""
    server, _ = file_server

    class FakeProtocolName:
        """Stands for a protocol instance handed to new_session."""

    a = server.new_session(FakeProtocolName())
    b = server.new_session("thrift")
    assert a.session_id != b.session_id
    assert a.protocol_name == "FakeProtocolName"
    assert server.stats.curr_connections == 2
    a.finish()
    assert server.stats.curr_connections == 1
    assert server.stats.total_connections == 2


def test_status_and_collection_wiring(file_server, tmp_path: Path) -> None:
    """The server's status is the one the collection consults at stop; the status file is used."""
    server, _ = file_server
    assert server.collection.status is server.status
    assert server.stats is server.collection.stats
    server.status.set_status("readonly")
    assert (tmp_path / "status").read_text() == "ReadOnly\n"
    assert server.status.status is Status.READ_ONLY


# -- reports protocols send


def test_report_values(clock: Clock, tmp_path: Path) -> None:
    """
    stats_entries, dump_stats and dump_config give the reports as values:
    every queue (then alias) by default, the names asked for otherwise.
    """
    path = write_config(tmp_path, "queues:\n  jobs: {max_items: 7}\naliases:\n  al: [jobs]\n")
    with started_from(path, clock) as server:
        server.collection.add("jobs", b"abc")
        entries = dict(server.stats_entries())
        assert entries["curr_items"] == "1"
        assert entries["queue_jobs_items"] == "1"
        assert entries["queue_al_put_items"] == "0"
        assert [name for name, _ in server.dump_stats()] == ["jobs", "al"]
        assert dict(server.dump_stats(["jobs"])[0][1])["items"] == "1"
        assert server.dump_stats(["nope"]) == [("nope", [])]
        [(name, lines)] = server.dump_config()
        assert name == "jobs"
        assert "max_items=7" in lines
        assert server.dump_config(["other"])[0][0] == "other"


def test_delete_queue_forgets_its_metrics(clock: Clock, tmp_path: Path) -> None:
    """delete_queue deletes the queue and drops its per-queue histograms."""
    with started_from(write_config(tmp_path), clock) as server:
        server.collection.add("jobs", b"abc")
        server.metrics.queue("jobs").set_latency_usec.add(5)
        server.delete_queue("jobs")
        assert server.collection.queue("jobs", create=False) is None
        assert server.metrics.queue_names() == []


def test_queues_report_into_their_metrics(clock: Clock, tmp_path: Path) -> None:
    """Each queue of from_config records its sizes into metrics.queue(name)."""
    with started_from(write_config(tmp_path), clock) as server:
        server.collection.add("jobs", b"abcde")
        server.collection.add("jobs", b"xy")
        queue_metrics = server.metrics.queue("jobs")
        assert server.collection.queue("jobs").observer is queue_metrics
        assert (queue_metrics.request_size.count, queue_metrics.request_size.total) == (2, 7)
        assert queue_metrics.queue_size.maximum == 2


def test_age_sweep_drops_the_queues_metrics(clock: Clock, tmp_path: Path) -> None:
    """
    A queue deleted by the max_queue_age sweep loses its q/<name>/ histograms:
    created again under that name, it starts from zero; the global sums keep
    what it recorded.
    """
    path = write_config(tmp_path, "queues:\n  temp: {max_queue_age: 5s}\n")
    path.write_text(path.read_text().replace("expiration_timer_frequency: null",
                                              "expiration_timer_frequency: 1s"))
    with started_from(path, clock) as server:
        server.collection.add("temp", b"abc")
        session = server.new_session("test")
        session.get_item("temp", None, False, False)
        server.metrics.record_set("temp", 40)
        old = server.metrics.queue("temp")
        assert (old.request_size.count, old.get_hit_latency_usec.count) == (1, 1)
        clock.advance(6)
        assert server.collection.queue("temp", create=False) is None
        assert "temp" not in server.metrics.queue_names()
        # What it recorded stays in the global sums.
        assert server.metrics.set_latency_usec.count == 1
        assert server.metrics.get_hit_latency_usec.count == 1
        server.collection.add("temp", b"again")
        fresh = server.metrics.queue("temp")
        assert (fresh.request_size.count, fresh.set_latency_usec.count) == (1, 0)
        assert fresh.get_hit_latency_usec.count == 0
        session.finish()
