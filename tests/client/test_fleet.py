"""
The fleet client against real servers on an in-memory network and a Clock:
server selection, refusal and failover, backoff, handle routing, the waiter race.
"""

from __future__ import annotations

from collections import Counter

import pytest
from twisted.internet.defer import CancelledError, Deferred

from kestrel.client import AllServersFailed, KestrelClient, ReadHandle
from kestrel.client.errors import HandleClosed
from kestrel.status import Status
from tests.client.conftest import Net, make_client, resolved

A, B, C = "a:22133", "b:22133", "c:22133"


def fleet(net: Net, *names: str, yaml: str = "", **options: object) -> KestrelClient:
    for name in names:
        net.add(name, yaml)
    return make_client(net, list(names), **options)


def settle(net: Net, d: Deferred) -> object:
    net.pump()
    return resolved(d)


# -- put: selection and failover


def test_puts_spread_over_every_healthy_server(net: Net) -> None:
    client = fleet(net, A, B, C)
    used = Counter()
    for i in range(60):
        used.update(settle(net, client.put("q", b"%d" % i)))
    assert set(used) == {A, B, C} and min(used.values()) >= 10
    assert sum(net.items(s, "q") for s in (A, B, C)) == 60
    for s in (A, B, C):
        assert net.items(s, "q") == used[s]


def test_batch_put_goes_to_one_server_and_reports_it(net: Net) -> None:
    client = fleet(net, A, B)
    servers = settle(net, client.put("q", [b"1", b"2", b"3"]))
    assert len(set(servers)) == 1 and len(servers) == 3
    assert net.items(servers[0], "q") == 3


def test_refused_put_moves_on_and_the_refuser_is_left_out(net: Net) -> None:
    """A ReadOnly server answers SERVER_ERROR: the put lands elsewhere, the refuser rests."""
    client = fleet(net, A, B)
    net.servers[A].status.set_status(Status.READ_ONLY)
    for i in range(20):
        assert settle(net, client.put("q", b"%d" % i)) == [B]
    assert client.health.failures(A) == 1  # tried once, then left out for its backoff
    assert net.items(B, "q") == 20


def test_down_server_is_retried_after_its_backoff(net: Net) -> None:
    client = fleet(net, A, B)
    net.down(A)
    for i in range(10):
        assert settle(net, client.put("q", b"%d" % i)) == [B]
    assert net.connects.count(A) == 1
    net.up(A)
    net.run(1.01)  # the first backoff is at most 1 s (base 1.0, jitter 0.5)
    used = Counter()
    for i in range(30):
        used.update(settle(net, client.put("q", b"%d" % i)))
    assert used[A] > 0 and client.health.failures(A) == 0


def test_put_fails_only_when_every_server_refused_and_says_why(net: Net) -> None:
    client = fleet(net, A, B, C, yaml="queues:\n  q:\n    max_items: 1\n")
    net.servers[A].status.set_status(Status.READ_ONLY)
    net.down(B)
    assert settle(net, client.put("q", b"fills C")) == [C]
    d = client.put("q", b"no room")
    net.pump()
    with pytest.raises(AllServersFailed) as info:
        resolved(d)
    reasons = dict(info.value.attempts)
    assert set(reasons) == {A, B, C}
    assert "read only" in reasons[A].lower() or "SERVER_ERROR" in reasons[A]
    assert "refused" in reasons[B].lower()
    assert "NOT_STORED" in reasons[C]
    assert client.health.failures(C) == 0  # a full queue is not an unhealthy server


def test_not_stored_items_go_to_the_next_server(net: Net) -> None:
    client = fleet(net, A, B, yaml="queues:\n  q:\n    max_items: 2\n")
    servers = settle(net, client.put("q", [b"1", b"2", b"3", b"4"]))
    assert sorted(Counter(servers).values()) == [2, 2]


# -- reliable reads: handle routing


def test_confirm_and_abort_go_to_the_connection_that_opened_the_read(net: Net) -> None:
    client = fleet(net, A, B, C)
    for s in (A, B, C):
        net.servers[s].collection.add("q", s.encode())
    handles = [settle(net, client.read("q")) for _ in range(3)]
    assert sorted(h.data for h in handles) == sorted(s.encode() for s in (A, B, C))
    for h in handles:
        assert h.data == h.server.encode()
        assert net.queue(h.server, "q").open_read_count == 1
    first, second, third = handles
    settle(net, first.confirm())
    settle(net, second.abort())
    assert net.items(first.server, "q") == 0
    assert net.queue(second.server, "q").memory_length == 1
    assert net.queue(second.server, "q").open_read_count == 0
    assert net.queue(third.server, "q").open_read_count == 1
    with pytest.raises(HandleClosed):
        resolved(first.confirm())


def test_connection_loss_returns_the_item_and_the_handle_says_so(net: Net) -> None:
    client = fleet(net, A)
    net.servers[A].collection.add("q", b"x")
    handle = settle(net, client.read("q"))
    net.down(A)
    assert net.queue(A, "q").memory_length == 1  # the server aborted it on the close
    with pytest.raises(HandleClosed, match="returns the item"):
        resolved(handle.confirm())


def test_connections_are_pooled_and_a_held_read_has_its_own(net: Net) -> None:
    client = fleet(net, A)
    for i in range(5):
        settle(net, client.put("q", b"%d" % i))
    assert len(net.connects) == 1
    h1 = settle(net, client.read("q"))
    h2 = settle(net, client.read("q"))  # h1 holds its connection: a second one opens
    assert len(net.connects) == 2
    settle(net, h1.confirm())
    settle(net, h2.confirm())
    assert settle(net, client.get("q")) == b"2"
    assert len(net.connects) == 2
    assert client.pool.idle_count(A) == 2


def test_get_is_a_read_confirmed_at_once(net: Net) -> None:
    client = fleet(net, A, B)
    net.servers[B].collection.add("q", b"x")
    assert settle(net, client.get("q")) == b"x"
    assert net.items(B, "q") == 0
    assert settle(net, client.get("q")) is None


# -- the waiter race


def test_empty_fleet_waits_on_every_server_and_takes_the_first_item(net: Net) -> None:
    client = fleet(net, A, B, C)
    d = client.read("q", timeout=5.0)
    net.run(0.1)
    assert not d.called
    for s in (A, B, C):
        assert net.queue(s, "q").waiter_count == 1
    net.servers[B].collection.add("q", b"late")
    net.run(0.01)
    handle = resolved(d)
    assert (handle.server, handle.data) == (B, b"late")
    net.run(0.01)
    for s in (A, C):  # the losers' waiters are gone with their connections
        assert net.queue(s, "q").waiter_count == 0
        assert net.queue(s, "q").open_read_count == 0
    net.servers[A].collection.add("q", b"for someone else")
    net.run(0.1)
    assert net.queue(A, "q").memory_length == 1  # no lost waiter took it
    settle(net, handle.confirm())


def test_a_loser_that_received_an_item_aborts_it_at_once(net: Net) -> None:
    """Two servers answer in the same instant: one item wins, the other is given back."""
    client = fleet(net, A, B)
    d = client.read("q", timeout=5.0)
    net.run(0.1)
    net.servers[A].collection.add("q", b"from A")
    net.servers[B].collection.add("q", b"from B")
    net.pump()
    handle: ReadHandle = resolved(d)
    loser = B if handle.server == A else A
    net.run(0.01)
    assert net.queue(loser, "q").open_read_count == 0
    assert net.queue(loser, "q").memory_length == 1
    assert net.queue(handle.server, "q").open_read_count == 1
    other = settle(net, client.read("q"))
    assert other.server == loser
    settle(net, handle.confirm())
    settle(net, other.confirm())
    assert net.items(A, "q") == net.items(B, "q") == 0


def test_race_times_out_with_none_and_leaves_nothing_open(net: Net) -> None:
    client = fleet(net, A, B)
    d = client.read("q", timeout=1.0)
    net.run(1.05)
    assert resolved(d) is None
    for s in (A, B):
        assert net.queue(s, "q").waiter_count == 0


def test_race_skips_a_down_server_and_fails_when_none_answers(net: Net) -> None:
    client = fleet(net, A, B)
    net.down(A)
    d = client.read("q", timeout=1.0)
    net.run(0.1)
    net.servers[B].collection.add("q", b"x")
    net.run(0.01)
    assert resolved(d).server == B
    net.down(B)
    with pytest.raises(AllServersFailed):
        settle(net, client.read("q", timeout=1.0))


def test_failed_read_names_every_server_even_those_left_out(net: Net) -> None:
    """A read that fails lists the servers it skipped (in backoff) too, not only those asked."""
    client = fleet(net, A, B, C)
    net.down(A)
    assert settle(net, client.read("q")) is None  # A fails and is left out; B and C are empty
    assert not client.health.healthy(A)
    connects = net.connects.count(A)
    net.down(B)
    net.down(C)
    with pytest.raises(AllServersFailed) as info:
        settle(net, client.read("q"))
    reasons = dict(info.value.attempts)
    assert set(reasons) == {A, B, C}
    assert reasons[A].startswith("left out for ") and "1 failure(s) in a row" in reasons[A]
    assert "refused" in reasons[A].lower()
    assert "left out" not in reasons[B] and "left out" not in reasons[C]
    assert net.connects.count(A) == connects  # named, but not asked while in backoff
    assert f"{A}: left out for " in str(info.value)


def test_failed_race_names_the_servers_it_did_not_wait_on(net: Net) -> None:
    """A waiting read whose contenders all fail names the left-out servers as well."""
    client = fleet(net, A, B, C)
    net.down(A)
    assert settle(net, client.read("q")) is None
    d = client.read("q", timeout=0.8)
    net.run(0.05)
    net.down(B)
    net.down(C)
    net.run(0.05)
    with pytest.raises(AllServersFailed) as info:
        resolved(d)
    reasons = dict(info.value.attempts)
    assert set(reasons) == {A, B, C}
    assert reasons[A].startswith("left out for ")


def test_cancelled_race_closes_its_waits(net: Net) -> None:
    client = fleet(net, A, B)
    d = client.read("q", timeout=5.0)
    net.run(0.1)
    d.cancel()
    with pytest.raises(CancelledError):
        resolved(d)
    net.run(0.01)
    for s in (A, B):
        assert net.queue(s, "q").waiter_count == 0
    net.servers[A].collection.add("q", b"x")
    net.run(0.1)
    assert net.queue(A, "q").memory_length == 1


def test_reply_timeout_leaves_the_server_out(net: Net) -> None:
    """A server that stops answering is timed out and left out; the fleet goes on."""
    client = fleet(net, A, B, reply_timeout=1.0)
    settle(net, client.put("q", b"warm"))
    net.mute(A)
    net.mute(B)
    d = client.put("q", b"x")
    net.run(1.5)
    assert not d.called  # the first server timed out after 1 s; the second is being waited on
    net.run(1.0)
    with pytest.raises(AllServersFailed, match="no reply within"):
        resolved(d)
    assert client.health.failures(A) == client.health.failures(B) == 1


def test_servers_in_backoff_are_a_last_resort(net: Net) -> None:
    """When every server is left out, a put still tries them (soonest back first)."""
    client = fleet(net, A, B)
    net.down(A)
    net.down(B)
    with pytest.raises(AllServersFailed):
        settle(net, client.put("q", b"x"))
    assert not client.health.healthy(A) and not client.health.healthy(B)
    net.up(A)
    net.up(B)
    assert settle(net, client.put("q", b"y")) in ([A], [B])


def test_a_handle_outlives_its_server_leaving_the_sets(net: Net) -> None:
    from kestrel.client import ServerSet

    net.add(A)
    net.add(B)
    servers = ServerSet()
    servers.update([A, B], [A, B])
    client = KestrelClient(servers, reactor=net.clock, connector=net.connector())
    net.servers[B].collection.add("q", b"x")
    handle = settle(net, client.read("q"))
    assert handle.server == B
    servers.update([A], [A])  # B is drained away (Quiescent) while the read is open
    settle(net, handle.confirm())
    assert net.items(B, "q") == 0
