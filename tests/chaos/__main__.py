"""
Run the crash and fault harness: C{python -m tests.chaos --help}.

Short mode (the default, what CI runs) does a few cycles per variant and
takes a few minutes; C{--long} does 25 cycles per variant. The exit status
is 0 when no variant lost, duplicated or resurrected an item, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.harness import (
    DEFAULT_VARIANTS,
    VARIANTS,
    failures,
    full_disk_unavailable,
    run_variant,
)
from tests.chaos.summary import finish

COLUMNS = ("variant", "cycles", "kills_in_replay", "acknowledged", "lost", "redelivered",
           "duplicated", "reappeared", "vanish_items", "vanish_lost", "seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Kill -9 real kestrel servers under load (all three protocols, "
                    "vanishing clients, small journals, every sync policy) and check that "
                    "every acknowledged item comes back exactly once (at most once more "
                    "per crash that found its read open) and no confirmed item reappears.")
    parser.add_argument("--long", action="store_true",
                        help="25 cycles per variant (default: 3, the short CI run)")
    parser.add_argument("--cycles", type=int, help="cycles per variant (overrides --long)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                        help="run only this variant (repeatable); default: every variant "
                             "but full-disk")
    parser.add_argument("--full-disk", action="store_true",
                        help="also run the full-disk variant (mounts a small tmpfs: needs root)")
    parser.add_argument("--seed", type=int, default=int(time.time()),
                        help="random seed (printed, to replay a run)")
    parser.add_argument("--workdir", type=Path, help="where servers keep their files "
                        "(default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args(argv)

    cycles = args.cycles or (25 if args.long else 3)
    names = list(args.variant or DEFAULT_VARIANTS)
    if args.full_disk and "full-disk" not in names:
        names.append("full-disk")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kestrel-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"kestrel chaos: {len(names)} variants x {cycles} cycles, seed {args.seed}, "
          f"in {workdir}", flush=True)
    results = []
    for index, name in enumerate(names):
        variant = VARIANTS[name]
        if variant.full_disk:
            why = full_disk_unavailable()
            if why is not None:
                print(f"[{index + 1}/{len(names)}] {name}: skipped ({why})", flush=True)
                continue
        print(f"[{index + 1}/{len(names)}] {name}: {variant.queue_config}", flush=True)
        verdict = run_variant(variant, cycles, workdir, args.seed + index,
                              progress=lambda line: print(line, flush=True))
        results.append(verdict)
        print(f"[{index + 1}/{len(names)}] {name}: " + ", ".join(
            f"{key}={verdict[key]}" for key in COLUMNS[1:] if key in verdict), flush=True)
    print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for verdict in results:
        print("| " + " | ".join(str(verdict.get(key, "")) for key in COLUMNS) + " |")
    return finish(results, args.json, {"seed": args.seed, "cycles": cycles}, failures)


if __name__ == "__main__":
    sys.exit(main())
