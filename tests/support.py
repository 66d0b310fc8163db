"""
Test support shared by the protocol and session unit tests: a real server
on a fake clock, one client connection over a StringTransport, and a
C{run_in_thread} whose jobs (fsyncs) run only when the test says so.

The server is the real one (collection, queues, journals in a temporary
folder, sessions, status); only the socket is replaced.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection

from benchmarks.servers import free_port as free_port  # one port chooser for tests and benchmarks
from kestrel.config import DEFAULT_CONFIG, parse_config
from kestrel.server import KestrelServer


def make_server(clock: Clock, path: Path, yaml: str = "", run_in_thread: Any = None,
                config_path: Path | None = None, **overrides: Any) -> KestrelServer:
    """
    A started server over a fresh queue directory under C{path}, driven by
    C{clock}, with no status file and no expiration timer.

    C{yaml} is a config document applied first (else the built-in defaults);
    C{overrides} are config fields set last.
    """
    base = parse_config(yaml) if yaml else DEFAULT_CONFIG
    config = attrs.evolve(base, queue_path=str(path / "queues"), status_file=None,
                          expiration_timer_frequency=None, **overrides)
    server = KestrelServer.from_config(config, clock, config_path=config_path,
                                       run_in_thread=run_in_thread)
    server.collection.startService()
    return server


def replies_to(factory: Callable[[KestrelServer], Factory], chunks: list[bytes]) -> bytes:
    """
    Every byte a fresh server answers on one connection of C{factory} when
    C{chunks} arrive one after the other (for the chunk-splitting properties).
    """
    clock = Clock()
    clock.advance(1_767_225_600.0)
    with tempfile.TemporaryDirectory() as path:
        server = make_server(clock, Path(path))
        client = StringClient(factory(server))
        for chunk in chunks:
            client.protocol.dataReceived(chunk)
        server.collection.stopService()
    return client.transport.value()


class StringClient:
    """One client connection: a factory's protocol on a StringTransportWithDisconnection."""

    def __init__(self, factory: Factory) -> None:
        self.protocol: Any = factory.buildProtocol(None)
        self.transport = StringTransportWithDisconnection()
        self.transport.protocol = self.protocol
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> bytes:
        """Feed C{data}; return (and clear) every byte written since the last call."""
        self.protocol.dataReceived(data)
        return self.take()

    def take(self) -> bytes:
        """Return (and clear) every byte the server wrote since the last call."""
        out = self.transport.value()
        self.transport.clear()
        return out

    @property
    def connected(self) -> bool:
        """Whether the server has not closed the connection."""
        return bool(self.transport.connected)

    def close(self) -> None:
        """The client goes away."""
        self.transport.loseConnection()


class ManualThread:
    """A run_in_thread that runs each job only when the test says so (fsyncs held back)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def __call__(self, job: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.jobs.append((job, d))
        return d

    def run_next(self) -> None:
        """Run the oldest job; its Deferred gets the result, or fails with what it raised."""
        job, d = self.jobs.pop(0)
        try:
            result = job()
        except Exception as e:
            d.errback(e)
        else:
            d.callback(result)

    def run_all(self) -> None:
        """Run every job, including those queued meanwhile (the next group commit)."""
        while self.jobs:
            self.run_next()

    def fail_all(self, error: Exception) -> None:
        """Fail every job (an fsync error), including those queued meanwhile."""
        while self.jobs:
            _, d = self.jobs.pop(0)
            d.errback(error)


class ThreadFlag(ManualThread):
    """
    A ManualThread that says when one of its jobs is running (C{running}),
    so that an injected fsync can tell the thread from the calling thread.
    A job's Deferred fires after the job, outside it, as on the reactor.
    """

    def __init__(self) -> None:
        super().__init__()
        self.running = False

    def run_next(self) -> None:
        """Run the oldest job as a thread would; its Deferred fires after, as on the reactor."""
        job, d = self.jobs.pop(0)
        self.running = True
        try:
            result = job()
        except Exception as e:
            self.running = False
            d.errback(e)
        else:
            self.running = False
            d.callback(result)
        finally:
            self.running = False


@contextmanager
def full_disk_writes(server: KestrelServer, clock: Clock, name: str) -> Iterator[None]:
    """
    While the block runs, queue C{name}'s journal writes go to C{/dev/full}
    (every write fails with ENOSPC, through the server's write batches); its
    own file is put back afterwards.
    """
    from kestrel.journal.syncfile import PeriodicSyncFile

    journal = server.collection.queue(name).journal
    kept = journal._writer
    journal._writer = PeriodicSyncFile("/dev/full", clock, None,
                                       coalescer=server.collection.write_coalescer)
    try:
        yield
    finally:
        journal._writer.close()
        journal._writer = kept

