"""
QueueCollection against the real queue, journal and config classes.

Time is a L{Clock}; journals live in a temporary directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from kestrel.collection import QueueCollection
from kestrel.config import ServerConfig, parse_config
from kestrel.errors import ConfigError, InvalidQueueName, ShuttingDown
from kestrel.item import QItem
from kestrel.metrics import QueueMetrics
from kestrel.status import ServerStatus
from tests.support import ManualThread


def make_config(tmp_path: Path, extra: str = "") -> ServerConfig:
    """A config whose queues live under C{tmp_path/queues}, with the sweep off unless set."""
    text = (f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
            f"status_file: {json.dumps(str(tmp_path / 'status'))}\n")
    if "expiration_timer_frequency" not in extra:
        text += "expiration_timer_frequency: null\n"
    return parse_config(text + extra)


def result_of(d: Deferred) -> object:
    """The result of a Deferred that must already have fired."""
    box: list[object] = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    return box[0]


def take(collection: QueueCollection, name: str, **kwargs: object) -> bytes | None:
    """Remove the head of C{name} at once and return its data (None if empty)."""
    item = result_of(collection.remove(name, **kwargs))
    assert item is None or isinstance(item, QItem)
    return None if item is None else item.data


def drain(collection: QueueCollection, name: str) -> list[bytes]:
    """Remove every item of C{name}, returning their data in order."""
    out = []
    while (data := take(collection, name)) is not None:
        out.append(data)
    return out


def files(tmp_path: Path) -> set[str]:
    """Names of the files in the queue directory."""
    return set(os.listdir(tmp_path / "queues"))


@pytest.fixture
def started(tmp_path: Path, clock: Clock):
    """Build and start a collection from extra YAML; stop them all at the end."""
    made: list[QueueCollection] = []

    def start(extra: str = "", **kwargs: object) -> QueueCollection:
        collection = QueueCollection(make_config(tmp_path, extra), clock, **kwargs)
        collection.startService()
        made.append(collection)
        return collection

    yield start
    for collection in made:
        if collection.running:
            collection.stopService()


# -- queue directory -----------------------------------------------------------


def test_creates_missing_queue_path(tmp_path: Path, clock: Clock) -> None:
    """The queue directory is created (with parents) if it is missing."""
    config = parse_config(f"queue_path: {json.dumps(str(tmp_path / 'a' / 'b'))}\n"
                          f"status_file: {json.dumps(str(tmp_path / 'status'))}\n")
    QueueCollection(config, clock)
    assert (tmp_path / "a" / "b").is_dir()


def test_queue_path_that_is_a_file_is_refused(tmp_path: Path, clock: Clock) -> None:
    """A queue path that is not a directory is a config error naming queue_path."""
    (tmp_path / "queues").write_bytes(b"not a directory")
    with pytest.raises(ConfigError) as e:
        QueueCollection(make_config(tmp_path), clock)
    assert "queue_path" in str(e.value)


# -- basic operations ----------------------------------------------------------


def test_add_then_remove_counts_global_stats(started) -> None:
    """Items come out in order; total_items, get_hits and get_misses count."""
    c = started()
    assert result_of(c.add("q", b"one")) is True
    assert result_of(c.add("q", b"two")) is True
    assert drain(c, "q") == [b"one", b"two"]
    assert c.stats.total_items == 2
    assert c.stats.get_hits == 2
    assert c.stats.get_misses == 1
    assert c.stats.queue_creates == 1
    assert c.current_items() == 0


def test_first_reference_creates_queue_and_journal(started, tmp_path: Path) -> None:
    """A read of a missing queue creates it, with its journal file."""
    c = started()
    assert take(c, "fresh") is None
    assert c.queue_names() == ["fresh"]
    assert "fresh" in files(tmp_path)


def test_queue_without_create_does_not_create(started, tmp_path: Path) -> None:
    """queue(name, create=False) of a missing queue is None and touches nothing."""
    c = started()
    assert c.queue("nothing", create=False) is None
    assert c.queue_names() == []
    assert files(tmp_path) == set()


def test_peek_leaves_the_item(started) -> None:
    """A peek returns the head without removing it."""
    c = started()
    c.add("q", b"x")
    assert result_of(c.remove("q", peek=True)).data == b"x"
    assert c.current_items() == 1


def test_blocking_remove_is_woken_by_add(started, clock: Clock) -> None:
    """A remove with a deadline waits for the next add."""
    c = started()
    d = c.remove("q", deadline=clock.seconds() + 5)
    assert not d.called
    c.add("q", b"late")
    assert result_of(d).data == b"late"


def test_blocking_remove_times_out(started, clock: Clock) -> None:
    """A remove with a deadline fires None when nothing arrives in time."""
    c = started()
    d = c.remove("q", deadline=clock.seconds() + 1)
    clock.advance(2)
    assert result_of(d) is None


def test_transactional_remove_unremove_and_confirm(started) -> None:
    """An aborted open read returns to the head; a confirmed one is gone."""
    c = started()
    c.add("q", b"a")
    c.add("q", b"b")
    item = result_of(c.remove("q", open_read=True))
    assert item.data == b"a" and item.xid != 0
    c.unremove("q", item.xid)
    item = result_of(c.remove("q", open_read=True))
    assert item.data == b"a"
    c.confirm_remove("q", item.xid)
    assert drain(c, "q") == [b"b"]


def test_unremove_on_missing_queue_creates_nothing(started, tmp_path: Path) -> None:
    """Abort and confirm on a queue that does not exist are no-ops."""
    c = started()
    c.unremove("ghost", 1)
    c.confirm_remove("ghost", 1)
    assert c.queue_names() == []
    assert files(tmp_path) == set()


# -- discovery and replay ----------------------------------------------------------


def test_replay_across_restart(started, tmp_path: Path, clock: Clock) -> None:
    """Queues found in the directory at start are replayed with their items and open reads."""
    c = started()
    for data in (b"a", b"b", b"c"):
        c.add("jobs", data)
    c.add("other", b"z")
    open_item = result_of(c.remove("jobs", open_read=True))
    assert open_item.data == b"a"
    result_of(c.stopService())

    c2 = started()
    assert sorted(c2.queue_names()) == ["jobs", "other"]
    # the open read came back to the head
    assert drain(c2, "jobs") == [b"a", b"b", b"c"]
    assert drain(c2, "other") == [b"z"]
    assert c2.stats.total_items == 0  # replayed adds are not client adds


def test_replay_skips_files_with_invalid_names(started, tmp_path: Path) -> None:
    """A stray file whose name may not name a queue is ignored at start."""
    (tmp_path / "queues").mkdir()
    (tmp_path / "queues" / "bad name").write_bytes(b"")
    c = started()
    assert c.queue_names() == []


def test_replay_registers_fanout_children(started) -> None:
    """After a restart, a fanout child found on disk receives its master's adds."""
    c = started()
    c.queue("feed+mobile")
    result_of(c.stopService())
    c2 = started()
    assert c2.fanout_children("feed") == ["feed+mobile"]
    c2.add("feed", b"news")
    assert drain(c2, "feed+mobile") == [b"news"]


# -- fanout ------------------------------------------------------------------------


def test_fanout_child_gets_later_adds_only(started) -> None:
    """Existing master items are not copied; adds after the child exists are."""
    c = started()
    c.add("feed", b"before")
    c.queue("feed+a")
    c.add("feed", b"after")
    assert drain(c, "feed+a") == [b"after"]
    assert drain(c, "feed") == [b"before", b"after"]
    assert c.stats.total_items == 3  # the child's add counts too
    assert ("children", "feed+a") in c.dump_stats("feed")


def test_offer_answers_at_once_for_a_queue_and_in_a_deferred_for_a_fanout_or_alias(
        started) -> None:
    """
    offer answers a plain queue's add with a bool (add: the same in a
    Deferred); a master with children and an alias combine several adds,
    so they answer with a Deferred, fired at once when every add was.
    """
    c = started(ALIASES)
    assert c.offer("plain", b"x") is True
    c.queue("feed+a")
    fanned = c.offer("feed", b"y")
    aliased = c.offer("both", b"z")
    assert isinstance(fanned, Deferred) and isinstance(aliased, Deferred)
    assert [fanned.result, aliased.result] == [True, True]
    assert drain(c, "plain") == [b"x"] and drain(c, "feed+a") == [b"y"]
    assert drain(c, "left") == [b"z"] and drain(c, "right") == [b"z"]
    assert c.stats.total_items == 5


def test_fanout_child_created_by_a_read(started) -> None:
    """Any reference to parent+child registers it, a read included."""
    c = started()
    assert take(c, "feed+b") is None
    c.add("feed", b"x")
    assert drain(c, "feed+b") == [b"x"]


def test_fanout_only_master_stores_nothing(started) -> None:
    """A fanout_only master reports success, stores nothing, and its children get the items."""
    c = started("queues:\n  feed: {fanout_only: true}\n")
    c.queue("feed+a")
    assert result_of(c.add("feed", b"x")) is True
    assert drain(c, "feed") == []
    assert drain(c, "feed+a") == [b"x"]


def test_deleting_child_unregisters_it(started, tmp_path: Path) -> None:
    """A deleted child no longer receives adds (and is not recreated by them)."""
    c = started()
    c.queue("feed+a")
    c.delete("feed+a")
    c.add("feed", b"x")
    assert "feed+a" not in c.queue_names()
    assert "feed+a" not in files(tmp_path)
    assert c.fanout_children("feed") == []
    assert all(k != "children" for k, _ in c.dump_stats("feed"))


def test_deleting_master_keeps_children(started) -> None:
    """Deleting the master leaves its children registered."""
    c = started()
    c.queue("feed+a")
    c.delete("feed")
    c.add("feed", b"x")
    assert drain(c, "feed+a") == [b"x"]


# -- aliases -----------------------------------------------------------------------


ALIASES = "aliases:\n  both: [left, right]\n"


def test_take_answers_at_once_without_a_deferred(started, clock: Clock) -> None:
    """
    take answers what it knows at once as it is: the head item (counted a
    hit; with held, no transaction of the queue), None for an empty queue
    asked not to wait or for an alias (a miss, creating nothing), and only
    a read that waits gets a Deferred, which fires with the item added.
    """
    c = started(ALIASES)
    c.offer("plain", b"x")
    c.offer("plain", b"y")
    item = c.take("plain")
    assert isinstance(item, QItem) and item.data == b"x"
    held = c.take("plain", open_read=True, held=True)
    assert isinstance(held, QItem) and held.data == b"y"
    queue = c.queue("plain")
    assert queue.transactions == 0 and queue.get_items_hit == 2
    assert c.take("plain") is None and c.take("both") is None
    assert c.queue("both", create=False) is None
    assert (c.stats.get_hits, c.stats.get_misses) == (2, 1)
    waiting = c.take("plain", deadline=clock.seconds() + 5)
    assert isinstance(waiting, Deferred) and not waiting.called
    c.offer("plain", b"z")
    assert result_of(waiting).data == b"z"  # type: ignore[attr-defined]
    assert c.stats.get_hits == 3
    peeked = c.take("plain", peek=True)
    assert peeked is None and c.stats.get_misses == 2


def test_alias_add_reaches_every_destination(started) -> None:
    """An add to an alias goes to every destination and counts put stats."""
    c = started(ALIASES)
    assert result_of(c.add("both", b"hello")) is True
    assert drain(c, "left") == [b"hello"]
    assert drain(c, "right") == [b"hello"]
    assert c.dump_stats("both") == [("put_items", "1"), ("put_bytes", "5"),
                                    ("children", "left,right")]
    assert c.alias_names() == ["both"]


def test_alias_add_fails_if_any_destination_refuses(started) -> None:
    """The alias add is true only if all destinations accepted; all are attempted."""
    c = started(ALIASES + "queues:\n  left: {max_items: 1}\n")
    c.add("left", b"full")
    assert result_of(c.add("both", b"x")) is False
    assert drain(c, "right") == [b"x"]
    assert c.dump_stats("both")[0] == ("put_items", "1")


def test_alias_reads_are_empty_and_create_nothing(started, tmp_path: Path) -> None:
    """Get and peek on an alias see an empty queue and create no queue or file."""
    c = started(ALIASES)
    c.add("both", b"x")
    assert take(c, "both") is None
    assert result_of(c.remove("both", peek=True)) is None
    assert "both" not in files(tmp_path)
    assert sorted(c.queue_names()) == ["both", "left", "right"]
    assert sorted(c.queue_names(include_aliases=False)) == ["left", "right"]


def test_alias_flush_and_delete_are_noops(started, tmp_path: Path) -> None:
    """Flush and delete of an alias name do nothing."""
    c = started(ALIASES)
    c.add("both", b"x")
    c.flush("both")
    c.delete("both")
    assert c.alias_names() == ["both"]
    assert c.current_items() == 2


# -- expiry --------------------------------------------------------------------------


def test_expire_to_queue(started, clock: Clock) -> None:
    """Expired items move to the expire_to_queue target with no expiry."""
    c = started("queues:\n  src: {max_age: 10s, expire_to_queue: dead}\n")
    c.add("src", b"old")
    assert "dead" in c.queue_names()  # created with the source
    clock.advance(11)
    assert c.flush_expired("src") == 1
    assert drain(c, "src") == []
    item = result_of(c.remove("dead"))
    assert item.data == b"old" and item.expiry_ms == 0
    assert c.stats.total_items == 1  # the move is not a client add


def test_flush_expired_counts_and_does_not_create(started, clock: Clock) -> None:
    """flush_expired returns the count; flush_all_expired sums over queues."""
    c = started()
    now_ms = int(clock.seconds() * 1000)
    c.add("a", b"1", now_ms + 1000)
    c.add("a", b"2", now_ms + 1000)
    c.add("b", b"3", now_ms + 1000)
    c.add("b", b"keep")
    clock.advance(2)
    assert c.flush_expired("a") == 2
    assert c.flush_all_expired() == 1
    assert c.flush_expired("missing") == 0
    assert "missing" not in c.queue_names()
    assert drain(c, "b") == [b"keep"]


def test_expiration_timer_sweeps(started, clock: Clock) -> None:
    """The timer of expiration_timer_frequency discards expired items on its own."""
    c = started("expiration_timer_frequency: 1s\n")
    c.add("q", b"x", int(clock.seconds() * 1000) + 500)
    assert c.current_items() == 1
    clock.advance(1)
    assert c.current_items() == 0
    assert c.queue("q").expired_items == 1


def test_expiration_timer_disabled(started, clock: Clock) -> None:
    """With expiration_timer_frequency null nothing sweeps."""
    c = started()
    c.add("q", b"x", int(clock.seconds() * 1000) + 500)
    clock.advance(10)
    assert c.current_items() == 1
    assert clock.getDelayedCalls() == []


def test_max_queue_age_deletes_empty_old_queues(started, clock: Clock, tmp_path: Path) -> None:
    """The sweep deletes queues that are empty and older than max_queue_age."""
    c = started("expiration_timer_frequency: 1s\n"
                "queues:\n  temp: {max_queue_age: 5s}\n  busy: {max_queue_age: 5s}\n")
    c.queue("temp")
    c.add("busy", b"x")
    c.queue("forever")
    clock.advance(5)
    assert "temp" in c.queue_names()  # not older than 5 s yet
    clock.advance(1)
    assert sorted(c.queue_names()) == ["busy", "forever"]
    assert "temp" not in files(tmp_path)
    assert c.stats.queue_expires == 1
    assert c.stats.queue_deletes == 1


# -- flush and delete ----------------------------------------------------------------


def test_flush_empties_but_keeps_open_reads(started) -> None:
    """flush removes every item; open reads stay open; a missing queue is not created."""
    c = started()
    for data in (b"a", b"b", b"c"):
        c.add("q", data)
    item = result_of(c.remove("q", open_read=True))
    c.flush("q")
    assert c.current_items() == 0
    c.unremove("q", item.xid)
    assert drain(c, "q") == [b"a"]
    c.flush("nothing")
    assert "nothing" not in c.queue_names()


def test_flush_all(started) -> None:
    """flush_all empties every queue."""
    c = started(ALIASES)
    c.add("a", b"1")
    c.add("both", b"2")
    c.flush_all()
    assert c.current_items() == 0


def test_delete_erases_journal_and_recreates_empty(started, tmp_path: Path, clock: Clock) -> None:
    """delete wakes waiters, erases the journal files, drops stats; a later add starts afresh."""
    c = started()
    c.add("q", b"x")
    waiter = c.remove("other", deadline=clock.seconds() + 60)
    c.queue("other")
    c.delete("other")
    assert result_of(waiter) is None
    c.delete("q")
    assert "q" not in files(tmp_path)
    assert c.dump_stats("q") == []
    assert c.stats.queue_deletes == 2
    c.add("q", b"new")
    assert drain(c, "q") == [b"new"]
    c.delete("never-existed")
    assert c.stats.queue_deletes == 2  # deleting a missing queue is a no-op


def test_delete_survives_restart(started, tmp_path: Path) -> None:
    """A deleted queue does not come back at the next start."""
    c = started()
    c.add("q", b"x")
    c.delete("q")
    result_of(c.stopService())
    c2 = started()
    assert c2.queue_names() == []


# -- keep_journal: false ----------------------------------------------------------------


def test_keep_journal_false_writes_nothing_and_erases_old_journal(started, tmp_path: Path) -> None:
    """A memory-only queue has no journal file, and an earlier journal is erased."""
    c = started()
    c.add("mem", b"old")
    result_of(c.stopService())
    assert "mem" in files(tmp_path)
    c2 = started("queues:\n  mem: {keep_journal: false}\n")
    assert drain(c2, "mem") == []
    c2.add("mem", b"new")
    assert "mem" not in files(tmp_path)
    assert drain(c2, "mem") == [b"new"]


# -- reload --------------------------------------------------------------------------


def test_reload_server_spec_example(started, tmp_path: Path) -> None:
    """ServerSpec: default max_items 9999, starship 50; existing queues take it at once."""
    c = started("queues:\n  weather_updates: {max_items: 1500000}\n  starship: {max_items: 100}\n"
                "aliases:\n  wx: [weather_updates]\n  gone: [starship]\n")
    c.queue("weather_updates")
    c.queue("starship")
    assert c.queue("weather_updates").config.max_items == 1500000
    c.reload(make_config(tmp_path, "default: {max_items: 9999}\n"
                                   "queues:\n  starship: {max_items: 50}\n"
                                   "aliases:\n  wx: [weather_updates, starship]\n"))
    assert c.queue("starship").config.max_items == 50
    assert c.queue("weather_updates").config.max_items == 9999
    assert c.alias_names() == ["wx"]  # removed aliases are removed
    assert c.dump_stats("wx")[2] == ("children", "weather_updates,starship")
    assert c.queue("brand_new").config.max_items == 9999


def test_reload_limits_apply_to_adds(started, tmp_path: Path) -> None:
    """A lowered max_items refuses the next add at once."""
    c = started()
    c.add("q", b"1")
    c.reload(make_config(tmp_path, "queues:\n  q: {max_items: 1}\n"))
    assert result_of(c.add("q", b"2")) is False


# -- hostile names ----------------------------------------------------------------------


HOSTILE = ["../x", "a/b", "", "x" * 201, "a b", "tab\there", "nl\n", "nul\0", "bell\x07",
           ".", "..", "~~", "a.1", "+child", "master+"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_never_create_files(started, tmp_path: Path, name: str) -> None:
    """Every operation that could create a queue refuses a hostile name; no file appears."""
    c = started()
    with pytest.raises(InvalidQueueName):
        c.queue(name)
    with pytest.raises(InvalidQueueName):
        c.add(name, b"x")
    with pytest.raises(InvalidQueueName):
        c.remove(name)
    c.flush(name)
    c.delete(name)
    assert c.flush_expired(name) == 0
    assert c.queue_names() == []
    assert files(tmp_path) == set()
    assert not (tmp_path / "x").exists()


def test_200_byte_name_is_fine(started) -> None:
    """The longest legal name creates a queue."""
    c = started()
    c.add("q" * 200, b"x")
    assert drain(c, "q" * 200) == [b"x"]


# -- stop ----------------------------------------------------------------------------


def test_stop_refuses_new_work_and_wakes_waiters(started, clock: Clock) -> None:
    """After stopService every new operation raises ShuttingDown; waiters get None."""
    c = started()
    waiter = c.remove("q", deadline=clock.seconds() + 60)
    result_of(c.stopService())
    assert result_of(waiter) is None
    with pytest.raises(ShuttingDown):
        c.add("q", b"x")
    with pytest.raises(ShuttingDown):
        c.remove("q")
    with pytest.raises(ShuttingDown):
        c.queue("q")
    c.unremove("q", 1)  # no-op, no error
    assert clock.getDelayedCalls() == []


def test_stop_waits_for_pending_fsyncs(started, tmp_path: Path, clock: Clock) -> None:
    """With durable acks, stop finishes only after the fsync of every acknowledged add."""
    thread = ManualThread()
    c = started("journal_fsync: thread\ndefault: {sync_journal: always, durable_acks: true}\n",
                run_in_thread=thread)
    acked = c.add("q", b"x")
    assert not acked.called
    finished: list[object] = []
    c.stopService().addBoth(finished.append)
    assert not acked.called and finished == []  # (the journal's close waits for its fsync)
    thread.run_all()
    assert result_of(acked) is True
    assert finished == [None]
    c2 = started()
    assert drain(c2, "q") == [b"x"]


# -- stats -------------------------------------------------------------------------------


def test_current_items_and_bytes(started) -> None:
    """current_items and current_bytes sum over queues."""
    c = started()
    c.add("a", b"12")
    c.add("b", b"345")
    assert c.current_items() == 2
    assert c.current_bytes() == 5
    assert c.reserved_memory_ratio() > 0
    assert c.dump_stats("unknown") == []
    assert [k for k, _ in c.dump_stats("a")][:3] == ["items", "bytes", "total_items"]


def test_replay_logs_progress_per_queue(started) -> None:
    """Start-up replay logs each queue with its items, bytes and seconds, then a summary."""
    c = started()
    c.add("logged", b"abc")
    c.add("logged", b"de")
    result_of(c.stopService())
    with capturedLogs() as events:
        started()
    ours = [e for e in events
            if e.get("log_namespace", "").startswith(("kestrel.collection", "kestrel.loading"))]
    replayed = [e for e in ours if e.get("queue") == "logged" and "seconds" in e]
    assert len(replayed) == 1
    assert (replayed[0]["items"], replayed[0]["bytes"]) == (2, 5)
    summary = [e for e in ours if e["log_format"].startswith("Replay finished")]
    assert summary and summary[0]["count"] == 1


def test_start_ignores_files_that_are_not_journals(started, tmp_path: Path) -> None:
    """
    A foreign file in the queue directory (twistd.pid) makes no queue, is
    left untouched, and is named in one warning at start.
    """
    c = started()
    c.add("real", b"abc")
    result_of(c.stopService())
    (tmp_path / "queues" / "twistd.pid").write_bytes(b"4242\n")
    with capturedLogs() as events:
        c = started()
    assert c.queue_names() == ["real"]
    assert files(tmp_path) == {"real", "twistd.pid"}
    assert (tmp_path / "queues" / "twistd.pid").read_bytes() == b"4242\n"
    warnings = [e for e in events if e["log_level"].name == "warn"]
    assert [e.get("file") for e in warnings] == ["twistd.pid"]
    assert drain(c, "real") == [b"abc"]


def test_graceful_stop_compacts_empty_journals(started, tmp_path: Path) -> None:
    """At stop under ReadOnly, an empty queue's journal is rewritten (kept small)."""
    status = ServerStatus(Clock(), None, "up")
    c = started(status=status)
    for _ in range(50):
        c.add("q", b"x" * 100)
    drain(c, "q")
    c.add("busy", b"x" * 100)
    before = (tmp_path / "queues" / "q").stat().st_size
    status.set_status("readonly")
    result_of(c.stopService())
    assert (tmp_path / "queues" / "q").stat().st_size < before
    assert (tmp_path / "queues" / "busy").stat().st_size > 100
    assert drain(started(), "busy") == [b"x" * 100]


# -- observers: per-queue metrics and deletions -------------------------------------


def test_queue_observer_is_asked_per_created_queue(started) -> None:
    """Every queue created (by reference, by expire_to wiring) gets the factory's observer."""
    observers: dict[str, QueueMetrics] = {}

    def observer_for(name: str) -> QueueMetrics:
        observers[name] = QueueMetrics()
        return observers[name]

    c = started("queues:\n  src: {expire_to_queue: dead}\n", queue_observer=observer_for)
    c.add("jobs", b"abcd")
    c.queue("src")
    assert sorted(observers) == ["dead", "jobs", "src"]
    assert c.queue("jobs").observer is observers["jobs"]
    assert observers["jobs"].request_size.total == 4
    assert take(c, "jobs") == b"abcd"
    assert observers["jobs"].queue_size.count == 2


def test_on_delete_hears_explicit_deletes_and_the_age_sweep(started, clock: Clock) -> None:
    """on_delete gets the name of every queue deleted, by delete() or by max_queue_age."""
    deleted: list[str] = []
    c = started("expiration_timer_frequency: 1s\nqueues:\n  temp: {max_queue_age: 5s}\n",
                on_delete=deleted.append)
    c.queue("temp")
    c.add("jobs", b"x")
    c.delete("jobs")
    c.delete("never-existed")
    assert deleted == ["jobs"]
    clock.advance(6)
    assert deleted == ["jobs", "temp"]
    assert "temp" not in c.queue_names()


def test_failing_on_delete_is_logged_and_the_delete_stands(started) -> None:
    """An on_delete that raises is logged; the queue is deleted all the same."""
    def broken(name: str) -> None:
        raise RuntimeError(name)

    c = started(on_delete=broken)
    c.add("jobs", b"x")
    with capturedLogs() as events:
        c.delete("jobs")
    assert c.queue("jobs", create=False) is None
    assert [e for e in events if e.get("log_failure") is not None]
