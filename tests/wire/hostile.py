"""
Hostile clients for the memory-bound wire tests and benchmarks/hostile_memory.py:
each scenario runs against a real server process and reports its RSS before,
during and after.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

MiB = 1024 * 1024


def rss(pid: int) -> int:
    """The resident set size of process C{pid}, in bytes (Linux C{/proc})."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settled_rss(pid: int, seconds: float = 1.0) -> int:
    """RSS once it has stopped moving (sampled every 0.1 s for up to C{seconds} plus 5 s)."""
    deadline = time.monotonic() + seconds + 5.0
    last = rss(pid)
    time.sleep(seconds)
    while time.monotonic() < deadline:
        now = rss(pid)
        if abs(now - last) < MiB:
            return now
        last = now
        time.sleep(0.2)
    return last


def _send_all(sock: socket.socket, chunks: list[bytes], outcome: list[str]) -> None:
    try:
        for chunk in chunks:
            sock.sendall(chunk)
        outcome.append("sent")
    except OSError:
        outcome.append("refused")


def run_senders(connect: Callable[[], socket.socket], payloads: list[list[bytes]],
                timeout: float = 120.0) -> tuple[list[socket.socket], list[str]]:
    """
    Open one connection per payload and send it (in threads, all at once);
    return the sockets (still open) and, per connection, C{sent} or C{refused}
    (the server closed it while we were sending).
    """
    sockets = [connect() for _ in payloads]
    outcomes: list[list[str]] = [[] for _ in payloads]
    threads = [threading.Thread(target=_send_all, args=(s, p, o), daemon=True)
               for s, p, o in zip(sockets, payloads, outcomes, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return sockets, [o[0] if o else "timeout" for o in outcomes]


def declared_set(size: int, sent: int, key: bytes = b"big") -> list[bytes]:
    """A memcache C{set} of C{size} declared bytes of which only C{sent} follow."""
    block = b"x" * MiB
    chunks = [b"set %s 0 0 %d\r\n" % (key, size)]
    left = sent
    while left > 0:
        chunks.append(block[:min(left, MiB)])
        left -= MiB
    return chunks


def long_line(size: int) -> list[bytes]:
    """A text-protocol line of C{size} bytes with no end."""
    block = b"x" * MiB
    return [block] * (size // MiB) + [block[:size % MiB]]


def close_all(sockets: list[socket.socket]) -> None:
    """Close every socket (reset: the server sees the end at once)."""
    for s in sockets:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        s.close()


def non_readers(connect: Callable[[], socket.socket], request: bytes, count: int,
                clients: int) -> list[socket.socket]:
    """C{clients} connections that each send C{request} C{count} times and never read."""
    sockets = []
    for _ in range(clients):
        s = connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(request * count)
        sockets.append(s)
    return sockets
