"""FileChores: jobs run in order on one thread of their own, and nothing comes back."""

from __future__ import annotations

import threading

from twisted.logger import capturedLogs

from kestrel.journal.chores import FileChores


def test_chores_run_in_order_on_one_other_thread() -> None:
    chores = FileChores(name="test-chores")
    ran: list[tuple[int, str]] = []
    for n in range(50):
        chores(lambda n=n: ran.append((n, threading.current_thread().name)))
    assert chores.join(timeout=10)
    assert [n for n, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"test-chores"}
    assert chores.stop(timeout=10)


def test_a_chore_that_raises_is_logged_and_the_next_runs() -> None:
    chores = FileChores()
    ran: list[str] = []

    def broken() -> None:
        raise OSError("no such device")

    with capturedLogs() as events:
        chores(broken)
        chores(lambda: ran.append("next"))
        assert chores.join(timeout=10)
    assert ran == ["next"]
    assert [e["log_format"] for e in events] == ["A file chore failed"]
    assert isinstance(events[0]["log_failure"].value, OSError)
    assert chores.stop(timeout=10)


def test_stop_runs_what_was_handed_over_then_ends_the_thread() -> None:
    chores = FileChores(name="test-stop")
    gate = threading.Event()
    ran: list[int] = []
    chores(gate.wait)
    chores(lambda: ran.append(1))
    assert not chores.join(timeout=0.01)  # held by the first chore
    gate.set()
    assert chores.stop(timeout=10)
    assert ran == [1]
    assert "test-stop" not in {t.name for t in threading.enumerate()}
    # A chore handed over after a stop starts a thread again.
    chores(lambda: ran.append(2))
    assert chores.join(timeout=10)
    assert ran == [1, 2]
    assert chores.stop(timeout=10)
    assert chores.stop(timeout=10)  # (stopping twice, or never started, is harmless)
    assert FileChores().stop()
