"""
The fault scenarios: a real server, real clients, one fault, then the checks.

Every scenario runs one server (L{tests.chaos.harness.ChaosServer}) under a
sync policy, drives clients over its sockets while a fault lasts (C{strace}
failing writes or fsyncs of chosen journal files, or a tmpfs filled up),
records everything in a L{FaultLedger}, and ends the same way
(L{_finish}): every client gone, the reads still open are counted (none may
be), memory is compared with the journal replayed offline, the server
restarts, memory is compared again, every queue is drained with confirmed
reads, and the ledger gives its verdict.

  - C{fanout-eio-write}, C{fanout-eio-fsync}: producers on all three
    protocols add to the fanout master C{fq} while writes (or fsyncs) of its
    child C{fq+a}'s journal fail; every item acknowledged on C{fq} must reach
    C{fq}, C{fq+a} and C{fq+b};
  - C{fanout-only-full}: the same with C{fanout_only} on C{fq} and the
    queue folder on a tmpfs filled up for a while (both children fail);
  - C{pipelined}: a reader waits on C{bq} (memcache plain, C{/open}, thrift),
    writes of C{bq}'s journal fail, and another client pipelines three sets:
    none that is refused may reach the reader;
  - C{restart-full}: the server restarts on a full disk; reliable consumers
    on the three protocols open and confirm while it is full, then after it
    is freed: no confirmed item may come back;
  - C{aborts}: open reads are aborted (thrift C{abort}, memcache C{/abort})
    while the journal cannot be written; once it can, no read may stay open;
  - C{vanishing}: plain reads whose reply is never read: readers that
    reset just before an item arrives, and readers of a 6 MiB item with a
    2 KiB receive buffer that reset without reading: the items must stay.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.clients import MemcacheClient, ThriftClient, blocked_reader
from tests.chaos.harness import (
    PROTOCOLS,
    ChaosServer,
    Load,
    fill_disk,
    full_disk_unavailable,
    tmpfs,
    waiters,
)
from tests.faults.checks import memory_vs_journal, stuck_open, wait_writable
from tests.faults.inject import ptrace_unavailable
from tests.faults.ledger import FaultLedger, Policy, key
from tests.faults.workload import (
    GONE,
    SHORT,
    THRIFT_AUTO_ABORT_MS,
    Run,
    Scale,
    any_consumer,
    consumer,
    drain,
    loaded,
    producer,
    refused,
    store,
)

#: The page size of a tmpfs (it allocates a file's space by pages).
PAGE = 4096
#: The bytes of an item's add record besides its data.
ADD_HEADER = 21


def _settle(run: Run, when: str) -> None:
    """With no client left: no read may stay open, and memory must be the journal."""
    run.ledger.problems.stuck_open += stuck_open(run.server, run.queues, when)
    run.ledger.problems.memory_vs_journal += memory_vs_journal(run.server, run.queues, when)


def _finish(run: Run) -> None:
    """The end of every scenario: checks after the fault, a restart, checks, the drain."""
    _settle(run, "after the fault")
    run.server.stop()
    run.server.start()
    _settle(run, "after a restart")
    drain(run)


def _probe(run: Run, queue: str, targets: list[str],
           failing: tuple[str, ...] | None = None) -> None:
    """
    Wait until C{queue} takes adds again (its probe item is expected on
    C{targets}). On a fanout master (C{failing}: see L{refused}) each refused
    attempt may have left a copy of the probe in the queues that took it.
    """
    [probe] = run.ids("probe", 1)
    failed = wait_writable(run.server, queue, probe)
    if failed is None:
        run.notes.append(f"{queue} still refused adds 10 s after the fault")
        return
    if failing is not None:
        for _ in range(failed):
            refused(run.ledger, [probe], targets, failing)
    run.ledger.acknowledged([key(t, probe) for t in targets])


# -- scenarios -------------------------------------------------------------


def _fanout(run: Run, how: str) -> None:
    """Load on a fanout master while one child's (or every) journal fails."""
    fanout_only = how == "full"
    targets = ["fq+a", "fq+b"] + ([] if fanout_only else ["fq"])
    # The child whose journal fails: a refused add must never come from it. A full
    # disk fails both children, but either may have taken an add the other refused.
    failing = () if fanout_only else ("fq+a",)
    client = run.memcache()
    for child in ("fq+a", "fq+b"):
        client.get(child)  # (creates the children)
    client.close()

    def spawn(load: Load) -> None:
        for protocol in PROTOCOLS + ("memcache",):
            load.spawn(f"producer-{protocol}", producer(run, load, protocol, "fq", targets,
                                                                failing))
        for queue in targets:
            load.spawn(f"consumer-{queue}", consumer(run, load, queue))

    with loaded(run, spawn):
        time.sleep(run.scale.load_seconds)
        if how == "full":
            ballast = run.server.queue_path / "ballast.tmp"
            started = time.monotonic()
            fill_disk(ballast, run.server.queue_path, keep=0)
            time.sleep(run.scale.fault_seconds)
            ballast.unlink()
            run.ledger.fault(started, time.monotonic(), 0, fsync=False)
        else:
            syscalls = ("write",) if how == "write" else ("fsync", "fdatasync")
            with run.strace(["fq+a"], syscalls, "EIO") as fault:
                time.sleep(run.scale.fault_seconds)
            run.record(fault)
        time.sleep(run.scale.load_seconds)
    _probe(run, "fq", targets, failing)
    _finish(run)


def pipelined(run: Run) -> None:
    """Three pipelined sets while a reader waits and the journal's writes fail."""
    queue = "bq"
    store(run, queue, 1)
    drain(run)
    for _ in range(run.scale.rounds):
        for kind in ("memcache", "memcache-open", "thrift"):
            drain(run)  # (the reader must wait)
            reader = blocked_reader(run.server.host, run.server.ports, kind, queue, 2000)
            deadline = time.monotonic() + 5
            while waiters(run.server, queue) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            items = run.ids(f"p-{kind}", 3)
            with run.strace([queue], ("write",), "EIO") as fault:
                writer = run.memcache()
                writer.sock.sendall(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (
                    queue.encode(), len(i), i) for i in items))
                for item in items:
                    try:
                        line = writer._line()
                    except GONE:
                        break  # (closed after an error: the rest is unanswered)
                    if line == b"STORED":
                        run.ledger.acknowledged([key(queue, item)])
                    else:
                        run.ledger.refused_adds([key(queue, item)])
                writer.close()
                _read_blocked(run, reader, kind, queue)
            run.record(fault)
            reader.close()
            _probe(run, queue, [queue])
            run.log(f"  pipelined: {kind} reader done, {fault.injected} writes failed")
    _finish(run)


def _read_blocked(run: Run, reader: Any, kind: str, queue: str) -> None:
    """What a blocked reader got (its wait ends at its timeout at the latest)."""
    try:
        if kind == "thrift":
            got = [item.data for item in reader.read_reply("get") or []]
        else:
            value = reader.read_value()
            got = [] if value is None else [value]
    except GONE:
        return
    for data in got:
        run.ledger.delivered(key(queue, data))
        if kind == "memcache-open":
            # Its read is open: the reader goes away, so the server aborts it.
            run.ledger.dropped([key(queue, data)])


def restart_full(run: Run) -> None:
    """
    Restart on a full disk; reliable consumers confirm while it is full and
    after it is freed, then the server restarts cleanly. The cycle runs
    C{rounds + 1} times (what goes wrong depends on timing).
    """
    queue = "rq"

    def spawn(load: Load) -> None:
        load.spawn("consumer-memcache", consumer(run, load, queue))
        for protocol in ("text", "thrift"):
            load.spawn(f"consumer-{protocol}", any_consumer(run, load, queue, protocol))

    for cycle in range(run.scale.rounds + 1):
        if cycle:
            _probe(run, queue, [queue])
        # Enough items that their reads outgrow the journal's last page (tmpfs fills by pages).
        store(run, queue, 3000, size=20)
        run.server.stop()
        ballast = run.server.queue_path / "ballast.tmp"
        started = time.monotonic()
        fill_disk(ballast, run.server.queue_path, keep=0)
        run.server.start()
        with loaded(run, spawn):
            for restart in range(run.scale.restarts):
                # Restart while the disk is still full: by turns cleanly and with SIGKILL.
                time.sleep(run.scale.fault_seconds / 2)
                if restart % 2:
                    run.server.kill()
                    run.ledger.crashed()
                else:
                    run.server.stop()
                run.ledger.restarted_in_fault(started)
                run.server.start()
                how = "SIGKILL" if restart % 2 else "SIGTERM"
                run.log(f"  restart-full: restarted on the full disk (after a {how})")
            time.sleep(run.scale.fault_seconds / 2)
            ballast.unlink()
            run.ledger.fault(started, time.monotonic(), 0, fsync=False)
            # Long enough for the queue to probe its journal and take adds again.
            time.sleep(max(run.scale.load_seconds, 2.0))
        run.log(f"  restart-full: cycle {cycle + 1} done")
        if cycle < run.scale.rounds:
            run.server.stop()
            run.server.start()
    _finish(run)


def _open_reads(run: Run, queue: str, thrift: ThriftClient, memcache: MemcacheClient
                ) -> tuple[list[tuple[int, bytes]], list[bytes]]:
    """Open two reads over thrift and one over memcache: the thrift ones, all the items."""
    opened: list[tuple[int, bytes]] = []
    held: list[bytes] = []
    with contextlib.suppress(*GONE):
        opened = thrift.get(queue, 2, 0, THRIFT_AUTO_ABORT_MS)
    with contextlib.suppress(*GONE):
        value = memcache.get(queue, "/open")
        held = [key(queue, value)] if value else []
    held += [key(queue, d) for _, d in opened]
    for item in held:
        run.ledger.delivered(item)
    return opened, held


def aborts(run: Run) -> None:
    """
    Open reads aborted while the disk is full (thrift C{abort}, memcache
    C{/abort}): by turns the reads are opened before the disk fills up (the
    aborts' records are the first that fail) or once it is full (the first
    read's record fits, the next not); the disk is freed after 0.3 s (before
    the queue reloads its journal), 1.2 s or 2.5 s (after one or two reloads).
    """
    queue = "aq"
    store(run, queue, 20)
    ballast = run.server.queue_path / "ballast.tmp"
    for round_ in range(2 * run.scale.rounds):
        # By turns the reads are opened before the disk fills up (the aborts' records
        # are the first that fail) or once it is full (one read's record fits, no more).
        early = round_ % 2 == 0
        thrift = ThriftClient(run.server.host, run.server.ports["thrift"])
        memcache = run.memcache()
        if early:
            opened, held = _open_reads(run, queue, thrift, memcache)
        # An item that leaves 2 (or 7: one open read) bytes free in the journal's last
        # page: once the disk is full (tmpfs allocates by pages) the next records fail.
        tail = run.journal(queue).stat().st_size % PAGE
        store(run, queue, 1, size=(PAGE - tail - ADD_HEADER - (2 if early else 7)) % PAGE)
        fill_disk(ballast, run.server.queue_path, keep=0)
        started = time.monotonic()
        if not early:
            opened, held = _open_reads(run, queue, thrift, memcache)
        with contextlib.suppress(*GONE):
            thrift.call("abort", queue_name=queue, ids={i for i, _ in opened})
        with contextlib.suppress(*GONE):
            memcache.get(queue, "/abort")
        # An aborted read may be delivered once more: the ledger lets it.
        run.ledger.dropped(held)
        time.sleep((0.3, 1.2, 2.5)[round_ % 3])
        ballast.unlink()
        run.ledger.fault(started, time.monotonic(), 0, fsync=False)
        thrift.close()
        memcache.close()
        _probe(run, queue, [queue])
        run.ledger.problems.stuck_open += stuck_open(run.server, [queue],
                                                     f"after abort round {round_ + 1}", 2.5)
        run.log(f"  aborts: round {round_ + 1} done")
    _finish(run)


def vanishing(run: Run) -> None:
    """Plain reads whose reply is never read: an RST before the item, a tiny receive buffer."""
    queue = "race"
    writer = run.memcache()
    for round_ in range(run.scale.race_rounds):
        kind = ("memcache", "thrift")[round_ % 2]
        reader = blocked_reader(run.server.host, run.server.ports, kind, queue, 5000)
        deadline = time.monotonic() + 5
        while waiters(run.server, queue) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        # The reader's reset, then at once the set (the case: the client
        # resets just before the set arrives). The server may take the set before
        # it sees the reset, but the reset is already in its kernel, so the reply
        # to the reader can never be written there. (A reset sent after the set
        # races with a reply the kernel may already hold: no server can tell.)
        [item] = run.ids("race", 1)
        reader.reset()
        writer.sock.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(item), item))
        if writer._line() == b"STORED":
            run.ledger.acknowledged([key(queue, item)])
        run.ledger.faulted(1)
        time.sleep(0.05)
        drain(run)  # (what the vanished reader took is not there)
    writer.close()
    big = "big"
    for kind in ("memcache", "thrift"):
        store(run, big, 1, size=6 << 20)
        host, port = run.server.host, run.server.ports[kind]
        if kind == "memcache":
            reader: Any = MemcacheClient(host, port, rcvbuf=2048)
            reader.send_get(big)
        else:
            reader = ThriftClient(host, port, rcvbuf=2048)
            reader.send_call("get", queue_name=big, max_items=1, timeout_msec=0,
                             auto_abort_msec=0)
        time.sleep(0.5)
        reader.reset()
        run.ledger.faulted(1)
        time.sleep(0.2)
    run.queues.append(big)
    _finish(run)


@dataclass(frozen=True)
class Scenario:
    """A scenario, what it needs of the machine, and the policies it applies to."""

    name: str
    body: Callable[[Run], None]
    queues: tuple[str, ...]
    #: C{"strace"} and/or C{"mount"}.
    needs: tuple[str, ...]
    #: Only policies that fsync (an fsync fault changes nothing under C{never}).
    fsync_only: bool = False
    #: Mount a tmpfs of this size on the queue folder before the server starts.
    tmpfs: str | None = None


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("fanout-eio-write", lambda run: _fanout(run, "write"), ("fq", "fq+a", "fq+b"),
             ("strace",)),
    Scenario("fanout-eio-fsync", lambda run: _fanout(run, "fsync"), ("fq", "fq+a", "fq+b"),
             ("strace",), fsync_only=True),
    Scenario("fanout-only-full", lambda run: _fanout(run, "full"), ("fq", "fq+a", "fq+b"),
             ("mount",), tmpfs="64m"),
    Scenario("pipelined", pipelined, ("bq",), ("strace",)),
    Scenario("restart-full", restart_full, ("rq",), ("mount",), tmpfs="16m"),
    Scenario("aborts", aborts, ("aq",), ("mount",), tmpfs="16m"),
    Scenario("vanishing", vanishing, ("race",), ()),
]}


def applies(scenario: Scenario, policy: Policy) -> bool:
    """Whether C{scenario} means something under C{policy}."""
    return policy.fsyncs or not scenario.fsync_only


def unavailable(scenario: Scenario) -> str | None:
    """Why C{scenario} cannot run on this machine, or C{None}."""
    checks = {"strace": ptrace_unavailable, "mount": full_disk_unavailable}
    for need in scenario.needs:
        why = _cached(need, checks[need])
        if why is not None:
            return why
    return None


_PROBES: dict[str, str | None] = {}


def _cached(need: str, probe: Callable[[], str | None]) -> str | None:
    if need not in _PROBES:
        _PROBES[need] = probe()
    return _PROBES[need]


def run_scenario(scenario: Scenario, policy: Policy, workdir: Path, seed: int,
                 scale: Scale = SHORT, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run C{scenario} under C{policy} in C{workdir}; return its verdict and counters."""
    root = workdir / f"{scenario.name}-{policy.name}".replace("+", "_")
    shutil.rmtree(root, ignore_errors=True)
    config = {"max_open_transactions": 100, "client_timeout": None,
              "default": dict(policy.queue_config)}
    if scenario.name == "fanout-only-full":
        config["queues"] = {"fq": {"fanout_only": True}}
    server = ChaosServer(root, PROTOCOLS, config=config)
    ledger = FaultLedger(policy)
    run = Run(server, ledger, random.Random(seed), scale, list(scenario.queues), log)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if scenario.tmpfs:
            stack.enter_context(tmpfs(server.queue_path, scenario.tmpfs))
        server.start()
        try:
            scenario.body(run)
        except (GONE + (RuntimeError,)) as e:
            # The server died or never came back: a failure of the run, not of the harness.
            run.notes.append(f"the scenario stopped: {e!r}"[:500])
        finally:
            if server.running:
                server.stop()
            text = server.log()
            shutil.copy(server.log_path, workdir / f"{root.name}-seed{seed}.log")
    verdict: dict[str, Any] = ledger.verdict()
    if scenario.tmpfs:
        verdict["injected"] += text.count("No space left on device")
    verdict.update(scenario=scenario.name, policy=policy.name,
                   seconds=round(time.monotonic() - started, 1),
                   tracebacks=text.count("Traceback (most recent call last)"),
                   not_recovered=len(run.notes),
                   problems=ledger.problems.memory_vs_journal + ledger.problems.stuck_open
                   + run.notes + ledger.examples())
    shutil.rmtree(root, ignore_errors=True)
    return verdict
