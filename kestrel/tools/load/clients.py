"""
The plumbing of C{kestrel-load}: blocking memcache connections that check every
reply byte for byte, a thrift client, request builders, threads and timing.

Clients are plain blocking sockets, one connection per simulated client, as
Kestrel's tools were. Every unexpected reply raises L{LoadError} with
Kestrel's "Unexpected response" message.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from kestrel.metrics import Histogram

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


