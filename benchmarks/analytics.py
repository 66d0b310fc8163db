"""
Benchmark of kestrel-analyze: the Spark job against one process running the codec.

Generates journals (``--size`` bytes in all, default 1 GiB, over ``--queues``
queues, rotating every ``--file-size`` bytes), then prints records per second
for:

- one process decoding every file with the record codec (``iter_records``);
- one process running the analytics scanner (``scan_buffer``: codec + columns);
- the Spark scan alone (parse to a DataFrame and count it);
- the whole Spark job (every table, summary and report).

This is not a test. Smoke-run it with a small size, e.g. ``--size 8MiB``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from kestrel.journal import records  # noqa: E402

T0 = 1_767_225_600_000
UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Parse C{123}, C{64MiB}, C{1GiB}, C{512k} into bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in UNITS:
        return int(float(t[:-1]) * UNITS[t[-1]])
    return int(t)


def generate(folder: str, total: int, queues: int, file_size: int, seed: int) -> int:
    """Write journals of about C{total} bytes into C{folder}; return the record count."""
    rng = random.Random(seed)
    # payload sizes: median about 96 bytes, a long tail up to 4 KiB
    payloads = [bytes(rng.randrange(256) for _ in range(n))
                for n in [8, 32, 64, 64, 96, 96, 96, 128, 128, 200, 400] * 10 + [1000, 4000]]
    per_queue = total // queues
    count = 0
    for qi in range(queues):
        name = f"bench{qi:02d}"
        now = T0
        written = 0
        queued = 0
        xid = 0
        open_xids: list[int] = []
        while written < per_queue:
            parts = []
            size = 0
            while size < file_size and written + size < per_queue:
                now += rng.randint(0, 40)
                r = rng.random()
                if r < 0.5 or queued == 0:
                    raw = records.encode_add(rng.choice(payloads), now,
                                             now + 60_000 if r < 0.1 else 0)
                    queued += 1
                elif r < 0.8:
                    raw = records.REMOVE_BYTES
                    queued -= 1
                elif r < 0.9 and len(open_xids) < 8:
                    xid += 1
                    open_xids.append(xid)
                    raw = records.encode_xid(9, xid)
                    queued -= 1
                elif open_xids:
                    x = open_xids.pop(0)
                    if r < 0.97:
                        raw = records.encode_xid(6, x)
                    else:
                        raw = records.encode_xid(5, x)
                        queued += 1
                else:
                    raw = records.REMOVE_BYTES
                    queued -= 1
                parts.append(raw)
                size += len(raw)
                count += 1
            written += size
            last = written >= per_queue
            fname = name if last else f"{name}.{now}"
            with open(os.path.join(folder, fname), "wb") as fh:
                fh.write(b"".join(parts))
            now += 1
    return count


def single_process(folder: str) -> tuple[int, float, float]:
    """Return (records, codec seconds, scanner seconds) over every file, read once."""
    from kestrel.analytics.scan import scan_buffer

    blobs = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            blobs.append(fh.read())
    started = time.perf_counter()
    n = 0
    for blob in blobs:
        for _ in records.iter_records(blob):
            n += 1
    codec = time.perf_counter() - started
    started = time.perf_counter()
    m = sum(scan_buffer(blob).count for blob in blobs)
    scanner = time.perf_counter() - started
    assert m == n
    return n, codec, scanner


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB", help="total journal bytes (default 1GiB)")
    p.add_argument("--queues", type=int, default=16, help="number of queues (default 16)")
    p.add_argument("--file-size", default="16MiB", help="rotate files at this size")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the generated journals and output")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    work = args.dir or tempfile.mkdtemp(prefix="kestrel-bench-")
    journals = os.path.join(work, "bench")
    out = os.path.join(work, "out")
    os.makedirs(journals, exist_ok=True)
    try:
        started = time.perf_counter()
        total = parse_size(args.size)
        count = generate(journals, total, args.queues, parse_size(args.file_size), args.seed)
        size = sum(os.path.getsize(os.path.join(journals, n)) for n in os.listdir(journals))
        print(f"generated {count:,} records, {size / (1 << 20):,.1f} MiB in "
              f"{len(os.listdir(journals))} files ({time.perf_counter() - started:.1f}s)")

        n, codec, scanner = single_process(journals)
        print(f"single process, codec iter_records:  {n / codec:12,.0f} records/s ({codec:.2f}s)")
        print(f"single process, scan_buffer columns: {n / scanner:12,.0f} records/s "
              f"({scanner:.2f}s)")

        from kestrel.analytics.cli import make_session
        from kestrel.analytics.job import Progress, run, scan
        from kestrel.analytics.layout import plan_local

        started = time.perf_counter()
        spark = make_session(args.master, {"spark.ui.enabled": "false"})
        print(f"spark session {spark.sparkContext.master} ({time.perf_counter() - started:.1f}s)")
        try:
            plan = plan_local([("bench", journals)])
            scan(spark, plan, "source").count()  # warm-up: JVM and Python workers
            started = time.perf_counter()
            rows = scan(spark, plan, "source").count()
            took = time.perf_counter() - started
            print(f"spark scan only (data source):       {n / took:12,.0f} records/s "
                  f"({took:.2f}s, {rows - len(plan.files):,} records)")
            started = time.perf_counter()
            run(spark, [("bench", journals)], out, progress=Progress(7, open(os.devnull, "w")))
            took = time.perf_counter() - started
            print(f"spark whole job (all outputs):       {n / took:12,.0f} records/s ({took:.2f}s)")
        finally:
            spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
