"""
Per-request cost of txkestrel next to darner, memcached, Redis and
beanstalkd, measured in one run.

Not a test. It starts every server once (txkestrel from this checkout, and
with --baseline-src a second txkestrel from another checkout; memcached;
darner when --darner names its binary; Redis and beanstalkd, each as a
plain and a durable instance), then runs each workload against each server
that speaks it, in turn, alternating the order every repetition, --runs
times. For every (workload, server) it prints the median over the runs, with
min-max, of

* the server's CPU time per unit of work: utime + stime of the server process
  (every thread) from /proc/<pid>/stat, before and after the run, divided by
  the pairs (or sets) served; the robust figure on a busy machine; and the
  part of it spent in the kernel (stime: system calls, the socket and file
  work they do), which tells a difference in the server's own code from one
  in what the kernel does for it;
* the throughput the client saw (wall clock: noisy when the machine is shared);
* the 1-minute load average at the end of the run;

and, from one more run under `strace -c -f -p <pid>` (when strace works here),
the system calls per request (a set+get pair is two requests) with the most
frequent ones, and for durable sets the sets per fsync.

Workloads (1 KiB items):

* db-1, db-10: darner's own C++ client `db` (built beside the darner binary,
  or --db) with 1 and 10 connections, each sending one request at a time,
  sets and gets interleaved on one queue; a pair is one set and one get;
* pipelined-10x16: 10 connections, each writing 16 set+get pairs at once and
  reading the 32 replies (the asyncio client of benchmarks/flood.py);
* dequeue-1: enqueue + dequeue of one item at a time, one request at a time,
  1 connection, with the one asyncio client of benchmarks/queue_client.py
  for every server: txkestrel, darner, memcached and the floors `set` +
  `get`; Redis `LPUSH` + `RPOP`; beanstalkd `put` + `reserve-with-timeout 0`
  + `delete` (three requests);
* reliable-1: enqueue + reliable dequeue + acknowledgement, one request at a
  time, 1 connection: txkestrel and darner `set`, `get q/open`,
  `get q/close`; Redis `LPUSH`, `LMOVE q q:reserved RIGHT LEFT`,
  `LREM q:reserved 1 item`; beanstalkd `put`, `reserve-with-timeout 0`,
  `delete`; the floors as txkestrel (memcached has no reliable read);
* durable-50: 50 connections with one enqueue outstanding each (the same
  client). txkestrel runs a second server with `sync_journal: always` and
  `durable_acks: true` (STORED only after the fsync that covers the set),
  darner gets `set <queue>/sync` (it fsyncs that write), Redis a second
  server with `appendfsync always`, beanstalkd a second one with `-f 0`;
  memcached has no durable mode;
* with --floor, benchmarks/floor_server.py (a bare Twisted memcache queue
  on txkestrel's reactor: no journal, no metrics) runs beside the others as
  "twisted-floor": the part of txkestrel's cost that is the reactor's and
  the kernel's;
* with --epoll, txkestrel also runs on Twisted's own epoll reactor
  (`--reactor epoll`) as "txkestrel-epoll" and, with --floor, so does the
  floor server as "twisted-floor-epoll": what kestrel.reactor saves;
* with --python-floor, the floor server's queue on a bare select.epoll loop
  (no Twisted) as "python-floor": the least any Python server costs;
* with --journal-floor, the floor server on txkestrel's reactor appending
  each set's ADDX and each hit's REMOVE record (an open's tentative remove,
  a close's confirm) to a journal file, one write each, as "journal-floor":
  the least a Python server on Twisted costs that journals every request
  before replying (no stats, metrics, limits or checks);
* with --bookkeeping-floor, the journal floor also doing per request what
  a Kestrel queue keeps and counts (limits, an item, expiry, counters,
  txkestrel's metrics), as "bookkeeping-floor": the floor under txkestrel's
  own layers;
* in durable-N, with --durable-floor, that server writing and fsyncing its
  journal once per reactor turn before the turn's replies, as
  "durable-floor" (and without Twisted as "durable-python-floor"); with
  --bookkeeping-floor, the durable floor also doing per set what a Kestrel
  queue keeps and counts (as above, the item unseen until the fsync), as
  "bookkeeping-floor";
* latency-100 (--latency): 100 connections sending sets and gets, one at a
  time each, at a fixed total rate (--rate requests/s); p50 and p99 of the
  request latency instead of the throughput.

Redis (`--appendonly yes --save ''`, `--appendfsync no` for the plain
workloads) and beanstalkd (`-b DIR -F`, never fsync, for the plain ones)
are Debian's `redis-server` and `beanstalkd`, each on a free loopback port
with its own data folder; `--redis ''` or `--beanstalkd ''` leaves one out.
darner is not part of this project: build it yourself and pass --darner
PATH (its `db` client is looked up beside it). Without --darner (and --db)
the db workloads are replaced by "one-at-a-time-1/10": the asyncio client
at depth 1, which writes a set and its get together and waits for both
replies (one pair at a time, not one request).

The Python servers (txkestrel, the floors) run on the interpreter running
this script unless --python names another: the python of a venv holding
txkestrel's dependencies. With --baseline-python, txkestrel-before (this
checkout unless --baseline-src) runs on that one: the same code on two
interpreters in one run, e.g. a Python built without profile-guided
optimization against Debian's.

    python benchmarks/cost.py --help
    python benchmarks/cost.py --darner ~/darner/darner --runs 5 --json cost.json
    python benchmarks/cost.py --runs 1 --pairs 2000 --no-strace      # smoke run
    python benchmarks/cost.py --only dequeue reliable durable --runs 5   # the peers' workloads
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import queue_client
from flood import flood
from queue_client import PAIR_REQUESTS, RELIABLE_REQUESTS
from servers import (
    ROOT,
    add_python_options,
    beanstalkd_process,
    cpu_times,
    darner_process,
    floor_process,
    free_port,
    interpreters_named,
    kestrel_process,
    memcached_process,
    pin_servers,
    redis_process,
    use_python,
)

DURABLE_CONFIG = "default:\n  sync_journal: always\n  durable_acks: true\n"
#: The memcache set+get workloads: Kestrel's dialect and plain memcache, two requests a pair.
MEMCACHE_PAIR = {"kestrel": 2, "memcache": 2}


@dataclass
class Server:
    """
    A running server: its label, port, pid, how its queues are named, and the
    protocol of benchmarks/queue_client.py it speaks (C{kestrel}, C{memcache},
    C{resp} or C{beanstalk}).
    """

    name: str
    port: int
    pid: int
    durable: bool = False
    queue_suffix: str = ""
    protocol: str = "kestrel"

    @property
    def in_memory(self) -> bool:
        """Whether it loses its items on exit (memcached, the floor): no queue to drain."""
        return self.name == "memcached" or self.name.endswith(("-floor", "-floor-epoll"))


@dataclass
class Sample:
    """One run of one workload against one server."""

    units: int
    cpu_s: float
    wall_s: float
    load: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    #: The load client's CPU (this process and the children it waited for).
    client_cpu_s: float = 0.0
    #: The part of C{cpu_s} the server spent in the kernel (stime).
    system_s: float = 0.0

    @property
    def cpu_us(self) -> float:
        """Server CPU microseconds per unit (pair or set)."""
        return self.cpu_s * 1e6 / self.units

    @property
    def system_us(self) -> float:
        """Server CPU microseconds per unit spent in the kernel."""
        return self.system_s * 1e6 / self.units

    @property
    def client_cpu_us(self) -> float:
        """The load client's CPU microseconds per unit."""
        return self.client_cpu_s * 1e6 / self.units

    @property
    def rate(self) -> float:
        """Units per second of wall-clock time."""
        return self.units / self.wall_s


@dataclass
class Result:
    """Every run of one workload against one server, and its strace counts."""

    workload: str
    server: str
    unit: str
    requests_per_unit: int
    samples: list[Sample] = field(default_factory=list)
    syscalls: dict[str, int] | None = None
    strace_units: int = 0

    def syscalls_per_request(self) -> float | None:
        """System calls per request in the strace run (None without strace)."""
        if not self.syscalls or not self.strace_units:
            return None
        return self.syscalls["total"] / (self.strace_units * self.requests_per_unit)

    def top_syscalls(self, n: int = 5) -> list[tuple[str, float]]:
        """The C{n} most frequent system calls, per request."""
        if not self.syscalls or not self.strace_units:
            return []
        per = self.strace_units * self.requests_per_unit
        calls = sorted(((k, v) for k, v in self.syscalls.items() if k != "total"),
                       key=lambda kv: -kv[1])
        return [(k, v / per) for k, v in calls[:n]]

    def units_per_fsync(self) -> float | None:
        """Units per fsync/fdatasync in the strace run (None when none were counted)."""
        if not self.syscalls:
            return None
        fsyncs = self.syscalls.get("fsync", 0) + self.syscalls.get("fdatasync", 0)
        return self.strace_units / fsyncs if fsyncs else None

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary: medians, ranges and the raw samples."""
        def med(values: list[float]) -> dict[str, float]:
            return {"median": statistics.median(values), "min": min(values), "max": max(values)}
        out: dict[str, object] = {
            "workload": self.workload, "server": self.server, "unit": self.unit,
            "cpu_us": med([s.cpu_us for s in self.samples]),
            "system_us": med([s.system_us for s in self.samples]),
            "rate": med([s.rate for s in self.samples]),
            "load": med([s.load for s in self.samples]),
            "syscalls_per_request": self.syscalls_per_request(),
            "top_syscalls": self.top_syscalls(),
            "units_per_fsync": self.units_per_fsync(),
            "samples": [asdict(s) for s in self.samples],
        }
        if self.samples and self.samples[0].p50_ms is not None:
            out["p50_ms"] = med([s.p50_ms or 0.0 for s in self.samples])
            out["p99_ms"] = med([s.p99_ms or 0.0 for s in self.samples])
        return out


# -- clients ------------------------------------------------------------------

def run_db(db: str, port: int, conns: int, pairs: int, size: int) -> tuple[int, float]:
    """darner's C++ client: C{pairs} sets and gets over C{conns} connections; (pairs, seconds)."""
    out = subprocess.run([db, "-p", str(port), "-c", str(conns), "-s", str(pairs),
                          "-g", str(pairs), "-i", str(size)],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    match = re.search(r"Time taken for tests:\s+([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"unexpected output from {db}: {out[:200]!r}")
    return pairs, float(match.group(1))


def run_pipelined(port: int, conns: int, depth: int, pairs: int, size: int) -> tuple[int, float]:
    """The flood.py client: C{depth} pairs per write on C{conns} connections."""
    rate = asyncio.run(flood(port, pairs, conns, depth, size))
    return pairs, pairs / rate


async def _paced(port: int, queue: bytes, count: int, interval: float, start: float,
                 payload: bytes, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    set_request = b"set %s 0 0 %d\r\n%s\r\n" % (queue, len(payload), payload)
    get_request = b"get %s\r\n" % queue
    loop = asyncio.get_running_loop()
    try:
        for i in range(count):
            due = start + i * interval
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = loop.time()
            if i % 2 == 0:
                writer.write(set_request)
                line = await reader.readline()
            else:
                writer.write(get_request)
                line = await reader.readline()
                if line.startswith(b"VALUE "):
                    await reader.readexactly(int(line.split()[3]) + 2 + 5)
            # From when the request was due: a late send counts as waiting.
            latencies.append(loop.time() - min(sent, max(due, start)))
    finally:
        writer.close()
        await writer.wait_closed()


def run_latency(port: int, queue: str, conns: int, rate: float, seconds: float,
                size: int) -> tuple[int, float, float, float]:
    """Sets and gets at C{rate} requests/s over C{conns} connections; (pairs, s, p50, p99 ms)."""
    per_conn = max(2, int(rate * seconds / conns) // 2 * 2)
    interval = conns / rate
    latencies: list[float] = []

    async def run() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.2
        t0 = time.perf_counter()
        await asyncio.gather(*(
            _paced(port, queue.encode(), per_conn, interval, start + i * interval / conns,
                   b"l" * size, latencies) for i in range(conns)))
        return time.perf_counter() - t0
    wall = asyncio.run(run())
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return conns * per_conn // 2, wall, p50, p99


# -- measurement --------------------------------------------------------------

def measure(server: Server, work: Callable[[Server], tuple]) -> Sample:
    """Run C{work} once against C{server}, reading its CPU time around it."""
    client_before = _own_cpu_seconds()
    user_before, system_before = cpu_times(server.pid)
    result = work(server)
    user_after, system_after = cpu_times(server.pid)
    client = _own_cpu_seconds() - client_before
    units, wall = result[0], result[1]
    system = system_after - system_before
    sample = Sample(units=units, cpu_s=user_after - user_before + system, wall_s=wall,
                    load=os.getloadavg()[0], client_cpu_s=client, system_s=system)
    if len(result) == 4:
        sample.p50_ms, sample.p99_ms = result[2], result[3]
    return sample


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (the load clients)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def strace_works() -> bool:
    """Whether `strace -c -p` can attach to a child process here."""
    if shutil.which("strace") is None:
        return False
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        probe = subprocess.run(["timeout", "-s", "INT", "0.5", "strace", "-c", "-p",
                                str(child.pid), "-o", os.devnull],
                               capture_output=True, text=True, timeout=10)
        return "attached" in probe.stderr
    finally:
        child.kill()
        child.wait()


def parse_strace(text: str) -> dict[str, int]:
    """Calls per system call (and C{total}) from an C{strace -c} summary."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and re.fullmatch(r"[0-9.]+", parts[0]) and parts[3].isdigit():
            calls[parts[-1]] = int(parts[3])
    return calls


@contextmanager
def straced(pid: int, workdir: Path) -> Iterator[dict[str, int]]:
    """Count the system calls of C{pid} (every thread) while the context runs."""
    out = workdir / f"strace-{pid}-{time.monotonic_ns()}.txt"
    err = workdir / "strace.err"
    with open(err, "w") as errfile:
        proc = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                                stderr=errfile)
    deadline = time.monotonic() + 10
    while "attached" not in err.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    counts: dict[str, int] = {}
    try:
        yield counts
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        counts.update(parse_strace(out.read_text() if out.exists() else ""))


# -- the run ------------------------------------------------------------------

@dataclass
class Workload:
    """
    A named way to load a server, in units of C{unit}; C{requests} maps each
    protocol it can load to the requests one unit takes in it (servers
    speaking another protocol sit it out).
    """

    name: str
    unit: str
    requests: dict[str, int]
    run: Callable[[Server], tuple]
    durable: bool = False
    queue: str = "cost"

    def servers(self, servers: list[Server]) -> list[Server]:
        """Those of C{servers} this workload can load."""
        return [s for s in servers if s.protocol in self.requests]


def _db_work(db: str, conns: int, pairs: int, size: int, server: Server) -> tuple:
    return run_db(db, server.port, conns, pairs, size)


def _pipelined_work(conns: int, depth: int, pairs: int, size: int, server: Server) -> tuple:
    return run_pipelined(server.port, conns, depth, pairs, size)


def _sets_work(conns: int, sets: int, size: int, server: Server) -> tuple:
    return queue_client.run_enqueues(server.protocol, server.port,
                                     "durable" + server.queue_suffix, conns, sets, size)


def _pairs_work(conns: int, pairs: int, size: int, reliable: bool, server: Server) -> tuple:
    return queue_client.run_pairs(server.protocol, server.port, "cost", conns, pairs, size,
                                  reliable=reliable)


def _latency_work(conns: int, rate: float, seconds: float, size: int, server: Server) -> tuple:
    return run_latency(server.port, "paced", conns, rate, seconds, size)


def workloads(args: argparse.Namespace) -> list[Workload]:
    """The workloads asked for, in the order they run."""
    size = args.size
    out: list[Workload] = []
    for conns in (1, 10):
        if args.db:
            run = partial(_db_work, args.db, conns, args.pairs, size)
            name = f"db-{conns}"
        else:
            run = partial(_pipelined_work, conns, 1, args.pairs, size)
            name = f"one-at-a-time-{conns}"
        out.append(Workload(name, "pair", MEMCACHE_PAIR, run, queue="db_bench"))
    out.append(Workload("pipelined-10x16", "pair", MEMCACHE_PAIR,
                        partial(_pipelined_work, 10, 16, args.pairs, size)))
    out.append(Workload("dequeue-1", "pair", PAIR_REQUESTS,
                        partial(_pairs_work, 1, args.pairs, size, False)))
    out.append(Workload("reliable-1", "item", RELIABLE_REQUESTS,
                        partial(_pairs_work, 1, args.pairs, size, True)))
    for conns in args.durable_conns:
        out.append(Workload(f"durable-{conns}", "set", {"kestrel": 1, "resp": 1, "beanstalk": 1},
                            partial(_sets_work, conns, args.durable_sets, size),
                            durable=True, queue="durable"))
    if args.latency:
        out.append(Workload("latency-100", "pair", MEMCACHE_PAIR,
                            partial(_latency_work, 100, args.rate, args.latency_seconds, size),
                            queue="paced"))
    return [w for w in out if not args.only or any(w.name.startswith(o) for o in args.only)]


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    import twisted
    return {"cpus": os.cpu_count(), "cpu_model": model, "mem_mib": mem,
            "kernel": platform.release(), "python": platform.python_version(),
            "twisted": twisted.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())}


def start_servers(args: argparse.Namespace, works: list[Workload], root: Path,
                  stack: ExitStack) -> tuple[list[Server], list[Server]]:
    """
    Start every server C{args} asks for under C{root} (stopped when C{stack}
    closes), each only if one of C{works} can load it; (plain, durable).
    """
    wants = {(p, w.durable) for w in works for p in w.requests}
    plain: list[Server] = []
    durable: list[Server] = []
    # (label, checkout, reactor, interpreter: None for --python's)
    sources: list[tuple[str, Path, str | None, str | None]] = [("txkestrel", ROOT, None, None)]
    if args.epoll:
        sources.append(("txkestrel-epoll", ROOT, "epoll", None))
    if args.baseline_src or args.baseline_python:
        sources.append(("txkestrel-before", (args.baseline_src or ROOT).resolve(), None,
                        args.baseline_python))
    for label, src, reactor, python in sources:
        if ("kestrel", False) in wants:
            port = free_port()
            proc = stack.enter_context(kestrel_process(root / label, port, src=src,
                                                       reactor=reactor, python=python))
            plain.append(Server(label, port, proc.pid))
        if ("kestrel", True) in wants:
            # The other journal_fsync modes asked for: this checkout, on --python, only.
            this = src == ROOT and python is None
            modes = [m for m in args.journal_fsync if m != "reactor"] if this else []
            for mode in (["reactor"] if "reactor" in args.journal_fsync or not this
                         else []) + modes:
                name = label if mode == "reactor" else f"{label}-{mode}"
                extra = DURABLE_CONFIG if mode == "reactor" else (
                    f"journal_fsync: {mode}\n{DURABLE_CONFIG}")
                port = free_port()
                proc = stack.enter_context(kestrel_process(
                    root / f"{name}-durable", port, extra_config=extra, src=src,
                    reactor=reactor, python=python))
                durable.append(Server(name, port, proc.pid, durable=True))
    if args.darner:
        port = free_port()
        proc = stack.enter_context(darner_process(args.darner, port, root / "darner"))
        plain.append(Server("darner", port, proc.pid))
        durable.append(Server("darner", port, proc.pid, durable=True, queue_suffix="/sync"))
    if args.memcached:
        port = free_port()
        proc = stack.enter_context(memcached_process(args.memcached, port))
        plain.append(Server("memcached", port, proc.pid, protocol="memcache"))
    peers = [("redis", "resp", args.redis, lambda port, folder, sync: redis_process(
                 args.redis, port, folder, "always" if sync else "no")),
             ("beanstalkd", "beanstalk", args.beanstalkd, lambda port, folder, sync:
                 beanstalkd_process(args.beanstalkd, port, folder, fsync_always=sync))]
    for label, protocol, binary, process in peers:
        for sync, servers in ((False, plain), (True, durable)):
            if binary and (protocol, sync) in wants:
                port = free_port()
                folder = root / (f"{label}-durable" if sync else label)
                proc = stack.enter_context(process(port, folder, sync))
                servers.append(Server(label, port, proc.pid, durable=sync, protocol=protocol))
    floors: list[tuple[str, str, Path | None, bool]] = []
    if args.floor:
        floors.append(("twisted-floor", "kestrel", None, False))
    if args.floor and args.epoll:
        floors.append(("twisted-floor-epoll", "epoll", None, False))
    if args.python_floor:
        floors.append(("python-floor", "none", None, False))
    if args.journal_floor:
        floors.append(("journal-floor", "kestrel", root / "journal-floor", False))
    if args.bookkeeping_floor:
        floors.append(("bookkeeping-floor", "kestrel", root / "bookkeeping-floor", True))
    if ("kestrel", False) in wants:
        for label, reactor, journal, bookkeeping in floors:
            port = free_port()
            proc = stack.enter_context(floor_process(port, reactor, journal,
                                                     bookkeeping=bookkeeping))
            plain.append(Server(label, port, proc.pid))  # (Kestrel's dialect: /open, /close)
    durable_floors: list[tuple[str, str, bool]] = []
    if args.durable_floor:
        durable_floors += [("durable-floor", "kestrel", False),
                           ("durable-python-floor", "none", False)]
    if args.bookkeeping_floor:
        durable_floors.append(("bookkeeping-floor", "kestrel", True))
    if ("kestrel", True) in wants:
        for label, reactor, bookkeeping in durable_floors:
            port = free_port()
            proc = stack.enter_context(floor_process(port, reactor, root / f"{label}-durable",
                                                     durable=True, bookkeeping=bookkeeping))
            durable.append(Server(label, port, proc.pid, durable=True))
    return plain, durable


def _drain(server: Server, work: Workload) -> None:
    if not server.in_memory:
        queue_client.drain(server.protocol, server.port, work.queue)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """
    The options of C{argv} (default: the command line), checked: every peer
    binary asked for exists, and every interpreter asked for runs
    txkestrel (C{interpreters}: what a report names of them, from
    L{interpreters_named}); exits with a usage error otherwise.
    """
    parser = argparse.ArgumentParser(
        description="Server CPU us per request, throughput, system calls per request and "
                    "load average of txkestrel, darner, memcached, Redis and beanstalkd, "
                    "measured alternately in one run (median of --runs).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--darner", help="darner binary (not part of this project; build it "
                        "yourself); its `db` client is looked up beside it")
    parser.add_argument("--db", help="darner's C++ load client `db` (default: beside --darner)")
    parser.add_argument("--memcached", default=shutil.which("memcached") or "/usr/bin/memcached",
                        help="memcached binary (apt-get install memcached); '' to leave it out")
    parser.add_argument("--redis", default=shutil.which("redis-server") or
                        "/usr/bin/redis-server",
                        help="redis-server binary (apt-get install redis-server), run with "
                             "--appendonly yes --save '' and --appendfsync no (durable-50: "
                             "always); '' to leave it out")
    parser.add_argument("--beanstalkd", default=shutil.which("beanstalkd") or
                        "/usr/bin/beanstalkd",
                        help="beanstalkd binary (apt-get install beanstalkd), run with -b DIR "
                             "-F (durable-50: -f 0); '' to leave it out")
    parser.add_argument("--baseline-src", type=Path,
                        help="also run txkestrel from this checkout (labelled txkestrel-before)")
    add_python_options(parser)
    parser.add_argument("--epoll", action="store_true",
                        help="also run txkestrel (and, with --floor, the floor server) on "
                             "Twisted's own epoll reactor instead of txkestrel's")
    parser.add_argument("--python-floor", action="store_true",
                        help="also run benchmarks/floor_server.py --reactor none (the same "
                             "queue on a bare select.epoll loop, no Twisted) as python-floor")
    parser.add_argument("--journal-floor", action="store_true",
                        help="also run benchmarks/floor_server.py --journal (the bare queue "
                             "appending its journal records, one write each) as journal-floor")
    parser.add_argument("--journal-fsync", nargs="+", default=["reactor"],
                        choices=["reactor", "thread"], metavar="MODE",
                        help="durable-N runs txkestrel once per journal_fsync mode given "
                             "(reactor: labelled txkestrel; thread: txkestrel-thread)")
    parser.add_argument("--durable-floor", action="store_true",
                        help="also run benchmarks/floor_server.py --journal --durable (the bare "
                             "queue writing and fsyncing its journal once per reactor turn "
                             "before replying) in durable-N, on txkestrel's reactor as "
                             "durable-floor and without Twisted as durable-python-floor")
    parser.add_argument("--bookkeeping-floor", action="store_true",
                        help="also run benchmarks/floor_server.py --journal --bookkeeping "
                             "(the journal floor doing, per request, what a Kestrel queue keeps "
                             "and counts: limits, item, expiry, counters, metrics) as "
                             "bookkeeping-floor; in durable-N with --durable too (unseen until "
                             "the fsync)")
    parser.add_argument("--floor", action="store_true",
                        help="also run benchmarks/floor_server.py (a bare Twisted memcache "
                             "queue, no journal): the reactor's and kernel's share")
    parser.add_argument("--runs", type=int, default=5, help="repetitions of every measurement")
    parser.add_argument("--pairs", type=int, default=20000,
                        help="set+get pairs per run (the pairs of dequeue-1, the items of "
                             "reliable-1)")
    parser.add_argument("--durable-sets", type=int, default=5000,
                        help="enqueues per durable-50 run (darner's /sync and beanstalkd "
                             "-f 0 do one fsync per enqueue)")
    parser.add_argument("--durable-conns", type=int, nargs="+", default=[50], metavar="N",
                        help="run the durable workload at each of these connection counts "
                             "(durable-N: N connections, one set outstanding each)")
    parser.add_argument("--size", type=int, default=1024, help="item size in bytes")
    parser.add_argument("--latency", action="store_true",
                        help="also measure p50/p99 latency of 100 paced clients")
    parser.add_argument("--rate", type=float, default=5000, help="requests/s of --latency")
    parser.add_argument("--latency-seconds", type=float, default=4.0,
                        help="length of a --latency run")
    parser.add_argument("--only", nargs="+",
                        help="run only the workloads named so (prefixes): db-1, db-10 or "
                             "one-at-a-time-1, -10 (without --darner), pipelined-10x16, "
                             "dequeue-1, reliable-1, durable-50, latency-100")
    parser.add_argument("--no-strace", action="store_true", help="skip the strace runs")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave the servers and the clients wherever the OS puts them "
                             "(by default, with 2 or more CPUs, every server runs on CPU 0 "
                             "and the clients on the others)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.darner and not args.db:
        beside = Path(args.darner).with_name("db")
        args.db = str(beside) if beside.exists() else None
    for flag, package in (("memcached", "memcached"), ("redis", "redis-server"),
                          ("beanstalkd", "beanstalkd")):
        binary = getattr(args, flag)
        if binary and not os.path.exists(binary):
            parser.error(f"{binary} not found: apt-get install {package}, or --{flag} ''")
    try:
        args.interpreters = interpreters_named(args.python, args.baseline_python)
    except RuntimeError as e:
        parser.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_python(args.python)
    use_strace = not args.no_strace and strace_works()
    cpus = sorted(os.sched_getaffinity(0))
    pinned = not args.no_pin and len(cpus) >= 2
    if pinned:
        pin_servers({cpus[0]})
        os.sched_setaffinity(0, set(cpus[1:]))  # (this process, its threads and its clients)

    info = machine()
    info.update(args.interpreters)
    info["pinned"] = (f"servers on CPU {cpus[0]}, clients on CPU "
                      f"{','.join(map(str, cpus[1:]))}" if pinned else "no")
    load_start = os.getloadavg()
    results: dict[tuple[str, str], Result] = {}
    with tempfile.TemporaryDirectory(prefix="kestrel-cost-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        plain, durable = start_servers(args, workloads(args), root, stack)
        for work in workloads(args):
            servers = work.servers(durable if work.durable else plain)
            if not servers:
                continue
            for server in servers:
                results[work.name, server.name] = Result(work.name, server.name, work.unit,
                                                         work.requests[server.protocol])
            for rep in range(args.runs):
                shift = rep % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    sample = measure(server, work.run)
                    results[work.name, server.name].samples.append(sample)
                    print(f"  {work.name} {server.name} run {rep + 1}: {sample.cpu_us:.1f} us/"
                          f"{work.unit} ({sample.system_us:.1f} system), "
                          f"{sample.rate:,.0f} {work.unit}s/s, load "
                          f"{sample.load:.2f}", file=sys.stderr, flush=True)
                    _drain(server, work)
            if use_strace:
                for server in servers:
                    with straced(server.pid, root) as counts:
                        units = work.run(server)[0]
                    _drain(server, work)
                    result = results[work.name, server.name]
                    result.syscalls, result.strace_units = dict(counts), units
    load_end = os.getloadavg()

    print(render(info, load_start, load_end, args, list(results.values()), use_strace))
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "load_start": load_start, "load_end": load_end,
            "command": command_line(argv), "runs": args.runs, "pairs": args.pairs,
            "durable_sets": args.durable_sets, "size": args.size, "strace": use_strace,
            "results": [r.to_json() for r in results.values()]}, indent=1))
    return 0


def command_line(argv: list[str] | None) -> str:
    """The command that reproduces this run (paths as given, quoted for a shell: `--redis ''`)."""
    words = sys.argv[1:] if argv is None else argv
    return shlex.join(["python3", "benchmarks/cost.py", *words])


def pythons_ran(info: dict[str, object]) -> str:
    """
    The interpreters of C{info} (L{machine}'s, with what a run adds): the
    clients', then, if a run chose others, the Python servers' and
    txkestrel-before's.
    """
    text = f"Python {info['python']}"
    if "server_python" in info:
        text += f" (clients); Python servers on {info['server_python']}"
        if "baseline_python" in info:
            text += f", txkestrel-before on {info['baseline_python']}"
    return text


def render(info: dict[str, object], load_start: tuple[float, float, float],
           load_end: tuple[float, float, float], args: argparse.Namespace,
           results: list[Result], use_strace: bool) -> str:
    """The figures as Markdown tables, one per workload."""
    lines = [f"{info['date']}: {info['cpus']} CPUs ({info['cpu_model']}), "
             f"{info['mem_mib']} MiB, Linux {info['kernel']}, {pythons_ran(info)}, "
             f"Twisted {info['twisted']}; pinned: {info.get('pinned', 'no')}; load average "
             f"{load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f} at the start, "
             f"{load_end[0]:.2f}/{load_end[1]:.2f}/{load_end[2]:.2f} at the end.",
             f"Median (min-max) of {args.runs} runs; {args.size} B items"
             + ("" if use_strace else "; no strace here, so no system-call counts") + "."]
    by_workload: dict[str, list[Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, []).append(r)
    for name, rows in by_workload.items():
        unit = rows[0].unit
        latency = rows[0].samples and rows[0].samples[0].p50_ms is not None
        lines += ["", f"### {name}", ""]
        header = (f"| server | CPU us per {unit} | of it system | {unit}s/s | syscalls per request "
                  f"| most frequent (per request) | load |")
        if latency:
            header = header.replace(f"| {unit}s/s |", "| p50 ms | p99 ms |")
        if unit == "set":
            header = header.replace("| load |", "| sets per fsync | client CPU us per set "
                                                 "| load |")
        lines += [header, "|" + "---|" * (header.count("|") - 1)]
        for r in rows:
            cpu = [s.cpu_us for s in r.samples]
            rate = [s.rate for s in r.samples]
            calls = r.syscalls_per_request()
            top = ", ".join(f"{k} {v:.2f}" for k, v in r.top_syscalls(4))
            cells = [r.server, f"{statistics.median(cpu):,.1f} ({min(cpu):,.1f}-{max(cpu):,.1f})",
                     f"{statistics.median([s.system_us for s in r.samples]):,.1f}"]
            if latency:
                cells += [f"{statistics.median([s.p50_ms or 0 for s in r.samples]):.2f}",
                          f"{statistics.median([s.p99_ms or 0 for s in r.samples]):.2f}"]
            else:
                cells.append(f"{statistics.median(rate):,.0f} ({min(rate):,.0f}-{max(rate):,.0f})")
            cells += ["-" if calls is None else f"{calls:.2f}", top or "-"]
            if unit == "set":
                per = r.units_per_fsync()
                cells.append("-" if per is None else f"{per:.1f}")
                cells.append(f"{statistics.median([s.client_cpu_us for s in r.samples]):,.1f}")
            cells.append(f"{statistics.median([s.load for s in r.samples]):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
