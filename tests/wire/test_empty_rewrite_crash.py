"""
Kill -9 while an empty queue's journal is replaced again and again.

With `default_journal_size: 1KiB`, every set + get of a 1 KiB item leaves the
queue empty with its journal past the threshold, so each get replaces the
journal file (an empty `q~~<ms>` renamed over `q`, the old file freed in a
thread, the directory fsynced in a thread under `always`, not at all under
`never`). The server is killed at random
moments of that loop; after each restart the queue must hold exactly the
item whose `STORED` the client read and whose get it had not sent, nothing
consumed may come back, and an item whose reply the kill cut off may be
there or not, once at most. (A plain get's item is removed in the journal
just after its reply is in the kernel: until the server answers the next
request, a kill may bring the item just read back, once; see
docs/reliability.md.)
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from tests.wire.conftest import KestrelProcess

ROUNDS = 12


def _item(round_: int, n: int) -> bytes:
    return (b"%d-%d-" % (round_, n)).ljust(1000, b"x")


def _reply(sock: socket.socket, buf: bytearray, end: bytes) -> bytes:
    """Read until C{buf} holds a reply ending in C{end}; return it (removed from C{buf})."""
    while True:
        at = buf.find(end)
        if at >= 0:
            reply = bytes(buf[:at + len(end)])
            del buf[:at + len(end)]
            return reply
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def _kill(proc: subprocess.Popen[bytes], killed_at: list[float]) -> None:
    """SIGKILL C{proc}, noting when in C{killed_at}."""
    killed_at.append(time.monotonic())
    proc.kill()


def _get(sock: socket.socket, buf: bytearray) -> bytes | None:
    sock.sendall(b"get q\r\n")
    reply = _reply(sock, buf, b"END\r\n")
    if reply == b"END\r\n":
        return None
    header, _, rest = reply.partition(b"\r\n")
    assert header.startswith(b"VALUE q 0 "), reply[:100]
    return rest[:int(header.split()[3])]


@pytest.mark.parametrize("sync_journal", ["always", "never"])
def test_kill_during_empty_rewrites_loses_and_brings_back_nothing(
        kestrel_factory: Callable[..., KestrelProcess], sync_journal: str) -> None:
    """(Under C{never} the rewrite fsyncs nothing: a kill -9 still loses nothing.)"""
    # (debug: an empty queue's rewrite is logged at that level)
    server = kestrel_factory(config={"default": {"sync_journal": sync_journal,
                                                 "default_journal_size": "1KiB"}},
                             log_level="debug")
    rng = random.Random(20261124)
    rewrites_before = 0
    checked_present = 0
    for round_ in range(ROUNDS):
        present: bytes | None = None  # STORED read, get not sent: must survive
        maybe: set[bytes] = set()  # a reply the kill may have cut off
        assert server.proc is not None
        killed_at: list[float] = []
        killer = threading.Timer(rng.uniform(0.2, 0.6), _kill, (server.proc, killed_at))
        killer.start()
        n = 0
        get_sent_at: float | None = None  # (while a get waits for its reply)
        try:
            with server.connect() as sock:
                buf = bytearray()
                while True:
                    data = _item(round_, n)
                    maybe = maybe | {data}
                    sock.sendall(b"set q 0 0 %d\r\n%s\r\n" % (len(data), data))
                    assert _reply(sock, buf, b"\r\n") == b"STORED\r\n"
                    present, maybe = data, set()
                    if rng.random() < 0.5:
                        # (a kill now finds an acknowledged item in a replaced journal)
                        time.sleep(rng.uniform(0.0, 0.005))
                    get_sent_at = time.monotonic()
                    maybe, present = {data}, None
                    assert _get(sock, buf) == data
                    get_sent_at = None
                    n += 1  # (its removal is journaled before the next STORED)
        except (OSError, ConnectionError):
            killer.join()
            # (only a get cut off counts: a set cut off after a get that was
            # answered, the kill noted before that get, leaves nothing acknowledged)
            if (get_sent_at is not None and killed_at[0] < get_sent_at
                    and _item(round_, n) in maybe):
                # The server was dead before this get was sent: the item is acknowledged.
                present, maybe = _item(round_, n), set()
        killer.join()
        server.proc.wait()
        log = server.new_log()
        rewrites_before += log.count("rewritten (empty)")
        server.start()
        checked_present += present is not None
        with server.connect() as sock:
            buf = bytearray()
            first = _get(sock, buf)
            if present is not None:
                assert first == present
            else:
                assert first is None or first in maybe, first[:20] if first else first
            assert _get(sock, buf) is None
        assert "Traceback" not in server.new_log()
    # The loop really replaced the journal over and over before the kills.
    assert rewrites_before > 10 * ROUNDS
    # Some kills found an acknowledged item waiting (the seed makes it so).
    assert checked_present > 0
    # A graceful stop leaves no spare file behind (a kill may: replay deletes it).
    with server.connect() as sock:
        buf = bytearray()
        for n in range(20):
            data = _item(ROUNDS, n)
            sock.sendall(b"set q 0 0 %d\r\n%s\r\n" % (len(data), data))
            assert _reply(sock, buf, b"\r\n") == b"STORED\r\n"
            assert _get(sock, buf) == data
    assert server.stop() == 0
    assert "rewritten (empty)" in server.new_log()
    assert os.listdir(server.queue_path) == ["q"]
