"""
The meta and binary dialects and the queue limits against a real server
process, over raw sockets.

The first tests are the rows of the issue that found a meta set's data block
run as requests: each `ms` must store its block and run nothing. The last
ones create queues past `max_queues` and past the file-descriptor budget:
one error line each, no traceback, and the server works on.
"""

from __future__ import annotations

import os
import resource
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from tests.wire.conftest import KestrelProcess, LineClient

_HEADER = struct.Struct(">BBHBBHIIQ")


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """One server for the module's dialect tests."""
    return kestrel_factory()


@pytest.fixture
def client(server: KestrelProcess) -> Iterator[LineClient]:
    """A raw-socket client of the memcache port."""
    c = LineClient(server.connect())
    yield c
    c.close()


def reply_lines(server: KestrelProcess, request: bytes, count: int) -> list[bytes]:
    """Send C{request} on a fresh connection; the next C{count} reply lines."""
    c = LineClient(server.connect())
    try:
        c.send(request)
        return [c.line() for _ in range(count)]
    finally:
        c.close()


@pytest.mark.parametrize("request_bytes, data", [
    (b"ms x1 9 T0 F0\r\nflush_all\r\n", b"flush_all"),
    (b"ms x2 8 T0 F0\r\nshutdown\r\n", b"shutdown"),
    (b"ms x3 10 T0 F0\r\nget victim\r\n", b"get victim"),
])
def test_ms_data_is_stored_and_never_run(server: KestrelProcess, request_bytes: bytes,
                                         data: bytes) -> None:
    """The data block of ms is an item: HD, the item reads back, nothing else happened."""
    assert reply_lines(server, b"set victim 0 0 1\r\nv\r\n", 1) == [b"STORED\r\n"]
    queue = request_bytes.split()[1]
    assert reply_lines(server, request_bytes + b"mn\r\n", 2) == [b"HD\r\n", b"MN\r\n"]
    assert server.running
    assert reply_lines(server, b"mg %s v\r\n" % queue, 2) == [
        b"VA %d\r\n" % len(data), data + b"\r\n"]
    assert reply_lines(server, b"get victim\r\n", 3) == [
        b"VALUE victim 0 1\r\n", b"v\r\n", b"END\r\n"]


def test_meta_pipeline(client: LineClient) -> None:
    """A pipeline of meta requests, quiet ones included, answered in order up to mn."""
    client.send(b"ms mp 3 q\r\nabc\r\nms mp 2 O7 k\r\nde\r\nmg mp v s\r\nmg mp v q\r\n"
                b"mg mp v q\r\nmn\r\n")
    assert client.line() == b"HD O7 kmp\r\n"
    assert client.line() == b"VA 3 s3\r\n"
    assert client.line() == b"abc\r\n"
    assert client.line() == b"VA 2\r\n"
    assert client.line() == b"de\r\n"
    assert client.line() == b"MN\r\n"


def test_binary_set_get_noop(client: LineClient) -> None:
    """Binary Set, Get (with a key option) and Noop over a socket."""
    def packet(opcode: int, key: bytes = b"", value: bytes = b"", extras: bytes = b"") -> bytes:
        body = len(extras) + len(key) + len(value)
        return _HEADER.pack(0x80, opcode, len(key), len(extras), 0, 0, body, 9, 0) + (
            extras + key + value)

    client.send(packet(0x01, b"bq", b"hello", bytes(8)) + packet(0x00, b"bq/peek")
                + packet(0x0A))
    header = client.exactly(24)
    assert header[:2] == b"\x81\x01" and header[6:8] == b"\0\0"
    header = client.exactly(24)
    assert header[:2] == b"\x81\x00" and header[6:8] == b"\0\0"
    assert client.exactly(_HEADER.unpack(header)[6]) == b"\0\0\0\0hello"
    assert client.exactly(24)[:2] == b"\x81\x0a"


# -- queue limits -----------------------------------------------------------------------

def no_traceback(server: KestrelProcess) -> None:
    """The server logged no traceback."""
    assert "Traceback" not in server.log()


def test_max_queues(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    Past max_queues a new queue gets one SERVER_ERROR line; existing queues,
    new connections and the connection itself work on.
    """
    server = kestrel_factory(config={"max_queues": 3})
    lines = reply_lines(server, b"get a\r\nget b\r\nset c 0 0 1\r\nx\r\nget d\r\nms e 1\r\ny\r\n"
                                b"get c\r\n", 7)
    refused = b"SERVER_ERROR queue %s not created: the server holds max_queues (3) queues; " \
              b"delete some or raise max_queues\r\n"
    assert lines == [b"END\r\n", b"END\r\n", b"STORED\r\n", refused % b"d", refused % b"e",
                     b"VALUE c 0 1\r\n", b"x\r\n"]
    assert reply_lines(server, b"delete a\r\nget d\r\n", 2) == [b"DELETED\r\n", b"END\r\n"]
    assert not (server.root / "kestrel-data" / "e").exists()
    no_traceback(server)


def test_file_descriptor_budget(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    With a descriptor limit of 200, queues may hold 100: the next new queue
    gets one SERVER_ERROR line, and existing queues, new connections and
    journal rotations work on.
    """
    server = kestrel_factory(config={"max_queues": 100_000,
                                     "queues": {"fd0": {"max_memory_size": "1KiB"}}})
    assert server.proc is not None
    pid = server.proc.pid
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (200, 200))
    client = LineClient(server.connect())
    try:
        refused = None
        for n in range(140):
            client.send(b"get fd%d\r\n" % n)
            line = client.line()
            if line != b"END\r\n":
                refused = (n, line)
                break
        assert refused is not None
        n, line = refused
        assert line == (b"SERVER_ERROR queue fd%d not created: queues may hold 100 file "
                        b"descriptors (half of RLIMIT_NOFILE); delete some or raise the "
                        b"limit\r\n" % n)
        assert n <= 100
        client.send(b"set fd0 0 0 2\r\nok\r\nget fd0\r\n")
        assert [client.line() for _ in range(4)] == [
            b"STORED\r\n", b"VALUE fd0 0 2\r\n", b"ok\r\n", b"END\r\n"]
        # fd0 rotates its journal (over 1 KiB with items held): a new file opens
        client.send(b"set fd0 0 0 100\r\n%s\r\n" % (b"x" * 100) * 30)
        assert [client.line() for _ in range(30)] == [b"STORED\r\n"] * 30
        deadline = time.monotonic() + 10
        while "Journal fd0: rotated to" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Journal fd0: rotated to" in server.log()
        client.send(b"set fd0 0 0 2\r\nok\r\n")
        assert client.line() == b"STORED\r\n"
        others = [LineClient(server.connect()) for _ in range(20)]
        for other in others:
            other.send(b"version\r\n")
            assert other.line().startswith(b"VERSION ")
            other.close()
        assert len(os.listdir(f"/proc/{pid}/fd")) < 200
    finally:
        client.close()
    no_traceback(server)
