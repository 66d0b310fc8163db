"""
Flood txkestrel over thrift: `put` batches and `get` with `max_items`.

Not a test. It starts our server (`python -m twisted kestrel`, thrift and
memcache ports, journals in a temporary directory, the default
`sync_journal: never`), then every connection repeats: `put` a batch of
`--batch` items of `--size` bytes to its own queue, then `get` with
`max_items=--batch` (no auto-abort) and checks it got them all back, until it
has moved its share of `--items`. It prints items per second (one item = put
and got back), the median over `--runs` runs with min-max.

If `benchmarks/flood.py` (the memcache flood) is present, its client is run
against the same server with pipeline depth `--batch` for a side-by-side line
(one memcache pair = one item set and got back).

    python benchmarks/thrift_flood.py --help
    python benchmarks/thrift_flood.py --items 500 --runs 1        # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCyBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TCyFramedTransportFactory, TFramedTransportFactory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from servers import free_port, kestrel_process, summary  # noqa: E402

try:
    import flood as memcache_flood
except ImportError:  # the memcache flood is another script; it may be absent
    memcache_flood = None

kestrel_thrift: Any = thriftpy2.load(str(ROOT / "thrift" / "kestrel.thrift"),
                                     module_name="kestrel_flood_thrift")


@contextmanager
def kestrel_server(workdir: Path, max_open: int) -> Iterator[tuple[int, int]]:
    """Our server with thrift and memcache listeners; yields (thrift port, memcache port)."""
    thrift_port, memcache_port = free_port(), free_port()
    with kestrel_process(workdir, memcache_port, thrift_port,
                         f"max_open_transactions: {max_open}\n"):
        yield thrift_port, memcache_port


def thrift_client(port: int) -> Any:
    """A thriftpy2 client (C transport and protocol when available), framed, binary."""
    try:
        return make_client(kestrel_thrift.Kestrel, "127.0.0.1", port, timeout=60000,
                           trans_factory=TCyFramedTransportFactory(),
                           proto_factory=TCyBinaryProtocolFactory())
    except Exception:
        return make_client(kestrel_thrift.Kestrel, "127.0.0.1", port, timeout=60000,
                           trans_factory=TFramedTransportFactory(),
                           proto_factory=TBinaryProtocolFactory())


def one_connection(port: int, queue: str, items: int, batch: int, payload: bytes,
                   errors: list[BaseException]) -> None:
    try:
        client = thrift_client(port)
        try:
            done = 0
            while done < items:
                n = min(batch, items - done)
                stored = client.put(queue, [payload] * n, 0)
                got = client.get(queue, n, 0, 0)
                if stored != n or len(got) != n or got[0].data != payload:
                    raise RuntimeError(f"{queue}: put {stored}/{n}, got {len(got)}")
                done += n
        finally:
            client.close()
    except BaseException as e:  # reported by the caller
        errors.append(e)


def thrift_flood(port: int, items: int, conns: int, batch: int, size: int) -> float:
    """Move C{items} items over C{conns} connections; return items per second."""
    payload = (b"x" * 63 + b"\n") * (size // 64) + b"y" * (size % 64)
    share = [items // conns + (1 if i < items % conns else 0) for i in range(conns)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=one_connection,
                                args=(port, f"flood{i}", share[i], batch, payload, errors))
               for i in range(conns)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return items / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Flood txkestrel over thrift (put batches, get max_items) and print "
                    "items/s, median of --runs runs; side by side with the memcache flood.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000, help="items per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration")
    parser.add_argument("--size", type=int, default=1024, help="item size in bytes")
    parser.add_argument("--batch", type=int, default=100,
                        help="items per put and max_items per get (memcache pipeline depth)")
    parser.add_argument("--conns", type=int, nargs="+", default=[1, 10],
                        help="connection counts")
    parser.add_argument("--no-memcache", action="store_true",
                        help="skip the memcache flood line")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="kestrel-thrift-flood-") as tmp:
        with kestrel_server(Path(tmp), max_open=max(args.batch, 1)) as (thrift_port, mc_port):
            for conns in args.conns:
                rates = [thrift_flood(thrift_port, args.items, conns, args.batch, args.size)
                         for _ in range(args.runs)]
                rows.append(("thrift put/get", conns, rates))
            if memcache_flood is not None and not args.no_memcache:
                for conns in args.conns:
                    rates = [asyncio.run(memcache_flood.flood(mc_port, args.items, conns,
                                                              args.batch, args.size))
                             for _ in range(args.runs)]
                    rows.append(("memcache set/get", conns, rates))

    print(f"{args.items} items of {args.size} B per run, batch/depth {args.batch}, "
          f"median (min-max) of {args.runs} run(s); sync_journal: never")
    print("| client | conns | items/s |")
    print("|---|---|---|")
    for name, conns, rates in rows:
        print(f"| {name} | {conns} | {summary(rates)} |")
    if memcache_flood is None and not args.no_memcache:
        print("(benchmarks/flood.py not found: no memcache line)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
