"""
Run the fault harness: C{python -m tests.faults --help}.

The short mode (the default) runs every scenario once under the three
policies CI uses; C{--long} runs longer faults, more rounds, under every
policy, C{--repeat} times. Exit status 0 when no run lost, resurrected or
duplicated an item, served a refused one, left reads open or let memory
disagree with the journal; 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos.summary import finish
from tests.faults.ledger import DEFAULT_POLICIES, POLICIES, failures
from tests.faults.scenarios import SCENARIOS, applies, run_scenario, unavailable
from tests.faults.workload import LONG, SHORT

COLUMNS = ("scenario", "policy", "acknowledged", "refused", "injected", "lost", "undone",
           "reappeared", "undone_confirms", "duplicated", "refused_served", "refused_kept",
           "memory_vs_journal", "stuck_open", "not_recovered", "tracebacks", "seconds")


def table(results: list[dict[str, Any]]) -> str:
    """The per-scenario, per-policy table (Markdown)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for verdict in results:
        lines.append("| " + " | ".join(str(verdict.get(k, "")) for k in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line: run the chosen scenarios under the chosen policies, print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults",
        description="Inject journal faults (strace EIO/ENOSPC on chosen journal files, a "
                    "full tmpfs) into real kestrel servers under load and check the ledger: "
                    "nothing acknowledged lost (beyond what a non-durable policy allows), no "
                    "confirmed item back, no refused item served, no read left open, memory "
                    "equal to the journal replayed offline, after the fault and after a "
                    "restart. Needs root (ptrace, mount) for most scenarios.")
    parser.add_argument("--long", action="store_true",
                        help="longer faults and more rounds, every policy (default: the short "
                             "CI run under never, always+durable, period)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                        help="run only this scenario (repeatable; default: all)")
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="run only under this policy (repeatable)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each scenario and policy this many times")
    parser.add_argument("--seed", type=int, default=int(time.time()),
                        help="random seed (printed, to replay a run)")
    parser.add_argument("--workdir", type=Path,
                        help="where servers keep their files and logs (default: a temporary "
                             "folder)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)

    policies = args.policy or (list(POLICIES) if args.long else list(DEFAULT_POLICIES))
    names = args.scenario or list(SCENARIOS)
    scale = LONG if args.long else SHORT
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kestrel-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    plan = [(SCENARIOS[n], POLICIES[p]) for n in names for p in policies
            if applies(SCENARIOS[n], POLICIES[p])] * args.repeat
    print(f"kestrel faults: {len(plan)} runs, seed {args.seed}, in {workdir}", flush=True)
    results = []
    for index, (scenario, policy) in enumerate(plan):
        head = f"[{index + 1}/{len(plan)}] {scenario.name} under {policy.name}"
        why = unavailable(scenario)
        if why is not None:
            print(f"{head}: skipped ({why})", flush=True)
            continue
        print(f"{head}: {policy.queue_config}", flush=True)
        verdict = run_scenario(scenario, policy, workdir, args.seed + index, scale,
                               log=lambda line: print(line, flush=True))
        results.append(verdict)
        print(f"{head}: " + ", ".join(f"{k}={verdict[k]}" for k in COLUMNS[2:]), flush=True)
        for problem in verdict["problems"]:
            print(f"    {problem}", flush=True)
    print()
    print(table(results))
    return finish(results, args.json, {"seed": args.seed, "long": args.long}, failures)


if __name__ == "__main__":
    sys.exit(main())
