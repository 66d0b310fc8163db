#!/usr/bin/env python3
"""
Server instructions per request, counted by valgrind's cachegrind: the
noise-free counterpart of `benchmarks/cost.py`'s CPU time.

On a shared machine a server's CPU time per request moves by 10-40% from
one run to the next, with the same code; the instructions it executes in
user space barely move (0.5-1% here). Each server runs under
`valgrind --tool=cachegrind --cache-sim=no` twice, once serving --warm
requests and once --warm + --requests, from a fresh start each time; the
difference of the two totals, over --requests, is its instructions per
request, start-up and shutdown excluded. Every thread of the server is
counted (the fsync thread too); the kernel's work (system time) is not:
`cost.py` measures that, and it is the same system calls per request for
every server here (its strace counts).

Workloads (the client is the asyncio one of `cost.py`, run natively):
* durable-N: N connections with one set outstanding each, durable
  (txkestrel: `sync_journal: always`, `durable_acks: true`; Redis:
  `appendfsync always`), as `cost.py`'s durable-N;
* dequeue-1 and reliable-1: one connection, enqueue then dequeue (reliable:
  `/open` + `/close`; Redis: LMOVE + LREM), one request at a time.

Work done once a second weighs more per request here than at full speed:
under cachegrind a server serves some 40 times fewer requests a second.
In a Python server that is above all the settle of its histograms, whose
cost grows with the distinct values recorded since the last; with
--settle-rarely the Python servers settle once in 10^6 s instead
(`benchmarks/settle_rarely`), and the count leaves it out.

Servers: txkestrel (this checkout), --baseline-src (another checkout, as
"txkestrel-before"; with --baseline-python, that or this checkout on
another interpreter), Redis (--redis, Debian's `redis-server`), and with
--floors the floors of `benchmarks/floor_server.py`: for durable-N the
durable floor and the bookkeeping floor, for dequeue-1 and reliable-1 the
journal floor and the bookkeeping floor (the same without `--durable`).
The Python servers run on --python (default: the interpreter running this
script). Needs `apt-get install valgrind`.

    python3 benchmarks/instructions.py                         # durable-50: txkestrel and Redis
    python3 benchmarks/instructions.py --floors --baseline-src ../before
    python3 benchmarks/instructions.py --only dequeue-1 reliable-1
    python3 benchmarks/instructions.py --floors --settle-rarely
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queue_client  # noqa: E402 - after the path (as cost.py's imports)
import servers  # noqa: E402
from cost import machine, pythons_ran  # noqa: E402

DURABLE_CONFIG = "default:\n  sync_journal: always\n  durable_acks: true\n"

#: The folder put on the Python servers' path by --settle-rarely (its sitecustomize).
SETTLE_RARELY = Path(__file__).resolve().with_name("settle_rarely")

#: How long a server under valgrind may take to start listening, in seconds.
START_SECONDS = 300.0

Starter = Callable[[Path, int], AbstractContextManager[object]]


@dataclass(frozen=True)
class Server:
    """
    A server to count: how to start it on a port in a folder, and its
    client protocol (`queue_client`'s: "kestrel" for memcache with
    Kestrel's reliable reads, "resp" for Redis).
    """

    name: str
    protocol: str
    start: Starter
    queue_suffix: str = ""


@dataclass(frozen=True)
class Workload:
    """A workload: its name, and what it runs against a port (given the protocol and suffix)."""

    name: str
    durable: bool
    run: Callable[[str, int, str, int], object]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description="Server instructions per request (valgrind cachegrind), txkestrel beside "
                    "its peers and floors.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--only", nargs="+", default=["durable-50"], metavar="WORKLOAD",
                        help="durable-N (any N), dequeue-1, reliable-1")
    parser.add_argument("--requests", type=int, default=10000,
                        help="sets (durable-N) or pairs counted per server")
    parser.add_argument("--warm", type=int, default=2000,
                        help="sets or pairs of the run whose total is subtracted")
    parser.add_argument("--size", type=int, default=1024, help="item size in bytes")
    parser.add_argument("--runs", type=int, default=1,
                        help="counts per server, the servers in turn within each; the table "
                             "gives the median (min-max)")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="another checkout of txkestrel, counted as txkestrel-before")
    servers.add_python_options(parser)
    parser.add_argument("--redis", default=shutil.which("redis-server") or "",
                        help="redis-server binary; '' to leave Redis out")
    parser.add_argument("--floors", action="store_true",
                        help="count the floors too: in durable-N the durable floor and the "
                             "bookkeeping floor, one request at a time the journal floor and "
                             "the bookkeeping floor")
    parser.add_argument("--settle-rarely", action="store_true",
                        help="run the Python servers with their histograms settled once in "
                             "10^6 s instead of every second (benchmarks/settle_rarely): "
                             "counts without that once-a-second work, which cachegrind's "
                             "slowdown makes weigh far more per request than at full speed")
    parser.add_argument("--valgrind", default=shutil.which("valgrind") or "valgrind",
                        help="valgrind binary (apt-get install valgrind)")
    return parser.parse_args(argv)


def workload(name: str, size: int) -> Workload:
    """The workload called C{name}; raises C{SystemExit} for an unknown one."""
    if name.startswith("durable-") and name[8:].isdigit():
        conns = int(name[8:])
        return Workload(name, True, lambda protocol, port, suffix, count: (
            queue_client.run_enqueues(protocol, port, "durable" + suffix, conns, count, size)))
    if name in ("dequeue-1", "reliable-1"):
        reliable = name == "reliable-1"
        return Workload(name, False, lambda protocol, port, suffix, count: (
            queue_client.run_pairs(protocol, port, "cost" + suffix, 1, count, size,
                                   reliable=reliable)))
    raise SystemExit(f"unknown workload {name!r}: durable-N, dequeue-1 or reliable-1")


def candidates(args: argparse.Namespace, work: Workload) -> Iterator[Server]:
    """The servers counted in C{work}, in the order they run."""
    extra = DURABLE_CONFIG if work.durable else ""

    def kestrel(src: Path, python: str | None = None) -> Starter:
        return lambda folder, port: servers.kestrel_process(folder, port, extra_config=extra,
                                                            src=src, python=python)

    yield Server("txkestrel", "kestrel", kestrel(servers.ROOT))
    if args.baseline_src is not None or args.baseline_python:
        yield Server("txkestrel-before", "kestrel",
                     kestrel((args.baseline_src or servers.ROOT).resolve(), args.baseline_python))
    if args.redis:
        fsync = "always" if work.durable else "no"
        yield Server("redis", "resp", lambda folder, port: servers.redis_process(
            args.redis, port, folder, fsync=fsync))
    if args.floors:
        durable = work.durable
        yield Server("durable-floor" if durable else "journal-floor", "kestrel",
                     lambda folder, port: servers.floor_process(
                         port, journal=folder / "journal", durable=durable))
        yield Server("bookkeeping-floor", "kestrel", lambda folder, port: servers.floor_process(
            port, journal=folder / "journal", durable=durable, bookkeeping=True))


def instructions(server: Server, work: Workload, count: int, valgrind: str) -> int:
    """Every instruction C{server} executed in user space, from start to stop, serving C{count}."""
    with tempfile.TemporaryDirectory(prefix=f"instructions-{server.name}-") as tmp:
        folder = Path(tmp)
        servers.run_under(servers.cachegrind_prefix(valgrind, folder), START_SECONDS)
        try:
            port = servers.free_port()
            with server.start(folder / "server", port):
                work.run(server.protocol, port, server.queue_suffix, count)
        finally:
            servers.run_under([])
        return servers.cachegrind_count(folder)


def per_request(server: Server, work: Workload, args: argparse.Namespace) -> float:
    """Instructions per request: the two runs' difference over C{--requests}."""
    short = instructions(server, work, args.warm, args.valgrind)
    long = instructions(server, work, args.warm + args.requests, args.valgrind)
    return (long - short) / args.requests


def report(work: Workload, counts: dict[str, list[float]]) -> list[str]:
    """
    The table of C{counts} (each server's instructions per request, one per
    run): the median (min-max), and the medians' ratios to txkestrel's and
    Redis's.
    """
    unit = "set" if work.durable else "item" if work.name == "reliable-1" else "pair"
    lines = [f"### {work.name}", "",
             f"| server | instructions per {unit} | vs txkestrel | vs redis |",
             "|---|---|---|---|"]
    medians = {name: statistics.median(runs) for name, runs in counts.items()}
    ours = medians.get("txkestrel")
    redis = medians.get("redis")
    for name, runs in counts.items():
        median = medians[name]
        versus = [f"{median / base:.2f}x" if base else "-" for base in (ours, redis)]
        spread = f" ({min(runs):,.0f}-{max(runs):,.0f})" if len(runs) > 1 else ""
        lines.append(f"| {name} | {median:,.0f}{spread} | {versus[0]} | {versus[1]} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    """Count every server of every workload asked for, --runs times; print the tables."""
    args = parse_args(argv)
    if shutil.which(args.valgrind) is None:
        raise SystemExit(f"{args.valgrind}: not found (apt-get install valgrind)")
    info = machine()
    try:
        info.update(servers.interpreters_named(args.python, args.baseline_python))
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    servers.use_python(args.python)
    if args.settle_rarely:
        servers.python_path_after([str(SETTLE_RARELY)])
    out: list[str] = []
    for name in args.only:
        work = workload(name, args.size)
        chosen = list(candidates(args, work))
        counts: dict[str, list[float]] = {server.name: [] for server in chosen}
        for run in range(1, args.runs + 1):
            for server in chosen:
                count = per_request(server, work, args)
                counts[server.name].append(count)
                print(f"  {work.name} {server.name} run {run}: {count:,.0f} instructions "
                      f"per request", file=sys.stderr, flush=True)
        out += report(work, counts)
    rarely = ("; Python servers settling their histograms once in 10^6 s"
              if args.settle_rarely else "")
    print(f"{info['date']}: {info['cpus']} CPUs ({info['cpu_model']}), Linux {info['kernel']}, "
          f"{pythons_ran(info)}, Twisted {info['twisted']}.\n"
          f"Instructions in user space per request under cachegrind: ({args.warm} + "
          f"{args.requests} requests - {args.warm}) / {args.requests}; {args.size} B items; "
          f"median (min-max) of {args.runs} run{'s' if args.runs > 1 else ''}{rarely}.\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
