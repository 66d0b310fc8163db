"""
C{kestrel-load}: Kestrel's load tests (flood, put-many, many-clients, leaky-reader, packing),
and C{fleet}, which drives a fleet of servers through L{kestrel.client}.

Each subcommand takes the flags and defaults of Kestrel 2.4's tool of the
same name, talks to any Kestrel-compatible server over memcache (or thrift
with C{--thrift}, where Kestrel's tool could), prints Kestrel's summary
lines, and adds latency percentiles (p50/p90/p99/p999, microseconds) measured
per request. Replies are checked byte for byte (memcache) or value for value
(thrift), and item order where Kestrel's tool checked it; a wrong reply
stops the run with Kestrel's "Unexpected response" message and exit status 1.

Clients are plain blocking sockets in threads, one connection per simulated
client, as Kestrel's tools were; see C{docs/load-tests.md} for what that
means for the figures.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

from kestrel.metrics import Histogram

#: Filler text for put-many and many-clients items (Kestrel used a song lyric).
FILLER = (
    "the queue keeps every letter that you send\n"
    "it holds them through the night and through the crash\n"
    "a journal line for each, from start to end\n"
    "and hands them back in order, none to lose\n"
)

#: How long to keep retrying a refused connection before giving up.
CONNECT_PATIENCE = 10.0

_T = TypeVar("_T")


class LoadError(Exception):
    """The server answered something unexpected, or could not be reached."""


class Output:
    """Thread-safe line printer (worker threads report progress too)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        """Print one line and flush."""
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


def latency_line(label: str, h: Histogram) -> str:
    """Format the latency percentiles added to every test's summary."""
    return (f"{label} latency in usec: count={h.count} min={h.minimum} p50={h.percentile(0.5)} "
            f"p90={h.percentile(0.9)} p99={h.percentile(0.99)} p999={h.percentile(0.999)} "
            f"max={h.maximum}")


def merged(histograms: Sequence[Histogram]) -> Histogram:
    """Return one histogram holding every value of C{histograms}."""
    total = Histogram()
    for h in histograms:
        total.merge(h)
    return total


# -- connections


class Connection:
    """A blocking socket with exact-read helpers for memcache replies."""

    def __init__(self, host: str, port: int, failures: list[int] | None = None) -> None:
        self.sock = connect(host, port, failures)
        self.buf = b""

    @classmethod
    def over(cls, sock: socket.socket) -> Connection:
        """Wrap an already connected socket."""
        conn = cls.__new__(cls)
        conn.sock = sock
        conn.buf = b""
        return conn

    def send(self, data: bytes) -> None:
        """Send every byte of C{data}."""
        self.sock.sendall(data)

    def read_exact(self, n: int) -> bytes:
        """Return exactly C{n} bytes (raises L{LoadError} if the server closes first)."""
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise LoadError(f"Connection closed by the server (got {self.buf[:200]!r})!")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def expect(self, expected: bytes, at: int) -> None:
        """Read a reply as long as C{expected}; raise "Unexpected response at <at>" if different."""
        got = self.read_exact(len(expected))
        if got != expected:
            raise LoadError(f"Unexpected response at {at}: {got[:200]!r}!")

    def read_line(self) -> bytes:
        """Return the next line, C{\\r\\n} included."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise LoadError(f"Connection closed by the server (got {self.buf[:200]!r})!")
            self.buf += chunk
        i = self.buf.index(b"\n") + 1
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_get(self, queue: str, at: int) -> bytes | None:
        """
        Read the reply to a C{get} (or one C{monitor} block): the item's data, or None at C{END}.

        Anything but C{END} or a well-formed C{VALUE <queue> 0 <n>} block is an
        "Unexpected response".
        """
        line = self.read_line()
        if line == END:
            return None
        parts = line.split()
        if (len(parts) != 4 or parts[0] != b"VALUE"
                or parts[1].split(b"/", 1)[0] != queue.encode()  # the key echoes the options
                or not parts[3].isdigit()):
            raise LoadError(f"Unexpected response at {at}: {line[:200]!r}!")
        block = self.read_exact(int(parts[3]) + 2 + len(END))
        if block[-7:] != b"\r\n" + END:
            raise LoadError(f"Unexpected response at {at}: {block[-60:]!r}!")
        return block[:-7]

    def expect_item(self, queue: str, expected: bytes, at: int) -> bool:
        """Read a C{get} reply: False for C{END}, True for C{expected}, else raise."""
        data = self.read_get(queue, at)
        if data is None:
            return False
        if data != expected:
            raise LoadError(f"Unexpected item at {at}: expected {expected[:40]!r}, "
                            f"got {data[:40]!r}!")
        return True

    def close(self) -> None:
        """Close the socket."""
        try:
            self.sock.close()
        except OSError:
            pass


def patiently(open_connection: Callable[[], _T], host: str, port: int,
              failures: list[int] | None,
              errors: type[BaseException] | tuple[type[BaseException], ...] = OSError) -> _T:
    """
    Return C{open_connection()}, retrying it on C{errors} for up to L{CONNECT_PATIENCE} seconds.

    As Kestrel's C{tryHard}, failures are counted (in C{failures[0]}); when
    the patience runs out, L{LoadError} names C{host:port} and the last error.
    """
    deadline = time.monotonic() + CONNECT_PATIENCE
    while True:
        try:
            return open_connection()
        except errors as e:
            if failures is not None:
                failures[0] += 1
            if time.monotonic() > deadline:
                raise LoadError(f"Cannot connect to {host}:{port}: {e}") from e
            time.sleep(0.01)


def connect(host: str, port: int, failures: list[int] | None = None) -> socket.socket:
    """
    Connect a TCP socket (no Nagle delay), retrying refused connections (see L{patiently}).
    """
    def open_socket() -> socket.socket:
        sock = socket.create_connection((host, port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return patiently(open_socket, host, port, failures)


# -- memcache requests and replies


def mc_set(queue: str, data: bytes) -> bytes:
    """A memcache C{set} of C{data}."""
    return b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data)


def mc_get(queue: str, timeout_msec: int | None = None, options: str = "") -> bytes:
    """A memcache C{get} with an optional C{/t=} and more options."""
    wait = "" if timeout_msec is None else f"/t={timeout_msec}"
    return f"get {queue}{wait}{options}\r\n".encode()


def mc_value(queue: str, data: bytes) -> bytes:
    """The reply to a C{get} that returned C{data}."""
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue.encode(), len(data), data)


STORED = b"STORED\r\n"
END = b"END\r\n"


# -- thrift


def thrift_module() -> Any:
    """Load Kestrel's IDL (C{kestrel/protocols/kestrel.thrift}) with thriftpy2."""
    import thriftpy2

    import kestrel.protocols

    idl = Path(kestrel.protocols.__file__).with_name("kestrel.thrift")
    return thriftpy2.load(str(idl), module_name="kestrel_load_thrift")


class ThriftClient:
    """A framed-binary thrift client of the C{Kestrel} service, one connection."""

    def __init__(self, host: str, port: int, failures: list[int] | None = None) -> None:
        from thriftpy2.protocol import TBinaryProtocolFactory
        from thriftpy2.rpc import make_client
        from thriftpy2.transport import TFramedTransportFactory

        module = thrift_module()

        def open_client() -> Any:
            return make_client(module.Kestrel, host, port, timeout=60_000,
                               proto_factory=TBinaryProtocolFactory(),
                               trans_factory=TFramedTransportFactory())

        # thriftpy2 wraps socket errors in its own types.
        self.client = patiently(open_client, host, port, failures, Exception)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def close(self) -> None:
        """Close the connection."""
        self.client.close()


# -- shared plumbing


def run_threads(targets: Sequence[Callable[[], Any]]) -> tuple[list[Any], float]:
    """
    Run each target in its own thread; return their results and the wall time in ms.

    The first exception raised by any target is re-raised here.
    """
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def wrap(i: int, target: Callable[[], Any]) -> None:
        try:
            results[i] = target()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i, t), daemon=True)
               for i, t in enumerate(targets)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = (time.monotonic() - start) * 1000
    if errors:
        raise errors[0]
    return results, duration


def timed(h: Histogram, started_ns: int) -> None:
    """Record the microseconds since C{started_ns} into C{h}."""
    h.add((time.perf_counter_ns() - started_ns) // 1000)


def send_expecting(conn: Connection, request: bytes, expected: bytes, n: int, step: int,
                   h: Histogram) -> None:
    """
    Send C{request} and check that the reply is C{expected}, until C{n} items are done.

    Each request does C{step} items; each round trip is timed into C{h}.
    """
    i = 0
    while i < n:
        t0 = time.perf_counter_ns()
        conn.send(request)
        conn.expect(expected, i)
        timed(h, t0)
        i += step


def get_until(conn: Connection, queue: str, request: bytes, n: int,
              expected: Callable[[int], bytes], h: Histogram) -> int:
    """
    Send the C{get} C{request} until C{n} items came back; return how many came back empty.

    The C{i}-th item must be C{expected(i)}; each round trip is timed into C{h}.
    """
    misses = count = 0
    while count < n:
        t0 = time.perf_counter_ns()
        conn.send(request)
        hit = conn.expect_item(queue, expected(count), count)
        timed(h, t0)
        if hit:
            count += 1
        else:
            misses += 1
    return misses


def thrift_put_until(client: ThriftClient, queue: str, n: int, step: int,
                     batch: Callable[[int], list[bytes]], h: Histogram) -> None:
    """
    Put C{batch(i)} (C{step} items) over thrift until C{n} items are in; time each put into C{h}.

    A put that does not report every item of its batch stored is an "Unexpected response".
    """
    i = 0
    while i < n:
        t0 = time.perf_counter_ns()
        got = client.put(queue, batch(i), 0)
        timed(h, t0)
        if got != step:
            raise LoadError(f"Unexpected response at {i}!")
        i += step


def flush_first(args: argparse.Namespace, queues: Sequence[str], out: Output) -> None:
    """Unless C{-F} was given, say so and flush every queue of C{queues}."""
    if args.flush:
        out("Flushing queues first.")
        for queue in queues:
            flush_queue(args, queue)


def monitor_if_asked(args: argparse.Namespace, queue: str, out: Output) -> None:
    """With C{-M}, monitor C{queue} (over memcache) until the test ends (see L{main})."""
    if args.monitor:
        args.stop_monitor = monitor_queue(args.host, 22133 if args.thrift else args.port,
                                          queue, out)


def flush_queue(args: argparse.Namespace, queue: str) -> None:
    """Flush C{queue} over the test's protocol."""
    if getattr(args, "thrift", False):
        client = ThriftClient(args.host, args.port)
        try:
            client.flush_queue(queue)
        finally:
            client.close()
        return
    conn = Connection(args.host, args.port)
    try:
        conn.send(b"flush %s\r\n" % queue.encode())
        conn.expect(END, 0)
    finally:
        conn.close()


def monitor_queue(host: str, port: int, queue: str, out: Output) -> threading.Event:
    """
    Print the queue's stats every second from a daemon thread (Kestrel's C{-M}).

    Setting the returned event stops it.
    """
    stop = threading.Event()
    def stats(conn: Connection) -> dict[str, int]:
        conn.send(b"stats\r\n")
        found = {}
        prefix = f"STAT queue_{queue}_"
        while (raw := conn.read_line()) != END:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if line.startswith(prefix):
                key, _, value = line[len(prefix):].partition(" ")
                if value.isdigit():
                    found[key] = int(value)
        return found

    def loop() -> None:
        try:
            conn = Connection(host, port)
            base = stats(conn).get("total_items", 0)
            while True:
                s = stats(conn)
                total = s.get("total_items", 0)
                out(f"{queue}: items={s.get('items', 0)} total_items={total} ({total - base}) "
                    f"bytes={s.get('bytes', 0)} mem_items={s.get('mem_items', 0)} "
                    f"mem_bytes={s.get('mem_bytes', 0)} journal_bytes={s.get('logsize', 0)}")
                if stop.wait(1):
                    conn.close()
                    return
        except (OSError, LoadError):
            return

    threading.Thread(target=loop, daemon=True, name="monitor-queue").start()
    return stop


# -- flood


def flood(args: argparse.Namespace, out: Output) -> int:
    """Producers and consumers flood C{-n} items through one queue; report throughput."""
    data = b"x" * 1024 * args.kilobytes
    queue, rollup = args.queue, args.rollup
    flush_first(args, [queue], out)
    put_times: list[Histogram] = []
    get_times: list[Histogram] = []

    def produce(n: int) -> None:
        h = Histogram()
        put_times.append(h)
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            thrift_put_until(client, queue, n, rollup, lambda i: [data] * rollup, h)
            client.close()
            return
        conn = Connection(args.host, args.port)
        send_expecting(conn, mc_set(queue, data) * rollup, STORED * rollup, n, rollup, h)
        conn.close()

    def consume(n: int) -> int:
        h = Histogram()
        get_times.append(h)
        misses = count = 0
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            while count < n:
                want = min(rollup, n - count)
                timeout = 1000 if (args.blocking or rollup > 1) else 0
                t0 = time.perf_counter_ns()
                items = client.get(queue, want, timeout, 0)
                timed(h, t0)
                if not items:
                    misses += 1
                for item in items:
                    if item.data != data:
                        raise LoadError(f"Unexpected response at {count}!")
                    count += 1
            client.close()
            return misses
        conn = Connection(args.host, args.port)
        if rollup == 1:
            request = mc_get(queue, 1000 if args.blocking else None)
            misses = get_until(conn, queue, request, n, lambda i: data, h)
        else:
            while count < n:
                want = min(rollup, n - count)
                t0 = time.perf_counter_ns()
                conn.send(b"monitor %s 1 %d\r\n" % (queue.encode(), want))
                got = 0
                while conn.expect_item(queue, data, count + got):
                    got += 1
                timed(h, t0)
                if got:
                    conn.send(b"confirm %s %d\r\n" % (queue.encode(), got))
                    conn.expect(END, count)
                    count += got
                else:
                    misses += 1
        conn.close()
        return misses

    if args.prefill > 0:
        out(f"prefill: {args.prefill} items of {args.kilobytes}kB")
        produce(args.prefill)

    per_producer = max(1, (args.items + args.producers - 1) // args.producers)
    if rollup > 1 and per_producer % rollup:
        per_producer += rollup - per_producer % rollup
    per_consumer = max(1, args.items // args.consumers)
    if rollup > 1 and per_consumer % rollup:
        per_consumer += rollup - per_consumer % rollup
    out(f"flood: producers={args.producers} each sending {per_producer} items "
        f"(in chunks of {rollup}) of {args.kilobytes}kB to {queue}")
    out(f"flood: consumers={args.consumers} each reading {per_consumer} items "
        f"(in chunks of {rollup}) from {queue}")
    monitor_if_asked(args, queue, out)
    put_times.clear()
    get_times.clear()
    targets: list[Callable[[], Any]] = [lambda: produce(per_producer)] * args.producers
    targets += [lambda: consume(per_consumer)] * args.consumers
    results, duration = run_threads(targets)
    misses = sum(r for r in results[args.producers:])
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / (args.items * args.consumers):.1f} usec/put throughput).")
    out(f"Consumer(s) spun {misses} times in misses.")
    out(latency_line("put", merged(put_times)))
    out(latency_line("get", merged(get_times)))
    return 0


# -- put-many


def put_many(args: argparse.Namespace, out: Output) -> int:
    """C{-c} clients put C{-n} items (and get them back with C{-g}); report a latency histogram."""
    clients, rollup = args.clients, args.rollup
    data = (FILLER * (args.bytes // len(FILLER) + 1)).encode()[:args.bytes]
    names = [args.queue + (str(i % args.queues) if args.queues > 1 else "")
             for i in range(clients)]
    flush_first(args, list(dict.fromkeys(names)), out)
    per_client = args.items // clients
    total = per_client * clients
    failures = [0]

    def session(name: str, h: Histogram, getting: bool) -> None:
        if args.thrift:
            client = ThriftClient(args.host, args.port, failures)
            if getting:
                i = 0
                while i < per_client:
                    t0 = time.perf_counter_ns()
                    items = client.get(name, rollup, 0, 0)
                    timed(h, t0)
                    if len(items) != rollup or any(it.data != data for it in items):
                        raise LoadError(f"Unexpected response at {i}!")
                    i += rollup
            else:
                thrift_put_until(client, name, per_client, rollup, lambda i: [data] * rollup, h)
            client.close()
            return
        conn = Connection(args.host, args.port, failures)
        if getting:
            request, expected = mc_get(name) * rollup, mc_value(name, data) * rollup
        else:
            request, expected = mc_set(name, data) * rollup, STORED * rollup
        send_expecting(conn, request, expected, per_client, rollup, h)
        conn.close()

    def cycle(getting: bool) -> None:
        timings = [Histogram() for _ in range(clients)]
        _, duration = run_threads([
            (lambda i=i: session(names[i], timings[i], getting)) for i in range(clients)])
        out(f"Finished in {int(duration)} msec "
            f"({duration * 1000.0 / max(1, total):.1f} usec/put throughput).")
        if failures[0]:
            out(f"Had to retry {failures[0]} times to make all connections.")
        h = merged(timings)
        stats = [("min", h.minimum), ("max", h.maximum)] + [
            (label, h.percentile(q)) for label, q in
            [("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
             ("p999", 0.999), ("p9999", 0.9999)]]
        out("Distribution in usec: " + " ".join(f"{k}={v}" for k, v in stats))

    out(f"Put {args.items} items of {args.bytes} bytes in bursts of {rollup} to "
        f"{args.host}:{args.port} in {args.queues} queues named {args.queue} "
        f"using {clients} clients.")
    cycle(False)
    if args.get:
        out(f"Get {args.items} items of {args.bytes} bytes in batches of {rollup} from "
            f"{args.host}:{args.port} in {args.queues} queues named {args.queue} "
            f"using {clients} clients.")
        cycle(True)
    return 0


# -- many-clients


def many_clients(args: argparse.Namespace, out: Output) -> int:
    """One slow producer, many consumers racing with C{/t=1000} gets; every item arrives once."""
    queue, count = args.queue, args.items
    data = FILLER.encode()
    open_reads = args.open_reads or args.kill > 0
    out(f"many-clients: {count} items to {args.host} using {args.clients} clients, "
        f"kill rate {args.kill}%, at {args.sleep} msec/item")
    flush_first(args, [queue], out)
    monitor_if_asked(args, queue, out)
    got = [0]
    lock = threading.Lock()
    set_times = Histogram()
    get_times: list[Histogram] = []

    def consumer() -> None:
        h = Histogram()
        get_times.append(h)
        rng = random.Random()
        request = mc_get(queue, 1000, "/close/open" if open_reads else "")
        conn: Connection | None = None
        while got[0] < count:
            if conn is None:
                conn = Connection(args.host, args.port)
            t0 = time.perf_counter_ns()
            conn.send(request)
            if rng.randrange(100) < args.kill:
                conn.close()
                conn = None
                continue
            if conn.expect_item(queue, data, got[0]):
                timed(h, t0)
                with lock:
                    got[0] += 1
        if conn is not None:
            if open_reads:
                conn.send(mc_get(queue, None, "/close"))
                conn.expect(END, got[0])
            conn.close()

    def producer() -> None:
        conn = Connection(args.host, args.port)
        request = mc_set(queue, data)
        for i in range(count):
            t0 = time.perf_counter_ns()
            conn.send(request)
            conn.expect(STORED, i)
            timed(set_times, t0)
            if args.sleep > 0:
                time.sleep(args.sleep / 1000)
        conn.close()

    _, duration = run_threads([consumer] * args.clients + [producer])
    out(f"Received {got[0]} items in {int(duration)} msec.")
    out(latency_line("set", set_times))
    out(latency_line("get hit", merged(get_times)))
    if got[0] != count:
        raise LoadError(f"Expected {count} items, received {got[0]}!")
    return 0


# -- packing


def packing(args: argparse.Namespace, out: Output) -> int:
    """Keep the queue one batch behind through C{-c} cycles to exercise read-behind and packing."""
    queue, n = args.queue, args.items
    data = "x" * 1024 * args.kilobytes
    out(f"packing: {n} items of {args.kilobytes}kB with {args.pause} second pauses")
    flush_first(args, [queue], out)
    monitor_if_asked(args, queue, out)
    counters = {"read": 0, "write": 0}
    put_times, get_times = Histogram(), Histogram()

    def item(counter: int) -> bytes:
        return (str(counter) + data)[:len(data)].encode()

    def put(start: int) -> None:
        h = Histogram()
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            thrift_put_until(client, queue, n, 1, lambda i: [item(start + i)], h)
            client.close()
        else:
            conn = Connection(args.host, args.port)
            for i in range(n):
                t0 = time.perf_counter_ns()
                conn.send(mc_set(queue, item(start + i)))
                conn.expect(STORED, i)
                timed(h, t0)
            conn.close()
        put_times.merge(h)

    def get(start: int) -> int:
        h = Histogram()
        misses = count = 0
        if args.thrift:
            client = ThriftClient(args.host, args.port)
            while count < n:
                t0 = time.perf_counter_ns()
                items = client.get(queue, 1, 1000, 0)
                timed(h, t0)
                if not items:
                    misses += 1
                elif items[0].data != item(start + count):
                    raise LoadError(f"Unexpected item at {count}: expected "
                                    f"{item(start + count)[:40]!r}, got {items[0].data[:40]!r}!")
                else:
                    count += 1
            client.close()
        else:
            conn = Connection(args.host, args.port)
            misses = get_until(conn, queue, mc_get(queue, 1000), n,
                               lambda i: item(start + i), h)
            conn.close()
        get_times.merge(h)
        return misses

    def cycle(reads: bool, writes: bool) -> None:
        targets: list[Callable[[], Any]] = []
        if writes:
            targets.append(lambda: put(counters["write"]))
        if reads:
            targets.append(lambda: get(counters["read"]))
        results, duration = run_threads(targets)
        if writes:
            out(f"Wrote {n} items starting at {counters['write']}.")
            counters["write"] += n
        if reads:
            counters["read"] += n
            out(f"Read {n} items in {int(duration)} msec. "
                f"Consumer spun {results[-1]} times in misses.")

    cycle(False, True)
    for i in range(args.cycles):
        out(f"cycle: {i + 1}")
        cycle(True, True)
        time.sleep(args.pause)
    cycle(True, False)
    out(latency_line("put", put_times))
    out(latency_line("get", get_times))
    return 0


# -- leaky-reader


def leaky_reader(args: argparse.Namespace, out: Output) -> int:
    """Thrift consumers confirm all but a fraction of reads; every item must end up confirmed."""
    queue, total = args.queue, args.items
    out(f"leaky-reader: {args.threads} threads each sending {total} items through {queue}")
    flush_first(args, [queue], out)
    incomplete = set(range(total))
    lock = threading.Lock()
    num_read = [0]
    put_times = Histogram()
    get_times: list[Histogram] = []

    def now() -> str:
        return datetime.now(UTC).isoformat(timespec="milliseconds")

    def producer() -> None:
        client = ThriftClient(args.host, args.port)
        for n in range(total):
            t0 = time.perf_counter_ns()
            if client.put(queue, [b"%08x" % n], 0) != 1:
                raise LoadError(f"Unexpected response at {n}!")
            timed(put_times, t0)
        client.close()

    def consumer() -> None:
        h = Histogram()
        get_times.append(h)
        rng = random.Random()
        client = ThriftClient(args.host, args.port)
        while num_read[0] < total:
            t0 = time.perf_counter_ns()
            items = client.get(queue, 1, 100, args.auto_abort)
            timed(h, t0)
            if not items:
                continue
            if len(items) > 1:
                raise LoadError(f"Unexpected number of items: {len(items)}!")
            try:
                xid, bit = items[0].id, int(items[0].data, 16)
            except ValueError:
                raise LoadError(f"Unexpected item: {items[0].data[:40]!r}!") from None
            if args.verbose:
                out(f"{now()}: open {xid:016x} = {bit:08x}")
            if rng.random() >= args.drop_rate:
                if args.verbose:
                    out(f"{now()}: confirm {xid:016x}")
                confirmed = client.confirm(queue, {xid})
                if confirmed != 1:
                    raise LoadError(f"Unexpected number of items confirmed: {confirmed} ({xid})!")
                with lock:
                    num_read[0] += 1
                    x = num_read[0]
                    incomplete.discard(bit)
                if x % 1000 == 0:
                    out(str(x))
        client.close()

    _, duration = run_threads([producer] + [consumer] * args.threads)
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / (total * args.threads):.1f} usec/put throughput).")
    if incomplete:
        out("Missed the following items:")
        for i in sorted(incomplete):
            out(f"\t{i:08x}")
    else:
        out("Completed all reads")
    out(latency_line("put", put_times))
    out(latency_line("get", merged(get_times)))
    return 1 if incomplete else 0


# -- fleet


def fleet(args: argparse.Namespace, out: Output) -> int:
    """
    Producers and reliable consumers move C{-n} items through a fleet with the fleet client.

    The servers come from C{--servers} or from ZooKeeper server sets
    (C{--zookeeper}). The client runs on the reactor in a background thread;
    every item is put, read with C{/open} and confirmed.
    """
    from twisted.internet.defer import Deferred
    from twisted.internet.threads import blockingCallFromThread

    from kestrel.client.blocking import running_reactor

    reactor = running_reactor()
    return blockingCallFromThread(  # type: ignore[no-any-return]
        reactor, lambda: Deferred.fromCoroutine(_fleet_run(reactor, args, out)))


async def _fleet_run(reactor: Any, args: argparse.Namespace, out: Output) -> int:
    from collections import Counter

    from twisted.internet.defer import Deferred, DeferredList
    from twisted.internet.task import deferLater

    from kestrel.client import ClientError, KestrelClient, ZooKeeperServers
    from kestrel.client.discovery import parse_servers, parse_zookeeper

    protocol = "thrift" if args.thrift else "memcache"
    if args.zookeeper:
        hosts, prefix = parse_zookeeper(args.zookeeper)
        client = KestrelClient(ZooKeeperServers(hosts, prefix, reactor, endpoint=protocol),
                               reactor=reactor, protocol=protocol)
    else:
        client = KestrelClient(parse_servers(args.servers), reactor=reactor, protocol=protocol)
    try:
        await client.ready()
    except ClientError as e:
        await client.close()
        raise LoadError(str(e)) from e
    queue, n, rollup = args.queue, args.items, args.rollup
    data = b"x" * args.bytes
    out(f"fleet: write set {','.join(client.servers.write)}; "
        f"read set {','.join(client.servers.read)}")
    out(f"fleet: protocol={protocol} producers={args.producers} consumers={args.consumers} "
        f"putting {n} items "
        f"of {args.bytes} bytes (in chunks of {rollup}) to {queue}")
    put_h, read_h, confirm_h = Histogram(), Histogram(), Histogram()
    put_on: Counter[str] = Counter()
    read_on: Counter[str] = Counter()
    state = {"put": 0, "read": 0, "misses": 0, "errors": 0}
    deadline = time.monotonic() + args.timeout

    def failed(what: str, error: ClientError) -> None:
        state["errors"] += 1
        out(f"fleet: {what} failed: {error}")

    async def produce(count: int) -> None:
        done = 0
        while done < count and time.monotonic() < deadline:
            batch = [data] * min(rollup, count - done)
            t0 = time.perf_counter_ns()
            try:
                servers = await client.put(queue, batch)
            except ClientError as e:
                failed("put", e)
                await deferLater(reactor, 0.5, lambda: None)
                continue
            timed(put_h, t0)
            put_on.update(servers)
            done += len(batch)
            state["put"] += len(batch)

    async def consume() -> None:
        while state["read"] < n and time.monotonic() < deadline:
            t0 = time.perf_counter_ns()
            try:
                handle = await client.read(queue, 1.0)
            except ClientError as e:
                failed("read", e)
                await deferLater(reactor, 0.5, lambda: None)
                continue
            timed(read_h, t0)
            if handle is None:
                state["misses"] += 1
                continue
            if handle.data != data:
                await handle.abort()
                raise LoadError(f"Unexpected response at {state['read']}!")
            t0 = time.perf_counter_ns()
            try:
                await handle.confirm()
            except ClientError as e:
                failed("confirm", e)
                continue
            timed(confirm_h, t0)
            read_on[handle.server] += 1
            state["read"] += 1

    def progress() -> None:
        out(f"fleet: {state['put']} put, {state['read']} read and confirmed")

    from twisted.internet.task import LoopingCall

    ticker = LoopingCall(progress)
    ticker.clock = reactor
    ticker.start(args.progress, now=False)
    per_producer = [n // args.producers + (1 if i < n % args.producers else 0)
                    for i in range(args.producers)]
    started = time.perf_counter()
    workers = [Deferred.fromCoroutine(produce(c)) for c in per_producer]
    workers += [Deferred.fromCoroutine(consume()) for _ in range(args.consumers)]
    results = await DeferredList(workers, consumeErrors=True)
    duration = (time.perf_counter() - started) * 1000.0
    ticker.stop()
    await client.close()
    for ok, value in results:
        if not ok:
            raise LoadError(value.getErrorMessage())
    out(f"Finished in {int(duration)} msec "
        f"({duration * 1000.0 / max(1, state['read']):.1f} usec/item throughput).")
    out("puts per server: " + " ".join(f"{s}={c}" for s, c in sorted(put_on.items())))
    out("reads per server: " + " ".join(f"{s}={c}" for s, c in sorted(read_on.items())))
    out(f"Consumer(s) spun {state['misses']} times in misses; {state['errors']} errors.")
    out(latency_line("put", put_h))
    out(latency_line("read", read_h))
    out(latency_line("confirm", confirm_h))
    if state["read"] < n:
        out(f"fleet: only {state['read']} of {n} items read within {args.timeout:g}s")
        return 1
    return 0


# -- command line


class _Parser(argparse.ArgumentParser):
    """An argument parser that exits with status 1 on bad usage, as Kestrel's tools did."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        """Print the usage and the problem, then exit 1."""
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _common(p: argparse.ArgumentParser, port: int = 22133, thrift: bool = True,
            monitor: bool = True) -> None:
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("-h", dest="host", default="localhost", metavar="HOSTNAME",
                   help="use kestrel on HOSTNAME (default: %(default)s)")
    p.add_argument("-p", dest="port", type=int, default=None, metavar="PORT",
                   help=f"use kestrel on PORT (default: {port}; 2229 with --thrift)")
    if thrift:
        p.add_argument("--thrift", action="store_true", help="use thrift RPC")
    p.add_argument("-F", dest="flush", action="store_false",
                   help="don't flush queue(s) before the test")
    if monitor:
        p.add_argument("-M", dest="monitor", action="store_true",
                       help="monitor queue stats during the test")


def _items(p: argparse.ArgumentParser, default: int,
           help: str = "put ITEMS items into the queue") -> None:
    p.add_argument("-n", dest="items", type=int, default=default, metavar="ITEMS",
                   help=help + " (default: %(default)s)")


def _kilobytes(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", dest="kilobytes", type=int, default=1, metavar="KILOBYTES",
                   help="put KILOBYTES per queue item (default: %(default)s)")


def _queue(p: argparse.ArgumentParser, default: str = "spam",
           help: str = "use queue NAME") -> None:
    p.add_argument("-q", dest="queue", default=default, metavar="NAME",
                   help=help + " (default: %(default)s)")


def _count(p: argparse.ArgumentParser, flag: str, dest: str, metavar: str, help: str,
           default: int) -> None:
    """Add an option taking a count of at least 1."""
    p.add_argument(flag, dest=dest, type=_positive, default=default, metavar=metavar,
                   help=help + " (default: %(default)s)")


def _rollup(p: argparse.ArgumentParser, request: str) -> None:
    p.add_argument("-r", dest="rollup", type=_positive, default=1, metavar="ITEMS",
                   help="roll up ITEMS items into a single " + request)


def build_parser() -> argparse.ArgumentParser:
    """Return the C{kestrel-load} command-line parser (one subcommand per load test)."""
    parser = _Parser(prog="kestrel-load", add_help=False,
                     description="Kestrel's load tests against any Kestrel-compatible server.")
    parser.add_argument("--help", action="help", help="show this help and exit")
    sub = parser.add_subparsers(dest="test", required=True, parser_class=_Parser,
                                metavar="{flood,put-many,many-clients,leaky-reader,packing,fleet}")

    p = sub.add_parser("flood", add_help=False,
                       help="spin up a producer and consumer and flood N items through kestrel")
    _items(p, 10000)
    _kilobytes(p)
    _queue(p)
    p.add_argument("-P", dest="prefill", type=int, default=0, metavar="ITEMS",
                   help="prefill ITEMS items into the queue before the test (default: 0)")
    _count(p, "-R", "producers", "THREADS", "create THREADS producers", 1)
    _count(p, "-C", "consumers", "THREADS", "create THREADS consumers", 1)
    _rollup(p, "multi-put request (default: 1)")
    p.add_argument("-B", dest="blocking", action="store_true",
                   help="do blocking reads (reads with a timeout)")
    _common(p)
    p.set_defaults(run=flood)

    p = sub.add_parser("put-many", add_help=False, help="spam items into kestrel")
    _count(p, "-c", "clients", "CLIENTS", "use CLIENTS concurrent clients", 100)
    _items(p, 10000)
    p.add_argument("-b", dest="bytes", type=int, default=1024, metavar="BYTES",
                   help="put BYTES per queue item (default: %(default)s)")
    _rollup(p, "multi-put/multi-get request (default: 1)")
    _queue(p, help="use queue NAME as prefix")
    _count(p, "-Q", "queues", "QUEUES", "use QUEUES different queues", 1)
    p.add_argument("-g", dest="get", action="store_true", help="get the items afterwards")
    _common(p, monitor=False)
    p.set_defaults(run=put_many)

    p = sub.add_parser("many-clients", add_help=False,
                       help="N clients do timeout reads on a queue while one producer trickles")
    p.add_argument("-s", dest="sleep", type=int, default=100, metavar="MILLISECONDS",
                   help="sleep MILLISECONDS between puts (default: %(default)s)")
    _items(p, 100, "put ITEMS total items into the queue")
    _queue(p)
    _count(p, "-c", "clients", "CLIENTS", "use CLIENTS consumers", 100)
    p.add_argument("-k", dest="kill", type=int, default=0, metavar="PERCENT",
                   help="kill PERCENT %% of clients before they can read the response "
                        "(default: 0; implies -x)")
    p.add_argument("-x", dest="open_reads", action="store_true",
                   help="use open reads (get /close/open)")
    _common(p, thrift=False)
    p.set_defaults(run=many_clients, thrift=False)

    p = sub.add_parser("leaky-reader", add_help=False,
                       help="deliver N items through kestrel over thrift, with occasional drops")
    _items(p, 1000)
    p.add_argument("-d", dest="drop_rate", type=float, default=0.01, metavar="RATE",
                   help="drop RATE items (fraction, default: %(default)f)")
    _queue(p, "spam-thrift")
    _count(p, "-t", "threads", "THREADS", "create THREADS consumers", 1)
    p.add_argument("-a", dest="auto_abort", type=int, default=5000, metavar="MSEC",
                   help="auto-abort unconfirmed reads after MSEC (default: %(default)s)")
    p.add_argument("-v", dest="verbose", action="store_true",
                   help="be verbose, writing opens/confirms to stdout")
    _common(p, port=2229, thrift=False, monitor=False)
    p.set_defaults(run=leaky_reader, thrift=True)

    p = sub.add_parser("packing", add_help=False,
                       help="write N items, then do read/write cycles with pauses")
    _queue(p, help="use named queue")
    _items(p, 25000)
    _kilobytes(p)
    p.add_argument("-t", dest="pause", type=float, default=1, metavar="SECONDS",
                   help="pause SECONDS between cycles (default: 1)")
    p.add_argument("-c", dest="cycles", type=int, default=100, metavar="CYCLES",
                   help="do read/writes CYCLES times (default: %(default)s)")
    _common(p)
    p.set_defaults(run=packing)

    p = sub.add_parser("fleet", add_help=False,
                       help="producers and reliable consumers move N items through a fleet "
                            "with the fleet client")
    p.add_argument("--help", action="help", help="show this help and exit")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--servers", metavar="HOST:PORT,...",
                       help="a static list of memcache (or, with --thrift, thrift) endpoints")
    where.add_argument("--zookeeper", metavar="ZKHOST:PORT/PATH",
                       help="follow the server sets under PATH in ZooKeeper")
    _items(p, 10000, "move ITEMS items through the fleet")
    p.add_argument("-b", dest="bytes", type=int, default=1024, metavar="BYTES",
                   help="put BYTES per queue item (default: %(default)s)")
    _queue(p)
    _count(p, "-R", "producers", "PRODUCERS", "run PRODUCERS concurrent producers", 2)
    _count(p, "-C", "consumers", "CONSUMERS", "run CONSUMERS concurrent reliable consumers", 2)
    _rollup(p, "put (default: 1)")
    p.add_argument("-t", dest="timeout", type=float, default=300.0, metavar="SECONDS",
                   help="give up after SECONDS (default: %(default)s)")
    p.add_argument("--progress", type=float, default=5.0, metavar="SECONDS",
                   help="print progress every SECONDS (default: %(default)s)")
    p.add_argument("--thrift", action="store_true",
                   help="use thrift RPC (reliable reads with ids and auto-abort)")
    p.set_defaults(run=fleet, port=0)
    return parser


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run C{kestrel-load} with C{argv} (default: the command line); return the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.port is None:
        args.port = 2229 if args.thrift else 22133
    out = Output(stdout if stdout is not None else sys.stdout)
    try:
        return args.run(args, out)
    except LoadError as e:
        out(str(e))
        return 1
    finally:
        stop = getattr(args, "stop_monitor", None)
        if stop is not None:
            stop.set()


if __name__ == "__main__":
    sys.exit(main())
