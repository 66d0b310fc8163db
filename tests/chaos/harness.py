"""
The crash and fault harness: real server processes under load, killed with
SIGKILL at random moments, and a ledger that checks afterwards that nothing
acknowledged was lost.

One run of a L{Variant} is a number of cycles. In each cycle a server starts
on the variant's journal folder (sometimes it is first killed while it
replays), then producers over the three protocols add items with unique ids,
reliable consumers over the three protocols open, then confirm, what they
get, and clients that block in a read and vanish (FIN or RST) come and go;
after a random time the server is killed with SIGKILL. At the end a clean
server drains every queue and the L{Ledger} is checked:

  - every acknowledged item came back (else it is I{lost});
  - an item came back more than once only if one of its reads was open at a
    crash, and at most once more per such crash (else it is I{duplicated});
  - no item came back after its confirmation was acknowledged (else it
    I{reappeared});
  - the vanishing readers, whose queue gets its items only once they are
    gone, took none of them.

Nothing here imports the server's code: it speaks to the server over its
sockets only (L{tests.chaos.clients}).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.clients import (
    MemcacheClient,
    ProtocolError,
    TextClient,
    ThriftClient,
    blocked_reader,
)
from tests.wire.conftest import KestrelProcess

PROTOCOLS = ("memcache", "text", "thrift")
#: Queues written and read by the main load (one per producer protocol).
QUEUES = ("chaos_m", "chaos_t", "chaos_r")
#: The queue the vanishing readers wait on.
VANISH_QUEUE = "chaos_vanish"


@dataclass(frozen=True)
class Variant:
    """One server configuration the harness runs (queue settings under C{default})."""

    name: str
    queue_config: dict[str, Any]
    #: Put the queue folder on a small tmpfs and fill it (needs mount rights).
    full_disk: bool = False


SMALL = {"max_memory_size": "4KiB", "max_journal_size": "16KiB",
         "default_journal_size": "8KiB"}

VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("never", {"sync_journal": "never"}),
    Variant("always", {"sync_journal": "always"}),
    Variant("always+durable", {"sync_journal": "always", "durable_acks": True}),
    Variant("period", {"sync_journal": "50ms"}),
    Variant("period+durable", {"sync_journal": "50ms", "durable_acks": True}),
    Variant("never+small", {"sync_journal": "never", **SMALL}),
    Variant("period+durable+small", {"sync_journal": "50ms", "durable_acks": True, **SMALL}),
    Variant("always+small", {"sync_journal": "always", **SMALL}),
    # Kestrel's other rewrite policy: empty queues rewritten by every journal
    # file, and rewrites that keep open reads backing off for a second.
    Variant("never+small+gentle", {"sync_journal": "never", **SMALL,
                                   "disable_aggressive_rewrites": True,
                                   "min_journal_compact_delay": "1s"}),
    Variant("full-disk", {"sync_journal": "50ms", "durable_acks": True, **SMALL},
            full_disk=True),
]}

#: The variants a default run (and CI) uses: all but the full disk, which needs mount rights.
DEFAULT_VARIANTS = tuple(name for name, v in VARIANTS.items() if not v.full_disk)


class Ledger:
    """What the clients saw: acknowledged adds, deliveries, confirmations, crashes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acked: set[bytes] = set()
        self.deliveries: Counter[bytes] = Counter()
        self.confirmed: set[bytes] = set()
        self.reappeared: set[bytes] = set()
        #: Reads open (delivered, confirm not acknowledged) at some crash, and how often.
        self.open_at_crash: Counter[bytes] = Counter()
        self._open: set[bytes] = set()
        self.vanish_expected: set[bytes] = set()
        self.vanish_got: Counter[bytes] = Counter()

    def acknowledged(self, ids: list[bytes]) -> None:
        with self._lock:
            self.acked.update(ids)

    def delivered(self, item: bytes) -> None:
        with self._lock:
            self.deliveries[item] += 1
            if item in self.confirmed:
                self.reappeared.add(item)
            self._open.add(item)

    def confirmed_all(self, items: list[bytes]) -> None:
        with self._lock:
            for item in items:
                self._open.discard(item)
                self.confirmed.add(item)

    def crashed(self) -> None:
        """The server was killed: every read open now may come back once more."""
        with self._lock:
            for item in self._open:
                self.open_at_crash[item] += 1
            self._open.clear()

    def dropped(self, items: list[bytes]) -> None:
        """A consumer lost its connection with these reads open: the server aborts them."""
        with self._lock:
            for item in items:
                if item in self._open:
                    self._open.discard(item)
                    self.open_at_crash[item] += 1

    def verdict(self) -> dict[str, int]:
        """The counts of the check (see the module docstring)."""
        with self._lock:
            lost = [i for i in self.acked if self.deliveries[i] == 0]
            redelivered = [i for i, n in self.deliveries.items() if n > 1]
            duplicated = [i for i in redelivered
                          if self.deliveries[i] > 1 + self.open_at_crash[i]]
            vanish_lost = [i for i in self.vanish_expected if self.vanish_got[i] == 0]
            return {
                "acknowledged": len(self.acked),
                "delivered": len(self.deliveries),
                "lost": len(lost),
                "redelivered": len(redelivered),
                "duplicated": len(duplicated),
                "reappeared": len(self.reappeared),
                "vanish_items": len(self.vanish_expected),
                "vanish_lost": len(vanish_lost),
            }


class ChaosServer(KestrelProcess):
    """A server process that can also be started without waiting for it (to kill it early)."""

    def start_no_wait(self) -> None:
        """Start the server and return at once (it may still be replaying)."""
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=root, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def waiters(server: KestrelProcess, queue: str) -> int:
    """The C{waiters} count of C{queue} (memcache C{dump_stats})."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    try:
        client.sock.sendall(b"dump_stats %s\r\n" % queue.encode())
        count = 0
        while (line := client._line()) != b"END":
            if line.strip().startswith(b"waiters="):
                count = int(line.strip().split(b"=")[1])
        return count
    finally:
        client.close()


def wait_for_no_waiters(server: KestrelProcess, queue: str, seconds: float) -> bool:
    """Whether the waiters of C{queue} went to 0 within C{seconds}."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if waiters(server, queue) == 0:
            return True
        time.sleep(0.02)
    return False


@dataclass
class Load:
    """
    The client threads of one cycle and the flag that stops them: each
    thread runs its body again and again (reconnecting after a refusal or a
    dead server) until the flag is set; L{next_ids} hands out unique ids.
    """

    server: KestrelProcess
    ledger: Ledger
    rng: random.Random
    cycle: int
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    counter: int = 0
    counter_lock: threading.Lock = field(default_factory=threading.Lock)

    def next_ids(self, prefix: str, n: int) -> list[bytes]:
        with self.counter_lock:
            start = self.counter
            self.counter += n
        pad = b"." * self.rng.randrange(0, 200)
        return [b"%s-%d-%d-%s" % (prefix.encode(), self.cycle, start + i, pad)
                for i in range(n)]

    def spawn(self, name: str, body: Callable[[], None],
              stop: threading.Event | None = None) -> threading.Thread:
        t = threading.Thread(target=self._guard, args=(body, stop or self.stop), name=name,
                             daemon=True)
        self.threads.append(t)
        t.start()
        return t

    def _guard(self, body: Callable[[], None], stop: threading.Event) -> None:
        while not stop.is_set() and not self.stop.is_set():
            try:
                body()
            except (OSError, ConnectionError, ProtocolError, ValueError):
                # The server died or refused: reconnect after a breath.
                time.sleep(0.05)


def _producer(load: Load, protocol: str, queue: str) -> Callable[[], None]:
    host, port = load.server.host, load.server.ports[protocol]

    def body() -> None:
        if protocol == "memcache":
            client: Any = MemcacheClient(host, port)
        elif protocol == "text":
            client = TextClient(host, port)
        else:
            client = ThriftClient(host, port)
        try:
            while not load.stop.is_set():
                if protocol == "memcache":
                    [item] = load.next_ids("m", 1)
                    if client.set(queue, item):
                        load.ledger.acknowledged([item])
                else:
                    items = load.next_ids(protocol[:2], load.rng.randrange(1, 4))
                    stored = client.put(queue, items)
                    # text stores every item it can; thrift stops at the first refusal.
                    if stored == len(items) or protocol == "thrift":
                        load.ledger.acknowledged(items[:stored])
        finally:
            client.close()

    return body


def _consumer(load: Load, protocol: str, queues: tuple[str, ...]) -> Callable[[], None]:
    host, port = load.server.host, load.server.ports[protocol]
    ledger = load.ledger

    def body() -> None:
        holding: list[bytes] = []
        try:
            if protocol in ("memcache", "text"):
                client: Any = (MemcacheClient if protocol == "memcache" else TextClient)(host, port)
                queue = load.rng.choice(queues)
                while not load.stop.is_set():
                    if protocol == "memcache":
                        got = client.get(queue, "/close/open/t=100" if holding else "/open/t=100")
                    else:
                        got = client.get(queue, 100)  # (confirms what it held on this queue)
                    ledger.confirmed_all(holding)
                    holding = []
                    if got is not None:
                        ledger.delivered(got)
                        holding = [got]
                    else:
                        queue = load.rng.choice(queues)
                client.close()
            else:
                rclient = ThriftClient(host, port)
                while not load.stop.is_set():
                    queue = load.rng.choice(queues)
                    got = rclient.get(queue, 5, 100, 60_000)
                    for _, data in got:
                        ledger.delivered(data)
                    holding = [data for _, data in got]
                    if got:
                        rclient.confirm(queue, {i for i, _ in got})
                        ledger.confirmed_all(holding)
                        holding = []
                rclient.close()
        except BaseException:
            ledger.dropped(holding)
            raise
        ledger.dropped(holding)

    return body


def _vanisher(load: Load) -> Callable[[], None]:
    """Block in a read of the vanish queue, then go away (FIN or RST) without reading."""
    server = load.server

    def body() -> None:
        protocol = load.rng.choice(("memcache", "memcache-open", "text", "thrift"))
        client = blocked_reader(server.host, server.ports, protocol, VANISH_QUEUE, 30000,
                                max_items=2)
        time.sleep(load.rng.uniform(0.01, 0.3))
        client.vanish(rst=load.rng.random() < 0.5)

    return body


def wait_for_adds(server: KestrelProcess, ledger: Ledger, cycle: int, seconds: float) -> bool:
    """
    Store one probe item on each of L{QUEUES} (acknowledged in C{ledger})
    until each is taken; whether all were within C{seconds}.
    """
    deadline = time.monotonic() + seconds
    for queue in QUEUES:
        probe = b"probe-%d-%s" % (cycle, queue.encode())
        while True:
            client = MemcacheClient(server.host, server.ports["memcache"])
            try:
                if client.set(queue, probe):
                    ledger.acknowledged([probe])
                    break
            except (ProtocolError, ConnectionError):
                pass  # (refused while the queue recovers: try again)
            finally:
                client.close()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    return True


def _fill_vanish_queue(server: KestrelProcess, ledger: Ledger, cycle: int) -> None:
    """After the vanishers are gone: store items on their queue, then drain it."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    try:
        for i in range(20):
            item = b"v-%d-%d" % (cycle, i)
            try:
                if client.set(VANISH_QUEUE, item):
                    ledger.vanish_expected.add(item)
            except (ProtocolError, ConnectionError):
                # (a full disk refuses it: not acknowledged, so not expected back)
                client.close()
                client = MemcacheClient(server.host, server.ports["memcache"])
        while (got := client.get(VANISH_QUEUE)) is not None:
            ledger.vanish_got[got] += 1
    finally:
        client.close()


def drain(server: KestrelProcess, ledger: Ledger) -> None:
    """Read every queue to the end with confirmed reads (the server is up)."""
    client = MemcacheClient(server.host, server.ports["memcache"])
    try:
        for queue in QUEUES:
            while True:
                got = client.get(queue, "/open")
                if got is None:
                    break
                ledger.delivered(got)
                client.get(queue, "/close")
                ledger.confirmed_all([got])
        while (got := client.get(VANISH_QUEUE)) is not None:
            ledger.vanish_got[got] += 1
    finally:
        client.close()


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Any:
    """Mount a tmpfs of C{size} on C{path} for the block (lazily unmounted after it)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def full_disk_unavailable() -> str | None:
    """Why the full-disk variant cannot run here, or C{None} if a tmpfs can be mounted."""
    if shutil.which("mount") is None:
        return "no mount command"
    probe = Path(f"/tmp/kestrel-chaos-probe-{os.getpid()}")
    try:
        with tmpfs(probe, "64k"):
            pass
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        return f"cannot mount a tmpfs: {err.decode(errors='replace').strip() or e}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


def run_variant(variant: Variant, cycles: int, workdir: Path, seed: int,
                progress: Callable[[str], None] = print,
                load_seconds: tuple[float, float] = (0.5, 2.5)) -> dict[str, Any]:
    """Run C{cycles} kill cycles of C{variant} in C{workdir}; return the verdict and counters."""
    rng = random.Random(seed)
    ledger = Ledger()
    root = workdir / variant.name.replace("+", "_")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    config = {"max_open_transactions": 100, "default": dict(variant.queue_config),
              "client_timeout": None}
    server = ChaosServer(root, PROTOCOLS, config=config)
    stack = contextlib.ExitStack()
    ballast: Path | None = None
    if variant.full_disk:
        stack.enter_context(tmpfs(server.queue_path, "3m"))
        ballast = server.queue_path / "ballast.tmp"
    kills_in_replay = 0
    started = time.monotonic()
    with stack:
        for cycle in range(cycles):
            if cycle and rng.random() < 0.3:
                # Kill it again while it starts (replays its journals).
                kills_in_replay += 1
                server.start_no_wait()
                time.sleep(rng.uniform(0.0, 0.4))
                server.kill()
            if ballast is not None:
                fill_disk(ballast, server.queue_path, keep=rng.randrange(4, 24) * 1024)
            server.start()
            load = Load(server, ledger, random.Random(rng.random()), cycle)
            for protocol, queue in zip(PROTOCOLS, QUEUES, strict=True):
                load.spawn(f"producer-{protocol}", _producer(load, protocol, queue))
            for protocol in PROTOCOLS:
                load.spawn(f"consumer-{protocol}", _consumer(load, protocol, QUEUES))
            vanish_stop = threading.Event()
            vanisher = load.spawn("vanisher", _vanisher(load), vanish_stop)
            duration = rng.uniform(*load_seconds)
            time.sleep(duration / 2)
            if ballast is not None:
                # The disk was full for a while: free it, so the queue takes adds again.
                with contextlib.suppress(FileNotFoundError):
                    ballast.unlink()
                # Kill it only once every queue took an add again: a queue that
                # takes adds has written the confirms it kept while it could not
                # (a restart inside the fault may undo those, as documented in
                # docs/reliability.md; tests/faults checks that window).
                if not wait_for_adds(server, ledger, cycle, 15.0):
                    progress(f"  {variant.name}: a queue still refuses adds after the disk "
                             f"was freed")
            # The vanishing readers are gone: what their queue gets now is not theirs.
            vanish_stop.set()
            vanisher.join(timeout=10)
            if not wait_for_no_waiters(server, VANISH_QUEUE, 5.0):
                progress(f"  {variant.name}: waiters of vanished clients remain")
            _fill_vanish_queue(server, ledger, cycle)
            time.sleep(duration / 2)
            server.kill()
            load.stop.set()
            for t in load.threads:
                t.join(timeout=10)
            ledger.crashed()
            verdict = ledger.verdict()
            progress(f"  {variant.name}: cycle {cycle + 1}/{cycles}: "
                     f"{verdict['acknowledged']} acknowledged, {verdict['lost']} not back yet, "
                     f"{verdict['redelivered']} redelivered")
        server.start()
        drain(server, ledger)
        server.stop()
        log = server.log()
        shutil.copy(server.log_path, workdir / f"{root.name}.log")
    verdict = ledger.verdict()
    verdict.update(variant=variant.name, cycles=cycles, kills_in_replay=kills_in_replay,
                   seconds=round(time.monotonic() - started, 1),
                   tracebacks=log.count("Traceback (most recent call last)"),
                   crash_opens_on_empty=log.count("on an empty queue; ignored"))
    if variant.full_disk:
        verdict["disk_errors_logged"] = log.count("No space left on device")
    shutil.rmtree(root, ignore_errors=True)
    return verdict


def fill_disk(ballast: Path, folder: Path, keep: int) -> None:
    """
    Fill the filesystem of C{folder} with C{ballast}, leaving about C{keep}
    bytes free (C{keep=0}: until the filesystem refuses more).
    """
    stat = os.statvfs(folder)
    left = max(0, stat.f_bavail * stat.f_frsize - keep)
    chunk = b"\0" * 65536
    with open(ballast, "ab", buffering=0) as f:
        try:
            while left > 0:
                left -= f.write(chunk[:left]) or 0
        except OSError:
            pass  # full: what was asked for


def failures(verdict: dict[str, Any]) -> list[str]:
    """What in a verdict breaks the promises (an empty list: none)."""
    problems = []
    for key in ("lost", "duplicated", "reappeared", "vanish_lost", "tracebacks"):
        if verdict.get(key):
            problems.append(f"{verdict['variant']}: {key} = {verdict[key]}")
    return problems
