"""read_stream: read, handle, confirm; abort and back off on failure; clean stop."""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred

from kestrel.client import Backoff
from tests.client.conftest import Net, make_client, resolved

A, B = "a:22133", "b:22133"


def test_workers_handle_and_confirm_every_item(net: Net) -> None:
    for s in (A, B):
        net.add(s)
    client = make_client(net, [A, B])
    seen: list[bytes] = []
    stream = client.read_stream("q", seen.append, concurrency=3, poll=0.5)
    for i in range(10):
        net.servers[(A, B)[i % 2]].collection.add("q", b"%d" % i)
    net.run(0.2)
    assert sorted(seen) == sorted(b"%d" % i for i in range(10))
    assert stream.processed == 10
    assert net.items(A, "q") == net.items(B, "q") == 0
    stopped = stream.stop()
    net.run(0.01)
    assert resolved(stopped) is None
    for s in (A, B):  # the waiting reads were cancelled: no waiter left behind
        assert net.queue(s, "q").waiter_count == 0


def test_a_failing_handler_aborts_and_backs_off(net: Net) -> None:
    net.add(A)
    client = make_client(net, [A])
    calls: list[float] = []

    def handler(data: bytes) -> None:
        calls.append(net.clock.seconds())
        if len(calls) < 3:
            raise ValueError("not yet")

    stream = client.read_stream("q", handler, poll=0.5,
                                backoff=Backoff(base=1.0, cap=4.0, jitter=0.0))
    net.servers[A].collection.add("q", b"x")
    net.run(4.0)
    assert len(calls) == 3
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert gaps == [pytest.approx(1.0, abs=0.02), pytest.approx(2.0, abs=0.02)]
    assert stream.failed == 2 and stream.processed == 1
    assert net.items(A, "q") == 0
    resolved(stream.stop())


def test_stop_lets_a_running_handler_finish_and_confirm(net: Net) -> None:
    net.add(A)
    client = make_client(net, [A])
    pending: list[Deferred[None]] = []

    def handler(data: bytes) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        pending.append(d)
        return d

    stream = client.read_stream("q", handler, concurrency=2, poll=0.5)
    net.servers[A].collection.add("q", b"x")
    net.run(0.1)
    assert len(pending) == 1
    stopped = stream.stop()
    net.run(0.1)
    assert not stopped.called
    pending[0].callback(None)
    net.run(0.1)
    assert resolved(stopped) is None
    assert stream.processed == 1 and net.items(A, "q") == 0


def test_coroutine_handlers_are_awaited(net: Net) -> None:
    net.add(A)
    client = make_client(net, [A])
    seen: list[bytes] = []

    async def handler(data: bytes) -> None:
        seen.append(data)

    stream = client.read_stream("q", handler)
    net.servers[A].collection.add("q", b"x")
    net.run(0.1)
    assert seen == [b"x"] and stream.processed == 1
    resolved(stream.stop())
