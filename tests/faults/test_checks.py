"""
The fault harness's own checks can fail: the ledger's rules per policy, a
journal that disagrees with memory, a read left open with no holder, and a
fault that strace really injects.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.clients import MemcacheClient, ProtocolError, ThriftClient
from tests.chaos.harness import PROTOCOLS, ChaosServer
from tests.faults.checks import journal_items, memory_vs_journal, stuck_open
from tests.faults.inject import Strace, ptrace_unavailable
from tests.faults.ledger import POLICIES, FaultLedger


def _ledger(policy: str) -> FaultLedger:
    ledger = FaultLedger(POLICIES[policy])
    ledger.acknowledged([b"early"])
    ledger.windows.append((time.monotonic() + 10, time.monotonic() + 20))
    ledger.ack_time[b"in-window"] = time.monotonic() + 15
    ledger.acked.add(b"in-window")
    return ledger


def test_a_durable_policy_allows_no_loss_even_in_a_fault() -> None:
    """Under always+durable an add acknowledged during the fault and lost is lost."""
    verdict = _ledger("always+durable").verdict()
    assert (verdict["lost"], verdict["undone"]) == (2, 0)


def test_a_period_allows_undoing_only_inside_the_window() -> None:
    """Under a period the add acknowledged in the window is undone; the early one is lost."""
    verdict = _ledger("period").verdict()
    assert (verdict["lost"], verdict["undone"]) == (1, 1)


def test_under_never_nothing_is_undone() -> None:
    """Under never a failed fsync cuts nothing: an add in the window that is missing is lost."""
    verdict = _ledger("never").verdict()
    assert (verdict["lost"], verdict["undone"]) == (2, 0)


def test_a_write_fault_opens_no_window() -> None:
    """A fault that fails only writes allows nothing, even under a period."""
    ledger = FaultLedger(POLICIES["period"])
    ledger.fault(time.monotonic() - 1, time.monotonic() + 1, 1, fsync=False)
    ledger.acknowledged([b"x"])
    assert ledger.verdict()["lost"] == 1


def test_a_confirmed_item_back_twice_is_reappeared_even_in_the_window() -> None:
    """A confirmation undone by a failed fsync brings its item back once at most."""
    ledger = FaultLedger(POLICIES["always+durable"])
    ledger.acknowledged([b"x"])
    ledger.delivered(b"x")
    ledger.fault(time.monotonic() - 1, time.monotonic() + 1, 1, fsync=True)
    ledger.confirmed_all([b"x"])
    ledger.delivered(b"x")
    verdict = ledger.verdict()
    assert (verdict["reappeared"], verdict["undone_confirms"]) == (0, 1)
    ledger.delivered(b"x")
    verdict = ledger.verdict()
    assert (verdict["reappeared"], verdict["duplicated"]) == (1, 1)


def test_each_confirmation_in_the_window_may_be_undone_once() -> None:
    """Confirmed, back, confirmed again, back again: two undone confirmations, nothing wrong."""
    ledger = FaultLedger(POLICIES["period"])
    ledger.acknowledged([b"x"])
    ledger.fault(time.monotonic() - 1, time.monotonic() + 1, 1, fsync=True)
    for _ in range(2):
        ledger.delivered(b"x")
        ledger.confirmed_all([b"x"])
    ledger.delivered(b"x")
    verdict = ledger.verdict()
    assert (verdict["undone_confirms"], verdict["reappeared"], verdict["duplicated"]) == (2, 0, 0)


def test_a_restart_excuses_only_what_comes_back_after_it() -> None:
    """A confirmation kept in memory may be undone by a restart, not before it."""
    ledger = FaultLedger(POLICIES["always+durable"])
    ledger.acknowledged([b"before", b"after"])
    started = time.monotonic()
    for item in (b"before", b"after"):
        ledger.delivered(item)
        ledger.confirmed_all([item])
    ledger.delivered(b"before")
    ledger.restarted_in_fault(started)
    ledger.delivered(b"after")
    verdict = ledger.verdict()
    assert (verdict["reappeared"], verdict["undone_confirms"]) == (1, 1)


def test_a_refused_item_served_is_counted() -> None:
    """An add answered with an error and delivered anyway."""
    ledger = FaultLedger(POLICIES["always+durable"])
    ledger.refused_adds([b"r"])
    ledger.delivered(b"r")
    assert ledger.verdict()["refused_served"] == 1


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = ChaosServer(tmp_path / "s", PROTOCOLS, config={"client_timeout": None})
    s.start()
    yield s
    s.stop()


def test_memory_vs_journal_sees_a_record_memory_lacks(server: ChaosServer) -> None:
    """A record appended behind the server's back: the journal replays one item more."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    for i in range(3):
        assert client.set("q", b"item-%d" % i)
    client.close()
    assert memory_vs_journal(server, ["q"], "now") == []
    journal = server.queue_path / "q"
    first_add = journal.read_bytes()[:len(b"item-0") + 21]
    with open(journal, "ab") as f:
        f.write(first_add)
    assert journal_items(server.queue_path, "q") == 4
    [problem] = memory_vs_journal(server, ["q"], "now")
    assert "but the journal replays 4 items" in problem


def test_stuck_open_sees_a_read_nobody_holds(server: ChaosServer) -> None:
    """A thrift read with a long auto-abort outlives its connection: reported as open."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    assert client.set("q", b"x")
    client.close()
    thrift = ThriftClient(server.host, server.ports["thrift"])
    assert len(thrift.get("q", 1, 0, 60_000)) == 1
    thrift.close()
    assert stuck_open(server, ["q"], "now", seconds=0.3) == [
        "now: q: 1 reads open with no client holding them"]


def test_strace_fails_the_chosen_file_only(server: ChaosServer) -> None:
    """EIO injected on one queue's journal refuses its adds; another queue's go on."""
    why = ptrace_unavailable()
    if why is not None:
        pytest.skip(why)
    client = MemcacheClient(server.host, server.ports["memcache"])
    assert client.set("a", b"1") and client.set("b", b"1")
    assert server.proc is not None
    with Strace(server.proc.pid, [server.queue_path / "a"], ("write",), "EIO") as fault:
        assert client.set("b", b"2")
        with pytest.raises(ProtocolError, match="SERVER_ERROR"):
            client.set("a", b"2")
    client.close()
    assert fault.injected >= 1
    assert fault.started <= fault.ended
