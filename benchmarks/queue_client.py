"""
One asyncio work-queue client for every server benchmarks/cost.py compares.

Not a benchmark itself. It speaks three protocols with the same loop around
them, so that every server is loaded by the same client code:

* C{kestrel}: the memcache text dialect of txkestrel and darner
  (C{set q}, C{get q}; reliable reads with C{get q/open} and C{get q/close});
* C{memcache}: the same set/get subset, for memcached and the floor servers
  (which have no reliable read);
* C{resp}: Redis lists (C{LPUSH q}, C{RPOP q}; reliable reads with
  C{LMOVE q q:reserved RIGHT LEFT} and C{LREM q:reserved 1 item});
* C{beanstalk}: beanstalkd tubes (C{put}; C{reserve-with-timeout 0} and
  C{delete}, for a plain dequeue as well as a reliable one).

Every request waits for its reply before the next is written (one request
at a time on each connection). Unexpected replies raise L{ProtocolError}.

    conn = await connect("resp", port)
    await conn.enqueue(b"q", b"item")
    assert await conn.dequeue(b"q") == b"item"
    await conn.close()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

#: Requests of one enqueue + dequeue, and of one enqueue + reserve + ack, per protocol.
PAIR_REQUESTS = {"kestrel": 2, "memcache": 2, "resp": 2, "beanstalk": 3}
RELIABLE_REQUESTS = {"kestrel": 3, "resp": 3, "beanstalk": 3}

RespValue = bytes | int | None | list["RespValue"]
Job = Callable[["QueueConnection"], Awaitable[None]]


class ProtocolError(ValueError):
    """A server answered something this client did not ask for or cannot read."""


class Reader(Protocol):
    """What the decoders read from: an C{asyncio.StreamReader}."""

    async def readline(self) -> bytes:
        """The next line, with its line ending (b"" at the end of the stream)."""

    async def readexactly(self, n: int) -> bytes:
        """The next C{n} bytes."""


async def _line(reader: Reader) -> bytes:
    line = await reader.readline()
    if not line.endswith(b"\r\n"):
        raise ProtocolError(f"connection closed or line without CRLF: {line[:80]!r}")
    return line[:-2]


async def _block(reader: Reader, length: int) -> bytes:
    try:
        block = await reader.readexactly(length + 2)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"connection closed inside a data block of {length} bytes") from None
    if block[-2:] != b"\r\n":
        raise ProtocolError(f"data block of {length} bytes not followed by CRLF")
    return block[:-2]


# -- memcache text --------------------------------------------------------------

def memcache_set(key: bytes, data: bytes) -> bytes:
    """The C{set} request storing C{data} under C{key} (flags 0, no expiry)."""
    return b"set %s 0 0 %d\r\n%s\r\n" % (key, len(data), data)


async def read_memcache_value(reader: Reader) -> bytes | None:
    """The data of a one-key C{get} reply (C{VALUE ...} then C{END}), or None for C{END}."""
    line = await _line(reader)
    if line == b"END":
        return None
    parts = line.split()
    if len(parts) not in (4, 5) or parts[0] != b"VALUE" or not parts[3].isdigit():
        raise ProtocolError(f"get answered {line[:80]!r}")
    data = await _block(reader, int(parts[3]))
    end = await _line(reader)
    if end != b"END":
        raise ProtocolError(f"VALUE not followed by END but {end[:80]!r}")
    return data


# -- RESP (Redis) -----------------------------------------------------------------

def resp_command(*args: bytes) -> bytes:
    """A Redis command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


async def read_resp(reader: Reader) -> RespValue:
    """
    One RESP2 reply: simple strings and bulk strings as bytes, integers as
    int, nil as None, arrays as lists; an error reply raises L{ProtocolError}.
    """
    line = await _line(reader)
    kind, rest = line[:1], line[1:]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise ProtocolError(f"Redis error: {rest[:200].decode(errors='replace')}")
    try:
        number = int(rest)
    except ValueError:
        raise ProtocolError(f"unreadable RESP reply {line[:80]!r}") from None
    if kind == b":":
        return number
    if kind == b"$":
        return None if number < 0 else await _block(reader, number)
    if kind == b"*":
        return None if number < 0 else [await read_resp(reader) for _ in range(number)]
    raise ProtocolError(f"unreadable RESP reply {line[:80]!r}")


# -- beanstalk --------------------------------------------------------------------

def beanstalk_put(data: bytes, priority: int = 1024, ttr: int = 60) -> bytes:
    """The C{put} request for a job of C{data}, no delay, C{ttr} seconds to run."""
    return b"put %d 0 %d %d\r\n%s\r\n" % (priority, ttr, len(data), data)


async def read_beanstalk_job(reader: Reader) -> tuple[int, bytes] | None:
    """(job id, data) from a C{RESERVED} reply; None for C{TIMED_OUT}."""
    line = await _line(reader)
    if line == b"TIMED_OUT":
        return None
    parts = line.split()
    if len(parts) != 3 or parts[0] != b"RESERVED" or not (
            parts[1].isdigit() and parts[2].isdigit()):
        raise ProtocolError(f"reserve answered {line[:80]!r}")
    return int(parts[1]), await _block(reader, int(parts[2]))


async def read_beanstalk_status(reader: Reader, expected: bytes) -> bytes:
    """A one-line reply whose first word must be C{expected}; the whole line."""
    line = await _line(reader)
    if line.split(b" ", 1)[0] != expected:
        raise ProtocolError(f"expected {expected!r}, got {line[:80]!r}")
    return line


# -- connections ------------------------------------------------------------------

class QueueConnection:
    """
    One connection to a queue server, one request at a time.

    C{enqueue} adds an item; C{dequeue} removes and returns the oldest (None
    when empty); C{reserve} hands out the oldest without removing it for
    good, C{ack} removes what C{reserve} handed out; C{drain} empties a queue.
    """

    protocol = ""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def enqueue(self, queue: bytes, data: bytes) -> None:
        """Add C{data} to C{queue}; return once the server confirmed it."""
        raise NotImplementedError

    async def dequeue(self, queue: bytes) -> bytes | None:
        """Remove and return the oldest item of C{queue}; None if it is empty."""
        raise NotImplementedError

    async def reserve(self, queue: bytes) -> tuple[object, bytes] | None:
        """Hand out the oldest item of C{queue} until C{ack}: (handle, data), or None."""
        raise ProtocolError(f"{self.protocol} has no reliable read")

    async def ack(self, queue: bytes, handle: object) -> None:
        """Remove for good the item C{reserve} handed out as C{handle}."""
        raise ProtocolError(f"{self.protocol} has no reliable read")

    async def drain(self, queue: bytes) -> None:
        """Remove every item of C{queue}."""
        while await self.dequeue(queue) is not None:
            pass

    async def close(self) -> None:
        """Close the connection."""
        self.writer.close()
        await self.writer.wait_closed()


class MemcacheConnection(QueueConnection):
    """memcache text: C{set} and C{get} (memcached, the floor servers)."""

    protocol = "memcache"

    async def enqueue(self, queue: bytes, data: bytes) -> None:
        """C{set}; the reply must be C{STORED}."""
        self.writer.write(memcache_set(queue, data))
        line = await _line(self.reader)
        if line != b"STORED":
            raise ProtocolError(f"set answered {line[:80]!r}")

    async def dequeue(self, queue: bytes) -> bytes | None:
        """C{get}."""
        self.writer.write(b"get %s\r\n" % queue)
        return await read_memcache_value(self.reader)


class KestrelConnection(MemcacheConnection):
    """Kestrel's memcache dialect (txkestrel, darner): memcache plus C{/open} and C{/close}."""

    protocol = "kestrel"

    async def reserve(self, queue: bytes) -> tuple[object, bytes] | None:
        """C{get q/open}: the connection holds the item open (the handle is None)."""
        self.writer.write(b"get %s/open\r\n" % queue)
        data = await read_memcache_value(self.reader)
        return None if data is None else (None, data)

    async def ack(self, queue: bytes, handle: object) -> None:
        """C{get q/close}: the open item is removed; the reply is an empty C{END}."""
        self.writer.write(b"get %s/close\r\n" % queue)
        if await read_memcache_value(self.reader) is not None:
            raise ProtocolError("get /close answered an item")


class RespConnection(QueueConnection):
    """Redis lists: a queue C{q} is the list C{q}, its reserved items the list C{q:reserved}."""

    protocol = "resp"

    async def _call(self, *args: bytes) -> RespValue:
        self.writer.write(resp_command(*args))
        return await read_resp(self.reader)

    async def enqueue(self, queue: bytes, data: bytes) -> None:
        """C{LPUSH q data}; the reply is the list's new length."""
        if not isinstance(await self._call(b"LPUSH", queue, data), int):
            raise ProtocolError("LPUSH did not answer a length")

    async def dequeue(self, queue: bytes) -> bytes | None:
        """C{RPOP q}."""
        return _bulk(await self._call(b"RPOP", queue))

    async def reserve(self, queue: bytes) -> tuple[object, bytes] | None:
        """C{LMOVE q q:reserved RIGHT LEFT}: the item itself is the handle."""
        data = _bulk(await self._call(b"LMOVE", queue, queue + b":reserved", b"RIGHT", b"LEFT"))
        return None if data is None else (data, data)

    async def ack(self, queue: bytes, handle: object) -> None:
        """C{LREM q:reserved 1 item}: exactly one must be removed."""
        assert isinstance(handle, bytes)
        if await self._call(b"LREM", queue + b":reserved", b"1", handle) != 1:
            raise ProtocolError("LREM removed nothing")

    async def drain(self, queue: bytes) -> None:
        """C{DEL q q:reserved}."""
        await self._call(b"DEL", queue, queue + b":reserved")


def _bulk(value: RespValue) -> bytes | None:
    if value is not None and not isinstance(value, bytes):
        raise ProtocolError(f"expected a bulk string, got {value!r:.80}")
    return value


class BeanstalkConnection(QueueConnection):
    """beanstalkd: a queue is a tube; a dequeue is a reserve and a delete."""

    protocol = "beanstalk"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.used = b"default"
        self.watched = b"default"

    async def _use(self, queue: bytes) -> None:
        if self.used != queue:
            self.writer.write(b"use %s\r\n" % queue)
            await read_beanstalk_status(self.reader, b"USING")
            self.used = queue

    async def _watch(self, queue: bytes) -> None:
        if self.watched != queue:
            self.writer.write(b"watch %s\r\n" % queue)
            await read_beanstalk_status(self.reader, b"WATCHING")
            self.writer.write(b"ignore %s\r\n" % self.watched)
            await read_beanstalk_status(self.reader, b"WATCHING")
            self.watched = queue

    async def enqueue(self, queue: bytes, data: bytes) -> None:
        """C{put} into the tube C{queue}; the reply must be C{INSERTED}."""
        await self._use(queue)
        self.writer.write(beanstalk_put(data))
        await read_beanstalk_status(self.reader, b"INSERTED")

    async def reserve(self, queue: bytes) -> tuple[object, bytes] | None:
        """C{reserve-with-timeout 0} on the tube C{queue}: the handle is the job id."""
        await self._watch(queue)
        self.writer.write(b"reserve-with-timeout 0\r\n")
        return await read_beanstalk_job(self.reader)

    async def ack(self, queue: bytes, handle: object) -> None:
        """C{delete <id>}; the reply must be C{DELETED}."""
        assert isinstance(handle, int)
        self.writer.write(b"delete %d\r\n" % handle)
        await read_beanstalk_status(self.reader, b"DELETED")

    async def dequeue(self, queue: bytes) -> bytes | None:
        """A reserve and a delete (two requests)."""
        job = await self.reserve(queue)
        if job is None:
            return None
        await self.ack(queue, job[0])
        return job[1]


CONNECTIONS: dict[str, type[QueueConnection]] = {
    c.protocol: c for c in (MemcacheConnection, KestrelConnection, RespConnection,
                            BeanstalkConnection)}


async def connect(protocol: str, port: int) -> QueueConnection:
    """A connection speaking C{protocol} (a key of L{CONNECTIONS}) to loopback C{port}."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return CONNECTIONS[protocol](reader, writer)


# -- workloads --------------------------------------------------------------------

async def _on_connection(protocol: str, port: int, job: Job) -> None:
    conn = await connect(protocol, port)
    try:
        await job(conn)
    finally:
        await conn.close()


def _timed(protocol: str, port: int, jobs: list[Job]) -> float:
    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(_on_connection(protocol, port, job) for job in jobs))
        return time.perf_counter() - started
    return asyncio.run(run())


def _shares(total: int, conns: int) -> list[int]:
    return [total // conns + (1 if i < total % conns else 0) for i in range(conns)]


def run_pairs(protocol: str, port: int, queue: str, conns: int, pairs: int, size: int,
              reliable: bool = False) -> tuple[int, float]:
    """
    C{pairs} items enqueued and dequeued over C{conns} connections, each
    connection enqueueing one item and dequeueing it before the next, one
    request at a time (with C{reliable}, the dequeue is a reserve and an
    ack); (pairs, seconds). Every item read must be the one written.
    """
    payload = b"p" * size
    key = queue.encode()

    async def job(conn: QueueConnection, count: int) -> None:
        for _ in range(count):
            await conn.enqueue(key, payload)
            if reliable:
                handle, data = await conn.reserve(key) or (None, None)
            else:
                data = await conn.dequeue(key)
            if data != payload:
                raise ProtocolError(f"dequeued {data!r:.80} instead of the item enqueued")
            if reliable:
                await conn.ack(key, handle)

    jobs: list[Job] = [partial(job, count=n) for n in _shares(pairs, conns)]
    return pairs, _timed(protocol, port, jobs)


def run_enqueues(protocol: str, port: int, queue: str, conns: int, items: int, size: int
                 ) -> tuple[int, float]:
    """C{items} enqueues over C{conns} connections, one outstanding on each; (items, seconds)."""
    payload = b"d" * size
    key = queue.encode()

    async def job(conn: QueueConnection, count: int) -> None:
        for _ in range(count):
            await conn.enqueue(key, payload)

    jobs: list[Job] = [partial(job, count=n) for n in _shares(items, conns)]
    return items, _timed(protocol, port, jobs)


def drain(protocol: str, port: int, queue: str) -> None:
    """Empty C{queue} (so the next run starts from an empty queue)."""
    async def job(conn: QueueConnection) -> None:
        await conn.drain(queue.encode())
    _timed(protocol, port, [job])
