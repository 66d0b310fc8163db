"""
The clients and bookkeeping the fault scenarios share: a L{Run} (one
scenario under one policy: its server, ledger and scale), producers and
reliable consumers over the three protocols that write everything they see
into the ledger, and helpers to store, drain and run client threads.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.clients import MemcacheClient, ProtocolError, TextClient, ThriftClient
from tests.chaos.harness import ChaosServer, Load
from tests.faults.inject import Strace
from tests.faults.ledger import FaultLedger, key

#: The auto-abort of thrift reads: a thrift read outlives its connection until then.
THRIFT_AUTO_ABORT_MS = 1000
#: Client socket errors: the server refused, closed or died; the outcome is unknown.
GONE = (OSError, ConnectionError, ProtocolError, ValueError)


@dataclass
class Scale:
    """How much a scenario does (the short CI run, or C{--long})."""

    #: Seconds a fault lasts under load.
    fault_seconds: float = 1.5
    #: Seconds of load before and after the fault.
    load_seconds: float = 0.7
    #: Rounds of the deterministic scenarios (pipelined, per reader kind; vanishing races).
    rounds: int = 1
    race_rounds: int = 10
    #: Restarts while the disk is full (restart-full).
    restarts: int = 3


SHORT = Scale()
LONG = Scale(fault_seconds=4.0, load_seconds=2.0, rounds=4, race_rounds=40, restarts=4)


@dataclass
class Run:
    """One scenario under one policy: its server, ledger, randomness and scale."""

    server: ChaosServer
    ledger: FaultLedger
    rng: random.Random
    scale: Scale
    queues: list[str]
    log: Callable[[str], None]
    counter: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.server.proc is not None
        return self.server.proc.pid

    def ids(self, prefix: str, n: int) -> list[bytes]:
        """C{n} new unique items."""
        start, self.counter = self.counter, self.counter + n
        return [b"%s-%d" % (prefix.encode(), start + i) for i in range(n)]

    def memcache(self) -> MemcacheClient:
        """A new memcache connection."""
        return MemcacheClient(self.server.host, self.server.ports["memcache"])

    def journal(self, queue: str) -> Path:
        """The current journal file of C{queue}."""
        return self.server.queue_path / queue

    def strace(self, queues: list[str], syscalls: tuple[str, ...], error: str) -> Strace:
        """A fault on the journals of C{queues} (enter it to start the fault)."""
        return Strace(self.pid, [self.journal(q) for q in queues], syscalls, error)

    def record(self, fault: Strace) -> None:
        """Put a finished C{strace} fault into the ledger."""
        self.ledger.fault(fault.started, fault.ended, fault.injected,
                          fsync=any("sync" in call for call in fault.syscalls))


def refused(ledger: FaultLedger, items: list[bytes], targets: list[str],
            failing: tuple[str, ...] | None) -> None:
    """
    Record refused adds of C{items}, expected on C{targets}. C{failing}:
    C{None} for a plain queue (served nowhere); for a fanout master, the
    children whose journals the fault fails (served never from them, at most
    once per refusal from the other targets, which may have taken the item).
    """
    strict = [key(t, i) for i in items for t in targets if failing is None or t in failing]
    ledger.refused_adds(strict)
    if failing is not None:
        ledger.refused_fanout([key(t, i) for i in items for t in targets if t not in failing])


def producer(run: Run, load: Load, protocol: str, queue: str, targets: list[str],
             failing: tuple[str, ...] | None = None) -> Callable[[], None]:
    """
    Add unique items to C{queue} over C{protocol}, again and again. An item
    acknowledged there is expected on every queue of C{targets} (ledger
    keys); one refused (error reply, C{NOT_STORED}, a count that stops before
    it) must be served nowhere, except, when C{queue} is a fanout master
    (C{failing} given), once from each target outside C{failing} (L{refused}).
    An add whose reply never came is neither.
    """
    host, port = run.server.host, run.server.ports[protocol]
    ledger = run.ledger

    def keys(items: list[bytes]) -> list[bytes]:
        return [key(t, i) for i in items for t in targets]

    def refuse(items: list[bytes]) -> None:
        refused(ledger, items, targets, failing)

    def body() -> None:
        client: Any = {"memcache": MemcacheClient, "text": TextClient,
                       "thrift": ThriftClient}[protocol](host, port)
        try:
            while not load.stop.is_set():
                if protocol == "memcache":
                    [item] = load.next_ids("m", 1)
                    try:
                        stored = client.set(queue, item)
                    except ProtocolError:
                        refuse([item])
                        raise
                    if stored:
                        ledger.acknowledged(keys([item]))
                    else:
                        refuse([item])
                    continue
                items = load.next_ids(protocol[:2], load.rng.randrange(1, 4))
                try:
                    count = client.put(queue, items)
                except ProtocolError:
                    # text: an error line stores nothing; thrift: the first item failed.
                    refuse(items if protocol == "text" else items[:1])
                    raise
                if protocol == "thrift" or count in (0, len(items)):
                    # thrift stops at the first refusal; text "+0" stored none, "+n" all.
                    ledger.acknowledged(keys(items[:count]))
                    refuse(items[count:count + 1] if protocol == "thrift" else items[count:])
        finally:
            client.close()

    return body


def consumer(run: Run, load: Load, queue: str) -> Callable[[], None]:
    """Open and confirm items of C{queue} over memcache (C{/open}, C{/close}) forever."""
    ledger = run.ledger

    def body() -> None:
        client = run.memcache()
        holding: list[bytes] = []
        try:
            while not load.stop.is_set():
                got = client.get(queue, "/close/open/t=100" if holding else "/open/t=100")
                ledger.confirmed_all(holding)
                holding = [key(queue, got)] if got is not None else []
                if got is not None:
                    ledger.delivered(holding[0])
            if holding:
                client.get(queue, "/close")
                ledger.confirmed_all(holding)
                holding = []
        finally:
            ledger.dropped(holding)
            client.close()

    return body


def any_consumer(run: Run, load: Load, queue: str, protocol: str) -> Callable[[], None]:
    """Open and confirm items of C{queue} over text (C{get}, C{confirm}) or thrift."""
    host, port = run.server.host, run.server.ports[protocol]
    ledger = run.ledger

    def body() -> None:
        holding: list[bytes] = []
        client: Any = None
        try:
            if protocol == "text":
                client = TextClient(host, port)
                while not load.stop.is_set():
                    got = client.get(queue, 100)  # confirms what it held (not durably)
                    ledger.confirmed_all(holding, durable=False)
                    holding = [key(queue, got)] if got is not None else []
                    if got is not None:
                        ledger.delivered(holding[0])
                if holding:
                    client.confirm(queue, 1)
                    ledger.confirmed_all(holding)
                    holding = []
            else:
                client = ThriftClient(host, port)
                while not load.stop.is_set():
                    got = client.get(queue, 3, 100, THRIFT_AUTO_ABORT_MS)
                    holding = [key(queue, data) for _, data in got]
                    for item in holding:
                        ledger.delivered(item)
                    if got and client.confirm(queue, {i for i, _ in got}) == len(got):
                        ledger.confirmed_all(holding)
                        holding = []
                    # (a read not confirmed went back at its auto-abort: it may come again)
                    ledger.dropped(holding)
                    holding = []
        finally:
            # A thrift read left open goes back at its auto-abort; a text one at the close.
            ledger.dropped(holding)
            if client is not None:
                client.close()

    return body


def store(run: Run, queue: str, count: int, size: int = 0) -> None:
    """Add C{count} acknowledged items to C{queue} (padded to C{size} bytes), 100 a put."""
    if count == 1 or size > 1000:
        client = run.memcache()
        try:
            for item in run.ids(queue, count):
                item = item.ljust(size, b".")
                if client.set(queue, item):
                    run.ledger.acknowledged([key(queue, item)])
        finally:
            client.close()
        return
    text = TextClient(run.server.host, run.server.ports["text"])
    try:
        for start in range(0, count, 100):
            items = [i.ljust(size, b".") for i in run.ids(queue, min(100, count - start))]
            if text.put(queue, items) == len(items):
                run.ledger.acknowledged([key(queue, i) for i in items])
    finally:
        text.close()


def drain(run: Run, seconds: float = 10.0) -> None:
    """
    Read every queue of the run to its end with confirmed reads. A queue
    that refuses reads (its journal still failing) is tried again until
    C{seconds} have passed; then it is noted as not recovered.
    """
    for queue in run.queues:
        deadline = time.monotonic() + seconds
        while True:
            holding: list[bytes] = []
            client: MemcacheClient | None = None
            try:
                client = run.memcache()
                while (got := client.get(queue, "/open")) is not None:
                    holding = [key(queue, got)]
                    run.ledger.delivered(holding[0])
                    client.get(queue, "/close")
                    run.ledger.confirmed_all(holding)
                    holding = []
                break
            except GONE as e:
                # (a read not confirmed goes back at the close: it may come again)
                run.ledger.dropped(holding)
                if time.monotonic() > deadline:
                    run.notes.append(f"{queue} still refused reads {seconds:.0f} s after "
                                     f"the fault: {e}")
                    break
                time.sleep(0.2)
            finally:
                if client is not None:
                    client.close()


@contextlib.contextmanager
def loaded(run: Run, spawn: Callable[[Load], None]) -> Iterator[Load]:
    """Run the client threads C{spawn} starts for the block, then stop and join them."""
    load = Load(run.server, run.ledger, random.Random(run.rng.random()), 0)
    spawn(load)
    try:
        yield load
    finally:
        load.stop.set()
        for t in load.threads:
            t.join(timeout=15)
