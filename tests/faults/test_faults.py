"""
The short run of the fault harness (what CI runs): every scenario once under
the policies C{never}, C{always} with C{durable_acks}, and a 50 ms period
(an fsync fault only where the policy fsyncs). A scenario skips only where
this machine cannot inject its fault (no ptrace for C{strace}, no right to
mount a tmpfs), and says so.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from tests.faults.ledger import DEFAULT_POLICIES, POLICIES, failures
from tests.faults.scenarios import SCENARIOS, applies, run_scenario, unavailable

CASES = [(s, p) for s in SCENARIOS for p in DEFAULT_POLICIES
         if applies(SCENARIOS[s], POLICIES[p])]


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "policy"), CASES)
def test_a_fault_loses_nothing_acknowledged(scenario: str, policy: str, tmp_path: Path) -> None:
    """
    After the fault and after a restart: nothing acknowledged lost (beyond the
    policy's doubt window), no confirmed item back, no refused item served,
    no read left open without a holder, memory equal to the journal.
    """
    why = unavailable(SCENARIOS[scenario])
    if why is not None:
        pytest.skip(why)
    verdict = run_scenario(SCENARIOS[scenario], POLICIES[policy], tmp_path,
                           seed=zlib.crc32(f"{scenario}/{policy}".encode()),
                           log=lambda line: None)
    assert verdict["acknowledged"] > 0, verdict
    assert failures(verdict) == [], verdict
