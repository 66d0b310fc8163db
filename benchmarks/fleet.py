"""
The fleet client over 1, 2 and 3 servers, against a bare connection per worker.

Not a test. For each server count it starts that many txkestrel servers
(`python -m twisted kestrel`, memcache only, journals in a temporary
directory, the default `sync_journal: never`) on loopback, then moves
`--items` items of `--size` bytes through them with `--producers` producers
and `--consumers` reliable consumers, all coroutines on one reactor in this
process:

- `bare`: one server, each worker with its own `kestrel.client.memcache`
  connection (a producer sends `set`; a consumer sends `get q/t=1000/open`,
  then `get q/close`): the cost of the protocol alone.
- `fleet`: the same work through `kestrel.client.KestrelClient` over a
  static list of the servers (server choice, pooling, health, handles,
  and the waiter race when the fleet is momentarily empty).

Each run has three phases: `put` (producers only, building a backlog),
`drain` (consumers only: read and confirm the backlog) and `mixed` (both at
once, so the queues stay near empty and reads often wait). It prints items
per second (median of `--runs`, with min-max), the servers' CPU per item
(utime + stime of every server process from /proc/<pid>/stat, summed, in
microseconds), this process's CPU per item, and the load average.

    python benchmarks/fleet.py --help
    python benchmarks/fleet.py --items 500 --runs 1       # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from servers import ROOT, cpu_seconds, free_port, kestrel_process

sys.path.insert(0, str(ROOT))

from twisted.internet import reactor  # noqa: E402
from twisted.internet.defer import CancelledError, Deferred, DeferredList  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol  # noqa: E402

from kestrel.client import KestrelClient  # noqa: E402
from kestrel.client.memcache import MemcacheConnection  # noqa: E402


@contextmanager
def server(workdir: Path) -> Iterator[tuple[int, int]]:
    """One txkestrel server, memcache only; yields (port, pid)."""
    port = free_port()
    with kestrel_process(workdir, port) as proc:
        yield port, proc.pid


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def waiting(d: Deferred[Any], waits: set[Deferred[Any]]) -> Any:
    """Await a read, which the last consumer may cancel; None if it did."""
    waits.add(d)
    try:
        return await d
    except CancelledError:
        return None
    finally:
        waits.discard(d)


def done(left: list[int], waits: set[Deferred[Any]]) -> None:
    """After an item: once all are in, stop the reads still waiting (no 1 s tail)."""
    if left[0] <= 0:
        for d in list(waits):
            d.cancel()


class Bare:
    """Each worker on its own connection to the first server (no fleet logic)."""

    def __init__(self, ports: list[int]) -> None:
        self.port = ports[0]

    async def connect(self) -> MemcacheConnection:
        conn = MemcacheConnection(f"127.0.0.1:{self.port}", reactor, 5.0)
        return await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port), conn)

    async def producer(self, queue: str, count: int, payload: bytes) -> None:
        conn = await self.connect()
        for _ in range(count):
            if not await conn.set(queue, payload):
                raise RuntimeError("NOT_STORED")
        conn.close()

    async def consumer(self, queue: str, left: list[int], waits: set[Deferred[Any]]) -> None:
        conn = await self.connect()
        while left[0] > 0:
            if await waiting(conn.get(queue, 1000, open=True), waits) is not None:
                left[0] -= 1
                await conn.get(queue, close=True)
                done(left, waits)
        conn.close()

    async def close(self) -> None:
        pass


class Fleet:
    """The same workers through the fleet client over every server."""

    def __init__(self, ports: list[int]) -> None:
        self.client = KestrelClient([f"127.0.0.1:{p}" for p in ports], reactor=reactor)

    async def producer(self, queue: str, count: int, payload: bytes) -> None:
        for _ in range(count):
            await self.client.put(queue, payload)

    async def consumer(self, queue: str, left: list[int], waits: set[Deferred[Any]]) -> None:
        while left[0] > 0:
            handle = await waiting(self.client.read(queue, 1.0), waits)
            if handle is not None:
                left[0] -= 1
                await handle.confirm()
                done(left, waits)

    async def close(self) -> None:
        await self.client.close()


async def workload(setup: Bare | Fleet, phase: str, args: argparse.Namespace, queue: str) -> int:
    """Run one phase (put, drain or mixed); return the items moved."""
    payload = b"x" * args.size
    per = args.items // args.producers
    n = per * args.producers
    left = [n]
    workers = []
    if phase in ("put", "mixed"):
        workers += [Deferred.fromCoroutine(setup.producer(queue, per, payload))
                    for _ in range(args.producers)]
    if phase in ("drain", "mixed"):
        waits: set[Deferred[Any]] = set()
        workers += [Deferred.fromCoroutine(setup.consumer(queue, left, waits))
                    for _ in range(args.consumers)]
    await DeferredList(workers, fireOnOneErrback=True, consumeErrors=True)
    return n


async def measure(setup: Bare | Fleet, phase: str, pids: list[int], args: argparse.Namespace,
                  queue: str) -> tuple[float, float, float]:
    """One phase: (items/s, server CPU us/item, client CPU us/item)."""
    servers_before = sum(cpu_seconds(p) for p in pids)
    client_before = own_cpu()
    started = time.perf_counter()
    n = await workload(setup, phase, args, queue)
    elapsed = time.perf_counter() - started
    server_cpu = sum(cpu_seconds(p) for p in pids) - servers_before
    client_cpu = own_cpu() - client_before
    return n / elapsed, server_cpu * 1e6 / n, client_cpu * 1e6 / n


PHASES = ("put", "drain", "mixed")


async def main_async(args: argparse.Namespace) -> None:
    counts = [int(c) for c in args.servers.split(",")]
    print(f"# {args.items} items of {args.size} bytes, {args.producers} producers, "
          f"{args.consumers} consumers, {args.runs} run(s); {os.cpu_count()} CPUs")
    print("# put: producers only (a backlog builds); drain: consumers only (read, confirm);")
    print("# mixed: both at once (the queue stays near empty, so reads often wait)")
    print(f"{'setup':<6} {'servers':>7} {'phase':<6} {'items/s median (min-max)':>26} "
          f"{'server us/item':>15} {'client us/item':>15} {'load avg':>9}")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        started = [stack.enter_context(server(Path(tmp) / f"s{i}")) for i in range(max(counts))]
        setups = [("bare", 1)] + [("fleet", c) for c in counts]
        for mode, count in setups:
            ports = [p for p, _ in started[:count]]
            pids = [pid for _, pid in started[:count]]
            results: dict[str, list[tuple[float, float, float]]] = {p: [] for p in PHASES}
            for run in range(args.runs):
                setup = Bare(ports) if mode == "bare" else Fleet(ports)
                for phase in PHASES:
                    queue = f"bench_{mode}_{count}_{run}_{'mixed' if phase == 'mixed' else 'pd'}"
                    results[phase].append(await measure(setup, phase, pids, args, queue))
                await setup.close()
            for phase in PHASES:
                rates = [r[0] for r in results[phase]]
                print(f"{mode:<6} {count:>7} {phase:<6} {statistics.median(rates):>10,.0f} "
                      f"({min(rates):,.0f}-{max(rates):,.0f}){'':>3} "
                      f"{statistics.median(r[1] for r in results[phase]):>15.0f} "
                      f"{statistics.median(r[2] for r in results[phase]):>15.0f} "
                      f"{os.getloadavg()[0]:>9.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20000, help="items per run (default 20000)")
    parser.add_argument("--size", type=int, default=256, help="bytes per item (default 256)")
    parser.add_argument("--producers", type=int, default=4, help="producers (default 4)")
    parser.add_argument("--consumers", type=int, default=4, help="consumers (default 4)")
    parser.add_argument("--servers", default="1,2,3", help="server counts (default 1,2,3)")
    parser.add_argument("--runs", type=int, default=3, help="runs per setup (default 3)")
    args = parser.parse_args(argv)
    failure: list[Any] = []

    def go() -> None:
        d = Deferred.fromCoroutine(main_async(args))
        d.addErrback(failure.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(go)
    reactor.run()
    if failure:
        failure[0].printTraceback()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
