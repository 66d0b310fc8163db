"""
What the memcache and thrift client connections share: a queue of pipelined
requests answered in order, each with a reply timeout, on one connection that
is dropped as soon as anything goes wrong.

A subclass encodes requests and decodes replies; this module owns the
request's lifecycle: refused at once when the connection is down, failed with
L{RequestTimeout} (and the connection aborted) when the reply is late, failed
with L{ConnectionGone} when the connection ends, and a cancelled request
drops the connection (its reply could no longer be matched).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITCPTransport
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from kestrel.client.errors import ConnectionGone, RequestTimeout


class Pending:
    """One request waiting for its reply: its Deferred, its timer, whether it was cancelled."""

    __slots__ = ("deferred", "timer", "cancelled", "on_cancel")

    def __init__(self) -> None:
        self.deferred: Deferred[Any] = Deferred(self._cancel)
        self.timer: IDelayedCall | None = None
        self.cancelled = False
        self.on_cancel: Callable[[], None] | None = None

    def _cancel(self, _: Deferred[Any]) -> None:
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel()

    def stop_timer(self) -> None:
        """Stop the reply timer, if it still runs."""
        if self.timer is not None and self.timer.active():
            self.timer.cancel()


P = TypeVar("P", bound=Pending)


class PipelinedConnection(Protocol, Generic[P]):
    """
    A client connection whose requests are answered in order.

    C{alive} is True between C{connectionMade} and C{connectionLost};
    C{on_lost} callbacks run once, with the connection, when it ends.
    """

    #: A TCP connection's transport (it can be aborted); None until connected.
    transport: ITCPTransport | None

    def __init__(self, server: str, clock: IReactorTime, reply_timeout: float) -> None:
        self.server = server
        self.clock = clock
        self.reply_timeout = reply_timeout
        self._pending: deque[P] = deque()
        self._buf = b""
        self.alive = False
        self.on_lost: list[Callable[[Any], None]] = []

    @property
    def idle(self) -> bool:
        """Whether no request is waiting for its reply."""
        return not self._pending

    def close(self) -> None:
        """Drop the connection now; pending requests fail with L{ConnectionGone}."""
        if self.transport is not None:
            self.transport.abortConnection()

    def _submit(self, request: P, timeout: float, encode: Callable[[], bytes]) -> Deferred[Any]:
        """
        Send C{request}, whose bytes C{encode} makes, and wait at most
        C{timeout} seconds for its reply; when the connection is down it fails
        at once with L{ConnectionGone} and nothing is encoded.
        """
        d = request.deferred
        if not self.alive:
            d.errback(ConnectionGone(f"{self.server}: not connected"))
            return d
        transport = self.transport
        assert transport is not None  # alive: between connectionMade and connectionLost
        data = encode()
        request.on_cancel = self.close
        request.timer = self.clock.callLater(timeout, self._timed_out, timeout)
        self._pending.append(request)
        transport.write(data)
        return d

    def _next_reply(self) -> P:
        """Take the head request off the queue (its reply has come) and stop its timer."""
        request = self._pending.popleft()
        request.stop_timer()
        return request

    # -- protocol

    def connectionMade(self) -> None:
        """The connection is up."""
        self.alive = True

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        """Fail whatever is pending and tell the owners."""
        self.alive = False
        self._fail_all(ConnectionGone(f"{self.server}: connection lost"))
        callbacks, self.on_lost = self.on_lost, []
        for callback in callbacks:
            callback(self)

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, deque()
        self._reset()
        for request in pending:
            request.stop_timer()
            if not request.cancelled and not request.deferred.called:
                request.deferred.errback(error)

    def _reset(self) -> None:
        """Forget any half-read reply (the requests it belonged to are being failed)."""

    def _timed_out(self, timeout: float) -> None:
        self._fail_all(RequestTimeout(f"{self.server}: no reply within {timeout:g}s"))
        self.close()
