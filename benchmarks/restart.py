"""
Restart benchmark: how long a server takes from start to serving a queue
whose journal holds many items, and how much memory it then holds.

Run from the repository root:

    python benchmarks/restart.py                       # 1M x 1 KiB items, 3 runs
    python benchmarks/restart.py --items 20000 --runs 1  # smoke run
    python benchmarks/restart.py --small-queue         # and a small queue beside it

It writes one journal file of --items ADDX records of --item-size bytes with
the project's own encoder (kestrel.journal.records.encode_add), starts
`python -m twisted kestrel` on it with max_memory_size --memory (listening
on memcache only; --all-ports opens text, thrift and admin too, as the
built-in defaults do), and polls the memcache port with `get <queue>` until
a reply (an item) comes back. It prints, per run and as the median: seconds
from process start to that first reply, the server's CPU seconds (utime +
stime from /proc/<pid>/stat) up to then, its resident memory (VmRSS from
/proc/<pid>/status) right after the reply, the size of the journal, and the
load average. The journal is read from the page cache (a first warm-up `cat`
makes sure of that), as in a restart of a server whose files are still
cached, and it is fsynced first (the first get may rotate the journal, which
fsyncs it).

With --small-queue, a second journal of --small-items items (queue `small`)
lies beside the big one. The server listens at once and replays the small
journal first, so `small` answers while the big queue still replays: the
benchmark then first polls `get small`, prints the seconds from process
start to its first item and the server's C{queues_loading} stat right after
it (1: the big queue was still loading then), and then times the big queue
as above while it sends `get small/peek` over and over on one connection,
printing how many such requests were answered before the big queue's first
reply and the slowest round trip among them (how long the replay kept the
server from answering).

With --cachegrind the server runs under valgrind's cachegrind, and each run
also prints the instructions it executed in user space from its start to
its stop after the first reply: a figure that load does not move, where the
times above move by tens of per cent on a shared machine. Less the count of
a run with `--items 10`, it is the replay's own. With --src the server is
another checkout's, to compare two versions; with --python, it runs on
another interpreter (a venv's python with txkestrel's dependencies):

    python benchmarks/restart.py --runs 1 --cachegrind
    python benchmarks/restart.py --runs 1 --cachegrind --items 10
    python benchmarks/restart.py --runs 1 --cachegrind --src ../before
    python benchmarks/restart.py --python ../debian-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.servers import (  # noqa: E402
    add_python_options,
    cachegrind_count,
    cachegrind_prefix,
    cpu_seconds,
    describe_python,
    free_port,
    python_env,
    stop,
)
from kestrel.journal import records as rec  # noqa: E402

MIB = 1024 * 1024


def write_journal(path: Path, items: int, item_size: int) -> int:
    """Write C{items} ADDX records of C{item_size} bytes to C{path}; return its size."""
    now = int(time.time() * 1000)
    data = b"x" * item_size
    record = rec.encode_add(data, now, 0)
    batch = record * 1024
    with open(path, "wb", buffering=8 * MIB) as f:
        full, rest = divmod(items, 1024)
        for _ in range(full):
            f.write(batch)
        f.write(record * rest)
    return path.stat().st_size


def rss_mib(pid: int) -> float:
    """Resident memory of C{pid} in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def queues_loading(port: int) -> int:
    """The server's C{queues_loading} stat (-1 when it reports none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        got = b""
        while not got.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    for line in got.decode().splitlines():
        if line.startswith("STAT queues_loading "):
            return int(line.split()[2])
    return -1


def peek_while(port: int, queue: str, running: threading.Event) -> list[float]:
    """Round trips (seconds) of C{get queue/peek} sent one after another while C{running}."""
    times: list[float] = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        request = f"get {queue}/peek\r\n".encode()
        while running.is_set():
            sent = time.perf_counter()
            s.sendall(request)
            got = b""
            while not got.endswith(b"END\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return times
                got += chunk
            times.append(time.perf_counter() - sent)
    return times


def first_reply(port: int, queue: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll C{get queue} on C{port} until an item comes back."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
                s.sendall(f"get {queue}\r\n".encode())
                got = b""
                while not got.endswith(b"END\r\n") and b"ERROR" not in got:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                if got.startswith(b"VALUE"):
                    return
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit("no reply before the timeout")


def one_run(workdir: Path, queue: str, memory: str, timeout: float,
            small: str | None = None, all_ports: bool = False, valgrind: str | None = None,
            src: Path = ROOT, python: str = sys.executable
            ) -> tuple[float, float, float, float, int, list[float], int]:
    """
    One restart: (seconds to the first item of C{queue}, server CPU seconds,
    RSS MiB, seconds to the first item of C{small} (nan without),
    C{queues_loading} right after that item (-1 without), the round trips
    of the peeks at C{small} made meanwhile, and, given C{valgrind}, the
    instructions the server executed under cachegrind from its start to its
    stop after that reply (else 0)). The server's code is the checkout at
    C{src}, run by the interpreter C{python}.
    """
    port = free_port()
    others = ((free_port(), free_port(), free_port()) if all_ports else (0, 0, 0))
    config = workdir / "kestrel.yaml"
    config.write_text(
        f"listen_address: 127.0.0.1\nmemcache_port: {port}\ntext_port: {others[0]}\n"
        f"thrift_port: {others[1]}\nadmin_port: {others[2]}\n"
        f"default:\n  max_memory_size: {memory}\nqueue_path: {workdir / 'queues'}\n"
        f"status_file: {workdir / 'status'}\n")
    # A get takes an item: keep a copy of the journals and put them back after the run.
    names = [queue] if small is None else [queue, small]
    for name in names:
        journal = workdir / "queues" / name
        shutil.copyfile(journal, workdir / f"{name}.orig")
        # A journal on disk after a restart is clean: fsync it, and read it once into the cache.
        with open(journal, "rb") as f:
            os.fsync(f.fileno())
        subprocess.run(["cat", str(journal)], stdout=subprocess.DEVNULL, check=True)
    prefix = [] if valgrind is None else cachegrind_prefix(valgrind, workdir)
    with open(workdir / "kestrel.log", "wb") as log:
        started = time.monotonic()
        proc = subprocess.Popen([*prefix, python, "-m", "twisted", "--log-format=text",
                                 "kestrel", "--config", str(config)], cwd=src, env=python_env(src),
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        small_elapsed, loading, peeks = float("nan"), -1, []
        running = threading.Event()
        if small is not None:
            first_reply(port, small, proc, timeout)
            small_elapsed = time.monotonic() - started
            loading = queues_loading(port)
            running.set()
            peeker = threading.Thread(target=lambda: peeks.extend(
                peek_while(port, small, running)))
            peeker.start()
        try:
            first_reply(port, queue, proc, timeout)
            elapsed = time.monotonic() - started
        finally:
            if small is not None:
                running.clear()
                peeker.join()
        cpu, rss = cpu_seconds(proc.pid), rss_mib(proc.pid)
        stop(proc)
        return (elapsed, cpu, rss, small_elapsed, loading, peeks,
                0 if valgrind is None else cachegrind_count(workdir))
    finally:
        stop(proc)
        # (the first get may have rotated the journal: drop every file it left)
        for leftover in (workdir / "queues").iterdir():
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        for name in names:
            os.replace(workdir / f"{name}.orig", workdir / "queues" / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000, help="items in the journal")
    parser.add_argument("--item-size", type=int, default=1024, help="bytes per item")
    parser.add_argument("--memory", default="128MiB", help="max_memory_size of the queue")
    parser.add_argument("--runs", type=int, default=3, help="restarts to time (median)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per run")
    parser.add_argument("--small-queue", action="store_true",
                        help="also time the first reply of a small queue (`small`) beside "
                             "the big one, while the big one still replays")
    parser.add_argument("--small-items", type=int, default=10,
                        help="items in the small queue's journal (with --small-queue)")
    parser.add_argument("--all-ports", action="store_true",
                        help="also open the text, thrift and admin ports (as the built-in "
                             "defaults do; without it only memcache listens)")
    parser.add_argument("--cachegrind", action="store_true",
                        help="run the server under valgrind's cachegrind and print the "
                             "instructions it executed from its start to its stop after the "
                             "first reply (apt-get install valgrind): unlike the times, a "
                             "figure load does not move; less those of a run with --items 10, "
                             "the replay's own")
    parser.add_argument("--src", type=Path, default=ROOT,
                        help="run the server from this checkout of txkestrel (default: "
                             "this one); the journal is written by this one's encoder")
    add_python_options(parser, baseline=False)
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (journal, config, server log)")
    args = parser.parse_args()
    try:
        interpreter = describe_python(args.python)
    except RuntimeError as e:
        parser.error(str(e))
    valgrind = None
    if args.cachegrind:
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            parser.error("--cachegrind: valgrind not found (apt-get install valgrind)")
        args.timeout = max(args.timeout, 1800.0)
    workdir = Path(tempfile.mkdtemp(prefix="kestrel-restart-", dir=args.dir))
    try:
        (workdir / "queues").mkdir()
        queue = "restart"
        size = write_journal(workdir / "queues" / queue, args.items, args.item_size)
        small = None
        if args.small_queue:
            small = "small"
            write_journal(workdir / "queues" / small, args.small_items, args.item_size)
        print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        print(f"server's Python: {interpreter}")
        print(f"journal: {args.items} items x {args.item_size} B = {size / MIB:.0f} MiB; "
              f"max_memory_size {args.memory}; listening: "
              f"{'memcache, text, thrift, admin' if args.all_ports else 'memcache only'}")
        results = []
        for run in range(args.runs):
            elapsed, cpu, rss, small_elapsed, loading, peeks, counted = one_run(
                workdir, queue, args.memory, args.timeout, small, args.all_ports, valgrind,
                args.src.resolve(), args.python)
            results.append((elapsed, cpu, rss, small_elapsed, counted))
            if small is not None:
                print(f"run {run + 1}: small queue's first reply after {small_elapsed:.2f} s "
                      f"(queues_loading then: {loading}); then {len(peeks)} peeks at it "
                      f"answered while the big one replayed, slowest "
                      f"{max(peeks, default=float('nan')) * 1000:.1f} ms, median "
                      f"{statistics.median(peeks or [float('nan')]) * 1000:.2f} ms")
            print(f"run {run + 1}: first reply after {elapsed:.2f} s, server CPU {cpu:.2f} s, "
                  f"RSS {rss:.0f} MiB, load average {os.getloadavg()[0]:.2f}"
                  + (f"; {counted:,} instructions (under cachegrind)" if valgrind else ""))
        if small is not None:
            print(f"median: small queue's first reply after "
                  f"{statistics.median(r[3] for r in results):.2f} s")
        print(f"median: first reply after {statistics.median(r[0] for r in results):.2f} s, "
              f"server CPU {statistics.median(r[1] for r in results):.2f} s, "
              f"RSS {statistics.median(r[2] for r in results):.0f} MiB "
              f"(load average {os.getloadavg()[0]:.2f})"
              + (f"; {statistics.median(r[4] for r in results):,.0f} instructions"
                 if valgrind else ""))
    finally:
        if args.keep:
            print(f"kept {workdir} (the journal and the last run's kestrel.log)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
