"""
CPU per memcache set+get pair inside txkestrel, with no sockets and no reactor.

Not a test. It builds a real server (real queues and journal files in a
temporary directory, `sync_journal: never`) driven by a manual clock, opens
one memcache connection on an in-memory transport, and feeds it `--pairs`
set+get pairs of 1 KiB items, `--depth` pairs per chunk of input (1: one
request at a time, the set and the get in separate chunks; 16: pipelined).
It prints this process's user and system CPU microseconds per pair
(getrusage), the median of `--runs` runs after one warm-up run: the cost of
the protocol, session, queue, journal and metrics code alone, which
`benchmarks/cost.py` measures together with Twisted's reactor and the
kernel's socket work.

    python3 benchmarks/inprocess.py --help
    python3 benchmarks/inprocess.py --depth 1 16
    python3 benchmarks/inprocess.py --profile 20       # cProfile: the top 20 functions
    python3 benchmarks/inprocess.py --opcodes 20       # bytecodes run per pair, the top 20

`--opcodes` counts the bytecode instructions the interpreter runs per pair
(outside this script), in total and per function: a figure that, unlike CPU
time, does not move with the machine's load.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import collections  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

import attrs  # noqa: E402
from twisted.internet.task import Clock  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from kestrel.config import DEFAULT_CONFIG  # noqa: E402
from kestrel.protocols.memcache import MemcacheFactory  # noqa: E402
from kestrel.server import KestrelServer  # noqa: E402


def pairs_once(protocol: object, transport: StringTransport, pairs: int, depth: int,
               size: int) -> None:
    """
    Feed C{pairs} set+get pairs, checking the replies' length: with C{depth}
    1 the set and the get arrive as separate chunks (one request at a time),
    else C{depth} pairs per chunk.
    """
    data = b"x" * size
    pair = b"set bench 0 0 %d\r\n%s\r\nget bench\r\n" % (size, data)
    reply_len = len(b"STORED\r\nVALUE bench 0 %d\r\n%s\r\nEND\r\n" % (size, data)) * depth
    chunks = [pair[:pair.index(b"get")], pair[pair.index(b"get"):]] if depth == 1 else [
        pair * depth]
    feed = protocol.dataReceived  # type: ignore[attr-defined]
    for _ in range(pairs // depth):
        for chunk in chunks:
            feed(chunk)
        if len(transport.value()) != reply_len:
            raise RuntimeError(f"unexpected reply: {transport.value()[:80]!r}")
        transport.clear()


def durable_once(clock: Clock, connections: list[tuple[Any, StringTransport]], sets: int,
                 size: int) -> None:
    """
    Feed C{sets} durable sets, one outstanding per connection: every
    connection sends a set, then the reactor turn ends (C{clock.advance(0)}:
    one write and fsync of the turn's records, then the replies), checking
    that every connection was answered C{STORED}.
    """
    request = b"set bench 0 0 %d\r\n%s\r\n" % (size, b"x" * size)
    for _ in range(sets // len(connections)):
        for protocol, _transport in connections:
            protocol.dataReceived(request)
        clock.advance(0)
        for _protocol, transport in connections:
            if transport.value() != b"STORED\r\n":
                raise RuntimeError(f"unexpected reply: {transport.value()[:80]!r}")
            transport.clear()


def count_opcodes(run: Any, pairs: int, top: int) -> None:
    """Run C{run} once under an opcode tracer; print the bytecodes per pair (or set) it ran."""
    counts: collections.Counter[str] = collections.Counter()
    own = __file__

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            code = frame.f_code
            if code.co_filename != own:
                counts[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    print(f"  {sum(counts.values()) / pairs:.0f} bytecodes per pair; the top {top} functions:")
    for name, count in counts.most_common(top):
        print(f"  {count / pairs:8.1f} {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="CPU us per memcache set+get pair inside txkestrel (no sockets, "
                    "no reactor), median of --runs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--pairs", type=int, default=32000, help="pairs per run")
    parser.add_argument("--depth", type=int, nargs="+", default=[1, 16],
                        help="pairs per chunk of input")
    parser.add_argument("--size", type=int, default=1024, help="item size in bytes")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per depth")
    parser.add_argument("--profile", type=int, metavar="N",
                        help="instead, profile one run per depth and print the top N functions")
    parser.add_argument("--durable", type=int, metavar="CONNS",
                        help="instead, durable sets (sync_journal: always, durable_acks, "
                             "journal_fsync: reactor) over CONNS connections, one outstanding "
                             "each; --pairs is then the number of sets")
    parser.add_argument("--opcodes", type=int, metavar="N",
                        help="instead, count the bytecodes run per pair in one run per depth "
                             "and print the top N functions")
    args = parser.parse_args(argv)

    clock = Clock()
    clock.advance(1_767_225_600.0)
    with tempfile.TemporaryDirectory(prefix="kestrel-inprocess-") as tmp:
        config = attrs.evolve(DEFAULT_CONFIG, queue_path=str(Path(tmp) / "queues"),
                              status_file=None, expiration_timer_frequency=None)
        if args.durable:
            config = attrs.evolve(config, journal_fsync="reactor", default=attrs.evolve(
                config.default, sync_journal=0.0, durable_acks=True))
        server = KestrelServer.from_config(config, clock)
        server.collection.startService()
        try:
            factory = MemcacheFactory(server)
            connections = []
            for _ in range(args.durable or 1):
                protocol = factory.buildProtocol(None)
                transport = StringTransport()
                protocol.makeConnection(transport)
                connections.append((protocol, transport))
            what = f"durable sets over {args.durable} connections" if args.durable else "pairs"
            print(f"{args.pairs} {what} of {args.size} B per run, median (min-max) of "
                  f"{args.runs}; CPU us per {'set' if args.durable else 'pair'} of this process")
            for depth in [args.durable] if args.durable else args.depth:

                def run(depth: int = depth) -> None:
                    # (the running server settles its metrics every second: here, per run)
                    if args.durable:
                        durable_once(clock, connections, args.pairs, args.size)
                    else:
                        pairs_once(protocol, transport, args.pairs, depth, args.size)
                    server.metrics.settle()

                run()  # warm-up
                label = f"durable-{depth}" if args.durable else f"depth {depth}"
                if args.profile:
                    profiler = cProfile.Profile()
                    profiler.runcall(run)
                    print(f"{label}:")
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
                    continue
                if args.opcodes:
                    print(f"{label}:")
                    count_opcodes(run, args.pairs, args.opcodes)
                    continue
                user, system = [], []
                for _ in range(args.runs):
                    before = resource.getrusage(resource.RUSAGE_SELF)
                    run()
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    user.append((after.ru_utime - before.ru_utime) * 1e6 / args.pairs)
                    system.append((after.ru_stime - before.ru_stime) * 1e6 / args.pairs)
                print(f"{label}: user {statistics.median(user):.1f} "
                      f"({min(user):.1f}-{max(user):.1f}), system "
                      f"{statistics.median(system):.1f} ({min(system):.1f}-{max(system):.1f})")
        finally:
            server.collection.stopService()
    return 0


if __name__ == "__main__":
    sys.exit(main())
