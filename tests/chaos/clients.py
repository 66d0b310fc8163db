"""
Small blocking clients of the three wire protocols, over plain sockets.

They speak exactly what a real client sends (memcache lines, text lines,
framed binary thrift built with thriftpy2) and can vanish mid-request with a
FIN (C{close}) or an RST (C{SO_LINGER 0}). The crash harness and the wire
tests of vanishing clients use them; nothing here knows the server's code.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import thriftpy2
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport.memory import TMemoryBuffer

IDL = Path(__file__).resolve().parents[2] / "thrift" / "kestrel.thrift"
kestrel_thrift: Any = thriftpy2.load(str(IDL), module_name="kestrel_chaos_thrift")


class ProtocolError(Exception):
    """The server answered something the client did not expect."""


class _Base:
    """One TCP connection with a receive buffer (C{rcvbuf}: the socket's SO_RCVBUF)."""

    def __init__(self, host: str, port: int, timeout: float = 10.0,
                 rcvbuf: int | None = None) -> None:
        if rcvbuf is None:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        else:
            # A small receive window, set before the handshake so that it holds.
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\n" not in self._buf:
            self._fill()
        line, _, self._buf = self._buf.partition(b"\n")
        return line.rstrip(b"\r")

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def close(self) -> None:
        """Close normally (FIN)."""
        try:
            self.sock.close()
        except OSError:
            pass

    def reset(self) -> None:
        """Vanish with an RST: linger 0, then close."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.close()
        except OSError:
            pass

    def vanish(self, rst: bool) -> None:
        """Go away without reading any reply: an RST if C{rst}, else a FIN."""
        if rst:
            self.reset()
        else:
            self.close()


class MemcacheClient(_Base):
    """Kestrel's memcache protocol: set, get with options, confirm by C{/close}."""

    def set(self, queue: str, data: bytes) -> bool:
        """C{set}; true on C{STORED}, false on C{NOT_STORED}; raises on an error line."""
        self.sock.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data))
        line = self._line()
        if line == b"STORED":
            return True
        if line == b"NOT_STORED":
            return False
        raise ProtocolError(line.decode("latin-1"))

    def send_get(self, queue: str, options: str = "") -> None:
        """Send a C{get} without reading its reply."""
        self.sock.sendall(b"get %s%s\r\n" % (queue.encode(), options.encode()))

    def read_value(self) -> bytes | None:
        """Read the reply to a C{get}: the value, or C{None} for C{END}."""
        line = self._line()
        if line == b"END":
            return None
        if not line.startswith(b"VALUE "):
            raise ProtocolError(line.decode("latin-1"))
        size = int(line.split()[3])
        data = self._exactly(size + 2)[:-2]
        if self._line() != b"END":
            raise ProtocolError("no END after VALUE")
        return data

    def get(self, queue: str, options: str = "") -> bytes | None:
        """C{get <queue><options>} (e.g. C{/open/t=500}); the value or C{None}."""
        self.send_get(queue, options)
        return self.read_value()


class TextClient(_Base):
    """Kestrel's text protocol: C{put}, C{get} (an open read), C{confirm}."""

    def put(self, queue: str, items: list[bytes]) -> int:
        """C{put}; the count of items stored."""
        self.sock.sendall(b"put %s:\n%s\n" % (queue.encode(), b"".join(i + b"\n" for i in items)))
        line = self._line()
        if not line.startswith(b"+"):
            raise ProtocolError(line.decode("latin-1"))
        return int(line[1:])

    def send_get(self, queue: str, timeout_ms: int | None = None) -> None:
        """Send a C{get} (which confirms this connection's earlier reads on C{queue})."""
        tail = b"" if timeout_ms is None else b" %d" % timeout_ms
        self.sock.sendall(b"get %s%s\n" % (queue.encode(), tail))

    def read_item(self) -> bytes | None:
        """Read a get's reply: the item or C{None} for C{*}."""
        line = self._line()
        if line == b"*":
            return None
        if not line.startswith(b":"):
            raise ProtocolError(line.decode("latin-1"))
        return line[1:]

    def get(self, queue: str, timeout_ms: int | None = None) -> bytes | None:
        """C{get <queue> [timeout_ms]}: the item (an open read) or C{None}."""
        self.send_get(queue, timeout_ms)
        return self.read_item()

    def confirm(self, queue: str, count: int) -> None:
        """C{confirm <queue> <count>}."""
        self.sock.sendall(b"confirm %s %d\n" % (queue.encode(), count))
        line = self._line()
        if not line.startswith(b"+"):
            raise ProtocolError(line.decode("latin-1"))


class ThriftClient(_Base):
    """Kestrel's thrift protocol (framed, binary): put, get, confirm."""

    _seqid = 0

    def send_call(self, api: str, **kwargs: Any) -> None:
        """Send one call frame without reading the reply."""
        self._seqid += 1
        args = getattr(kestrel_thrift.Kestrel, api + "_args")(**kwargs)
        out = TMemoryBuffer()
        proto = TBinaryProtocol(out)
        proto.write_message_begin(api, TMessageType.CALL, self._seqid)
        proto.write_struct(args)
        proto.write_message_end()
        payload = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_reply(self, api: str) -> Any:
        """Read one reply frame: the call's result; a server exception is raised."""
        (length,) = struct.unpack(">i", self._exactly(4))
        proto = TBinaryProtocol(TMemoryBuffer(self._exactly(length)))
        _name, message_type, _seqid = proto.read_message_begin()
        if message_type == TMessageType.EXCEPTION:
            exc = TApplicationException()
            proto.read_struct(exc)
            raise ProtocolError(exc.message)
        result = getattr(kestrel_thrift.Kestrel, api + "_result")()
        proto.read_struct(result)
        return result.success

    def call(self, api: str, **kwargs: Any) -> Any:
        """One call and its result."""
        self.send_call(api, **kwargs)
        return self.read_reply(api)

    def put(self, queue: str, items: list[bytes]) -> int:
        """C{put}; the count stored."""
        return int(self.call("put", queue_name=queue, items=items, expiration_msec=0))

    def get(self, queue: str, max_items: int, timeout_msec: int = 0,
            auto_abort_msec: int = 0) -> list[tuple[int, bytes]]:
        """C{get}; C{(id, data)} pairs."""
        items = self.call("get", queue_name=queue, max_items=max_items,
                          timeout_msec=timeout_msec, auto_abort_msec=auto_abort_msec)
        return [(item.id, item.data) for item in items or []]

    def confirm(self, queue: str, ids: set[int]) -> int:
        """C{confirm}; how many ids were open."""
        return int(self.call("confirm", queue_name=queue, ids=ids))


def blocked_reader(host: str, ports: Mapping[str, int], protocol: str, queue: str,
                   timeout_ms: int, max_items: int = 1) -> _Base:
    """
    A connection that has sent a read of C{queue} waiting up to C{timeout_ms}
    and not read its reply. C{protocol} is C{memcache}, C{memcache-open} (a
    reliable read), C{text} or C{thrift} (asking for C{max_items}, no auto-abort).
    """
    port = ports[protocol.split("-")[0]]
    if protocol.startswith("memcache"):
        client: Any = MemcacheClient(host, port)
        client.send_get(queue, ("/open" if protocol == "memcache-open" else "")
                        + f"/t={timeout_ms}")
    elif protocol == "text":
        client = TextClient(host, port)
        client.send_get(queue, timeout_ms)
    else:
        client = ThriftClient(host, port)
        client.send_call("get", queue_name=queue, max_items=max_items, timeout_msec=timeout_ms,
                         auto_abort_msec=0)
    return client
