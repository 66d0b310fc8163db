"""
What the fault harness asks of a server besides the ledger: its per-queue
counts in memory (memcache C{stats}), the same counts replayed offline from
its journal files (C{kestrel-qpack} then C{kestrel-qdump}, as an operator
would), and whether a queue takes adds again after a fault.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.clients import MemcacheClient, ProtocolError
from tests.wire.conftest import ROOT, KestrelProcess

_SUMMARY = re.compile(rb"(\d+) items totalling")


def queue_stats(server: KestrelProcess) -> dict[str, dict[str, int]]:
    """Per queue: C{items} (queued, open reads excluded) and C{open_transactions}."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    out: dict[str, dict[str, int]] = {}
    try:
        client.sock.sendall(b"stats\r\n")
        while (line := client._line()) != b"END":
            parts = line.split()
            if len(parts) != 3 or not parts[1].startswith(b"queue_"):
                continue
            name = parts[1][len(b"queue_"):].decode()
            for stat in ("open_transactions", "items"):
                if name.endswith("_" + stat) and not name.endswith(("_total_items",
                                                                    "_expired_items",
                                                                    "_mem_items")):
                    out.setdefault(name[: -len(stat) - 1], {})[stat] = int(parts[2])
                    break
    finally:
        client.close()
    return out


def journal_files(folder: Path, queue: str) -> list[Path]:
    """The journal files of C{queue}, oldest first: rotated C{<q>.<ms>}, then C{<q>}."""
    rotated = sorted((p for p in folder.iterdir()
                      if p.name.startswith(queue + ".") and p.name[len(queue) + 1:].isdigit()),
                     key=lambda p: int(p.name[len(queue) + 1:]))
    current = folder / queue
    return rotated + ([current] if current.exists() else [])


def _tool(module: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def journal_items(folder: Path, queue: str) -> int:
    """
    How many items (queued plus open reads) the journal of C{queue} holds,
    replayed offline from a copy: C{kestrel-qpack} chains the files into one,
    C{kestrel-qdump -q} counts it. Raises L{ValueError} if the tools refuse
    the journal (an inconsistent one: a remove of nothing, an abort of an
    unknown read).
    """
    files = journal_files(folder, queue)
    if not files:
        return 0
    with tempfile.TemporaryDirectory(prefix="kestrel-faults-journal-") as tmp:
        copies = []
        for path in files:
            copy = Path(tmp) / path.name
            shutil.copyfile(path, copy)
            copies.append(str(copy))
        packed = str(Path(tmp) / "packed")
        done = _tool("kestrel.tools.qpack", "-f", packed, *copies)
        if done.returncode:
            raise ValueError(f"kestrel-qpack refused the journal of {queue}: "
                             f"{done.stderr.decode(errors='replace').strip()}")
        dumped = _tool("kestrel.tools.qdump", "-q", packed)
        found = _SUMMARY.search(dumped.stdout)
        if dumped.returncode or found is None:
            raise ValueError(f"kestrel-qdump could not read the packed journal of {queue}: "
                             f"{dumped.stderr.decode(errors='replace').strip()}")
        return int(found.group(1))


def memory_vs_journal(server: KestrelProcess, queues: list[str], when: str) -> list[str]:
    """
    Compare each queue's items in memory (queued plus open) with its journal
    replayed offline; one line per disagreement. The server must be idle
    (no client working) so that both describe the same moment.
    """
    stats = queue_stats(server)
    problems = []
    for queue in queues:
        memory = stats.get(queue, {})
        in_memory = memory.get("items", 0) + memory.get("open_transactions", 0)
        try:
            on_disk = journal_items(server.queue_path, queue)
        except ValueError as e:
            problems.append(f"{when}: {queue}: {e}")
            continue
        if in_memory != on_disk:
            problems.append(f"{when}: {queue}: memory {memory} but the journal replays "
                            f"{on_disk} items")
    return problems


def stuck_open(server: KestrelProcess, queues: list[str], when: str,
               seconds: float = 3.0) -> list[str]:
    """
    Reads still open on C{queues} once no client holds any (every client is
    gone, no thrift read is pending): one line per queue where they stay
    open for C{seconds}.
    """
    deadline = time.monotonic() + seconds
    while True:
        stats = queue_stats(server)
        stuck = {q: stats.get(q, {}).get("open_transactions", 0) for q in queues}
        stuck = {q: n for q, n in stuck.items() if n}
        if not stuck or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [f"{when}: {q}: {n} reads open with no client holding them"
            for q, n in sorted(stuck.items())]


def wait_writable(server: KestrelProcess, queue: str, probe: bytes,
                  seconds: float = 10.0) -> int | None:
    """
    Store C{probe} on C{queue} until the server takes it (a failed queue
    refuses adds until its journal can be written again): how many attempts
    it refused (or left unanswered) before it did, or C{None} if it never did.
    """
    deadline = time.monotonic() + seconds
    failed = 0
    while time.monotonic() < deadline:
        client = MemcacheClient(server.host, server.ports["memcache"])
        try:
            if client.set(queue, probe):
                return failed
        except (ProtocolError, OSError):
            pass
        finally:
            client.close()
        failed += 1
        time.sleep(0.1)
    return None
