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
from tests.faults.ledger import POLICIES, FaultLedger, key
from tests.faults.workload import refused


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


def confirmed_in_a_window_then_back(policy: str, durable: bool = True) -> FaultLedger:
    """C{x} delivered, confirmed inside an fsync fault's window, then delivered again."""
    ledger = FaultLedger(POLICIES[policy])
    ledger.acknowledged([b"x"])
    ledger.delivered(b"x")
    ledger.fault(time.monotonic() - 1, time.monotonic() + 1, 1, fsync=True)
    ledger.confirmed_all([b"x"], durable=durable)
    ledger.delivered(b"x")
    return ledger


@pytest.mark.parametrize("policy", ["always", "always+durable", "period+durable"])
def test_under_a_durable_policy_a_confirmed_item_back_is_reappeared(policy: str) -> None:
    """Confirmations wait for their fsync there: one undone by a failed fsync is wrong."""
    verdict = confirmed_in_a_window_then_back(policy).verdict()
    assert (verdict["reappeared"], verdict["undone_confirms"]) == (1, 0)


@pytest.mark.parametrize("policy", ["always+durable", "period"])
def test_an_implicit_confirmation_may_be_undone_in_the_window(policy: str) -> None:
    """Text's implicit confirmation is never durable first: undone once is allowed."""
    verdict = confirmed_in_a_window_then_back(policy, durable=False).verdict()
    assert (verdict["reappeared"], verdict["undone_confirms"]) == (0, 1)


def test_a_confirmed_item_back_twice_is_reappeared_even_in_the_window() -> None:
    """A confirmation undone by a failed fsync brings its item back once at most."""
    ledger = confirmed_in_a_window_then_back("period")
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
    ledger = FaultLedger(POLICIES["period"])
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


def test_under_a_durable_policy_a_restart_excuses_no_confirmation() -> None:
    """Such a confirmation is refused while the disk is full: one undone is wrong."""
    ledger = FaultLedger(POLICIES["always"])
    ledger.acknowledged([b"x"])
    started = time.monotonic()
    ledger.delivered(b"x")
    ledger.confirmed_all([b"x"])
    ledger.restarted_in_fault(started)
    ledger.delivered(b"x")
    verdict = ledger.verdict()
    assert (verdict["reappeared"], verdict["undone_confirms"]) == (1, 0)


def test_a_refused_item_served_is_counted() -> None:
    """An add answered with an error and delivered anyway."""
    ledger = FaultLedger(POLICIES["always+durable"])
    ledger.refused_adds([b"r"])
    ledger.delivered(b"r")
    assert ledger.verdict()["refused_served"] == 1


def _fanout_refusal(ledger: FaultLedger, item: bytes) -> None:
    """An add of C{item} to fq refused because fq+a's journal failed (fq, fq+b may keep it)."""
    refused(ledger, [item], ["fq", "fq+a", "fq+b"], ("fq+a",))


def test_a_refused_fanout_add_may_come_once_from_the_queues_that_took_it() -> None:
    """Served once from fq and from fq+b: allowed (kept), not refused_served."""
    ledger = FaultLedger(POLICIES["always+durable"])
    _fanout_refusal(ledger, b"x")
    for queue in ("fq", "fq+b"):
        ledger.delivered(key(queue, b"x"))
        ledger.confirmed_all([key(queue, b"x")])
    verdict = ledger.verdict()
    assert (verdict["refused_served"], verdict["refused_kept"], verdict["duplicated"],
            verdict["reappeared"]) == (0, 2, 0, 0)


def test_the_fanout_allowance_hides_nothing_served_from_the_failing_child() -> None:
    """The same refusal served from fq+a, whose journal failed, is refused_served."""
    ledger = FaultLedger(POLICIES["always+durable"])
    _fanout_refusal(ledger, b"x")
    for queue in ("fq", "fq+a", "fq+b"):
        ledger.delivered(key(queue, b"x"))
    verdict = ledger.verdict()
    assert (verdict["refused_served"], verdict["refused_kept"]) == (1, 2)
    assert ledger.examples()[0] == "refused but served: 1, e.g. fq+a:x"


def test_a_kept_copy_comes_at_most_once_per_refused_attempt() -> None:
    """Refused once, kept in fq+b, confirmed there, then served again: wrong."""
    ledger = FaultLedger(POLICIES["always+durable"])
    _fanout_refusal(ledger, b"x")
    ledger.delivered(key("fq+b", b"x"))
    ledger.confirmed_all([key("fq+b", b"x")])
    ledger.delivered(key("fq+b", b"x"))
    verdict = ledger.verdict()
    assert (verdict["refused_served"], verdict["duplicated"], verdict["reappeared"]) == (1, 1, 1)


def test_a_retried_fanout_add_may_come_once_per_attempt_but_not_from_the_failing_child(
) -> None:
    """Refused once then acknowledged: twice from fq and fq+b, once only from fq+a."""
    ledger = FaultLedger(POLICIES["always+durable"])
    _fanout_refusal(ledger, b"probe")
    ledger.acknowledged([key(q, b"probe") for q in ("fq", "fq+a", "fq+b")])
    for queue in ("fq", "fq", "fq+a", "fq+b", "fq+b"):
        ledger.delivered(key(queue, b"probe"))
        ledger.confirmed_all([key(queue, b"probe")])
    verdict = ledger.verdict()
    assert (verdict["lost"], verdict["duplicated"], verdict["reappeared"],
            verdict["refused_served"]) == (0, 0, 0, 0)
    ledger.delivered(key("fq+a", b"probe"))
    verdict = ledger.verdict()
    assert (verdict["duplicated"], verdict["reappeared"]) == (1, 1)


def test_a_refusal_of_a_plain_queue_keeps_no_copy() -> None:
    """Outside a fanout (no failing child named) every refused copy is strict."""
    ledger = FaultLedger(POLICIES["period"])
    refused(ledger, [b"x"], ["q"], None)
    ledger.delivered(key("q", b"x"))
    assert ledger.verdict()["refused_served"] == 1


def _served_around_a_refusal(policy: str, fsync: bool, after: float) -> dict[str, int]:
    """fq+a (the failing child) serves x C{after} s after refusing it, in a fault."""
    ledger = FaultLedger(POLICIES[policy])
    now = time.monotonic()
    ledger.fault(now - 1, now + 1, 1, fsync=fsync)
    _fanout_refusal(ledger, b"x")
    ledger.delivered(key("fq+a", b"x"))
    ledger.refused_at[key("fq+a", b"x")] = now
    ledger.first_delivery[key("fq+a", b"x")] = now + after
    return ledger.verdict()


@pytest.mark.parametrize(("policy", "fsync", "after"), [
    # served while its failing fsync ran, under policies where adds wait for it:
    # no reader sees an add before its fsync succeeded, so this is a failure
    ("always+durable", True, -0.05),
    ("period+durable", True, -0.05),
    ("always+durable", True, 1.0),  # served well after its refusal
    ("always+durable", False, -0.05),  # a write fault: the add never reached memory
    ("period", True, -0.05),  # adds do not wait for the fsync: a refusal stored nothing
])
def test_a_refused_add_served_from_the_failing_child_is_refused_served(
        policy: str, fsync: bool, after: float) -> None:
    """Before, during or after its failing fsync, under any policy: never allowed."""
    verdict = _served_around_a_refusal(policy, fsync, after)
    assert verdict["refused_served"] == 1 and "refused_early" not in verdict


def test_an_item_served_before_its_refusal_is_refused_served() -> None:
    """Handed to a reader while its fsync ran (then refused): counted, once or twice."""
    ledger = FaultLedger(POLICIES["always+durable"])
    now = time.monotonic()
    ledger.fault(now - 1, now + 1, 1, fsync=True)
    ledger.delivered(key("fq+a", b"x"))
    _fanout_refusal(ledger, b"x")
    assert ledger.verdict()["refused_served"] == 1
    ledger.delivered(key("fq+a", b"x"))
    verdict = ledger.verdict()
    assert (verdict["refused_served"], verdict["duplicated"]) == (1, 1)


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
