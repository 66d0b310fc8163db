"""
The fleet client: one loosely ordered queue over many Kestrel servers.

Every operation picks its servers from the current membership (a static list
or ZooKeeper server sets, L{kestrel.client.discovery}), skipping those left
out by L{kestrel.client.health} after a failure:

- C{put} writes to one server chosen at random among the healthy members of
  the write set; what it refuses (C{NOT_STORED}, C{SERVER_ERROR}, no
  connection, a timeout) goes to the next, so a put fails only when every
  server refused it (L{AllServersFailed} says which and why).
- C{read} returns a L{ReadHandle} whose C{confirm()} / C{abort()} go back over
  the very connection that opened the read (open reads belong to a connection
  on memcache; on thrift the read also has an id and an auto-abort). It
  first asks the healthy read servers one by one, in random order, without
  waiting; when all are empty and C{timeout} is given, it waits
  on every read server at once and takes the first item (see L{_Race}).
- C{get} is a read that is confirmed at once.

Guarantee for the race: an item taken by a waiter that lost is never handed
to the caller and never confirmed. A loser whose item has already reached the
client aborts it at once on its own connection; a loser still waiting has its
connection closed, and the server ends that connection's open read (returning
the item to its queue head) or drops its waiter; a loser still connecting is
never asked. So after a lost race each other server has its items back within
one round trip. On thrift, where closing a connection does not return its open
reads, a waiting loser is left to answer instead and whatever it brings is
aborted on arrival.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.client.discovery import ServerSet, StaticServers
from kestrel.client.errors import (
    AllServersFailed,
    ClientError,
    HandleClosed,
    NoServers,
    RequestTimeout,
)
from kestrel.client.health import Backoff, Health
from kestrel.client.pool import Connection, Connector, Pool, tcp_connector
from kestrel.client.stream import ReadStream


def _reason(error: BaseException | Failure) -> str:
    exception = error.value if isinstance(error, Failure) else error
    if isinstance(exception, ClientError):
        return str(exception)
    return f"{type(exception).__name__}: {exception}"


class ReadHandle:
    """
    One item of an open (reliable) read, tied to the server connection that gave it.

    C{confirm()} removes the item for good; C{abort()} returns it to the head
    of its queue on that server. Either fires with None, or fails with
    L{HandleClosed} when the connection died first: the server has then
    already returned the item to its queue, and it will be delivered again.
    """

    def __init__(self, client: KestrelClient, conn: Connection, queue: str,
                 data: bytes, xid: int = 0) -> None:
        self.queue = queue
        self.data = data
        self.server = conn.server
        self.xid = xid
        self._client = client
        self._conn: Connection | None = conn

    @property
    def open(self) -> bool:
        """Whether neither confirm() nor abort() was called yet."""
        return self._conn is not None

    def confirm(self) -> Deferred[None]:
        """Confirm the item on its server (memcache C{get <queue>/close}, thrift C{confirm})."""
        return self._settle("confirm")

    def abort(self) -> Deferred[None]:
        """Give the item back to its server's queue (C{get <queue>/abort}, thrift C{abort})."""
        return self._settle("abort")

    def _settle(self, what: str) -> Deferred[None]:
        conn, self._conn = self._conn, None
        d: Deferred[None] = Deferred()
        if conn is None:
            d.errback(HandleClosed(f"{self.server}: read on {self.queue} already settled"))
            return d
        if not conn.alive:
            d.errback(HandleClosed(f"{self.server}: connection lost; the server returns "
                                   f"the item to {self.queue} (memcache: at once; thrift: "
                                   "at its auto-abort)"))
            return d

        def done(settled: bool) -> None:
            self._client.pool.release(conn)
            if not settled and what == "confirm":
                raise HandleClosed(f"{self.server}: the read on {self.queue} was no longer "
                                   "open (auto-aborted); the item will be delivered again")

        def failed(f: Failure) -> NoReturn:
            self._client.pool.discard(conn)
            self._client._failed(conn.server, f)
            raise HandleClosed(f"{self.server}: {what} on {self.queue} failed "
                               f"({_reason(f)}); the server returns the item to the queue "
                               "(memcache: at once; thrift: at its auto-abort)")

        operation = conn.confirm if what == "confirm" else conn.abort
        settling = operation(self.queue, self.xid)
        settling.addErrback(failed)
        return settling.addCallback(done)

    def __repr__(self) -> str:
        return f"<ReadHandle {self.queue}@{self.server} {len(self.data)} bytes>"


class _Race:
    """
    A read that waits on several servers at once; the first item wins.

    Each contender connects, then sends C{get <q>/t=<ms>/open}. Once a winner
    is known (or the race is cancelled): a contender still connecting hands
    its connection back unused; one waiting for its reply has its connection
    closed (the server drops the waiter, or aborts an item already sent);
    one whose item arrives later anyway aborts it on its connection at once.
    Fires with the winning L{ReadHandle}, None when every server answered
    empty, or L{AllServersFailed} when none answered.
    """

    def __init__(self, client: KestrelClient, queue: str, servers: Sequence[str],
                 timeout: float, skipped: Sequence[str] = ()) -> None:
        self.client = client
        self.skipped = list(skipped)
        self.queue = queue
        self.timeout_ms = max(1, int(timeout * 1000))
        self.result: Deferred[ReadHandle | None] = Deferred(self._cancel)
        self.decided = False
        self.remaining = len(servers)
        self.empty = 0
        self.attempts: list[tuple[str, str]] = []
        self.waiting: dict[str, tuple[Deferred[Any], Connection | None]] = {}
        for server in servers:
            self._start(server)

    def _start(self, server: str) -> None:
        connecting = self.client.pool.acquire(server)
        self.waiting[server] = (connecting, None)

        def connected(conn: Connection) -> None:
            if self.decided:
                self.client.pool.release(conn)  # never opened
                self._done(server)
                return
            request = conn.take(self.queue, self.timeout_ms, True)
            self.waiting[server] = (request, conn)
            request.addCallbacks(lambda got: self._answered(server, conn, got),
                                 lambda f: self._failed(server, conn, f))

        connecting.addCallbacks(connected, lambda f: self._failed(server, None, f))

    def _answered(self, server: str, conn: Connection,
                  got: tuple[bytes, int] | None) -> None:
        self.client.health.succeeded(server)
        if got is None:
            self.client.pool.release(conn)
            self.empty += 1
        elif self.decided:
            # Lost the race with an item in hand: give it back right away.
            self.client.log.debug("aborting an item of {queue} on {server} after a lost race",
                                  queue=self.queue, server=server)
            conn.abort(self.queue, got[1]).addCallbacks(
                lambda _: self.client.pool.release(conn),
                lambda _: self.client.pool.discard(conn))
        else:
            self._decide(ReadHandle(self.client, conn, self.queue, got[0], got[1]))
        self._done(server)

    def _failed(self, server: str, conn: Connection | None, f: Failure) -> None:
        if conn is not None:
            self.client.pool.discard(conn)
        if not self.decided:  # after the decision, failures are the closes we asked for
            self.client._failed(server, f)
            self.attempts.append((server, _reason(f)))
        self._done(server)

    def _done(self, server: str) -> None:
        self.waiting.pop(server, None)
        self.remaining -= 1
        if self.remaining == 0 and not self.decided:
            if self.empty:
                self._decide(None)
            else:
                self.decided = True
                self.result.errback(AllServersFailed(
                    f"read from {self.queue}",
                    self.attempts + self.client._not_tried(self.skipped)))

    def _decide(self, handle: ReadHandle | None) -> None:
        self._stop_others()
        self.result.callback(handle)

    def _cancel(self, _: Deferred[Any]) -> None:
        self._stop_others()

    def _stop_others(self) -> None:
        """
        Abandon the connects; close the waiting memcache connections (the
        server drops the waiter or aborts what it sent). A waiting thrift
        get is left to answer: closing would leave its item open until the
        auto-abort, so it is aborted on arrival instead.
        """
        self.decided = True
        for d, conn in list(self.waiting.values()):
            if conn is None or conn.cancel_returns_items:
                d.cancel()


class KestrelClient:
    """
    A Twisted client for one Kestrel server or a fleet of them.

    C{servers} is a list of C{host:port} (each both read and written) or a
    L{ServerSet} (e.g. L{kestrel.client.discovery.ZooKeeperServers}).
    Every network wait is bounded: C{connect_timeout} for a connect,
    C{reply_timeout} for a reply (plus the wait asked for, on a blocking
    read), C{discovery_timeout} for the first membership.

    @param protocol: C{memcache} (the default) or C{thrift}; with thrift,
        reliable reads auto-abort after C{auto_abort} seconds unless settled.
        The servers' addresses must be those of that protocol's listener.
    @param connector: opens connections (tests pass fake transports).
    @param rand: the random source for server choice and backoff jitter.
    """

    log = Logger()

    def __init__(self, servers: Sequence[str] | ServerSet, *, reactor: Any = None,
                 protocol: str = "memcache", connect_timeout: float = 3.0,
                 reply_timeout: float = 5.0, discovery_timeout: float = 10.0,
                 backoff: Backoff | None = None, max_idle: int = 8, auto_abort: float = 30.0,
                 connector: Connector | None = None,
                 rand: random.Random | None = None) -> None:
        if protocol not in ("memcache", "thrift"):
            raise ValueError(f"unknown protocol {protocol!r}: memcache or thrift")
        if reactor is None:
            from twisted.internet import reactor as global_reactor  # noqa: TID251 - default
            reactor = global_reactor
        self.reactor = reactor
        self.servers = servers if isinstance(servers, ServerSet) else StaticServers(servers)
        self.rand = rand or random.Random()
        self.health = Health(reactor, backoff, self.rand.random)
        self.protocol = protocol
        self.pool = Pool(connector or tcp_connector(reactor, connect_timeout, reply_timeout,
                                                    protocol, auto_abort), max_idle)
        self.discovery_timeout = discovery_timeout
        self._known: set[str] = set()
        self.servers.subscribe(self._membership_changed)
        self.servers.start()

    # -- membership and health

    def _membership_changed(self) -> None:
        now = set(self.servers.read) | set(self.servers.write)
        for gone in self._known - now:
            self.pool.forget_server(gone)
        self._known = now

    def ready(self) -> Deferred[None]:
        """Fire once the server membership is known (at once for a static list)."""
        return Deferred.fromCoroutine(self._ready())

    async def _ready(self) -> None:
        if self.servers.known:
            return
        waiting = self.servers.ready()
        timer = self.reactor.callLater(self.discovery_timeout, waiting.cancel)
        try:
            await waiting
        except CancelledError:
            raise RequestTimeout(f"no server membership within {self.discovery_timeout:g}s "
                                 "(is ZooKeeper reachable?)") from None
        finally:
            if timer.active():
                timer.cancel()

    def _failed(self, server: str, error: BaseException | Failure) -> None:
        pause = self.health.failed(server, _reason(error))
        self.log.info("server {server} left out for {pause:.2f}s: {reason}",
                      server=server, pause=pause, reason=_reason(error))

    async def _lend(self, server: str, attempts: list[tuple[str, str]]) -> Connection | None:
        """A connection to C{server} from the pool; None when it fails (noted in C{attempts})."""
        try:
            return await self.pool.acquire(server)
        except Exception as e:
            self._failed(server, e)
            attempts.append((server, _reason(e)))
            return None

    def _not_tried(self, servers: Sequence[str]) -> list[tuple[str, str]]:
        """C{(server, why it was not tried)} for each of C{servers}: those left out by health."""
        return [(server, self.health.left_out(server) or "not tried") for server in servers]

    def _order(self, servers: Sequence[str]) -> list[str]:
        """Healthy servers in random order, then those left out (soonest back first)."""
        healthy, out = self.health.split(list(servers))
        self.rand.shuffle(healthy)
        return healthy + out

    # -- put

    def put(self, queue: str, items: bytes | Sequence[bytes],
            expiry: float | None = None) -> Deferred[list[str]]:
        """
        Store C{items} (one bytes, or a sequence) on C{queue}, somewhere in the write set.

        C{expiry} is seconds from now (None: never). Fires with the server that
        acknowledged each item, in order; fails with L{AllServersFailed} when
        every write server refused some item, or L{NoServers}.
        """
        return Deferred.fromCoroutine(self._put(queue, items, expiry))

    async def _put(self, queue: str, items: bytes | Sequence[bytes],
                   expiry: float | None) -> list[str]:
        if not self.servers.known:
            await self._ready()
        batch = [items] if isinstance(items, bytes | bytearray) else list(items)
        stored_on: list[str | None] = [None] * len(batch)
        remaining = list(range(len(batch)))
        candidates = self._order(self.servers.write)
        if not candidates:
            raise NoServers(f"no server in the write set for {queue}")
        attempts: list[tuple[str, str]] = []
        for server in candidates:
            if not remaining:
                break
            conn = await self._lend(server, attempts)
            if conn is None:
                continue
            outcomes: list[tuple[bool, Any]]
            if len(remaining) == 1:  # the common case, without a DeferredList
                try:
                    outcomes = [(True, await conn.put_item(queue, bytes(batch[remaining[0]]),
                                                           expiry))]
                except Exception:
                    outcomes = [(False, Failure())]
            else:
                outcomes = await DeferredList([conn.put_item(queue, bytes(batch[i]), expiry)
                                               for i in remaining], consumeErrors=True)
            still: list[int] = []
            error: Failure | None = None
            for i, (ok, value) in zip(remaining, outcomes, strict=True):
                if ok and value:
                    stored_on[i] = server
                else:
                    still.append(i)
                    if not ok and error is None:
                        error = value
            if error is None:
                self.health.succeeded(server)
                self.pool.release(conn)
            else:
                self.pool.discard(conn)
                self._failed(server, error)
            if still:
                attempts.append((server, _reason(error) if error is not None
                                 else f"NOT_STORED ({len(still)} of {len(remaining)} items)"))
            remaining = still
        if remaining:
            raise AllServersFailed(f"put of {len(remaining)} item(s) to {queue}", attempts)
        return [s for s in stored_on if s is not None]

    # -- reads

    def read(self, queue: str, timeout: float | None = None) -> Deferred[ReadHandle | None]:
        """
        Open a reliable read on C{queue} somewhere in the read set.

        Fires with a L{ReadHandle}, or None when no item came within
        C{timeout} seconds (None or 0: do not wait). Fails with
        L{AllServersFailed} when no read server answered at all; its
        C{attempts} name every read server: those asked, with their failure,
        and those left out by an earlier failure (a read asks them only when
        every server is left out), with why and for how long.
        """
        return Deferred.fromCoroutine(self._read(queue, timeout))

    def get(self, queue: str, timeout: float | None = None) -> Deferred[bytes | None]:
        """
        Take one item from C{queue} (a read confirmed at once); None when none came in time.

        A confirm that fails (the server died in between) leaves the item to be
        delivered again: C{get} is at-least-once in that case.
        """
        return Deferred.fromCoroutine(self._get(queue, timeout))

    async def _get(self, queue: str, timeout: float | None) -> bytes | None:
        handle = await self._read(queue, timeout)
        if handle is None:
            return None
        try:
            await handle.confirm()
        except HandleClosed as e:
            self.log.warn("get from {queue}: {error}", queue=queue, error=e)
        return handle.data

    async def _read(self, queue: str, timeout: float | None) -> ReadHandle | None:
        if not self.servers.known:
            await self._ready()
        servers = self._order(self.servers.read)
        if not servers:
            raise NoServers(f"no server in the read set for {queue}")
        healthy = [s for s in servers if self.health.healthy(s)] or servers
        attempts: list[tuple[str, str]] = []
        started = self.reactor.seconds()
        for server in healthy:
            conn = await self._lend(server, attempts)
            if conn is None:
                continue
            try:
                got = await conn.take(queue, None, True)
            except CancelledError:
                raise
            except Exception as e:
                self.pool.discard(conn)
                self._failed(server, e)
                attempts.append((server, _reason(e)))
                continue
            self.health.succeeded(server)
            if got is not None:
                return ReadHandle(self, conn, queue, got[0], got[1])
            self.pool.release(conn)
        skipped = [s for s in servers if s not in healthy]
        if len(attempts) == len(healthy) and not timeout:
            raise AllServersFailed(f"read from {queue}", attempts + self._not_tried(skipped))
        if not timeout:
            return None
        # All empty (or failed): wait on every read server at once, the
        # healthy ones, or all of them when none is healthy now.
        waiting_on = [s for s in servers if self.health.healthy(s)] or servers
        left = timeout - (self.reactor.seconds() - started)  # the sweep counts too
        if left <= 0:
            return None
        return await _Race(self, queue, waiting_on, left,
                           [s for s in servers if s not in waiting_on]).result

    # -- worker loops and lifetime

    def read_stream(self, queue: str, handler: Callable[[bytes], Any], concurrency: int = 1,
                    **options: Any) -> ReadStream:
        """Start a L{kestrel.client.stream.ReadStream} of C{concurrency} workers on C{queue}."""
        stream = ReadStream(self, queue, handler, concurrency, **options)
        stream.start()
        return stream

    def close(self) -> Deferred[None]:
        """Close idle connections and stop discovery."""
        self.pool.close()
        return self.servers.stop()
