"""
The server's service tree: queues, listeners, status, ZooKeeper, with an explicit stop order.

L{make_kestrel_service} builds a L{KestrelService} over a
L{kestrel.server.KestrelServer}. Starting it opens a listener for each
enabled port on C{listen_address} at once, while the journals replay on the
reactor thread, one queue after another, smallest first
(L{kestrel.collection.QueueCollection.start_loading}): a queue serves as
soon as its own journal is replayed, and requests for a queue still loading
wait for it. It logs C{kestrel listening} with the ports when they are open
and queues still load, then one C{kestrel ready} line with the ports once
every queue is loaded (at once when there is nothing to replay). A journal
that cannot be read stops the server, as before. Stopping it closes the listeners and
waits for them, finishes the live sessions (their open reads go back to the
queues), and only then stops the collection, which waits for pending fsyncs
and closes the journals. The listeners are C{StreamServerEndpointService}
children of the L{KestrelService} C{MultiService}, built once in
L{make_kestrel_service} (the thrift and admin modules, and thriftpy2,
twisted.web and prometheus_client with them, only when their port is set);
C{MultiService} alone would stop the queues without waiting for them, which
is why start and stop spell out the order.

Signals (installed once the reactor runs, main thread only): SIGHUP reloads
the config in place (the handler only hops to the reactor); SIGTERM and SIGINT
(Ctrl-C) stop cleanly and the process then exits with status 0.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IReactorFromThreads,
    IReactorTCP,
    IReactorThreads,
    IReactorTime,
)
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.config import ServerConfig
from kestrel.errors import ConfigError, KestrelError, ShuttingDown
from kestrel.journal.chores import FileChores
from kestrel.metrics import SETTLE_INTERVAL
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from kestrel.server import KestrelServer
from kestrel.serverset import ServerSetPublisher

__all__ = ["DelayedStop", "KestrelService", "ListenerError", "ListenerService",
           "SHUTDOWN_DELAY", "ServerReactor", "make_kestrel_service", "server_reactor"]

#: Seconds between a C{shutdown} command and the start of the stop (as Kestrel's 100 ms).
SHUTDOWN_DELAY = 0.1

_log = Logger()


@runtime_checkable
class ServerReactor(Protocol):
    """
    The reactor the server runs on, as far as this module uses it directly:
    its lifecycle (C{IReactorCore}: C{running}, C{stop}, C{callWhenRunning}),
    timers (C{IReactorTime}), TCP (C{IReactorTCP}) and the hop from a signal
    handler (C{IReactorFromThreads}). Where a Twisted or kestrel API takes one
    of those interfaces, the reactor is adapted to it (C{IReactorTCP(reactor)}),
    which checks that it provides it. Every Twisted reactor is one; tests pass
    C{MemoryReactorClock}, which lacks only the hop that signal handlers make.
    """

    @property
    def running(self) -> bool:
        """Whether the reactor is running (C{IReactorCore.running})."""

    def stop(self) -> None:
        """Stop the reactor (C{IReactorCore.stop})."""

    def callWhenRunning(self, callable: Callable[..., Any], *args: Any,
                        **kwargs: Any) -> Any:
        """Call C{callable} once the reactor runs (C{IReactorCore.callWhenRunning})."""

    def seconds(self) -> float:
        """The current time (C{IReactorTime.seconds})."""

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any,
                  **kwargs: Any) -> IDelayedCall:
        """Call C{callable} in C{delay} seconds (C{IReactorTime.callLater})."""

    def callFromThread(self, callable: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call C{callable} on the reactor thread (C{IReactorFromThreads.callFromThread})."""

    def listenTCP(self, port: int, factory: Any, backlog: int = 50,
                  interface: str = "") -> IListeningPort:
        """Listen on a TCP port (C{IReactorTCP.listenTCP})."""


def server_reactor(reactor: object) -> ServerReactor:
    """
    Return C{reactor} as a L{ServerReactor}, or raise C{TypeError} when it
    lacks a member the server needs (checked at run time, for the launcher's
    global reactor).
    """
    if not isinstance(reactor, ServerReactor):
        raise TypeError(f"{type(reactor).__name__} cannot run the server: it needs "
                        "IReactorCore, IReactorTime, IReactorTCP and IReactorFromThreads")
    return reactor


class ListenerError(CannotListenError):
    """A listener's port cannot be opened; the message names the listener, address and port."""

    def __init__(self, name: str, error: CannotListenError) -> None:
        super().__init__(error.interface, error.port, error.socketError)
        self.name = name

    def __str__(self) -> str:
        reason = getattr(self.socketError, "strerror", None) or str(self.socketError)
        return (f"{self.name}_port: cannot listen on {self.interface or '*'}:{self.port} "
                f"for the {self.name} listener: {reason}")


class ListenerService(StreamServerEndpointService):
    """
    One listener (C{memcache}, C{text}, C{thrift} or C{admin}): a
    C{StreamServerEndpointService} named after its protocol.

    Starting it listens at once and raises L{ListenerError} (one line naming
    the listener, address and port) when the port cannot be opened;
    C{port} is the listening port while it runs.
    """

    name: str

    def __init__(self, name: str, endpoint: Any, factory: Any) -> None:
        super().__init__(endpoint, factory)
        self.setName(name)
        self.port: IListeningPort | None = None

    def privilegedStartService(self) -> None:
        """Listen now; a port that cannot be opened raises L{ListenerError}."""
        self._raiseSynchronously = True  # the base class's switch: raise a listen error here
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            self._waitingForPort = None
            self.running = False
            raise ListenerError(self.name, e) from e
        assert self._waitingForPort is not None
        self._waitingForPort.addCallback(self._listening)

    def _listening(self, port: IListeningPort) -> IListeningPort:
        self.port = port
        return port

    def stopService(self) -> Deferred[None]:
        """Stop listening; the Deferred fires once the port is closed."""
        self.port = None
        if self._waitingForPort is None:
            Service.stopService(self)
            return succeed(None)
        d: Deferred[None] = super().stopService()
        self._waitingForPort = None
        return d


def _listeners(config: ServerConfig, server: KestrelServer,
               reactor: ServerReactor) -> list[ListenerService]:
    """The listeners of every enabled port, in a fixed order (memcache, text, thrift, admin)."""
    listeners = []
    for name, port, make in [
        ("memcache", config.memcache_port, MemcacheFactory),
        ("text", config.text_port, TextFactory),
        ("thrift", config.thrift_port, _thrift_factory),
        ("admin", config.admin_port, _admin_site),
    ]:
        if port:
            address = config.admin_address if name == "admin" else config.listen_address
            endpoint = TCP4ServerEndpoint(IReactorTCP(reactor), port,
                                          backlog=config.listen_backlog,
                                          interface=address)
            listeners.append(ListenerService(name, endpoint, make(server)))
    return listeners


def _thrift_factory(server: KestrelServer) -> Any:
    """The thrift factory; thriftpy2 and its IDL are imported only when a thrift port is set."""
    from kestrel.protocols.thrift import ThriftFactory
    return ThriftFactory(server)


def _admin_site(server: KestrelServer) -> Any:
    """The admin site; twisted.web and prometheus_client are imported only with an admin port."""
    from kestrel.admin import make_admin_site
    return make_admin_site(server)


def port_number(port: IListeningPort) -> int:
    """The TCP port number C{port} listens on."""
    address = port.getHost()
    if not isinstance(address, IPv4Address | IPv6Address):
        raise TypeError(f"not a TCP listener: {address!r}")
    return address.port


def _advertised(listeners: Sequence[ListenerService],
                address: str) -> Callable[[], Mapping[str, tuple[str, int]]]:
    """A function returning the bound memcache, thrift and text listeners as C{(host, port)}."""

    def endpoints() -> dict[str, tuple[str, int]]:
        return {listener.name: (address, port_number(listener.port))
                for listener in listeners
                if listener.port is not None and listener.name in ("memcache", "thrift", "text")}
    return endpoints


class DelayedStop:
    """
    The server's C{shutdown} command: stop the reactor (and so the service)
    L{SHUTDOWN_DELAY} seconds after the first request; later requests change nothing.
    """

    def __init__(self, reactor: ServerReactor) -> None:
        self.reactor = reactor
        self._call: IDelayedCall | None = None

    def __call__(self) -> None:
        """Schedule the stop, once."""
        if self._call is None:
            self._call = self.reactor.callLater(SHUTDOWN_DELAY, self.reactor.stop)


class KestrelService(MultiService):
    """
    The whole server as one service: start listens while the journals
    replay; stop unwinds in order.

    Its children are the L{ListenerService}s, one per enabled port. They do
    not open in C{privilegedStartService} (which twistd calls first), but in
    L{startService}, once the queue collection has listed the queues to
    load; and they stop before the queue collection, in the order
    L{stopService} spells out. C{loaded} fires once every queue is loaded.

    @ivar file_chores: the journals' L{FileChores} (None on a reactor
        without threads), stopped last.

    While it runs, the server's latency and size histograms are settled
    every L{SETTLE_INTERVAL} seconds (L{kestrel.metrics.Metrics.settle}),
    which bounds the values that wait uncounted.
    """

    _log = Logger()
    name = "kestrel"

    def __init__(self, server: KestrelServer, reactor: ServerReactor,
                 listeners: Sequence[ListenerService], *,
                 zookeeper: IService | None = None,
                 install_signal_handlers: bool = True,
                 file_chores: FileChores | None = None) -> None:
        super().__init__()
        self.server = server
        self.reactor = reactor
        self.zookeeper = zookeeper
        self.file_chores = file_chores
        self.install_signal_handlers = install_signal_handlers
        for listener in listeners:
            listener.setServiceParent(self)
        self._old_handlers: dict[int, Any] = {}
        self._stopping: Deferred[None] | None = None
        self._settle_metrics = LoopingCall(server.metrics.settle)
        self._settle_metrics.clock = IReactorTime(reactor)
        #: Fires once every queue is loaded (set by L{startService}).
        self.loaded: Deferred[None] = Deferred()
        #: Why the server stopped itself after it started listening (a
        #: journal that cannot be replayed), or C{None}: the launcher turns it
        #: into exit status 1 (L{kestrel.tap.StartErrors}).
        self.start_error: str | None = None

    @property
    def ports(self) -> dict[str, IListeningPort]:
        """The listening ports by listener name, while running."""
        return {child.name: child.port for child in self
                if isinstance(child, ListenerService) and child.port is not None}

    def privilegedStartService(self) -> None:
        """Nothing: the listeners open in L{startService}."""
        Service.privilegedStartService(self)

    def startService(self) -> None:
        """
        Start replaying the journals, open every listener, log C{kestrel
        listening}, and C{kestrel ready} once every queue is loaded.

        The server joins its ZooKeeper server sets once every queue is loaded
        (at once when there is nothing to replay), so that a client finding
        it there finds every queue served, as when the replay came before
        the listeners.

        A listener that cannot be opened (or a ZooKeeper publisher that cannot
        start) stops what was started and raises; after a replay, a publisher
        that cannot start stops the server (C{start_error}). A journal that
        cannot be replayed stops the server (the reactor), as it did when the
        replay came before the listeners.
        """
        Service.startService(self)
        server = self.server
        self._settle_metrics.start(SETTLE_INTERVAL, now=False)
        self.loaded = server.collection.start_loading()
        address = server.config.listen_address
        try:
            for child in self:
                child.startService()
            if self.zookeeper is not None and not server.collection.queues_loading():
                self.zookeeper.startService()
        except Exception as e:
            if isinstance(e, CannotListenError | KestrelError):  # an operator error: one line
                self._log.error("kestrel cannot start ({error}); stopping", error=str(e))
            else:
                self._log.failure("kestrel cannot start; stopping")
            for child in self:
                if child.running:
                    child.stopService()
            self._settle_metrics.stop()
            self.loaded.addErrback(lambda _: None)
            server.collection.stopService()
            self.running = False
            raise
        bound = {name: port_number(port) for name, port in self.ports.items()}
        listeners = " ".join(f"{name}={port}" for name, port in bound.items()) or "no ports"
        loading = server.collection.queues_loading()
        if loading:
            self._log.info(
                "kestrel listening on {address}: {listeners}; {count} queue(s) still loading",
                address=address, listeners=listeners, ports=bound, count=loading)

        def ready(_: object) -> None:
            self._log.info("kestrel ready on {address}: {listeners}", address=address,
                           listeners=listeners, ports=bound)

        def failed(failure: Failure) -> None:
            if self._stopping is not None or failure.check(ShuttingDown):
                return
            self._log.error("kestrel cannot start (a journal cannot be replayed: {error}); "
                            "stopping", error=failure.getErrorMessage())
            self.start_error = f"a journal cannot be replayed: {failure.getErrorMessage()}"
            if self.reactor.running:
                self.reactor.stop()
            else:
                self.reactor.callWhenRunning(self.reactor.stop)

        if self.zookeeper is not None and not self.zookeeper.running:
            self.loaded.addCallback(self._join_server_sets)
        self.loaded.addCallbacks(ready, failed)
        if self.install_signal_handlers:
            self.reactor.callWhenRunning(self._install_signals)

    def _join_server_sets(self, result: object) -> object:
        """Every queue is loaded: join the ZooKeeper server sets (or stop, if that fails)."""
        zookeeper = self.zookeeper
        if zookeeper is None or zookeeper.running or self._stopping is not None:
            return result
        try:
            zookeeper.startService()
        except Exception as e:
            self._log.error("kestrel cannot join its ZooKeeper server sets ({error}); stopping",
                            error=str(e))
            self.start_error = f"zookeeper: {e}"
            if self.reactor.running:
                self.reactor.stop()
            else:
                self.reactor.callWhenRunning(self.reactor.stop)
        return result

    def stopService(self) -> Deferred[None]:
        """
        Stop in order: ZooKeeper, listeners (waited for), live sessions, the
        queue collection (pending fsyncs, journals closed), then the
        journals' file chores.
        """
        if self._stopping is not None:
            return self._stopping
        Service.stopService(self)
        if self._settle_metrics.running:
            self._settle_metrics.stop()
        self._restore_signals()
        self._log.info("kestrel stopping")
        d: Deferred[Any] = succeed(None)
        if self.zookeeper is not None and self.zookeeper.running:
            d.addCallback(lambda _: maybeDeferred(self.zookeeper.stopService))  # type: ignore
            d.addErrback(self._logged, "Stopping ZooKeeper failed")
        d.addCallback(lambda _: self._stop_listening())
        d.addCallback(lambda _: self._disconnect_clients())
        d.addCallback(lambda _: self.server.collection.stopService())
        d.addErrback(self._logged, "Stopping the queues failed")
        d.addCallback(lambda _: self._stop_file_chores())
        d.addCallback(lambda _: self._log.info("kestrel stopped"))
        self._stopping = d
        return d

    def _stop_file_chores(self) -> None:
        """Let the journals' file chores (closing replaced files) finish: 5 seconds at most."""
        if self.file_chores is not None and not self.file_chores.stop(timeout=5.0):
            self._log.warn("File chores still running at stop; the process exits without them")

    def _logged(self, failure: Failure, why: str) -> None:
        self._log.failure(why, failure)

    def _stop_listening(self) -> Deferred[Any]:
        """Stop every running listener (last first) and wait for all of them."""
        return DeferredList([maybeDeferred(child.stopService)
                             for child in reversed(list(self)) if child.running],
                            consumeErrors=True)

    def _disconnect_clients(self) -> None:
        """Finish every live session so open reads return to their queues before close."""
        for child in self:
            disconnect = getattr(getattr(child, "factory", None), "disconnect_all", None)
            if disconnect is not None:
                disconnect()

    # -- signals -----------------------------------------------------------

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread() or not self.running:
            return
        for signum, handler in [(signal.SIGHUP, self._on_sighup),
                                (signal.SIGTERM, self._on_sigterm),
                                (signal.SIGINT, self._on_sigterm)]:
            self._old_handlers[signum] = signal.signal(signum, handler)

    def _restore_signals(self) -> None:
        old, self._old_handlers = self._old_handlers, {}
        for signum, handler in old.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(signum, handler)

    def _on_sighup(self, signum: int, frame: object) -> None:
        self.reactor.callFromThread(self.reload)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.reactor.callFromThread(self._log.info, "Received {signal}, shutting down",
                                    signal=signal.Signals(signum).name)
        self.reactor.callFromThread(self.reactor.stop)

    def reload(self) -> None:
        """Reload the config file in place (SIGHUP); a broken file is logged and ignored."""
        try:
            self.server.reload()
        except ConfigError as e:
            self._log.error("Reload on SIGHUP failed: {problems}", problems=str(e))
        except Exception:
            self._log.failure("Reload on SIGHUP failed")
        else:
            self._log.info("Config reloaded on SIGHUP")


def _run_in_thread(reactor: ServerReactor) -> Callable[[Callable[[], Any]], Deferred[Any]] | None:
    """Run blocking work (fsync) in the reactor's thread pool, when it has one."""
    if not IReactorThreads.providedBy(reactor):
        return None
    threads = IReactorThreads(reactor)

    def run(work: Callable[[], Any]) -> Deferred[Any]:
        return deferToThreadPool(threads, threads.getThreadPool(), work)
    return run


def make_kestrel_service(config: ServerConfig, reactor: ServerReactor,
                         config_path: str | None = None, *,
                         install_signal_handlers: bool = True) -> KestrelService:
    """
    Build the server described by C{config} on C{reactor}, ready to start.

    C{config_path} is the file C{reload} rereads (None: reload keeps the
    config). Nothing touches the disk or the network until C{startService}
    (except creating C{queue_path}).
    """
    run_in_thread = _run_in_thread(reactor)
    # Chores need a thread as run_in_thread does: without it (a test reactor)
    # the journals do that work inline.
    chores = FileChores() if run_in_thread is not None else None
    server = KestrelServer.from_config(config, IReactorTime(reactor), config_path=config_path,
                                       run_in_thread=run_in_thread, file_chores=chores,
                                       on_shutdown=DelayedStop(reactor))
    listeners = _listeners(config, server, reactor)
    zookeeper = None
    if config.zookeeper is not None:
        zookeeper = ServerSetPublisher.from_config(
            config.zookeeper, server.status, _advertised(listeners, config.listen_address),
            # callFromThread is all IReactorFromThreads declares, and a ServerReactor has
            # it; zope interfaces are nominal to mypy. (Not adapted: a test reactor such as
            # MemoryReactorClock does not declare it, and a publisher not started never hops.)
            cast(IReactorFromThreads, reactor))
    return KestrelService(server, reactor, listeners, zookeeper=zookeeper,
                          install_signal_handlers=install_signal_handlers,
                          file_chores=chores)
