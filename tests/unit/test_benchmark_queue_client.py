"""
The codecs of benchmarks/queue_client.py (the one client benchmarks/cost.py
loads every server with): RESP, memcache text and beanstalk replies read
through a real C{asyncio.StreamReader}, and the Kestrel dialect's plain and
reliable reads against a running txkestrel.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import queue_client as qc  # noqa: E402
from servers import free_port, kestrel_process  # noqa: E402

#: Keys of printable ASCII, drawn as such (filtering random bytes rejects most draws).
KEYS = st.lists(st.integers(33, 126), min_size=1, max_size=40).map(bytes)


T = TypeVar("T")


def read(decoder: Callable[..., Awaitable[T]], data: bytes, *args: bytes) -> tuple[T, bytes]:
    """Run C{decoder} over C{data} (then end of stream); its result and what it left unread."""
    async def run() -> tuple[T, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        value = await decoder(reader, *args)
        return value, await reader.read()
    return asyncio.run(run())


RESP = st.recursive(
    st.none() | st.integers(-2**63, 2**63 - 1) | st.binary(max_size=64),
    lambda inner: st.lists(inner, max_size=4), max_leaves=12)


def encode_reply(value: qc.RespValue) -> bytes:
    """A RESP2 reply as Redis writes it (bulk strings, integers, nil, arrays)."""
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(encode_reply(v) for v in value)


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=6))
def test_resp_command_reads_back_as_its_arguments(args: list[bytes]) -> None:
    """A command is an array of bulk strings: read as a reply it gives its arguments back."""
    assert read(qc.read_resp, qc.resp_command(*args) + b"+next\r\n") == (args, b"+next\r\n")


@given(RESP)
def test_read_resp_reads_every_reply_redis_writes(value: qc.RespValue) -> None:
    """Bulk strings (CRLF inside included), integers, nil and nested arrays, nothing more."""
    assert read(qc.read_resp, encode_reply(value) + b":1\r\n") == (value, b":1\r\n")


def test_read_resp_simple_strings_errors_and_garbage() -> None:
    """+OK is bytes; an error reply, an unknown type or a short bulk raise ProtocolError."""
    assert read(qc.read_resp, b"+OK\r\n") == (b"OK", b"")
    assert read(qc.read_resp, b"*-1\r\n") == (None, b"")
    for bad in (b"-ERR wrong type\r\n", b"?3\r\n", b":x\r\n", b"$5\r\nab\r\n", b"$2\r\nabcd",
                b"+OK"):
        with pytest.raises(qc.ProtocolError):
            read(qc.read_resp, bad)


@given(KEYS, st.binary(max_size=300))
def test_memcache_value_reads_the_data(key: bytes, data: bytes) -> None:
    """VALUE <key> <flags> <length>, the data (CRLF inside included), END: the data."""
    reply = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(data), data)
    assert read(qc.read_memcache_value, reply + b"END\r\n") == (data, b"END\r\n")


def test_memcache_value_empty_and_bad_replies() -> None:
    """END alone is an empty queue; errors, a wrong length or a missing END raise."""
    assert read(qc.read_memcache_value, b"END\r\n") == (None, b"")
    for bad in (b"ERROR\r\n", b"SERVER_ERROR oops\r\n", b"VALUE q 0 3\r\nabcd\r\nEND\r\n",
                b"VALUE q 0 2\r\nab\r\nSTORED\r\n", b"VALUE q 0 x\r\nab\r\nEND\r\n", b""):
        with pytest.raises(qc.ProtocolError):
            read(qc.read_memcache_value, bad)


@given(KEYS, st.binary(max_size=300))
def test_memcache_set_frames_the_data(key: bytes, data: bytes) -> None:
    """The set header names the key and the exact length; the data follows with CRLF."""
    header, _, rest = qc.memcache_set(key, data).partition(b"\r\n")
    assert header == b"set %s 0 0 %d" % (key, len(data))
    assert rest == data + b"\r\n"


@given(st.integers(0, 2**32), st.binary(max_size=300))
def test_beanstalk_job_reads_id_and_data(job_id: int, data: bytes) -> None:
    """RESERVED <id> <bytes> and the data give (id, data); TIMED_OUT gives None."""
    reply = b"RESERVED %d %d\r\n%s\r\n" % (job_id, len(data), data)
    assert read(qc.read_beanstalk_job, reply + b"DELETED\r\n") == ((job_id, data),
                                                                    b"DELETED\r\n")
    assert read(qc.read_beanstalk_job, b"TIMED_OUT\r\n") == (None, b"")


@given(st.binary(max_size=300))
def test_beanstalk_put_frames_the_data(data: bytes) -> None:
    """put <pri> <delay 0> <ttr> <bytes>, then the data and CRLF."""
    header, _, rest = qc.beanstalk_put(data).partition(b"\r\n")
    assert header == b"put 1024 0 60 %d" % len(data)
    assert rest == data + b"\r\n"


def test_beanstalk_bad_replies() -> None:
    """An unexpected status line or a short job raises ProtocolError."""
    for bad in (b"DEADLINE_SOON\r\n", b"RESERVED 1\r\n", b"RESERVED 1 5\r\nab\r\n"):
        with pytest.raises(qc.ProtocolError):
            read(qc.read_beanstalk_job, bad)
    assert read(qc.read_beanstalk_status, b"INSERTED 7\r\n", b"INSERTED") == (b"INSERTED 7",
                                                                              b"")
    with pytest.raises(qc.ProtocolError):
        read(qc.read_beanstalk_status, b"JOB_TOO_BIG\r\n", b"INSERTED")


def test_kestrel_dialect_against_txkestrel(tmp_path: Path) -> None:
    """
    Over a real socket to txkestrel, the workloads cost.py runs move every
    item through: plain and reliable pairs, enqueues, then a drain leaves
    the queue empty.
    """
    port = free_port()
    with kestrel_process(tmp_path, port):
        assert qc.run_pairs("kestrel", port, "q", 2, 20, 100)[0] == 20
        assert qc.run_pairs("kestrel", port, "q", 1, 20, 100, reliable=True)[0] == 20
        assert qc.run_enqueues("kestrel", port, "q", 3, 10, 100)[0] == 10
        qc.drain("kestrel", port, "q")

        async def empty() -> bytes | None:
            conn = await qc.connect("kestrel", port)
            try:
                return await conn.dequeue(b"q")
            finally:
                await conn.close()
        assert asyncio.run(empty()) is None
