"""
ClientSession over a real KestrelServer (real collection, queues, journals, status).

Time is a L{Clock}; journals live in a temporary directory.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock

from kestrel.config import parse_config
from kestrel.errors import AvailabilityError, ForbiddenStatus, TooManyOpenReads, UnknownStatus
from kestrel.item import QItem
from kestrel.server import KestrelServer
from kestrel.session import ClientSession
from kestrel.status import Status


def result_of(d: Deferred) -> object:
    """The result of a Deferred that must already have fired (a Failure included)."""
    box: list[object] = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    return box[0]


@pytest.fixture
def make_server(tmp_path: Path, clock: Clock):
    """Build and start a server from extra YAML."""
    servers: list[KestrelServer] = []

    def make(extra: str = "") -> KestrelServer:
        text = (f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
                f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
                "expiration_timer_frequency: null\n" + extra)
        server = KestrelServer.from_config(parse_config(text), clock)
        server.collection.startService()
        servers.append(server)
        return server

    yield make
    for server in servers:
        if server.collection.running:
            server.collection.stopService()


@pytest.fixture
def server(make_server) -> KestrelServer:
    """A server allowing 3 open reads per queue per session."""
    return make_server("max_open_transactions: 3\n")


def add(server: KestrelServer, name: str, *items: bytes) -> None:
    """Add items straight to the collection."""
    for data in items:
        assert result_of(server.collection.add(name, data)) is True


def contents(server: KestrelServer, name: str) -> list[bytes]:
    """Drain queue C{name} through the collection and return its items in order."""
    out = []
    while (item := result_of(server.collection.remove(name))) is not None:
        out.append(item.data)
    return out


def get(session: ClientSession, name: str, open_read: bool = False,
        peeking: bool = False) -> bytes | None:
    """A non-blocking get through the session."""
    item = result_of(session.get_item(name, None, open_read, peeking))
    assert item is None or isinstance(item, QItem)
    return None if item is None else item.data


# -- open reads ---------------------------------------------------------------------


def test_open_reads_close_and_abort_oldest_first(server: KestrelServer) -> None:
    """close and abort act on the oldest open read of the queue."""
    add(server, "q", b"a", b"b", b"c")
    s = server.new_session("memcache")
    assert [get(s, "q", open_read=True) for _ in range(3)] == [b"a", b"b", b"c"]
    assert s.count_open_reads("q") == 3
    assert s.abort_read("q") is True   # a goes back
    assert s.close_read("q") is True   # b confirmed
    assert s.count_open_reads("q") == 1
    assert contents(server, "q") == [b"a"]
    assert s.close_all_reads("q") == 1  # c confirmed
    s.finish()
    assert contents(server, "q") == []


def test_abort_and_close_without_open_read(server: KestrelServer) -> None:
    """abort/close with nothing open report False and change nothing."""
    s = server.new_session("memcache")
    assert s.abort_read("q") is False
    assert s.close_read("q") is False
    assert s.close_all_reads("q") == 0


def test_close_reads_is_all_or_nothing(server: KestrelServer) -> None:
    """close_reads(n) confirms the n oldest only if n are open."""
    add(server, "q", b"a", b"b")
    s = server.new_session("memcache")
    get(s, "q", open_read=True)
    get(s, "q", open_read=True)
    assert s.close_reads("q", 3) is False
    assert s.close_reads("q", 0) is False
    assert s.count_open_reads("q") == 2
    assert s.close_reads("q", 1) is True
    s.finish()
    assert contents(server, "q") == [b"b"]


def test_too_many_open_reads(make_server) -> None:
    """Opening beyond max_open_transactions raises TooManyOpenReads, per queue."""
    server = make_server()  # built-in limit: 1
    add(server, "q", b"a", b"b")
    add(server, "r", b"c")
    s = server.new_session("memcache")
    assert get(s, "q", open_read=True) == b"a"
    with pytest.raises(TooManyOpenReads):
        s.get_item("q", None, True, False)
    assert get(s, "r", open_read=True) == b"c"
    assert get(s, "q", peeking=True) == b"b"  # peeks are not limited


def test_disconnect_returns_open_reads_in_order(server: KestrelServer) -> None:
    """finish() aborts every open read; the first opened is delivered first."""
    add(server, "q", b"a", b"b", b"c", b"d")
    add(server, "r", b"x")
    s = server.new_session("memcache")
    for _ in range(3):
        get(s, "q", open_read=True)
    get(s, "r", open_read=True)
    s.finish()
    assert contents(server, "q") == [b"a", b"b", b"c", b"d"]
    assert contents(server, "r") == [b"x"]
    assert server.stats.cmd_get_open_dropped == 4
    s.finish()  # a second call changes nothing
    assert server.stats.cmd_get_open_dropped == 4


def test_item_handed_to_finished_session_goes_back(server: KestrelServer) -> None:
    """An open read that lands after finish() is aborted at once (finished_but_add)."""
    add(server, "q", b"a")
    s = server.new_session("memcache")
    s.finish()
    assert get(s, "q", open_read=True) == b"a"
    assert server.stats.finished_but_add == 1
    assert s.count_open_reads("q") == 0
    assert contents(server, "q") == [b"a"]


def test_open_reads_on_deleted_queue_are_noops(server: KestrelServer) -> None:
    """Closing or aborting a read of a deleted queue does nothing and creates nothing."""
    add(server, "q", b"a")
    s = server.new_session("memcache")
    get(s, "q", open_read=True)
    s.delete("q")
    assert s.close_read("q") is True
    assert "q" not in server.collection.queue_names()


# -- waits ------------------------------------------------------------------------


def test_blocking_get_is_served_by_a_later_add(server: KestrelServer, clock: Clock) -> None:
    """A get with a deadline waits for the next add."""
    s = server.new_session("memcache")
    d = s.get_item("q", clock.seconds() + 10, True, False)
    assert not d.called
    add(server, "q", b"late")
    assert result_of(d).data == b"late"
    assert s.count_open_reads("q") == 1


def test_blocking_get_times_out(server: KestrelServer, clock: Clock) -> None:
    """A get whose deadline passes fires None and counts a miss."""
    s = server.new_session("memcache")
    d = s.get_item("q", clock.seconds() + 0.5, False, False)
    clock.advance(1)
    assert result_of(d) is None
    assert server.stats.get_misses == 1


def test_disconnect_cancels_pending_waits(server: KestrelServer, clock: Clock) -> None:
    """finish() cancels every wait; a later item stays for others."""
    s = server.new_session("memcache")
    d1 = s.get_item("q", clock.seconds() + 10, True, False)
    d2 = s.get_item("r", clock.seconds() + 10, False, True)
    s.finish()
    assert result_of(d1).check(CancelledError)
    assert result_of(d2).check(CancelledError)
    assert server.stats.waiters_aborted == 2
    assert server.stats.cmd_get_timeout_dropped == 2
    add(server, "q", b"kept")
    other = server.new_session("memcache")
    assert get(other, "q") == b"kept"


def test_cancelled_waiter_hands_wakeup_on(server: KestrelServer, clock: Clock) -> None:
    """When one session's wait is cancelled, the next waiter gets the item."""
    a = server.new_session("memcache")
    b = server.new_session("memcache")
    da = a.get_item("q", clock.seconds() + 10, False, False)
    db = b.get_item("q", clock.seconds() + 10, False, False)
    a.finish()
    add(server, "q", b"x")
    assert result_of(da).check(CancelledError)
    assert result_of(db).data == b"x"


# -- monitor ------------------------------------------------------------------------


def test_monitor_streams_up_to_max_items(server: KestrelServer, clock: Clock) -> None:
    """monitor_until hands over items as open reads and stops at max_items."""
    add(server, "q", b"a", b"b", b"c")
    s = server.new_session("memcache")
    got: list[bytes] = []
    d = s.monitor_until("q", clock.seconds() + 10, 2, True, lambda item: got.append(item.data))
    assert result_of(d) is None
    assert got == [b"a", b"b"]
    assert s.count_open_reads("q") == 2
    assert server.stats.cmd_monitor == 1
    stats = server.stats  # each monitor fetch is a get: cmd_get = get_hits + get_misses
    assert (stats.cmd_monitor_get, stats.cmd_get, stats.get_hits, stats.get_misses) == (2, 2, 2, 0)


def test_monitor_stops_at_open_read_limit_and_waits(server: KestrelServer,
                                                    clock: Clock) -> None:
    """The stream waits for items until the open-read limit is reached."""
    add(server, "q", b"a")
    s = server.new_session("memcache")
    got: list[bytes] = []
    d = s.monitor_until("q", clock.seconds() + 10, 10, True, lambda item: got.append(item.data))
    assert not d.called
    add(server, "q", b"b")
    assert not d.called
    add(server, "q", b"c", b"d")
    assert result_of(d) is None  # 3 open reads: the limit
    assert got == [b"a", b"b", b"c"]
    assert contents(server, "q") == [b"d"]


def test_monitor_ends_at_deadline(server: KestrelServer, clock: Clock) -> None:
    """An empty queue ends the stream at the deadline."""
    s = server.new_session("memcache")
    d = s.monitor_until("q", clock.seconds() + 2, 5, True, lambda item: None)
    assert not d.called
    clock.advance(3)
    assert result_of(d) is None


def test_monitor_cancelled_by_disconnect(server: KestrelServer, clock: Clock) -> None:
    """finish() ends a waiting stream, and its items go back."""
    add(server, "q", b"a")
    s = server.new_session("memcache")
    d = s.monitor_until("q", clock.seconds() + 10, 5, True, lambda item: None)
    assert not d.called
    s.finish()
    assert result_of(d) is None
    assert contents(server, "q") == [b"a"]


# -- thrift ids ---------------------------------------------------------------------


def test_thrift_ids_are_process_wide_and_closable_anywhere(server: KestrelServer) -> None:
    """External ids grow across sessions; another connection may confirm them."""
    add(server, "q", b"a", b"b", b"c")
    s1 = server.new_session("thrift")
    s2 = server.new_session("thrift")
    got1 = result_of(s1.get_items("q", 2, None, 10_000))
    got2 = result_of(s2.get_items("q", 5, None, 10_000))
    assert [(i, item.data) for i, item in got1] == [(1, b"a"), (2, b"b")]
    assert [(i, item.data) for i, item in got2] == [(3, b"c")]
    assert s2.confirm_ids("q", {1, 99}) == 1
    assert s1.count_open_reads("q") == 1
    assert s1.abort_ids("q", {2, 3}) == 2
    assert s1.count_open_reads("q") == 0
    assert s2.count_open_reads("q") == 0
    assert contents(server, "q") == [b"b", b"c"]  # first handed out, first again


def test_thrift_abort_returns_items(server: KestrelServer) -> None:
    """Aborted ids go back to the head of their queue."""
    add(server, "q", b"a", b"b")
    s = server.new_session("thrift")
    got = result_of(s.get_items("q", 2, None, 10_000))
    assert s.abort_ids("q", [i for i, _ in got]) == 2
    assert contents(server, "q") == [b"a", b"b"]


def test_thrift_auto_abort_timer(server: KestrelServer, clock: Clock) -> None:
    """An unconfirmed id is aborted after auto_abort_ms; a confirmed one cancels its timer."""
    add(server, "q", b"a", b"b")
    s = server.new_session("thrift")
    (id_a, _), (id_b, _) = result_of(s.get_items("q", 2, None, 500))
    assert s.confirm_ids("q", [id_b]) == 1
    clock.advance(0.4)
    assert contents(server, "q") == []
    clock.advance(0.2)
    assert contents(server, "q") == [b"a"]
    assert s.confirm_ids("q", [id_a]) == 0
    assert clock.getDelayedCalls() == []


def test_thrift_reads_survive_disconnect(server: KestrelServer, clock: Clock) -> None:
    """finish() leaves thrift open reads open: another session can still confirm."""
    add(server, "q", b"a")
    s = server.new_session("thrift")
    [(external, _)] = result_of(s.get_items("q", 1, None, 60_000))
    s.finish()
    assert server.stats.cmd_get_open_dropped == 0
    assert contents(server, "q") == []
    other = server.new_session("thrift")
    assert other.confirm_ids("q", [external]) == 1
    clock.advance(61)
    assert contents(server, "q") == []


def test_thrift_get_without_auto_abort_removes(server: KestrelServer) -> None:
    """auto_abort_ms 0 removes items for good with id 0; max_items 0 gives nothing."""
    add(server, "q", b"a", b"b")
    s = server.new_session("thrift")
    assert result_of(s.get_items("q", 0, None, 0)) == []
    got = result_of(s.get_items("q", 5, None, 0))
    assert [(i, item.data) for i, item in got] == [(0, b"a"), (0, b"b")]
    assert s.count_open_reads("q") == 0


def test_thrift_get_waits_until_deadline(server: KestrelServer, clock: Clock) -> None:
    """With a deadline, get collects what arrives until max_items or the deadline."""
    s = server.new_session("thrift")
    d = s.get_items("q", 3, clock.seconds() + 1, 1000)
    add(server, "q", b"a")
    assert not d.called
    clock.advance(1.5)
    assert [item.data for _, item in result_of(d)] == [b"a"]


def test_thrift_open_limit_stops_collecting(server: KestrelServer) -> None:
    """The per-session open-read limit stops a thrift get; the next gets nothing."""
    add(server, "q", b"a", b"b", b"c", b"d")
    s = server.new_session("thrift")
    assert len(result_of(s.get_items("q", 10, None, 1000))) == 3
    assert result_of(s.get_items("q", 10, None, 1000)) == []


# -- status and limits --------------------------------------------------------------


def test_quiescent_blocks_reads_and_writes(server: KestrelServer) -> None:
    """Quiescent refuses reads and writes; confirm and abort still work."""
    add(server, "q", b"a", b"b")
    s = server.new_session("memcache")
    get(s, "q", open_read=True)
    s.set_status("quiescent")
    assert s.current_status() is Status.QUIESCENT
    with pytest.raises(AvailabilityError):
        s.get_item("q", None, False, False)
    with pytest.raises(AvailabilityError):
        s.monitor_until("q", None, 1, True, lambda item: None)
    with pytest.raises(AvailabilityError):
        s.get_items("q", 1, None, 0)
    with pytest.raises(AvailabilityError):
        s.set_item("q", b"x")
    assert s.close_read("q") is True


def test_queue_info_reports_counters_without_side_effects(make_server, clock: Clock) -> None:
    """
    queue_info gives a queue's counters (items, bytes, journal bytes, age,
    waiters, open reads); for a missing queue or an alias it is None and
    creates nothing.
    """
    server = make_server("aliases:\n  al: [q]\n")
    session = server.new_session()
    add(server, "q", b"aaa", b"bb", b"c")
    clock.advance(2)
    assert get(session, "q", open_read=True) == b"aaa"
    waiting = ClientSession(server).get_item("w", clock.seconds() + 10, False, False)
    info = session.queue_info("q")
    assert info is not None
    assert (info.items, info.bytes, info.age, info.waiters, info.open_transactions) == (
        2, 3, 2000, 0, 1)
    assert info.journal_bytes == server.collection.queue("q").journal.size > 0
    assert session.queue_info("w").waiters == 1
    assert session.queue_info("missing") is None
    assert session.queue_info("al") is None
    assert "missing" not in server.collection.queue_names()
    waiting.cancel()


def test_readonly_blocks_every_write(server: KestrelServer) -> None:
    """ReadOnly refuses set, flush, delete, flush_expired, flush_all and flush_all_expired."""
    add(server, "q", b"a")
    s = server.new_session("memcache")
    s.set_status("readonly")
    for call in (lambda: s.set_item("q", b"x"), lambda: s.flush("q"), lambda: s.delete("q"),
                 lambda: s.flush_expired("q"), s.flush_all, s.flush_all_expired):
        with pytest.raises(AvailabilityError):
            call()
    assert get(s, "q") == b"a"  # reads are fine
    s.set_status("up")
    assert result_of(s.set_item("q", b"x")) is True


def test_set_status_errors(server: KestrelServer) -> None:
    """Unknown names and down are refused."""
    s = server.new_session("memcache")
    with pytest.raises(UnknownStatus):
        s.set_status("sideways")
    with pytest.raises(ForbiddenStatus):
        s.set_status("down")
    assert str(s.current_status()) == "Up"


def test_connection_limits(make_server) -> None:
    """Sessions opened beyond a limit refuse writes (or reads) for their lifetime."""
    server = make_server("connection_limit_refuse_writes: 1\n"
                         "connection_limit_refuse_reads: 2\n")
    first = server.new_session("memcache")
    second = server.new_session("memcache")
    third = server.new_session("text")
    assert result_of(first.set_item("q", b"a")) is True
    with pytest.raises(AvailabilityError):
        second.set_item("q", b"b")
    assert get(second, "q", peeking=True) == b"a"
    with pytest.raises(AvailabilityError):
        third.get_item("q", None, False, False)
    assert server.stats.curr_connections == 3
    second.finish()
    third.finish()
    assert server.stats.curr_connections == 1
    assert server.stats.total_connections == 3
    with pytest.raises(AvailabilityError):
        second.set_item("q", b"b")  # still refused: the verdict is for life


# -- writes and stats ---------------------------------------------------------------


def test_writes_and_command_stats(server: KestrelServer, clock: Clock) -> None:
    """set/get/peek count cmd_set, cmd_get, cmd_peek, get_hits, get_misses."""
    s = server.new_session("memcache")
    assert result_of(s.set_item("q", b"a")) is True
    assert get(s, "q", peeking=True) == b"a"
    assert get(s, "q") == b"a"
    assert get(s, "q") is None
    stats = server.stats
    assert (stats.cmd_set, stats.cmd_get, stats.cmd_peek) == (1, 2, 1)
    assert (stats.get_hits, stats.get_misses) == (2, 1)
    s.set_item("q", b"x", int(clock.seconds() * 1000) + 100)
    clock.advance(1)
    assert s.flush_expired("q") == 1
    s.set_item("q", b"y")
    s.flush("q")
    assert contents(server, "q") == []
    s.set_item("r", b"z")
    s.flush_all()
    assert contents(server, "r") == []
    s.delete("r")
    assert "r" not in server.collection.queue_names()
    assert s.flush_all_expired() == 0


def test_alias_reads_through_session(make_server) -> None:
    """A get on an alias is empty; a set on it reaches the destinations."""
    server = make_server("aliases:\n  al: [x, y]\n")
    s = server.new_session("memcache")
    assert result_of(s.set_item("al", b"v")) is True
    assert get(s, "al") is None
    assert contents(server, "x") == [b"v"]


# -- model ----------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.binary(max_size=3)),
        st.tuples(st.just("open"), st.none()),
        st.tuples(st.just("close"), st.none()),
        st.tuples(st.just("abort"), st.none()),
        st.tuples(st.just("close_n"), st.integers(min_value=0, max_value=4)),
        st.tuples(st.just("disconnect"), st.none()),
    ),
    max_size=40,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
@example(ops=[("add", b"a"), ("add", b"b"), ("add", b"c"), ("open", None), ("open", None),
              ("abort", None), ("open", None), ("disconnect", None)])
def test_open_reads_match_the_model(tmp_path: Path, ops: list[tuple[str, object]]) -> None:
    """
    Any mix of adds, opens, closes, aborts, confirms and disconnects leaves
    exactly the unconfirmed items in the queue, in the order the model says.
    """
    clock = Clock()
    text = (f"queue_path: {json.dumps(str(tmp_path / 'queues'))}\n"
            f"status_file: {json.dumps(str(tmp_path / 'status'))}\n"
            "expiration_timer_frequency: null\nmax_open_transactions: 3\n"
            "default: {keep_journal: false}\n")
    server = KestrelServer.from_config(parse_config(text), clock)
    queue: deque[bytes] = deque()
    fifo: deque[bytes] = deque()
    session = server.new_session("memcache")
    for op, arg in ops:
        if op == "add":
            add(server, "q", arg)
            queue.append(arg)
        elif op == "open":
            if len(fifo) == 3:
                with pytest.raises(TooManyOpenReads):
                    session.get_item("q", None, True, False)
                continue
            expected = queue.popleft() if queue else None
            assert get(session, "q", open_read=True) == expected
            if expected is not None:
                fifo.append(expected)
        elif op == "close":
            assert session.close_read("q") is bool(fifo)
            if fifo:
                fifo.popleft()
        elif op == "abort":
            assert session.abort_read("q") is bool(fifo)
            if fifo:
                queue.appendleft(fifo.popleft())
        elif op == "close_n":
            ok = 0 < arg <= len(fifo)
            assert session.close_reads("q", arg) is ok
            if ok:
                for _ in range(arg):
                    fifo.popleft()
        else:
            session.finish()
            queue.extendleft(reversed(fifo))
            fifo.clear()
            session = server.new_session("memcache")
        assert session.count_open_reads("q") == len(fifo)
    session.finish()
    queue.extendleft(reversed(fifo))
    assert contents(server, "q") == list(queue)


def test_thrift_get_cut_by_disconnect_keeps_timers(server: KestrelServer, clock: Clock) -> None:
    """A waiting thrift get ended by finish() returns what it has; those ids still auto-abort."""
    add(server, "q", b"a")
    s = server.new_session("thrift")
    d = s.get_items("q", 3, clock.seconds() + 60, 1000)
    assert not d.called
    s.finish()
    [(external, item)] = result_of(d)
    assert item.data == b"a" and external in server.external_reads
    clock.advance(1)
    assert contents(server, "q") == [b"a"]


def test_monitor_consumer_error_fails_the_stream(server: KestrelServer, clock: Clock) -> None:
    """A consumer that raises ends the stream with its error; the read stays open for finish()."""
    add(server, "q", b"a", b"b")
    s = server.new_session("memcache")

    def broken(item: QItem) -> None:
        raise RuntimeError("consumer broke")

    failure = result_of(s.monitor_until("q", None, 5, True, broken))
    assert failure.check(RuntimeError)
    assert s.count_open_reads("q") == 1
    s.finish()
    assert contents(server, "q") == [b"a", b"b"]


def test_set_items_stops_at_a_refusal_only_when_asked(make_server) -> None:
    """
    set_items offers every item (text put) or stops at the first refusal
    (thrift put), and reports each offered item's outcome in order.
    """
    server = make_server("queues:\n  small: {max_items: 2}\n")
    session = server.new_session("text")
    items = [b"a", b"b", b"c", b"d"]
    assert result_of(session.set_items("small", items)) == [True, True, False, False]
    assert contents(server, "small") == [b"a", b"b"]
    thrift = server.new_session("thrift")
    assert result_of(thrift.set_items("small", items, stop_at_refusal=True)) == [True, True, False]
    assert contents(server, "small") == [b"a", b"b"]


def test_set_items_waits_for_every_durable_acknowledgement(make_server, clock: Clock) -> None:
    """With durable acks on a sync period, set_items fires only after the covering fsync."""
    server = make_server("queues:\n  safe: {sync_journal: 50ms, durable_acks: true}\n")
    session = server.new_session("thrift")
    d = session.set_items("safe", [b"x", b"y"], stop_at_refusal=True)
    assert not d.called
    clock.advance(0.05)
    assert result_of(d) == [True, True]


def test_set_items_raises_when_writes_are_blocked(make_server) -> None:
    """A refusal of the whole batch (server read-only) is raised, not counted."""
    server = make_server("default_status: readonly\n")
    session = server.new_session("text")
    with pytest.raises(AvailabilityError):
        session.set_items("q", [b"x"])


# -- the client closes its side while a read waits ------------------------------------


def test_end_waits_ends_a_blocking_get_with_no_item(server: KestrelServer, clock: Clock) -> None:
    """After end_waits() the waiting get fires None, and the next item stays in the queue."""
    s = server.new_session()
    d = s.get_item("q", clock.seconds() + 60, False, False)
    assert not d.called
    assert s.end_waits() == 1
    assert result_of(d) is None
    add(server, "q", b"a")
    assert contents(server, "q") == [b"a"]


def test_after_end_waits_reads_do_not_wait(server: KestrelServer, clock: Clock) -> None:
    """A read asked for after the client's side closed answers at once (item or nothing)."""
    s = server.new_session()
    s.end_waits()
    assert result_of(s.get_item("q", clock.seconds() + 60, True, False)) is None
    add(server, "q", b"a")
    assert get(s, "q", open_read=True) == b"a"
    s.finish()
    assert contents(server, "q") == [b"a"]


def test_end_waits_ends_a_monitor(server: KestrelServer, clock: Clock) -> None:
    """A monitor waiting for more ends; the open read it handed out goes back at finish()."""
    add(server, "q", b"a")
    s = server.new_session()
    got: list[bytes] = []
    done = s.monitor_until("q", clock.seconds() + 60, 5, True, lambda i: got.append(i.data))
    assert got == [b"a"] and not done.called
    s.end_waits()
    assert result_of(done) is None
    add(server, "q", b"b")
    s.finish()
    assert contents(server, "q") == [b"a", b"b"]


@pytest.mark.parametrize("how", ["finish", "end_waits"])
def test_thrift_get_without_auto_abort_cut_by_a_close_puts_items_back(
        server: KestrelServer, clock: Clock, how: str) -> None:
    """A waiting thrift get that removes for good returns its items to the head when cut."""
    add(server, "q", b"a", b"b")
    s = server.new_session("thrift")
    d = s.get_items("q", 5, clock.seconds() + 60, 0)
    assert not d.called
    getattr(s, how)()
    assert result_of(d) == []
    assert contents(server, "q") == [b"a", b"b"]


def test_thrift_get_without_auto_abort_confirms_what_it_replies(server: KestrelServer,
                                                                 clock: Clock) -> None:
    """
    A waiting thrift get that completes holds its items until the protocol
    says its reply is in the kernel, then removes them for good.
    """
    add(server, "q", b"a")
    s = server.new_session("thrift")
    d = s.get_items("q", 2, clock.seconds() + 60, 0)
    add(server, "q", b"b")
    assert [(i, item.data) for i, item in result_of(d)] == [(0, b"a"), (0, b"b")]
    queue = server.collection.queue("q")
    assert queue.open_read_count == 2 and len(s.held_reads) == 2
    assert s.held_reads.written(in_kernel=True) is False
    assert queue.open_read_count == 0 and queue.length == 0
    s.finish()
    assert contents(server, "q") == []
