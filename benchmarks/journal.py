"""
Journal benchmark: replay speed against `cat`, raw fsync rate, and adds/s
through PersistentQueue under each sync policy.

Run from the repository root:

    python benchmarks/journal.py                 # 1 GiB journal, 3 runs
    python benchmarks/journal.py --size 8MiB --runs 1 --seconds 0.5   # smoke run

It prints, in order:
  1. replay MB/s of a journal of 1 KiB ADDX items next to `cat FILE > /dev/null`
     MB/s on the same file (page cache warm, median of --runs) and their ratio;
  2. raw fsync/s of the disk holding --dir (1 KiB append + fsync);
  3. adds/s through PersistentQueue with sync_journal never, a 0.01 s period,
     and always + durable_acks, at 1, 10 and 100 concurrent writers (that many
     adds whose Deferreds are pending), with fsync on a thread pool, next to
     the raw fsync rate and the ratio.

Without durable_acks an add is acknowledged at once, so its writers run one
after the other and the writer count only matters for always + durable_acks.
`cat` is timed with its process start, which flatters the ratio on tiny files.

--cpu-ceiling makes the journal's fsync a no-op (the raw probe stays real):
durable adds/s then show the most the CPU allows with an infinitely fast disk.

--via journal drives the adds straight through FileJournal instead of
PersistentQueue (the switch for when kestrel.queue is unavailable).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from twisted.internet import defer  # noqa: E402
from twisted.internet.threads import deferToThreadPool  # noqa: E402
from twisted.python.threadpool import ThreadPool  # noqa: E402

from kestrel.item import QItem  # noqa: E402
from kestrel.journal import records as rec  # noqa: E402
from kestrel.journal.journal import FileJournal  # noqa: E402

ITEM = 1024
MIB = 1024 * 1024
UNITS = {"": 1, "B": 1, "KIB": 1024, "KB": 1000, "MIB": MIB, "MB": 10**6,
         "GIB": 1024**3, "GB": 10**9, "K": 1024, "M": MIB, "G": 1024**3}


def parse_size(text: str) -> int:
    """Parse '1GiB', '8MiB', '500MB', '4096' into bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def build_journal(path: Path, size: int) -> int:
    """Write a journal of 1 KiB ADDX items of about C{size} bytes; return the item count."""
    record = rec.encode_add(b"x" * ITEM, 1_767_225_600_000, 0)
    per_chunk = max(1, (4 * MIB) // len(record))
    count = max(1, size // len(record))
    with open(path, "wb") as f:
        left = count
        while left:
            n = min(left, per_chunk)
            f.write(record * n)
            left -= n
    return count


def time_cat(path: Path) -> float:
    start = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run(["cat", str(path)], stdout=null, check=True)
    return time.perf_counter() - start


def time_replay(directory: Path) -> tuple[float, int]:
    from twisted.internet.task import Clock

    clock = Clock()
    clock.advance(time.time())
    sink: collections.deque[rec.Record] = collections.deque(maxlen=0)
    journal = FileJournal(str(directory), "q", clock, None)
    start = time.perf_counter()
    journal.replay(sink.append)
    elapsed = time.perf_counter() - start
    journal.close()
    return elapsed, journal.size


def bench_replay(work: Path, size: int, runs: int) -> None:
    d = work / "replay"
    d.mkdir()
    path = d / "q"
    count = build_journal(path, size)
    nbytes = path.stat().st_size
    time_cat(path)  # warm the page cache
    cats = [time_cat(path) for _ in range(runs)]
    replays = []
    for _ in range(runs):
        elapsed, replayed = time_replay(d)
        assert replayed == nbytes, (replayed, nbytes)
        replays.append(elapsed)
    mb = nbytes / 1e6
    cat_rate = mb / statistics.median(cats)
    replay_rate = mb / statistics.median(replays)
    print(f"journal: {count} items of {ITEM} B, {nbytes / MIB:.1f} MiB, median of {runs} runs")
    print(f"  cat FILE > /dev/null : {cat_rate:10.1f} MB/s")
    print(f"  FileJournal.replay   : {replay_rate:10.1f} MB/s "
          f"({count / statistics.median(replays):,.0f} records/s)")
    print(f"  ratio replay/cat     : {replay_rate / cat_rate:10.3f}  (target >= 0.1)")
    shutil.rmtree(d)


#: Extra seconds added to every fsync (--fsync-delay), to emulate a slower disk.
FSYNC_DELAY = 0.0
#: With --cpu-ceiling the journal's fsync does nothing (the raw probe stays real).
JOURNAL_FSYNC_OFF = False


def disk_fsync(fd: int) -> None:
    """fsync C{fd}, then wait C{FSYNC_DELAY} seconds more (an emulated slower disk)."""
    os.fsync(fd)
    if FSYNC_DELAY:
        time.sleep(FSYNC_DELAY)


def bench_fsync(work: Path, seconds: float) -> float:
    path = work / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = b"y" * ITEM
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while True:
            os.write(fd, block)
            disk_fsync(fd)
            n += 1
            if time.perf_counter() >= deadline:
                break
    finally:
        os.close(fd)
        os.unlink(path)
    rate = n / (time.perf_counter() - start)
    emulated = f", emulated +{FSYNC_DELAY * 1000:g} ms per fsync" if FSYNC_DELAY else ""
    print(f"raw fsync: {rate:,.0f} fsync/s (1 KiB append + fsync, {n} in {seconds:.1f}s"
          f"{emulated})")
    return rate


class Writers:
    """Keep C{concurrency} adds outstanding for C{seconds}; count the acknowledged ones."""

    #: Adds a writer makes in a row before it lets the reactor turn (timers,
    #: fsync completions), as a server does between two reads from the network.
    BURST = 64

    def __init__(self, reactor: Any, add: Callable[[], defer.Deferred[Any]], concurrency: int,
                 seconds: float) -> None:
        self.reactor = reactor
        self.add = add
        self.concurrency = concurrency
        self.seconds = seconds
        self.acked = 0
        self.running = 0
        self.done: defer.Deferred[float] = defer.Deferred()

    def start(self) -> defer.Deferred[float]:
        self.start_time = time.perf_counter()
        self.deadline = self.start_time + self.seconds
        self.running = self.concurrency
        for _ in range(self.concurrency):
            self._loop()
        return self.done

    def _loop(self) -> None:
        burst = self.BURST
        while time.perf_counter() < self.deadline:
            d = self.add()
            if not d.called:
                d.addCallback(self._acked_then_loop)
                return
            self.acked += 1
            burst -= 1
            if not burst:
                self.reactor.callLater(0, self._loop)
                return
        self.running -= 1
        if self.running == 0:
            self.done.callback(self.acked / (time.perf_counter() - self.start_time))

    def _acked_then_loop(self, _: object) -> None:
        self.acked += 1
        self._loop()


POLICIES: list[tuple[str, float | None, bool]] = [
    ("never", None, False),
    ("0.01s period", 0.01, False),
    ("always + durable_acks", 0.0, True),
]


@defer.inlineCallbacks
def bench_adds(reactor: Any, work: Path, seconds: float, via: str, fsync_rate: float | None,
               pool: ThreadPool) -> Any:
    from kestrel.config import QueueConfig

    def run_in_thread(f: Callable[[], Any]) -> defer.Deferred[Any]:
        return deferToThreadPool(reactor, pool, f)

    payload = b"z" * ITEM
    raw = "not measured" if fsync_rate is None else f"{fsync_rate:,.0f}/s"
    print(f"adds/s through {'PersistentQueue' if via == 'queue' else 'FileJournal'} "
          f"({ITEM} B items, {seconds:.1f}s each; raw fsync {raw}"
          f"{'; journal fsync a no-op' if JOURNAL_FSYNC_OFF else ''})")
    print(f"  {'sync_journal':<24}{'writers':>8}{'adds/s':>12}{'ratio to raw fsync':>22}"
          f"{'adds per fsync':>16}")
    n = 0
    fsyncs = [0]

    def counting_fsync(fd: int) -> None:
        fsyncs[0] += 1
        if not JOURNAL_FSYNC_OFF:
            disk_fsync(fd)

    for label, policy, durable in POLICIES:
        for concurrency in (1, 10, 100):
            n += 1
            d = work / f"adds{n}"
            d.mkdir()
            journal = FileJournal(str(d), "q", reactor, policy, run_in_thread=run_in_thread,
                                  fsync=counting_fsync)
            if via == "queue":
                from kestrel.queue import PersistentQueue

                config = QueueConfig(sync_journal=policy, durable_acks=durable)
                queue = PersistentQueue("q", config, journal, reactor)
                queue.setup()

                def add(queue: Any = queue) -> defer.Deferred[Any]:
                    return queue.add(payload)
            else:
                journal.replay(lambda r: None)
                item = QItem(payload, int(time.time() * 1000))

                if durable:
                    def add(journal: FileJournal = journal,
                            item: QItem = item) -> defer.Deferred[Any]:
                        return journal.add(item)
                else:
                    def add(journal: FileJournal = journal,
                            item: QItem = item) -> defer.Deferred[Any]:
                        journal.add(item).addErrback(lambda f: None)
                        return defer.succeed(None)
            fsyncs[0] = 0
            writers = Writers(reactor, add, concurrency, seconds)
            rate = yield writers.start()
            # (under "never" the only fsync is the one at close)
            per_fsync = (f"{writers.acked / fsyncs[0]:.1f}"
                         if fsyncs[0] and policy is not None else "-")
            closing = queue.close() if via == "queue" else journal.close()
            yield closing
            shutil.rmtree(d)
            ratio = "-" if fsync_rate is None else f"{rate / fsync_rate:.2f}"
            print(f"  {label:<24}{concurrency:>8}{rate:>12,.0f}{ratio:>22}{per_fsync:>16}")


def main(argv: list[str] | None = None) -> int:
    """Run the journal benchmarks and print the figures."""
    parser = argparse.ArgumentParser(
        description="Journal replay speed vs cat, raw fsync rate, and adds/s per sync policy.")
    parser.add_argument("--size", type=parse_size, default=parse_size("1GiB"),
                        help="journal size for the replay benchmark (default 1GiB)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per replay/cat measurement; the median is shown (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="duration of the fsync and of each adds/s measurement (default 3)")
    parser.add_argument("--dir", default=None,
                        help="directory for the files (default: a temporary directory)")
    parser.add_argument("--via", choices=["queue", "journal"], default="queue",
                        help="drive adds through PersistentQueue (default) or FileJournal")
    parser.add_argument("--skip", action="append", default=[],
                        choices=["replay", "fsync", "adds"], help="skip a part (repeatable)")
    parser.add_argument("--fsync-delay", type=float, default=0.0, metavar="MS",
                        help="add MS milliseconds to every fsync, in the raw probe and the "
                             "journal alike, to emulate a slower disk (default 0)")
    parser.add_argument("--cpu-ceiling", action="store_true",
                        help="make the journal's fsync a no-op (still on the thread pool, "
                             "still grouped): the adds/s then show what the CPU allows "
                             "with an infinitely fast disk")
    args = parser.parse_args(argv)
    global FSYNC_DELAY, JOURNAL_FSYNC_OFF
    FSYNC_DELAY = args.fsync_delay / 1000.0
    JOURNAL_FSYNC_OFF = args.cpu_ceiling

    work = Path(tempfile.mkdtemp(prefix="kestrel-bench-", dir=args.dir))
    try:
        if "replay" not in args.skip:
            bench_replay(work, args.size, args.runs)
        fsync_rate = bench_fsync(work, args.seconds) if "fsync" not in args.skip else None
        if "adds" not in args.skip:
            from twisted.internet import reactor

            pool = ThreadPool(minthreads=1, maxthreads=4, name="fsync")
            pool.start()
            failures: list[Any] = []

            def run() -> None:
                d = bench_adds(reactor, work, args.seconds, args.via, fsync_rate, pool)
                d.addErrback(failures.append)
                d.addBoth(lambda _: reactor.stop())

            reactor.callWhenRunning(run)
            reactor.run()
            pool.stop()
            if failures:
                failures[0].printTraceback(file=sys.stderr)
                return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
