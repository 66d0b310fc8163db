"""
Rewrite latency benchmark: set latency while the journal of an empty queue
is rewritten over and over, next to the same load without rewrites.

Run from the repository root:

    python benchmarks/rewrite_latency.py                 # 10 connections, 5 s, 5 rounds
    python benchmarks/rewrite_latency.py --seconds 1 --rounds 1   # smoke run

Each connection sends set + get pairs of --item-size bytes to a queue of its
own, one request at a time, so its queue is empty after every get (with
--backlog N, it first leaves N items in its queue, which then never
empties, and the rewrites are those of a queue holding items: through
max_journal_size --rewrite-size). Two servers take turns:
"no rewrites" with default_journal_size 1GiB (the journal never reaches it in
a run), and "rewrites" with default_journal_size --rewrite-size, which makes
the queue rewrite its journal each time that many bytes were journaled (the
empty-queue rewrite: an empty file renamed over the journal, the old file
freed and the directory fsynced in a thread, no fsync under the default
sync_journal: never; --sync-journal sets the policy of both servers). It
prints, per server and round, the set latency p50/p99/p99.9,
set+get pairs per second, the server's CPU µs per pair (utime + stime from
/proc/<pid>/stat), the journal rewrites counted by `stats`, and the load
average; then the medians, the p99 ratio of the medians (rewrites / no
rewrites) and the spread of the ratio round by round (each round's two runs
follow each other, so a round's ratio is the one least moved by a machine
whose load drifts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.servers import cpu_seconds, free_port, kestrel_process  # noqa: E402


async def one_client(port: int, queue: str, payload: bytes, stop_at: float,
                     latencies: list[float], backlog: int = 0) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    set_cmd = f"set {queue} 0 0 {len(payload)}\r\n".encode() + payload + b"\r\n"
    get_cmd = f"get {queue}\r\n".encode()
    pairs = 0
    for _ in range(backlog):
        writer.write(set_cmd)
        await reader.readuntil(b"\r\n")
    try:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            writer.write(set_cmd)
            line = await reader.readuntil(b"\r\n")
            latencies.append(time.perf_counter() - started)
            if line != b"STORED\r\n":
                raise SystemExit(f"set failed: {line!r}")
            writer.write(get_cmd)
            await reader.readuntil(b"END\r\n")
            pairs += 1
    finally:
        writer.close()
    return pairs


async def stat_sum(port: int, prefix: str, suffix: str) -> float:
    """Sum the C{stats} values whose names start with C{prefix} and end with C{suffix}."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"stats\r\n")
    got = (await reader.readuntil(b"END\r\n")).decode()
    writer.close()
    total = 0.0
    for line in got.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith(prefix) and parts[1].endswith(suffix):
            total += float(parts[2])
    return total


async def load(port: int, queue: str, connections: int, item_size: int,
               seconds: float, backlog: int = 0) -> tuple[list[float], int, float]:
    payload = b"x" * item_size
    latencies: list[float] = []
    started = time.monotonic()
    stop_at = started + seconds
    counts = await asyncio.gather(*(one_client(port, f"{queue}{i}", payload, stop_at, latencies,
                                               backlog)
                                    for i in range(connections)))
    return latencies, sum(counts), time.monotonic() - started


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def run(workdir: Path, journal_size: str, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    queue = "rw"
    if args.backlog:
        # Queues that keep items: they rewrite once their files pass max_journal_size.
        extra = (f"default:\n  max_journal_size: {journal_size}\n"
                 "  default_journal_size: 1GiB\n  min_journal_compact_delay: null\n")
    else:
        extra = f"default:\n  default_journal_size: {journal_size}\n"
    if args.sync_journal:
        extra += f"  sync_journal: {args.sync_journal}\n"
    with kestrel_process(workdir, port, extra_config=extra) as proc:
        cpu_before = cpu_seconds(proc.pid)
        latencies, pairs, elapsed = asyncio.run(
            load(port, queue, args.connections, args.item_size, args.seconds, args.backlog))
        cpu = cpu_seconds(proc.pid) - cpu_before
        rewrites = asyncio.run(stat_sum(port, f"queue_{queue}", "_journal_rewrites"))
    return {
        "p50": percentile(latencies, 0.50) * 1e3,
        "p99": percentile(latencies, 0.99) * 1e3,
        "p999": percentile(latencies, 0.999) * 1e3,
        "rate": pairs / elapsed,
        "cpu_us": cpu / max(pairs, 1) * 1e6,
        "rewrites": rewrites,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--item-size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one run")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median)")
    parser.add_argument("--rewrite-size", default="256KiB",
                        help="default_journal_size of the server that rewrites (with "
                             "--backlog: its max_journal_size)")
    parser.add_argument("--backlog", type=int, default=0,
                        help="items each connection first leaves in its queue, so that the "
                             "queues are never empty and rewrite as queues holding items do "
                             "(through max_journal_size; the server without rewrites has "
                             "1GiB)")
    parser.add_argument("--sync-journal", default=None,
                        help="sync_journal of both servers (e.g. 10ms, always; default: the "
                             "server's default, never)")
    args = parser.parse_args()
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    results: dict[str, list[dict[str, float]]] = {"no rewrites": [], "rewrites": []}
    with tempfile.TemporaryDirectory(prefix="kestrel-rewrite-") as tmp:
        for round_ in range(args.rounds):
            for label, size in (("no rewrites", "1GiB"), ("rewrites", args.rewrite_size)):
                got = run(Path(tmp) / f"{label.replace(' ', '-')}-{round_}", size, args)
                results[label].append(got)
                print(f"round {round_ + 1} {label:11}: set p50 {got['p50']:.2f} ms, "
                      f"p99 {got['p99']:.2f} ms, p99.9 {got['p999']:.2f} ms, "
                      f"{got['rate']:.0f} pairs/s, server CPU {got['cpu_us']:.0f} µs/pair, "
                      f"{got['rewrites']:.0f} rewrites, load average {os.getloadavg()[0]:.2f}")
    medians = {label: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for label, runs in results.items()}
    for label, m in medians.items():
        print(f"median {label:11}: set p50 {m['p50']:.2f} ms, p99 {m['p99']:.2f} ms, "
              f"p99.9 {m['p999']:.2f} ms, {m['rate']:.0f} pairs/s, "
              f"server CPU {m['cpu_us']:.0f} µs/pair, {m['rewrites']:.0f} rewrites")
    ratio = medians["rewrites"]["p99"] / medians["no rewrites"]["p99"]
    print(f"p99 with rewrites / without: {ratio:.2f}x (load average {os.getloadavg()[0]:.2f})")
    by_round = sorted(with_["p99"] / without["p99"] for without, with_
                      in zip(results["no rewrites"], results["rewrites"], strict=True))
    print(f"p99 ratio round by round: median {statistics.median(by_round):.2f}x, "
          f"range {by_round[0]:.2f}x-{by_round[-1]:.2f}x over {len(by_round)} rounds")


if __name__ == "__main__":
    main()
