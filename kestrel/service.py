"""
The server's service tree: queues, listeners, status, ZooKeeper, with an explicit stop order.

L{make_kestrel_service} builds a L{KestrelService} over a
L{kestrel.server.KestrelServer}. Starting it replays every journal
(synchronously, inside L{kestrel.collection.QueueCollection.startService}),
then opens a listener for each enabled port on C{listen_address}, then logs
one C{kestrel ready} line with the ports. Stopping it closes the listeners and
waits for them, finishes the live sessions (their open reads go back to the
queues), and only then stops the collection, which waits for pending fsyncs
and closes the journals. C{MultiService} would stop children without waiting
for one another, which is why the order is spelled out here.

Signals (installed once the reactor runs, main thread only): SIGHUP reloads
the config in place (the handler only hops to the reactor); SIGTERM and SIGINT
(Ctrl-C) stop cleanly and the process then exits with status 0.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import IService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.config import ServerConfig
from kestrel.errors import ConfigError, KestrelError
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.server import KestrelServer

__all__ = ["KestrelService", "Listener", "SHUTDOWN_DELAY", "make_kestrel_service"]

#: Seconds between a C{shutdown} command and the start of the stop (as Kestrel's 100 ms).
SHUTDOWN_DELAY = 0.1

_log = Logger()


class ListenerError(CannotListenError):
    """A listener's port cannot be opened; the message names the listener, address and port."""

    def __init__(self, name: str, error: CannotListenError) -> None:
        super().__init__(error.interface, error.port, error.socketError)
        self.name = name

    def __str__(self) -> str:
        reason = getattr(self.socketError, "strerror", None) or str(self.socketError)
        return (f"{self.name}_port: cannot listen on {self.interface or '*'}:{self.port} "
                f"for the {self.name} listener: {reason}")


@attrs.frozen
class Listener:
    """One TCP listener to open: its name (C{memcache}, ...), port and factory."""

    name: str
    port: int
    factory: Any
    #: The address to bind; None: C{listen_address}.
    address: str | None = None


def _optional_factory(module: str, attribute: str, server: KestrelServer) -> Any:
    """
    Build a factory from C{module.attribute(server)}, or return None if that
    module is not part of this installation (logged).
    """
    try:
        mod = __import__(module, fromlist=[attribute])
        make = getattr(mod, attribute)
    except (ImportError, AttributeError) as e:
        _log.warn("{module}.{attribute} is not available ({error}); listener disabled",
                  module=module, attribute=attribute, error=str(e))
        return None
    return make(server)


def _listeners(config: ServerConfig, server: KestrelServer) -> list[Listener]:
    """The listeners of every enabled port, in a fixed order."""
    listeners = []
    if config.memcache_port:
        listeners.append(Listener("memcache", config.memcache_port, MemcacheFactory(server)))
    for name, port, module, attribute in [
        ("text", config.text_port, "kestrel.protocols.text", "TextFactory"),
        ("thrift", config.thrift_port, "kestrel.protocols.thrift", "ThriftFactory"),
        ("admin", config.admin_port, "kestrel.admin", "make_admin_site"),
    ]:
        if port:
            factory = _optional_factory(module, attribute, server)
            if factory is not None:
                address = config.admin_address if name == "admin" else None
                listeners.append(Listener(name, port, factory, address))
    return listeners


class KestrelService(Service):
    """
    The whole server as one service: start replays then listens; stop unwinds in order.

    @ivar ports: the listening ports by listener name, while running.
    """

    _log = Logger()
    name = "kestrel"

    def __init__(self, server: KestrelServer, reactor: Any, listeners: list[Listener], *,
                 zookeeper: IService | None = None,
                 install_signal_handlers: bool = True) -> None:
        self.server = server
        self.reactor = reactor
        self.listeners = listeners
        self.zookeeper = zookeeper
        self.install_signal_handlers = install_signal_handlers
        self.ports: dict[str, IListeningPort] = {}
        self._old_handlers: dict[int, Any] = {}
        self._stopping: Deferred[None] | None = None
        self._shutdown_call: Any = None

    def startService(self) -> None:
        """
        Replay the journals, open every listener, then log C{kestrel ready}.

        A listener that cannot be opened (or a ZooKeeper publisher that cannot
        start) stops what was started and raises.
        """
        super().startService()
        server = self.server
        server.collection.startService()
        address = server.config.listen_address
        try:
            for listener in self.listeners:
                try:
                    self.ports[listener.name] = self.reactor.listenTCP(
                        listener.port, listener.factory, interface=listener.address or address)
                except CannotListenError as e:
                    raise ListenerError(listener.name, e) from e
            if self.zookeeper is not None:
                self.zookeeper.startService()
        except Exception as e:
            if isinstance(e, CannotListenError | KestrelError):  # an operator error: one line
                self._log.error("kestrel cannot start ({error}); stopping", error=str(e))
            else:
                self._log.failure("kestrel cannot start; stopping")
            for port in self.ports.values():
                port.stopListening()
            self.ports.clear()
            server.collection.stopService()
            self.running = False
            raise
        server.shutdown_callback = self.shutdown_soon
        bound = {name: port.getHost().port for name, port in self.ports.items()}
        self._log.info(
            "kestrel ready on {address}: {listeners}",
            address=address,
            listeners=" ".join(f"{name}={port}" for name, port in bound.items()) or "no ports",
            ports=bound,
        )
        if self.install_signal_handlers:
            self.reactor.callWhenRunning(self._install_signals)

    def advertised_endpoints(self) -> dict[str, tuple[str, int]]:
        """The bound C{memcache}, C{thrift} and C{text} listeners as C{(host, port)}."""
        address = self.server.config.listen_address
        return {name: (address, port.getHost().port) for name, port in self.ports.items()
                if name in ("memcache", "thrift", "text")}

    def shutdown_soon(self) -> None:
        """Stop the reactor (and so this service) L{SHUTDOWN_DELAY} seconds from now."""
        if self._shutdown_call is None:
            self._shutdown_call = self.reactor.callLater(SHUTDOWN_DELAY, self.reactor.stop)

    def stopService(self) -> Deferred[None]:
        """
        Stop in order: ZooKeeper, listeners (waited for), live sessions, then
        the queue collection (pending fsyncs, journals closed).
        """
        if self._stopping is not None:
            return self._stopping
        super().stopService()
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
        d.addCallback(lambda _: self._log.info("kestrel stopped"))
        self._stopping = d
        return d

    def _logged(self, failure: Failure, why: str) -> None:
        self._log.failure(why, failure)

    def _stop_listening(self) -> Deferred[Any]:
        ports, self.ports = list(self.ports.values()), {}
        return DeferredList([maybeDeferred(p.stopListening) for p in ports], consumeErrors=True)

    def _disconnect_clients(self) -> None:
        """Finish every live session so open reads return to their queues before close."""
        for listener in self.listeners:
            disconnect = getattr(listener.factory, "disconnect_all", None)
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


def _run_in_thread(reactor: Any) -> Callable[[Callable[[], Any]], Deferred[Any]] | None:
    """Run blocking work (fsync) in the reactor's thread pool, when it has one."""
    if not IReactorThreads.providedBy(reactor):
        return None

    def run(work: Callable[[], Any]) -> Deferred[Any]:
        return deferToThreadPool(reactor, reactor.getThreadPool(), work)
    return run


def _zookeeper_service(config: ServerConfig, service: KestrelService) -> IService | None:
    """The ZooKeeper server-set publisher when configured and installed, else None."""
    if config.zookeeper is None:
        return None
    try:
        from kestrel.serverset import ServerSetPublisher
    except ImportError as e:
        _log.error("zookeeper is configured but kestrel.serverset is unavailable: {error}",
                   error=str(e))
        return None
    return ServerSetPublisher.from_config(config.zookeeper, service.server.status,
                                          service.advertised_endpoints, service.reactor)


def make_kestrel_service(config: ServerConfig, reactor: Any,
                         config_path: str | None = None, *,
                         install_signal_handlers: bool = True) -> KestrelService:
    """
    Build the server described by C{config} on C{reactor}, ready to start.

    C{config_path} is the file C{reload} rereads (None: reload keeps the
    config). Nothing touches the disk or the network until C{startService}
    (except creating C{queue_path}).
    """
    server = KestrelServer.from_config(config, reactor, config_path=config_path,
                                       run_in_thread=_run_in_thread(reactor))
    service = KestrelService(server, reactor, _listeners(config, server),
                             install_signal_handlers=install_signal_handlers)
    service.zookeeper = _zookeeper_service(config, service)
    return service
