"""
Replay of damaged journals at every byte offset: C{python -m tests.chaos.journal_damage}.

A real multi-file journal is built through a queue (rotations, a pack, open
reads, confirms and aborts), then every file of it is, at every byte offset
in turn, cut there (truncated) or has one bit flipped there, and a fresh
queue replays the damaged copy. For each case the replay must not raise; the
report counts the cases where the damage was detected (a warning or error
logged), where a consumed item came back, and where an item still live was
missing. C{tests/chaos/test_journal_damage.py} asserts the promises; this
command prints the figures quoted in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from kestrel.config import QueueConfig
from kestrel.journal.journal import FileJournal
from kestrel.queue import PersistentQueue

#: Items the journal is built from (enough for a dozen rotations and a pack).
ITEMS = 40

CONFIG = {"max_memory_size": 96, "max_journal_size": 384, "default_journal_size": 1 << 20}


def _no_fsync(fd: int) -> None:
    """Copies replayed here need no durability: skipping fsync keeps thousands of cases fast."""


class _CutAndGoOn(FileJournal):
    """Replay as Kestrel does: damage in a rotated file is cut and replay goes on."""

    def replay(self, apply, reset=None):  # type: ignore[no-untyped-def]
        return super().replay(apply)


#: Set by C{--cut-and-go-on}: measure the behaviour replay had before files were set aside.
CUT_AND_GO_ON = False


def _queue(path: Path, clock: Clock) -> PersistentQueue:
    cls = _CutAndGoOn if CUT_AND_GO_ON else FileJournal
    journal = cls(str(path), "q", clock, None, fsync=_no_fsync)
    q = PersistentQueue("q", QueueConfig(**CONFIG), journal, clock)
    q.setup()
    return q


def build_journal(path: Path) -> tuple[set[bytes], set[bytes]]:
    """
    Write a multi-file journal of queue C{q} into C{path}.

    Returns the items live at the end (queued or open) and those consumed
    (removed or confirmed) for good.
    """
    clock = Clock()
    clock.advance(1_767_225_600.0)
    q = _queue(path, clock)
    consumed: set[bytes] = set()
    held = []
    for i in range(ITEMS):
        clock.advance(0.01)
        q.add(b"item-%03d" % i)
        if i % 4 == 1:
            item = q.remove()
            consumed.add(item.data)
        elif i % 4 == 2:
            held.append(q.remove(open_read=True))
        elif i % 4 == 3 and held:
            item = held.pop(0)
            if i % 8 == 3:
                q.confirm_remove(item.xid)
                consumed.add(item.data)
            else:
                q.unremove(item.xid)
    live = {b"item-%03d" % i for i in range(ITEMS)} - consumed
    # Left as after a crash: the open reads are still open in the journal.
    return live, consumed


@dataclass
class Case:
    """One damaged copy: which file, where, how; and what its replay gave."""

    file: str
    offset: int
    how: str
    #: How many warnings or errors told of damage (0: none detected).
    warnings: int
    resurrected: int
    missing: int


def replay_damaged(files: dict[str, bytes], work: Path, name: str, offset: int, how: str,
                   live: set[bytes], consumed: set[bytes]) -> Case:
    """Write C{files} to C{work}, damage C{name} at C{offset}, replay; never raises (else a bug)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for file, content in files.items():
        data = bytearray(content)
        if file == name:
            if how == "cut":
                del data[offset:]
            else:
                data[offset] ^= 1 << (offset % 8)
        (work / file).write_bytes(bytes(data))
    clock = Clock()
    clock.advance(1_767_225_700.0)
    with capturedLogs() as events:
        q = _queue(work, clock)
        got = []
        while (item := q.remove()) is not None:
            got.append(item.data)
        q.close()
    warnings = sum(1 for e in events
                   if e.get("log_level") in (LogLevel.warn, LogLevel.error)
                   and ("dropped" in e or "DAMAGE" in e.get("log_format", "")))
    found = set(got)
    return Case(name, offset, how, warnings, len(found & consumed), len(live - found))


def run(work: Path) -> list[Case]:
    """Build the journal in C{work} and replay every damaged copy of it."""
    source = work / "journal"
    source.mkdir(parents=True)
    live, consumed = build_journal(source)
    files = {name: (source / name).read_bytes() for name in sorted(os.listdir(source))}
    cases = []
    for name, content in files.items():
        for offset in range(len(content)):
            for how in ("cut", "flip"):
                cases.append(replay_damaged(files, work / "copy", name, offset, how,
                                            live, consumed))
    return cases


def summary(cases: list[Case]) -> dict[str, Counter[str]]:
    """Counts per kind of file (rotated or current) and damage."""
    out: dict[str, Counter[str]] = {}
    for case in cases:
        kind = ("current" if case.file == "q" else "rotated") + " " + case.how
        counter = out.setdefault(kind, Counter())
        counter["cases"] += 1
        counter["detected"] += case.warnings > 0
        counter["consumed item back"] += case.resurrected > 0
        counter["detected, consumed item back"] += case.warnings > 0 and case.resurrected > 0
        counter["live item missing"] += case.missing > 0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.journal_damage",
        description="Cut or flip a bit of a real multi-file journal at every byte offset, "
                    "replay each copy, and count what replay detected, brought back or lost.")
    parser.add_argument("--cut-and-go-on", action="store_true",
                        help="replay as Kestrel does (cut a damaged rotated file, go on with "
                             "the next), for comparison")
    args = parser.parse_args(argv)
    global CUT_AND_GO_ON
    CUT_AND_GO_ON = args.cut_and_go_on
    with tempfile.TemporaryDirectory(prefix="kestrel-damage-") as tmp:
        files = Path(tmp) / "journal"
        files.mkdir()
        build_journal(files)
        print("journal files:", ", ".join(f"{n} ({(files / n).stat().st_size} bytes)"
                                          for n in sorted(os.listdir(files))))
        shutil.rmtree(files)
        cases = run(Path(tmp))
    print("| damage | cases | detected | consumed item back | detected, consumed item back "
          "| live item missing |")
    print("|---|---|---|---|---|---|")
    for kind, c in sorted(summary(cases).items()):
        print(f"| {kind} | {c['cases']} | {c['detected']} | {c['consumed item back']} | "
              f"{c['detected, consumed item back']} | {c['live item missing']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
