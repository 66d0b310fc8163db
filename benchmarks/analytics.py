"""
Benchmark of kestrel-analyze: Spark, the one-process engine and ``cat``, over three sizes.

For each size (``--sizes``, default ``256MiB,1GiB,3GiB``) it generates
journals (``--queues`` queues rotating every ``--file-size`` bytes: the
files of one queue are generated once and copied under later rotation
names, so the journals are consistent and large sizes generate quickly),
then runs, each as its own process, with a warm page cache:

- ``cat`` of every file into /dev/null (the floor: reading the bytes);
- ``kestrel-analyze --engine local`` (one Python process, every table);
- ``kestrel-analyze --master local[N]`` (Spark, every table, same outputs);

and prints records/s, MiB/s (per wall second and per CPU second), wall
seconds, CPU seconds (user + system of the whole process tree, JVM and
Python workers included) and the peak resident memory of the tree, both
sampled from /proc every 0.1 s. On a loaded machine the CPU
seconds are the fairer comparison. It also times Spark on one
tiny file: its fixed overhead. The load average is printed with each line:
on a shared machine, compare runs made at the same load.

This is not a test. Smoke-run it with ``--sizes 8MiB,16MiB,32MiB``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
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


def _file(rng: random.Random, file_size: int, now: int) -> tuple[bytes, int, int]:
    """One journal file of about C{file_size} bytes; return it, its records and the clock."""
    payloads = [bytes(rng.randrange(256) for _ in range(n))
                for n in [8, 32, 64, 64, 96, 96, 96, 128, 128, 200, 400] * 10 + [1000, 4000]]
    parts: list[bytes] = []
    size = count = queued = xid = 0
    open_xids: list[int] = []
    while size < file_size:
        now += rng.randint(0, 40)
        r = rng.random()
        if r < 0.5 or queued == 0:
            raw = records.encode_add(rng.choice(payloads), now, now + 60_000 if r < 0.1 else 0)
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
            raw = records.encode_xid(6, x) if r < 0.97 else records.encode_xid(5, x)
            queued += r >= 0.97
        else:
            raw = records.REMOVE_BYTES
            queued -= 1
        parts.append(raw)
        size += len(raw)
        count += 1
    return b"".join(parts), count, now


def generate(folder: str, total: int, queues: int, file_size: int, seed: int) -> int:
    """Write journals of about C{total} bytes into C{folder}; return the record count."""
    rng = random.Random(seed)
    per_queue = max(1, total // queues)
    count = 0
    for qi in range(queues):
        name = f"bench{qi:02d}"
        data, n, span = _file(rng, min(file_size, per_queue), T0)
        files = max(1, round(per_queue / len(data)))
        for i in range(files):
            fname = name if i == files - 1 else f"{name}.{T0 + (i + 1) * (span - T0 + 1000)}"
            with open(os.path.join(folder, fname), "wb") as fh:
                fh.write(data)
            count += n
    return count


class PeakRss:
    """Samples the resident memory and CPU time of a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.cpu_ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            total = 0
            for p in self._tree():
                try:
                    with open(f"/proc/{p}/statm") as fh:
                        total += int(fh.read().split()[1]) * page
                    with open(f"/proc/{p}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    self.cpu_ticks[p] = int(fields[11]) + int(fields[12])  # utime + stime
                except (OSError, ValueError, IndexError):
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.1)

    def stop(self) -> int:
        """Stop sampling; return the peak in bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak

    def cpu_seconds(self) -> float:
        """CPU seconds of the tree, as last sampled (up to 0.1 s before each process ended)."""
        return sum(self.cpu_ticks.values()) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, float]:
    """Run C{cmd}; return (wall s, peak tree RSS bytes, CPU s of the tree). Fails if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = PeakRss(proc.pid)
    _, err = proc.communicate()
    took = time.perf_counter() - started
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    return took, peak, sampler.cpu_seconds()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256MiB,1GiB,3GiB", help="total journal bytes per run")
    p.add_argument("--queues", type=int, default=24, help="number of queues (default 24)")
    p.add_argument("--file-size", default="8MiB", help="rotate files at this size")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--skip", default="", help="comma-separated modes to skip: cat,local,spark")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    work = args.dir or tempfile.mkdtemp(prefix="kestrel-bench-")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cli = [sys.executable, "-m", "kestrel.analytics.cli"]
    spark_conf = ["--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=2g"]
    print(f"cpus {os.cpu_count()}, master {args.master}, {args.queues} queues, "
          f"files of {args.file_size}")
    try:
        if "spark" not in skip:
            tiny = os.path.join(work, "tiny")
            os.makedirs(tiny, exist_ok=True)
            with open(os.path.join(tiny, "q"), "wb") as fh:
                fh.write(records.encode_add(b"x", T0) + records.REMOVE_BYTES)
            took, peak, cpu = timed([*cli, tiny, "--out", os.path.join(work, "out-tiny"),
                                     "--master", args.master, *spark_conf], env)
            print(f"spark fixed overhead (one 2-record file): {took:.1f}s wall, {cpu:.1f}s CPU, "
                  f"peak {peak / 2**20:,.0f} MiB, load {os.getloadavg()[0]:.1f}")
        for text in args.sizes.split(","):
            folder = os.path.join(work, "bench")
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            started = time.perf_counter()
            n = generate(folder, parse_size(text), args.queues, parse_size(args.file_size),
                         args.seed)
            files = sorted(os.listdir(folder))
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
            print(f"\n{text}: {n:,} records, {size / 2**20:,.0f} MiB in {len(files)} files "
                  f"(generated in {time.perf_counter() - started:.0f}s)")
            subprocess.run(["cat", *[os.path.join(folder, f) for f in files]],
                           stdout=subprocess.DEVNULL, check=True)  # warm the page cache
            runs = {
                "cat": ["cat", *[os.path.join(folder, f) for f in files]],
                "local": [*cli, folder, "--out", os.path.join(work, "out-local"),
                          "--engine", "local"],
                "spark": [*cli, folder, "--out", os.path.join(work, "out-spark"),
                          "--master", args.master, *spark_conf],
            }
            for mode, cmd in runs.items():
                if mode in skip:
                    continue
                if mode == "cat":
                    cmd = ["sh", "-c", " ".join(cmd) + " > /dev/null"]
                took, peak, cpu = timed(cmd, env)
                mib = size / 2**20
                print(f"  {mode:6} {n / took:12,.0f} records/s  {mib / took:7.1f} MiB/s  "
                      f"{mib / max(cpu, 0.01):7.1f} MiB per CPU s  {took:7.1f}s wall  "
                      f"{cpu:7.1f}s CPU  peak {peak / 2**20:7,.0f} MiB  "
                      f"load {os.getloadavg()[0]:.1f}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
