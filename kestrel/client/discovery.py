"""
Where the servers are: a static list, or Twitter server sets in ZooKeeper.

A server set gives two lists of C{host:port} names: C{read} (servers to read
from) and C{write} (servers to write to), and calls its subscribers on the
reactor thread whenever either changes. C{ready()} fires once the first
membership is known.

L{ZooKeeperServers} follows C{<path_prefix>/read} and C{<path_prefix>/write}
as the server publishes them (see C{docs/zookeeper.md}): a member counts only
while its status is C{ALIVE}. kazoo is blocking, so every ZooKeeper call runs
on one worker thread; watches and connection-state changes schedule a full
re-read of both sets there, and the result is handed to the reactor with
C{callFromThread}. While ZooKeeper is unreachable the last membership stays
in use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from kestrel.client.errors import ClientError
from kestrel.client.pool import split_address

Listener = Callable[[], None]


class ServerSet:
    """The base of server sets: two membership lists and change listeners."""

    def __init__(self) -> None:
        self.read: list[str] = []
        self.write: list[str] = []
        self._listeners: list[Listener] = []
        self._ready: list[Deferred[None]] = []
        self.known = False

    def subscribe(self, listener: Listener) -> None:
        """Call C{listener()} (on the reactor thread) after every membership change."""
        self._listeners.append(listener)

    def ready(self) -> Deferred[None]:
        """A Deferred firing once the first membership is known."""
        if self.known:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._ready.append(d)
        return d

    def update(self, read: Sequence[str], write: Sequence[str]) -> None:
        """Replace both memberships (reactor thread) and tell listeners if they changed."""
        read, write = sorted(set(read)), sorted(set(write))
        changed = not self.known or read != self.read or write != self.write
        self.read, self.write = read, write
        if not self.known:
            self.known = True
            waiting, self._ready = self._ready, []
            for d in waiting:
                d.callback(None)
        if changed:
            for listener in list(self._listeners):
                listener()

    def start(self) -> None:
        """Begin following the membership (nothing to do for a static set)."""

    def stop(self) -> Deferred[None]:
        """Stop following it; fires when done."""
        return succeed(None)


class StaticServers(ServerSet):
    """A fixed list of servers, each in both the read and the write set."""

    def __init__(self, servers: Sequence[str]) -> None:
        super().__init__()
        if not servers:
            raise ClientError("no servers given")
        self.update(servers, servers)


def parse_servers(text: str) -> list[str]:
    """C{"h:p,h:p"} as a list of C{host:port} names."""
    servers = [s.strip() for s in text.split(",") if s.strip()]
    for server in servers:
        split_address(server)  # raises ValueError for one that is not host:port
    return servers


def parse_zookeeper(text: str) -> tuple[str, str]:
    """C{"zkhost:port[,zkhost:port]/path/prefix"} as C{(hosts, path_prefix)}."""
    hosts, slash, path = text.partition("/")
    if not hosts or not slash:
        raise ValueError(f"expected zkhost:port/path_prefix, got {text!r}")
    return hosts, "/" + path.rstrip("/")


def member_address(data: bytes, endpoint: str = "memcache") -> str | None:
    """
    The C{host:port} of one ServerSet member's C{endpoint}, or None when it is
    not C{ALIVE}, lacks that endpoint, or is not readable JSON.
    """
    try:
        document = json.loads(data.decode("utf-8"))
        if document.get("status") != "ALIVE":
            return None
        found = document.get("additionalEndpoints", {}).get(endpoint)
        if found is None and endpoint == "memcache":
            found = document.get("serviceEndpoint")
        if found is None:
            return None
        host, port = str(found["host"]), int(found["port"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ZooKeeperServers(ServerSet):
    """
    The read and write server sets under C{path_prefix} in ZooKeeper at C{hosts}.

    C{endpoint} names the listener to use (C{memcache}). C{client_factory}
    builds the kazoo client (tests may pass options). C{refresh_every}
    re-reads the sets even without a watch firing, as a safety net.
    """

    _log = Logger()

    def __init__(self, hosts: str, path_prefix: str, reactor: Any, *,
                 endpoint: str = "memcache", session_timeout: float = 10.0,
                 refresh_every: float = 30.0,
                 client_factory: Callable[..., Any] | None = None) -> None:
        super().__init__()
        self.hosts = hosts
        self.path_prefix = path_prefix.rstrip("/")
        self.endpoint = endpoint
        self.session_timeout = session_timeout
        self.refresh_every = refresh_every
        self._reactor = reactor
        self._client_factory = client_factory
        self._pool: ThreadPool | None = None
        self._client: Any = None
        self._refresh_queued = False
        self._timer: Any = None
        self._stopping = False

    def start(self) -> None:
        """Start the worker thread, connect, and read both sets (watching them)."""
        if self._pool is not None:
            return
        self._stopping = False
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="kestrel-client-zookeeper")
        self._pool.start()
        if hasattr(self._reactor, "addSystemEventTrigger"):
            # Never keep the process alive at exit with a forgotten worker thread.
            self._reactor.addSystemEventTrigger("before", "shutdown", self.stop)
        self._run(self._connect)
        self._schedule_refresh()

    def stop(self) -> Deferred[None]:
        """Close the ZooKeeper client and the worker thread."""
        self._stopping = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self._pool is None:
            return succeed(None)
        d = self._run(self._close)

        def stop_pool(result: object) -> None:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.stop()

        return d.addBoth(stop_pool)

    # -- reactor thread

    def _run(self, job: Callable[[], Any]) -> Deferred[Any]:
        assert self._pool is not None
        d: Deferred[Any] = deferToThreadPool(self._reactor, self._pool, job)
        return d

    def _schedule_refresh(self) -> None:
        if self._stopping or self._pool is None or self._refresh_queued:
            return
        self._refresh_queued = True
        d = self._run(self._read_sets)
        d.addCallbacks(self._got_sets, self._refresh_failed)

    def _got_sets(self, sets: tuple[list[str], list[str]] | None) -> None:
        self._rearm()
        if sets is not None and not self._stopping:
            before = (list(self.read), list(self.write))
            self.update(*sets)
            if before != (self.read, self.write):
                self._log.info("fleet servers now read={read} write={write}",
                               read=self.read, write=self.write)

    def _refresh_failed(self, failure: Any) -> None:
        self._rearm()
        self._log.warn("reading server sets from ZooKeeper failed: {error}",
                       error=failure.getErrorMessage())

    def _rearm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if not self._stopping:
            self._timer = self._reactor.callLater(self.refresh_every, self._schedule_refresh)

    # -- worker thread (and kazoo's threads for the watch callbacks)

    def _watch(self, *_: Any) -> None:
        """A kazoo watch fired (kazoo thread): re-read both sets."""
        self._reactor.callFromThread(self._schedule_refresh)

    def _on_state(self, state: str) -> None:
        if str(state) == "CONNECTED":
            self._reactor.callFromThread(self._schedule_refresh)

    def _connect(self) -> None:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        log = logging.getLogger("kestrel.client.discovery.kazoo")
        factory = self._client_factory or KazooClient
        client = factory(hosts=self.hosts, timeout=self.session_timeout,
                         connection_retry=KazooRetry(max_tries=-1, max_delay=2.0),
                         command_retry=KazooRetry(max_tries=3, max_delay=1.0), logger=log)
        client.add_listener(self._on_state)
        self._client = client
        client.start_async().wait(self.session_timeout)

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.stop()
            client.close()

    def _read_sets(self) -> tuple[list[str], list[str]] | None:
        """Read both sets with watches set (worker thread); None when not connected."""
        self._refresh_queued_done()
        client = self._client
        if client is None or not client.connected:
            return None
        from kazoo.exceptions import NoNodeError

        found: list[list[str]] = []
        for kind in ("read", "write"):
            path = f"{self.path_prefix}/{kind}"
            members: list[str] = []
            if client.exists(path, watch=self._watch) is not None:
                try:
                    children = client.get_children(path, watch=self._watch)
                except NoNodeError:
                    children = []
                for child in sorted(children):
                    try:
                        data, _ = client.get(f"{path}/{child}", watch=self._watch)
                    except NoNodeError:
                        continue
                    address = member_address(data, self.endpoint)
                    if address is not None:
                        members.append(address)
            found.append(members)
        return found[0], found[1]

    def _refresh_queued_done(self) -> None:
        # A watch firing from now on needs a new read: this one may miss it.
        self._reactor.callFromThread(setattr, self, "_refresh_queued", False)
