"""
The client matrix: one scenario per queue operation, run through each real
client against a real server, with the server's own counters checked after
every step.

Each client module defines an L{Adapter} subclass that expresses the
operations with that client's public API. An operation the client cannot
express is C{None} on the adapter and has a reason in C{unsupported}: its
test id ends in C{-unsupported}, and the test checks that the marker and the
adapter agree, so that nothing is skipped silently. L{render_table} turns the
adapters into the table of docs/clients.md (a test keeps the two equal).

The counters come from the server's C{STATS} over a raw socket, never from
the client under test: a client that returns None for an item the server
removed (or opened) is caught by the C{items} / C{open_transactions} check
that follows.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from tests.wire.conftest import KestrelProcess

#: The operations of the matrix, in table order, with their column titles.
OPERATIONS: dict[str, str] = {
    "set": "set/put",
    "get": "get",
    "open": "open",
    "close": "close",
    "close_open": "close+open",
    "abort": "abort",
    "peek": "peek",
    "blocking_get": "blocking get",
    "stats": "stats",
    "delete": "delete",
    "flush": "flush",
    "flush_all": "flush_all",
    "version": "version",
}

#: How long a blocking get waits in the scenarios (ms), and the longest one.
SHORT_WAIT_MS = 300
LONG_WAIT_MS = 5000


class Adapter:
    """
    One client expressed as the matrix's operations. Every operation is
    C{None} here; a subclass defines those its client can express and names
    the others, with the reason, in C{unsupported}.

    Fetches return the item's data or None; C{close} and C{abort} return
    nothing (and check what the client got back).
    """

    #: The client's name in the matrix.
    name: ClassVar[str] = "?"
    #: Operation -> why the client cannot express it.
    unsupported: ClassVar[dict[str, str]] = {}
    #: The protocol the client speaks (the version rule depends on it).
    protocol: ClassVar[str] = "memcache"

    set: Callable[[str, bytes], None] | None = None
    get: Callable[[str], bytes | None] | None = None
    open: Callable[[str], bytes | None] | None = None
    close: Callable[[str], None] | None = None
    close_open: Callable[[str], bytes | None] | None = None
    abort: Callable[[str], None] | None = None
    peek: Callable[[str], bytes | None] | None = None
    blocking_get: Callable[[str, int], bytes | None] | None = None
    stats: Callable[[str], int] | None = None  # the client's view of queue_<q>_items
    delete: Callable[[str], None] | None = None
    flush: Callable[[str], None] | None = None
    flush_all: Callable[[], None] | None = None
    version: Callable[[], str] | None = None

    def __init__(self, servers: list[KestrelProcess]) -> None:
        self.servers = servers

    def server_for(self, queue: str) -> KestrelProcess:
        """The server that holds C{queue} (the only one, unless the client hashes keys)."""
        return self.servers[0]

    def queue_name(self, base: str) -> str:
        """A queue name for a scenario (a hashing client picks one that lives on one server)."""
        return base

    def shutdown(self) -> None:
        """Close the client's connections."""


class MemcacheAdapter(Adapter):
    """
    A memcache client: every read is a C{get} of C{<queue>[/options]}
    through L{fetch}, which a subclass defines with its client's get.
    """

    def fetch(self, key: str) -> bytes | None:
        """The client's get of C{key}: the item's data, or None."""
        raise NotImplementedError

    def get(self, queue: str) -> bytes | None:
        return self.fetch(queue)

    def open(self, queue: str) -> bytes | None:
        return self.fetch(f"{queue}/open")

    def close(self, queue: str) -> None:
        assert self.fetch(f"{queue}/close") is None

    def close_open(self, queue: str) -> bytes | None:
        return self.fetch(f"{queue}/close/open")

    def abort(self, queue: str) -> None:
        assert self.fetch(f"{queue}/abort") is None

    def peek(self, queue: str) -> bytes | None:
        return self.fetch(f"{queue}/peek")

    def blocking_get(self, queue: str, timeout_ms: int) -> bytes | None:
        return self.fetch(f"{queue}/t={timeout_ms}")


class LibraryClientAdapter(MemcacheAdapter):
    """
    A client whose C{self.client} answers C{get}, C{set}, C{delete} and
    C{flush_all} (true when done) and C{disconnect_all}, as pylibmc and
    python-binary-memcached do.
    """

    client: Any

    def fetch(self, key: str) -> bytes | None:
        return self.client.get(key)

    def set(self, queue: str, data: bytes) -> None:
        assert self.client.set(queue, data) is True

    def delete(self, queue: str) -> None:
        assert self.client.delete(queue) is True

    def flush_all(self) -> None:
        assert self.client.flush_all() is True

    def shutdown(self) -> None:
        self.client.disconnect_all()


# -- the server's side ------------------------------------------------------------------------

def raw_request(server: KestrelProcess, request: bytes, until: bytes) -> bytes:
    """Send C{request} on a fresh connection; return the reply up to C{until}."""
    with socket.create_connection((server.host, server.memcache_port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while not reply.endswith(until):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def server_stats(server: KestrelProcess) -> dict[str, str]:
    """The server's STATS, by name."""
    reply = raw_request(server, b"stats\r\n", b"END\r\n")
    stats = {}
    for line in reply.decode("latin-1").split("\r\n"):
        if line.startswith("STAT "):
            _, name, value = line.split(" ", 2)
            stats[name] = value
    return stats


def counters(server: KestrelProcess, queue: str) -> tuple[int, int] | None:
    """The server's (items, open_transactions) of C{queue}, or None when it has no such queue."""
    stats = server_stats(server)
    items = stats.get(f"queue_{queue}_items")
    if items is None:
        return None
    return int(items), int(stats[f"queue_{queue}_open_transactions"])


def seed(server: KestrelProcess, queue: str, *items: bytes) -> None:
    """Put C{items} into C{queue} over a raw socket (not through the client under test)."""
    request = b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(i), i) for i in items)
    assert raw_request(server, request, b"STORED\r\n" * len(items)) == b"STORED\r\n" * len(items)


class Check:
    """The scenario's view of one queue on its server."""

    def __init__(self, adapter: Adapter, base: str) -> None:
        self.queue = adapter.queue_name(base)
        self.server = adapter.server_for(self.queue)

    def seed(self, *items: bytes) -> None:
        """Put items into the queue over a raw socket."""
        seed(self.server, self.queue, *items)

    def expect(self, items: int, open_reads: int = 0) -> None:
        """The server holds C{items} items and C{open_reads} open reads of the queue."""
        assert counters(self.server, self.queue) == (items, open_reads)

    def expect_gone(self) -> None:
        """The server has no such queue."""
        assert counters(self.server, self.queue) is None


# -- the scenarios --------------------------------------------------------------------------

def scenario_set(a: Adapter, q: Check) -> None:
    a.set(q.queue, b"one")
    q.expect(1)
    a.set(q.queue, b"two")
    q.expect(2)
    assert raw_request(q.server, b"get %s\r\n" % q.queue.encode(), b"END\r\n") == (
        b"VALUE %s 0 3\r\none\r\nEND\r\n" % q.queue.encode())
    q.expect(1)


def scenario_get(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.get(q.queue) == b"one"
    q.expect(1)
    assert a.get(q.queue) == b"two"
    q.expect(0)
    assert a.get(q.queue) is None
    q.expect(0)


def scenario_open(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.open(q.queue) == b"one"
    q.expect(1, 1)
    assert raw_request(q.server, b"get %s\r\n" % q.queue.encode(), b"END\r\n") == (
        b"VALUE %s 0 3\r\ntwo\r\nEND\r\n" % q.queue.encode())
    q.expect(0, 1)


def scenario_close(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.open(q.queue) == b"one"
    q.expect(1, 1)
    a.close(q.queue)
    q.expect(1, 0)
    assert a.open(q.queue) == b"two"
    a.close(q.queue)
    q.expect(0, 0)


def scenario_close_open(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.open(q.queue) == b"one"
    q.expect(1, 1)
    assert a.close_open(q.queue) == b"two"
    q.expect(0, 1)
    a.close(q.queue)
    q.expect(0, 0)


def scenario_abort(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.open(q.queue) == b"one"
    q.expect(1, 1)
    a.abort(q.queue)
    q.expect(2, 0)
    assert a.open(q.queue) == b"one"
    a.close(q.queue)
    q.expect(1, 0)


def scenario_peek(a: Adapter, q: Check) -> None:
    q.seed(b"one")
    assert a.peek(q.queue) == b"one"
    q.expect(1)
    assert a.peek(q.queue) == b"one"
    q.expect(1)


def scenario_blocking_get(a: Adapter, q: Check) -> None:
    started = time.monotonic()
    assert a.blocking_get(q.queue, SHORT_WAIT_MS) is None
    assert time.monotonic() - started >= SHORT_WAIT_MS / 1000 - 0.05
    q.expect(0)
    late = threading.Timer(0.3, q.seed, (b"late",))
    late.start()
    try:
        started = time.monotonic()
        assert a.blocking_get(q.queue, LONG_WAIT_MS) == b"late"
        assert time.monotonic() - started < LONG_WAIT_MS / 1000
    finally:
        late.join()
    q.expect(0)


def scenario_stats(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    assert a.stats(q.queue) == 2
    q.expect(2)


def scenario_delete(a: Adapter, q: Check) -> None:
    q.seed(b"one")
    q.expect(1)
    a.delete(q.queue)
    q.expect_gone()


def scenario_flush(a: Adapter, q: Check) -> None:
    q.seed(b"one", b"two")
    a.flush(q.queue)
    q.expect(0)


def scenario_flush_all(a: Adapter, q: Check) -> None:
    other = Check(a, q.queue + "_other")
    q.seed(b"one", b"two")
    other.seed(b"three")
    a.flush_all()
    q.expect(0)
    other.expect(0)


def scenario_version(a: Adapter, q: Check) -> None:
    version = a.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    if a.protocol == "memcache":
        assert int(version.split(".")[0]) >= 1  # libmemcached refuses a major version 0
    else:
        assert version == server_stats(q.server)["version"]


SCENARIOS: dict[str, Callable[[Adapter, Check], None]] = {
    op: globals()[f"scenario_{op}"] for op in OPERATIONS
}
#: The operations each scenario needs besides its own.
NEEDS = {"close": ("open",), "close_open": ("open", "close"), "abort": ("open", "close")}


def operation_params(adapter_class: type[Adapter]) -> list[Any]:
    """The matrix's operations as test parameters; an unsupported one's id says so."""
    return [pytest.param(op, id=f"{op}-unsupported" if op in adapter_class.unsupported else op)
            for op in OPERATIONS]


def check_marker(adapter_class: type[Adapter], op: str) -> None:
    """An operation is marked unsupported (with a reason) exactly when the adapter lacks it."""
    missing = getattr(adapter_class, op) is None
    assert missing == (op in adapter_class.unsupported), op
    if missing:
        assert adapter_class.unsupported[op].strip()


def run_operation(adapter: Adapter, op: str, prefix: str) -> None:
    """
    Run the scenario of C{op} through C{adapter} on a queue of its own, or,
    for an operation the matrix marks unsupported, check that the marker and
    the adapter agree.
    """
    check_marker(type(adapter), op)
    if op in adapter.unsupported:
        return
    for needed in NEEDS.get(op, ()):
        assert needed not in adapter.unsupported
    SCENARIOS[op](adapter, Check(adapter, f"{prefix}_{op}"))


def render_table(adapters: list[type[Adapter]]) -> str:
    """The matrix as the Markdown table of docs/clients.md."""
    lines = ["| client | " + " | ".join(OPERATIONS.values()) + " |",
             "|---|" + "---|" * len(OPERATIONS)]
    for adapter in adapters:
        cells = ["no" if op in adapter.unsupported else "yes" for op in OPERATIONS]
        lines.append(f"| {adapter.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
