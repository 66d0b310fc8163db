"""
A blocking facade over the fleet client, for scripts that do not use Twisted.

The Twisted reactor runs in a daemon thread (started on first use, shared by
every L{BlockingClient} of the process); each call hands the operation to it
and waits for the result. Every wait is bounded by the client's own timeouts.
Do not use this from code that already runs the reactor: use
L{kestrel.client.KestrelClient} there.

    from kestrel.client.blocking import BlockingClient

    client = BlockingClient(servers=["10.0.0.1:22133", "10.0.0.2:22133"])
    client.put("jobs", [b"one", b"two"])
    handle = client.read("jobs", timeout=1.0)
    if handle is not None:
        print(handle.data)
        handle.confirm()
    client.close()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.threads import blockingCallFromThread

from kestrel.client.discovery import ZooKeeperServers, parse_zookeeper
from kestrel.client.fleet import KestrelClient, ReadHandle

_T = TypeVar("_T")
_lock = threading.Lock()


def running_reactor() -> Any:
    """The global reactor, started in a daemon thread if it is not running yet."""
    from twisted.internet import reactor  # noqa: TID251 - the facade owns the reactor thread

    with _lock:
        if not reactor.running:
            started = threading.Event()
            reactor.callWhenRunning(started.set)
            threading.Thread(target=reactor.run, kwargs={"installSignalHandlers": False},
                             daemon=True, name="kestrel-client-reactor").start()
            if not started.wait(10):
                raise RuntimeError("the reactor thread did not start")
    return reactor


class BlockingHandle:
    """A reliable read: C{data}, C{server}, and blocking C{confirm()} / C{abort()}."""

    def __init__(self, owner: BlockingClient, handle: ReadHandle) -> None:
        self._owner = owner
        self._handle = handle
        self.data = handle.data
        self.server = handle.server
        self.queue = handle.queue

    def confirm(self) -> None:
        """Confirm the item (raises L{kestrel.client.errors.HandleClosed} if it was lost)."""
        self._owner._call(self._handle.confirm)

    def abort(self) -> None:
        """Return the item to its queue."""
        self._owner._call(self._handle.abort)


class BlockingClient:
    """
    The fleet client with blocking calls. Give C{servers} (C{host:port} list) or
    C{zookeeper} (C{"zkhost:port/path_prefix"}); C{options} go to L{KestrelClient}.
    """

    def __init__(self, servers: Sequence[str] | None = None, zookeeper: str | None = None,
                 **options: Any) -> None:
        if (servers is None) == (zookeeper is None):
            raise ValueError("give either servers or zookeeper")
        self._reactor = running_reactor()

        def build() -> KestrelClient:
            if zookeeper is not None:
                hosts, prefix = parse_zookeeper(zookeeper)
                endpoint = options.get("protocol", "memcache")
                return KestrelClient(ZooKeeperServers(hosts, prefix, self._reactor,
                                                      endpoint=endpoint),
                                     reactor=self._reactor, **options)
            return KestrelClient(list(servers or ()), reactor=self._reactor, **options)

        self.client: KestrelClient = blockingCallFromThread(self._reactor, build)

    def _call(self, operation: Callable[..., Deferred[_T]], *args: Any) -> _T:
        # mypy cannot choose _R between the arms of blockingCallFromThread's union.
        return blockingCallFromThread(self._reactor, operation, *args)  # type: ignore[arg-type]

    def put(self, queue: str, items: bytes | Sequence[bytes],
            expiry: float | None = None) -> list[str]:
        """Store C{items}; return the server that acknowledged each one."""
        return self._call(self.client.put, queue, items, expiry)

    def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take one item, waiting up to C{timeout} seconds; None when none came."""
        return self._call(self.client.get, queue, timeout)

    def read(self, queue: str, timeout: float | None = None) -> BlockingHandle | None:
        """Open a reliable read, waiting up to C{timeout} seconds; None when none came."""
        handle = self._call(self.client.read, queue, timeout)
        return None if handle is None else BlockingHandle(self, handle)

    def close(self) -> None:
        """Close connections and stop discovery (the reactor thread keeps running)."""
        self._call(self.client.close)
