"""
Flood txkestrel and Debian's memcached with the same pipelined memcache client.

Not a test. It starts our server (`python -m twisted kestrel`, memcache port
only, journals in a temporary directory, the default `sync_journal: never`)
and `memcached` on free loopback ports, then for every combination of
connection count and pipeline depth runs the same asyncio client against
each: every connection sends `depth` (set, get) pairs of 1 KiB items in one
write, reads the `2 * depth` replies, and repeats until it has moved its share
of `--items`. It prints pairs per second (one pair = one item set and got
back), the median over `--runs` runs with min-max, and the ratio
ours/memcached.

    python benchmarks/flood.py --help
    python benchmarks/flood.py --items 200 --runs 1          # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servers import free_port, kestrel_process, memcached_process, summary


@contextmanager
def kestrel_server(workdir: Path) -> Iterator[int]:
    """Our server on a free port, memcache only; yields the port."""
    port = free_port()
    with kestrel_process(workdir, port):
        yield port


def install_memcached() -> None:
    """Install Debian's memcached with apt-get (as root), as the reference server."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    print("memcached not found: installing it with apt-get", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "memcached"], check=False, env=env)


@contextmanager
def memcached_server(binary: str) -> Iterator[int]:
    """Debian's memcached on a free loopback port; yields the port."""
    port = free_port()
    with memcached_process(binary, port):
        yield port


async def one_connection(port: int, key: bytes, pairs: int, depth: int, payload: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pair = b"set %s 0 0 %d\r\n%s\r\nget %s\r\n" % (key, len(payload), payload, key)
    reply = b"STORED\r\nVALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(payload), payload)
    done = 0
    try:
        while done < pairs:
            n = min(depth, pairs - done)
            writer.write(pair * n)
            got = await reader.readexactly(len(reply) * n)
            if got != reply * n:
                raise RuntimeError(f"unexpected reply from port {port}: {got[:80]!r}")
            done += n
    finally:
        writer.close()
        await writer.wait_closed()


async def flood(port: int, items: int, conns: int, depth: int, size: int) -> float:
    """Move C{items} pairs over C{conns} connections; return pairs per second."""
    payload = (b"x" * 63 + b"\n") * (size // 64) + b"y" * (size % 64)
    share = [items // conns + (1 if i < items % conns else 0) for i in range(conns)]
    started = time.perf_counter()
    await asyncio.gather(*(one_connection(port, b"flood%d" % i, share[i], depth, payload)
                           for i in range(conns)))
    return items / (time.perf_counter() - started)


def measure(port: int, args: argparse.Namespace, conns: int, depth: int) -> list[float]:
    return [asyncio.run(flood(port, args.items, conns, depth, args.size))
            for _ in range(args.runs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Flood txkestrel and memcached with the same pipelined memcache client "
                    "(1 KiB set+get pairs) and print pairs/s, median of --runs runs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--items", type=int, default=20000, help="pairs per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration")
    parser.add_argument("--size", type=int, default=1024, help="item size in bytes")
    parser.add_argument("--conns", type=int, nargs="+", default=[1, 10, 50],
                        help="connection counts")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 16],
                        help="pipeline depths (pairs per write)")
    parser.add_argument("--memcached", default=shutil.which("memcached") or "/usr/bin/memcached",
                        help="memcached binary (apt-get install memcached)")
    parser.add_argument("--no-memcached", action="store_true", help="only flood txkestrel")
    args = parser.parse_args(argv)
    if not args.no_memcached and not os.path.exists(args.memcached):
        install_memcached()
        args.memcached = shutil.which("memcached") or args.memcached
        if not os.path.exists(args.memcached):
            parser.error(f"{args.memcached} not found: apt-get install memcached, "
                         "or --no-memcached")

    results: dict[tuple[str, int, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="kestrel-flood-") as tmp:
        with kestrel_server(Path(tmp)) as port:
            for conns in args.conns:
                for depth in args.depths:
                    results["ours", conns, depth] = measure(port, args, conns, depth)
    if not args.no_memcached:
        with memcached_server(args.memcached) as port:
            for conns in args.conns:
                for depth in args.depths:
                    results["memcached", conns, depth] = measure(port, args, conns, depth)

    print(f"{args.items} pairs of {args.size} B per run, median (min-max) of {args.runs} run(s); "
          "txkestrel sync_journal: never")
    print("| conns | depth | txkestrel pairs/s | memcached pairs/s | ours/memcached |")
    print("|---|---|---|---|---|")
    for conns in args.conns:
        for depth in args.depths:
            ours = results["ours", conns, depth]
            theirs = results.get(("memcached", conns, depth))
            ratio = (f"{statistics.median(ours) / statistics.median(theirs):.2f}"
                     if theirs else "-")
            print(f"| {conns} | {depth} | {summary(ours)} | "
                  f"{summary(theirs) if theirs else '-'} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
