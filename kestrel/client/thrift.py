"""
One thrift connection to a Kestrel server (framed transport, binary protocol).

The same operations as L{kestrel.client.memcache.MemcacheConnection}
(C{put_item}, C{take}, C{confirm}, C{abort}), over Kestrel's IDL. Calls may
be pipelined: the server answers them in order. A reliable read is a C{get}
with C{auto_abort_msec}: the item comes with an id, and if it is not
confirmed or aborted in time the server returns it to its queue by itself.

Unlike memcache, closing a thrift connection does not return the items it
holds open (they wait for their auto-abort), so a waiting C{get} that lost a
race is not cancelled by closing its connection: it is left to answer and
any item it brings is aborted at once (C{cancel_returns_items} is False).
"""

from __future__ import annotations

import struct
from typing import Any

from thriftpy2.thrift import TApplicationException, TMessageType
from twisted.internet.defer import Deferred

from kestrel.client.errors import ClientError, ProtocolError, ServerRefused
from kestrel.client.pipeline import Pending, PipelinedConnection
from kestrel.protocols.thrift import kestrel_thrift

try:
    from thriftpy2.protocol.cybin import (  # type: ignore[attr-defined]
        TCyBinaryProtocol as TBinaryProtocol,
    )
    from thriftpy2.transport.memory import TCyMemoryBuffer as TMemoryBuffer
except ImportError:  # pragma: no cover - thriftpy2 built without its C extensions
    from thriftpy2.protocol.binary import TBinaryProtocol
    from thriftpy2.transport.memory import TMemoryBuffer

_SERVICE = kestrel_thrift.Kestrel
_HEADER = struct.Struct(">i")
#: The largest reply frame accepted.
MAX_FRAME = 64 * 1024 * 1024


class _Call(Pending):
    __slots__ = ("api",)

    def __init__(self, api: str) -> None:
        super().__init__()
        self.api = api


class ThriftConnection(PipelinedConnection[_Call]):
    """
    A client connection speaking Kestrel's thrift IDL.

    C{auto_abort_ms} is the auto-abort of reliable reads. Failures are
    L{ServerRefused} (a C{TApplicationException} from the server, e.g. a
    status that refuses the operation), L{ProtocolError}, L{RequestTimeout}
    or L{ConnectionGone}; any of them drops the connection.
    """

    cancel_returns_items = False

    def __init__(self, server: str, clock: Any, reply_timeout: float = 5.0,
                 auto_abort_ms: int = 30_000) -> None:
        super().__init__(server, clock, reply_timeout)
        self.auto_abort_ms = auto_abort_ms
        self._seqid = 0

    # -- operations

    def put_item(self, queue: str, data: bytes, expiry: float | None = None) -> Deferred[bool]:
        """Store C{data} on C{queue}; True when the server took it."""
        expiration = 0 if not expiry else max(1, int(expiry * 1000))
        d = self._call("put", self.reply_timeout, queue_name=queue, items=[data],
                       expiration_msec=expiration)
        return d.addCallback(lambda stored: stored == 1)

    def take(self, queue: str, timeout_ms: int | None = None,
             reliable: bool = True) -> Deferred[tuple[bytes, int] | None]:
        """One item (with its open-read id when C{reliable}), or None when none came in time."""
        d = self._call("get", (timeout_ms or 0) / 1000.0 + self.reply_timeout,
                       queue_name=queue, max_items=1, timeout_msec=int(timeout_ms or 0),
                       auto_abort_msec=self.auto_abort_ms if reliable else 0)
        return d.addCallback(lambda items: (items[0].data, items[0].id) if items else None)

    def confirm(self, queue: str, xid: int) -> Deferred[bool]:
        """Confirm open read C{xid}; False when it was no longer open (auto-aborted)."""
        d = self._call("confirm", self.reply_timeout, queue_name=queue, ids={xid})
        return d.addCallback(lambda n: n == 1)

    def abort(self, queue: str, xid: int) -> Deferred[bool]:
        """Return open read C{xid} to its queue; False when it was no longer open."""
        d = self._call("abort", self.reply_timeout, queue_name=queue, ids={xid})
        return d.addCallback(lambda n: n == 1)

    def _call(self, api: str, timeout: float, **arguments: Any) -> Deferred[Any]:
        def encode() -> bytes:
            self._seqid = (self._seqid + 1) & 0x7FFFFFFF
            buf = TMemoryBuffer()
            proto = TBinaryProtocol(buf)
            proto.write_message_begin(api, TMessageType.CALL, self._seqid)
            args = getattr(_SERVICE, api + "_args")()
            for name, value in arguments.items():
                setattr(args, name, value)
            args.write(proto)
            proto.write_message_end()
            body = buf.getvalue()
            return _HEADER.pack(len(body)) + body

        return self._submit(_Call(api), timeout, encode)

    # -- protocol

    def dataReceived(self, data: bytes) -> None:
        """Decode every complete reply frame."""
        self._buf += data
        try:
            while len(self._buf) >= 4:
                (length,) = _HEADER.unpack_from(self._buf)
                if length < 0 or length > MAX_FRAME:
                    raise ProtocolError(f"{self.server}: bad frame length {length}")
                if len(self._buf) < 4 + length:
                    return
                frame, self._buf = self._buf[4:4 + length], self._buf[4 + length:]
                if not self._pending:
                    raise ProtocolError(f"{self.server}: unexpected reply")
                self._reply(frame)
        except ClientError as e:
            self._fail_all(e)
            self.close()

    def _reply(self, frame: bytes) -> None:
        call = self._next_reply()
        proto = TBinaryProtocol(TMemoryBuffer(frame))
        try:
            api, kind, _ = proto.read_message_begin()
            if kind == TMessageType.EXCEPTION:
                error = TApplicationException()
                error.read(proto)
                raise ServerRefused(self.server, f"{call.api}: {error.message}")
            if api != call.api:
                raise ProtocolError(f"{self.server}: reply to {api}, expected {call.api}")
            result = getattr(_SERVICE, call.api + "_result")()
            result.read(proto)
        except Exception as e:
            failure = e if isinstance(e, ClientError) else ProtocolError(
                f"{self.server}: undecodable reply: {e}")
            if not call.cancelled and not call.deferred.called:
                call.deferred.errback(failure)
            raise failure from None
        if not call.deferred.called:
            call.deferred.callback(result.success)
