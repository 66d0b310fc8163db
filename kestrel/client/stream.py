"""
C{read_stream}: the consumer loop users otherwise write by hand.

Each of C{concurrency} workers repeats: open a reliable read (waiting up to
C{poll} seconds on the whole read set), call the handler with the item's
bytes, then confirm it. When the handler fails (raises, or its Deferred
fails), the item is aborted, so another worker or client gets it again, and
the worker pauses for a backoff that grows with consecutive failures. When
the read itself fails (no server answered), the worker pauses likewise.

C{stop()} stops taking new items: a waiting read is cancelled (its
connections are closed, so the servers keep or return their items), a
handler already running is allowed to finish and its item is confirmed or
aborted; the Deferred it returns fires when every worker has ended.

A stream needs only what L{ReadSource} and L{OpenRead} describe, which
L{kestrel.client.fleet.KestrelClient} and its L{ReadHandle} provide; this
module does not import the fleet client (the fleet client imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred, DeferredList, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kestrel.client.health import Backoff


class OpenRead(Protocol):
    """One item of an open reliable read: its bytes, where it came from, and how to settle it."""

    @property
    def data(self) -> bytes:
        """The item."""

    @property
    def server(self) -> str:
        """The server that handed it out (for log lines)."""

    def confirm(self) -> Deferred[None]:
        """Remove the item for good."""

    def abort(self) -> Deferred[None]:
        """Give the item back to its queue."""


class ReadSource(Protocol):
    """What a stream reads through: a reactor for its pauses, and reliable reads."""

    @property
    def reactor(self) -> IReactorTime:
        """The reactor the stream's backoff pauses are scheduled on."""

    def read(self, queue: str, timeout: float | None = None) -> Deferred[Any]:
        """Open a reliable read: fire with an L{OpenRead}, or None when none came in time."""


class ReadStream:
    """
    Workers consuming C{queue} through C{client}, calling C{handler(data)} per item.

    C{handler} may return a Deferred (or be a coroutine function). C{processed}
    and C{failed} count confirmed and aborted items.
    """

    log = Logger()

    def __init__(self, client: ReadSource, queue: str,
                 handler: Callable[[bytes], Any], concurrency: int = 1, *,
                 poll: float = 1.0, backoff: Backoff | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.poll = poll
        self.backoff = backoff or Backoff(base=0.05, cap=5.0)
        self.processed = 0
        self.failed = 0
        self.running = False
        self._workers: list[Deferred[None]] = []
        self._reads: set[Deferred[Any]] = set()
        self._sleeps: set[Deferred[None]] = set()

    def start(self) -> None:
        """Start the workers."""
        if self.running:
            return
        self.running = True
        self._workers = [Deferred.fromCoroutine(self._worker()) for _ in range(self.concurrency)]

    def stop(self) -> Deferred[None]:
        """Stop the workers; fires once each has finished its current item."""
        self.running = False
        for d in list(self._reads) + list(self._sleeps):
            d.cancel()
        return DeferredList(self._workers, consumeErrors=True).addCallback(lambda _: None)

    def _sleep(self, seconds: float) -> Deferred[None]:
        d: Deferred[None] = Deferred(lambda _: timer.cancel() if timer.active() else None)
        timer = self.client.reactor.callLater(seconds, d.callback, None)
        self._sleeps.add(d)
        return d.addBoth(self._forget_sleep, d)

    def _forget_sleep(self, result: Any, d: Deferred[None]) -> Any:
        self._sleeps.discard(d)
        if isinstance(result, Failure) and result.check(CancelledError):
            return None
        return result

    async def _worker(self) -> None:
        failures = 0
        while self.running:
            read = self.client.read(self.queue, self.poll)
            self._reads.add(read)
            try:
                handle: OpenRead | None = await read
            except CancelledError:
                break
            except Exception as e:
                failures += 1
                self.log.warn("reading {queue} failed: {error}", queue=self.queue, error=e)
                await self._sleep(self.backoff.delay(failures))
                continue
            finally:
                self._reads.discard(read)
            if handle is None:
                continue
            try:
                await maybeDeferred(self.handler, handle.data)
            except Exception as e:
                self.failed += 1
                failures += 1
                self.log.warn("handler failed on an item of {queue} from {server}; aborting it: "
                              "{error}", queue=self.queue, server=handle.server, error=e)
                try:
                    await handle.abort()
                except Exception as abort_error:
                    self.log.warn("{error}", error=abort_error)
                if self.running:
                    await self._sleep(self.backoff.delay(failures))
                continue
            failures = 0
            try:
                await handle.confirm()
                self.processed += 1
            except Exception as e:
                self.log.warn("confirm failed: {error}", error=e)
