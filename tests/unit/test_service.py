"""Wiring tests of kestrel.service on a MemoryReactorClock: nothing is bound."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from zope.interface import implementer

from kestrel.config import DEFAULT_CONFIG, ServerConfig
from kestrel.errors import KestrelError
from kestrel.metrics import SETTLE_INTERVAL
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.service import SHUTDOWN_DELAY, KestrelService, make_kestrel_service


def config_in(tmp_path: Path, **overrides: Any) -> ServerConfig:
    return attrs.evolve(DEFAULT_CONFIG, queue_path=str(tmp_path / "queues"),
                        status_file=str(tmp_path / "status"), **overrides)


def build(config: ServerConfig, reactor: Any) -> KestrelService:
    return make_kestrel_service(config, reactor, install_signal_handlers=False)


class ProbeReactor(MemoryReactorClock):
    """A MemoryReactorClock whose ports stop only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping: list[Deferred[None]] = []
        self.seen_at_listen: list[list[str]] = []
        self.service: KestrelService | None = None

    def listenTCP(self, port: int, factory: Any, backlog: int = 50,
                  interface: str = "") -> Any:
        if self.service is not None:
            self.seen_at_listen.append(self.service.server.collection.queue_names())
        real = super().listenTCP(port, factory, backlog, interface)
        reactor = self

        class Port:
            def getHost(self) -> Any:
                return real.getHost()

            def stopListening(self) -> Deferred[None]:
                d: Deferred[None] = Deferred()
                reactor.stopping.append(d)
                return d
        return Port()


def test_listeners_on_listen_address(tmp_path: Path) -> None:
    """Every enabled port gets a listener on listen_address; port 0 is disabled."""
    reactor = MemoryReactorClock()
    service = build(config_in(tmp_path, memcache_port=22100, text_port=0, thrift_port=22101,
                              admin_port=0, listen_address="127.0.0.2"), reactor)
    service.startService()
    servers = [(port, interface) for port, _f, _b, interface in reactor.tcpServers]
    assert servers == [(22100, "127.0.0.2"), (22101, "127.0.0.2")]
    assert isinstance(reactor.tcpServers[0][1], MemcacheFactory)
    service.stopService()


def test_metrics_settled_on_the_clock_while_running(tmp_path: Path) -> None:
    """
    While the server runs, every histogram is settled each SETTLE_INTERVAL:
    what waits uncounted is what the last interval recorded; stopped, no
    timer is left behind.
    """
    reactor = MemoryReactorClock()
    service = build(config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0), reactor)
    service.startService()
    metrics = service.server.metrics
    queue = metrics.queue("q")
    queue.item_added(10, 1)
    metrics.record_fsync(0.5)
    reactor.advance(SETTLE_INTERVAL / 2)
    assert queue.request_size.pending == [10] and metrics.fsync_delay_usec.pending == [5e5]
    reactor.advance(SETTLE_INTERVAL / 2)
    assert queue.request_size.pending == [] and metrics.fsync_delay_usec.pending == []
    queue.item_added(20, 2)
    reactor.advance(SETTLE_INTERVAL)
    assert queue.queue_size.pending == [] and queue.request_size.total == 30
    service.stopService()
    assert not [call for call in reactor.getDelayedCalls() if call.active()]


def test_listening_before_replay_then_ready(tmp_path: Path) -> None:
    """
    The listeners open before any journal is replayed (`kestrel listening`);
    one `kestrel ready` event follows once every queue is loaded.
    """
    config = config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0)
    first = build(config, MemoryReactorClock())
    first.startService()
    assert first.server.collection.add("old", b"x").result is True
    first.stopService()

    reactor = ProbeReactor()
    service = build(config, reactor)
    reactor.service = service
    with capturedLogs() as events:
        service.startService()
        assert reactor.seen_at_listen == [[]]
        assert service.server.collection.loading_names() == ["old"]
        listening = [e for e in events
                     if e.get("log_format", "").startswith("kestrel listening")]
        assert len(listening) == 1 and listening[0]["count"] == 1
        assert not [e for e in events if e.get("log_format", "").startswith("kestrel ready")]
        assert not service.loaded.called
        reactor.advance(0)
    assert service.loaded.called
    assert service.server.collection.queue_names() == ["old"]
    ready = [e for e in events if e.get("log_format", "").startswith("kestrel ready")]
    assert len(ready) == 1
    assert ready[0]["ports"] == {"memcache": 22133}
    service.stopService()
    for d in reactor.stopping:
        d.callback(None)


def test_stop_waits_for_listeners_before_closing_queues(tmp_path: Path) -> None:
    """The collection stops only after every listener has stopped."""
    reactor = ProbeReactor()
    service = build(config_in(tmp_path, text_port=0, admin_port=0), reactor)
    service.startService()
    stopped = service.stopService()
    assert len(reactor.stopping) == 2
    assert service.server.collection.running
    reactor.stopping[0].callback(None)
    assert service.server.collection.running
    reactor.stopping[1].callback(None)
    assert not service.server.collection.running
    assert stopped.called


def test_stop_returns_open_reads(tmp_path: Path) -> None:
    """Stopping finishes live sessions first: their open reads are back in the journal."""
    config = config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0)
    reactor = MemoryReactorClock()
    service = build(config, reactor)
    service.startService()
    factory = reactor.tcpServers[0][1]
    proto = factory.buildProtocol(None)
    transport = StringTransportWithDisconnection()
    transport.protocol = proto
    proto.makeConnection(transport)
    proto.dataReceived(b"set q 0 0 1\r\na\r\nget q/open\r\n")
    assert transport.value() == b"STORED\r\nVALUE q/open 0 1\r\na\r\nEND\r\n"
    service.stopService()
    assert proto.session.finished

    again = build(config, MemoryReactorClock())
    again.startService()
    again.reactor.advance(0)
    item = again.server.collection.remove("q").result
    assert item is not None and item.data == b"a"
    again.stopService()


def test_shutdown_command_stops_reactor(tmp_path: Path) -> None:
    """request_shutdown stops the reactor SHUTDOWN_DELAY seconds later."""
    reactor = MemoryReactorClock()
    service = build(config_in(tmp_path), reactor)
    service.startService()
    service.server.request_shutdown()
    reactor.advance(SHUTDOWN_DELAY - 0.01)
    assert not reactor.hasStopped
    reactor.advance(0.02)
    assert reactor.hasStopped
    service.stopService()


def test_listen_failure_stops_queues(tmp_path: Path) -> None:
    """A port that cannot be opened makes startService raise with the queues stopped."""

    class Busy(MemoryReactorClock):
        def listenTCP(self, port: int, factory: Any, backlog: int = 50,
                      interface: str = "") -> Any:
            raise CannotListenError(interface, port, OSError("in use"))

    service = build(config_in(tmp_path), Busy())
    with pytest.raises(CannotListenError):
        service.startService()
    assert not service.server.collection.running
    assert not service.running


def test_reload_applies_config_file(tmp_path: Path) -> None:
    """The service's reload (SIGHUP) rereads the file; a broken file keeps the config."""
    path = tmp_path / "kestrel.yaml"
    path.write_text(f"queue_path: {tmp_path / 'queues'}\ndefault: {{max_items: 7}}\n")
    config = config_in(tmp_path)
    service = make_kestrel_service(config, MemoryReactorClock(), config_path=str(path),
                                   install_signal_handlers=False)
    service.startService()
    service.reload()
    assert service.server.config.default.max_items == 7
    path.write_text("nonsense_key: 1\n")
    with capturedLogs() as events:
        service.reload()
    assert service.server.config.default.max_items == 7
    assert any("nonsense_key" in str(e.get("problems", "")) for e in events)
    service.stopService()


def test_no_zookeeper_by_default(tmp_path: Path) -> None:
    """Without a zookeeper section no publisher is built."""
    assert build(config_in(tmp_path), MemoryReactorClock()).zookeeper is None


def test_zookeeper_publisher_built_when_configured(tmp_path: Path) -> None:
    """With a zookeeper section a server-set publisher is built (not started) over the status."""
    from kestrel.config import ZooKeeperConfig
    from kestrel.serverset import ServerSetPublisher

    config = config_in(tmp_path, zookeeper=ZooKeeperConfig(host="127.0.0.1",
                                                           path_prefix="/kestrel/test"))
    service = build(config, MemoryReactorClock())
    assert isinstance(service.zookeeper, ServerSetPublisher)
    assert service.zookeeper.status is service.server.status
    assert not service.zookeeper.running


def test_journal_that_cannot_be_replayed_stops_the_server(tmp_path: Path) -> None:
    """As when replay came before the listeners, a journal that cannot be read stops it."""
    config = config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0)
    first = build(config, MemoryReactorClock())
    first.startService()
    assert first.server.collection.add("old", b"x").result is True
    first.stopService()
    reactor = MemoryReactorClock()
    reactor.running = True
    service = build(config, reactor)
    service.startService()
    journal = tmp_path / "queues" / "old"
    journal.unlink()
    journal.mkdir()  # (listed as a journal, no regular file when its turn comes)
    with capturedLogs() as events:
        reactor.advance(0)
    assert reactor.hasStopped
    assert any("kestrel cannot start" in e.get("log_format", "") for e in events)
    service.stopService()


class RecordingPublisher(Service):
    """Stands in for the ZooKeeper publisher: records when it was started."""

    def __init__(self, collection: Any, fail: bool = False) -> None:
        self.collection = collection
        self.fail = fail
        self.loading_at_start: list[int] = []

    def startService(self) -> None:
        self.loading_at_start.append(self.collection.queues_loading())
        if self.fail:
            raise KestrelError("no endpoint to publish")
        super().startService()


def restarted_with_a_journal(tmp_path: Path, reactor: Any) -> KestrelService:
    """A service over a queue folder holding one journal (queue "old"), not started yet."""
    config = config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0)
    first = build(config, MemoryReactorClock())
    first.startService()
    assert first.server.collection.add("old", b"x").result is True
    first.stopService()
    return build(config, reactor)


def test_server_sets_are_joined_once_every_queue_is_loaded(tmp_path: Path) -> None:
    """
    The server listens before it replays, but joins its ZooKeeper server
    sets only once every queue serves; with nothing to replay, at once.
    """
    reactor = MemoryReactorClock()
    reactor.running = True
    service = restarted_with_a_journal(tmp_path, reactor)
    publisher = service.zookeeper = RecordingPublisher(service.server.collection)
    service.startService()
    assert service.ports and not publisher.running
    reactor.advance(0)
    assert publisher.running and publisher.loading_at_start == [0]
    service.stopService()

    empty = build(config_in(tmp_path / "other", text_port=0, thrift_port=0, admin_port=0),
                  MemoryReactorClock())
    publisher = empty.zookeeper = RecordingPublisher(empty.server.collection)
    empty.startService()
    assert publisher.running and publisher.loading_at_start == [0]
    empty.stopService()


def test_server_sets_that_cannot_be_joined_after_replay_stop_the_server(
        tmp_path: Path) -> None:
    """A publisher failing once the queues are loaded stops the server with a start error."""
    reactor = MemoryReactorClock()
    reactor.running = True
    service = restarted_with_a_journal(tmp_path, reactor)
    service.zookeeper = RecordingPublisher(service.server.collection, fail=True)
    service.startService()
    with capturedLogs() as events:
        reactor.advance(0)
    assert reactor.hasStopped
    assert service.start_error == "zookeeper: no endpoint to publish"
    assert any("cannot join its ZooKeeper" in e.get("log_format", "") for e in events)
    service.stopService()


class _InlinePool:
    """A thread pool that runs each job at once, on the calling thread."""

    def callInThreadWithCallback(self, on_result: Any, job: Any,  # noqa: N802 - Twisted's name
                                 *args: Any, **kwargs: Any) -> None:
        try:
            result = job(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


@implementer(IReactorThreads)
class ThreadedMemoryReactor(MemoryReactorClock):
    """A MemoryReactorClock that has threads (IReactorThreads): its pool runs jobs inline."""

    def getThreadPool(self) -> Any:  # noqa: N802 - Twisted's name
        return _InlinePool()

    def callFromThread(self, f: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        f(*args, **kwargs)

    def callInThread(self, f: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        f(*args, **kwargs)

    def suggestThreadPoolSize(self, size: int) -> None:  # noqa: N802 - Twisted's name
        pass


def test_journals_hand_replaced_files_to_file_chores_stopped_with_the_service(
        tmp_path: Path) -> None:
    """
    With a reactor that has threads, the journals' empty rewrites hand the
    replaced files to the service's file chores (one thread); stopping the
    service ends that thread with every replaced file closed and no spare
    file left.
    """
    config = config_in(tmp_path, text_port=0, thrift_port=0, admin_port=0)
    config = attrs.evolve(config, default=attrs.evolve(config.default,
                                                       default_journal_size=1024))
    service = build(config, ThreadedMemoryReactor())
    assert service.file_chores is not None
    service.startService()
    collection = service.server.collection
    for _ in range(10):
        assert collection.add("q", b"x" * 2000).result is True
        assert collection.remove("q").result is not None
    assert int(dict(collection.queue("q").dump_stats())["journal_rewrites"]) >= 5
    assert service.file_chores.join(timeout=10)
    assert "kestrel-file-chores" in {t.name for t in threading.enumerate()}
    service.stopService()
    assert "kestrel-file-chores" not in {t.name for t in threading.enumerate()}
    queue_path = tmp_path / "queues"
    assert sorted(os.listdir(queue_path)) == ["q"]
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [t for t in held if t.startswith(str(queue_path))]


def test_server_reactor_checks_the_members_the_service_uses() -> None:
    """The launcher's reactor passes; one without a thread hop (signal handlers) is refused."""
    from twisted.internet import reactor

    from kestrel.service import server_reactor

    assert server_reactor(reactor) is reactor
    with pytest.raises(TypeError, match="^MemoryReactorClock cannot run the server"):
        server_reactor(MemoryReactorClock())
