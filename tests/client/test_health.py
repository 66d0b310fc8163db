"""Backoff policy and server health: exponential, capped, jittered, reset by a success."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.client.health import Backoff, Health


def test_delay_doubles_then_caps() -> None:
    b = Backoff(base=0.5, cap=4.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


@given(st.integers(1, 60), st.floats(0, 1, exclude_max=True))
def test_jitter_stays_within_its_band(failures: int, r: float) -> None:
    b = Backoff(base=0.1, cap=10.0, jitter=0.5)
    raw = min(10.0, 0.1 * 2 ** (failures - 1))
    assert raw * 0.5 <= b.delay(failures, lambda: r) <= raw


def test_failed_server_is_left_out_then_retried() -> None:
    clock = Clock()
    health = Health(clock, Backoff(base=1.0, cap=8.0, jitter=0.0))
    assert health.failed("a:1", "refused") == 1.0
    assert not health.healthy("a:1") and health.healthy("b:1")
    clock.advance(1.0)
    assert health.healthy("a:1")
    assert health.failed("a:1", "refused") == 2.0
    assert health.split(["a:1", "b:1"]) == (["b:1"], ["a:1"])
    health.succeeded("a:1")
    assert health.failures("a:1") == 0 and health.healthy("a:1")


def test_split_orders_left_out_servers_by_return_time() -> None:
    clock = Clock()
    health = Health(clock, Backoff(base=1.0, cap=8.0, jitter=0.0))
    for _ in range(3):
        health.failed("a:1", "x")
    health.failed("b:1", "x")
    assert health.split(["a:1", "b:1", "c:1"]) == (["c:1"], ["b:1", "a:1"])
