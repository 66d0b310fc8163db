"""
One memcache connection to a Kestrel server, with a Deferred per request.

Requests may be pipelined; replies are matched in order. Every request has a
reply timeout: when it expires, every pending request fails with
L{RequestTimeout} and the connection is aborted (a late reply could no longer
be matched). An error reply (C{SERVER_ERROR}, C{CLIENT_ERROR}, C{ERROR}) fails
its request and drops the connection too, so a connection that misbehaved is
never reused. The server ends open reads when a connection closes, so dropping
a connection also returns any item it held to its queue.

C{VALUE} lines are accepted naming either the bare queue (Kestrel, and
txkestrel until now) or the key exactly as sent (C{q/t=500/open}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from kestrel.client.errors import ClientError, ProtocolError, ServerRefused
from kestrel.client.pipeline import Pending, PipelinedConnection

#: The longest reply header line accepted.
MAX_LINE = 8192


def get_key(queue: str, timeout_ms: int | None = None, *, open: bool = False,
            close: bool = False, abort: bool = False) -> bytes:
    """The key of a Kestrel C{get}: the queue, then C{/t=ms}, C{/close}, C{/open}, C{/abort}."""
    key = queue
    if close:
        key += "/close"
    if open:
        key += "/open"
    if abort:
        key += "/abort"
    if timeout_ms is not None and timeout_ms > 0:
        key += f"/t={int(timeout_ms)}"
    return key.encode("utf-8")


class _Request(Pending):
    """One request waiting for its reply."""

    __slots__ = ("kind", "keys")

    def __init__(self, kind: str, keys: tuple[bytes, ...]) -> None:
        super().__init__()
        self.kind = kind
        self.keys = keys


class MemcacheConnection(PipelinedConnection[_Request]):
    """
    A client connection speaking Kestrel's memcache dialect.

    C{set} fires with True (C{STORED}) or False (C{NOT_STORED}); C{get}
    fires with the item's bytes or None (C{END}). Failures are
    L{ServerRefused}, L{ProtocolError}, L{RequestTimeout} or
    L{ConnectionGone}. C{on_lost} callbacks run once when the connection ends.
    """

    #: Closing the connection returns the items it holds open (the server aborts them).
    cancel_returns_items = True

    def __init__(self, server: str, clock: Any, reply_timeout: float = 5.0) -> None:
        super().__init__(server, clock, reply_timeout)
        self._value_len: int | None = None
        self._value: bytes | None = None

    # -- requests

    def set(self, queue: str, data: bytes, expiry: float | None = None) -> Deferred[bool]:
        """Store C{data} on C{queue}; C{expiry} is seconds from now (None: never)."""
        exptime = 0 if not expiry else max(1, int(round(expiry)))
        head = b"set %s 0 %d %d\r\n" % (queue.encode("utf-8"), exptime, len(data))
        return self._send(head + data + b"\r\n", "set", (), self.reply_timeout)

    def get(self, queue: str, timeout_ms: int | None = None, *, open: bool = False,
            close: bool = False, abort: bool = False) -> Deferred[bytes | None]:
        """Fetch from C{queue} with Kestrel's options; the reply may wait C{timeout_ms}."""
        key = get_key(queue, timeout_ms, open=open, close=close, abort=abort)
        wait = (timeout_ms or 0) / 1000.0
        return self._send(b"get %s\r\n" % key, "get", (queue.encode("utf-8"), key),
                          wait + self.reply_timeout)

    # -- the operations the fleet client uses (shared with the thrift connection)

    def put_item(self, queue: str, data: bytes, expiry: float | None = None) -> Deferred[bool]:
        """Store C{data} on C{queue}; True when the server took it."""
        return self.set(queue, data, expiry)

    def take(self, queue: str, timeout_ms: int | None = None,
             reliable: bool = True) -> Deferred[tuple[bytes, int] | None]:
        """
        One item, or None when none came in time. C{reliable} opens the read
        (C{/open}): it belongs to this connection until confirmed or aborted.
        The id is always 0 (memcache reads are named by queue and connection).
        """
        d = self.get(queue, timeout_ms, open=reliable)
        return d.addCallback(lambda data: None if data is None else (data, 0))

    def confirm(self, queue: str, xid: int = 0) -> Deferred[bool]:
        """Confirm this connection's open read on C{queue} (C{/close})."""
        return self.get(queue, close=True).addCallback(lambda _: True)

    def abort(self, queue: str, xid: int = 0) -> Deferred[bool]:
        """Return this connection's open read on C{queue} to its head (C{/abort})."""
        return self.get(queue, abort=True).addCallback(lambda _: True)

    def _send(self, data: bytes, kind: str, keys: tuple[bytes, ...],
              timeout: float) -> Deferred[Any]:
        # Cancelling a request drops the connection: a reply can no longer be
        # matched, and the server returns anything the connection held open.
        return self._submit(_Request(kind, keys), timeout, lambda: data)

    # -- protocol

    def dataReceived(self, data: bytes) -> None:
        """Parse as many complete replies as have arrived."""
        self._buf += data
        try:
            while self._pending and self._parse_one():
                pass
        except ClientError as e:
            self._fail_all(e)
            self.close()
            return
        if not self._pending and self._buf:
            self._fail_all(ProtocolError(f"{self.server}: unexpected data {self._buf[:40]!r}"))
            self.close()

    def _parse_one(self) -> bool:
        """Consume one step of the head request's reply; False when more bytes are needed."""
        request = self._pending[0]
        if self._value_len is not None:  # reading a VALUE block
            need = self._value_len + 2
            if len(self._buf) < need:
                return False
            block, self._buf = self._buf[:need], self._buf[need:]
            if not block.endswith(b"\r\n"):
                raise ProtocolError(f"{self.server}: VALUE data not followed by CRLF")
            self._value, self._value_len = block[:-2], None
            return True
        line = self._line()
        if line is None:
            return False
        if request.kind == "get":
            if self._value is None and line.startswith(b"VALUE "):
                parts = line.split()
                if len(parts) < 4 or parts[1] not in request.keys or not parts[3].isdigit():
                    raise ProtocolError(f"{self.server}: unexpected reply {line[:80]!r}")
                self._value_len = int(parts[3])
                return True
            if line == b"END":
                value, self._value = self._value, None
                self._finish(value)
                return True
        elif line == b"STORED":
            self._finish(True)
            return True
        elif line == b"NOT_STORED":
            self._finish(False)
            return True
        self._error_line(line)
        return True

    def _line(self) -> bytes | None:
        i = self._buf.find(b"\n")
        if i < 0:
            if len(self._buf) > MAX_LINE:
                raise ProtocolError(f"{self.server}: reply line too long")
            return None
        line, self._buf = self._buf[:i], self._buf[i + 1:]
        return line.rstrip(b"\r")

    def _error_line(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        if line.startswith(b"SERVER_ERROR"):
            raise ServerRefused(self.server, text)
        raise ProtocolError(f"{self.server}: {text}")

    def _finish(self, result: object) -> None:
        request = self._next_reply()
        if not request.deferred.called:
            request.deferred.callback(result)

    def _reset(self) -> None:
        self._value_len = self._value = None
