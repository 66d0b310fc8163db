"""
Browser requests sent to the memcache and text ports, and an over-long text
put: a real server process, real sockets on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.wire.conftest import KestrelProcess, LineClient, text_lines

BROWSER_POST = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
                b"Content-Type: text/plain\r\nContent-Length: 43\r\n\r\n"
                b"put csrf_victim:\nwritten-by-a-web-page\n\n")


@pytest.fixture(scope="module")
def server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    return kestrel_factory(protocols=("memcache", "text"))


def exchange(server: KestrelProcess, protocol: str, data: bytes) -> tuple[bytes, bool]:
    """Send C{data}; return everything answered until the server closes, and whether it did."""
    client = LineClient(server.connect(protocol, timeout=5))
    try:
        client.send(data)
        out = b""
        try:
            while True:
                chunk = client.sock.recv(65536)
                if not chunk:
                    return out, True
                out += chunk
        except TimeoutError:
            return out, False
    finally:
        client.close()


def test_text_port_refuses_a_browser_post(server: KestrelProcess) -> None:
    """The issue's CSRF: one error line, closed, and the body's put never ran."""
    out, closed = exchange(server, "text", BROWSER_POST)
    assert (out, closed) == (b"-HTTP requests are not served on this port.\n", True)
    assert text_lines(server, b"peek csrf_victim\n") == [b"*\n"]


@pytest.mark.parametrize("request_line", [b"GET / HTTP/1.1", b"POST /x HTTP/1.0", b"GET /"])
def test_memcache_port_refuses_http(server: KestrelProcess, request_line: bytes) -> None:
    body = b"set csrf 0 0 1\r\nx\r\n"
    data = request_line + b"\r\nContent-Type: text/plain\r\n\r\n" + body
    out, closed = exchange(server, "memcache", data)
    assert (out, closed) == (b"CLIENT_ERROR HTTP requests are not served on this port\r\n", True)
    client = LineClient(server.connect("memcache"))
    client.send(b"get csrf\r\n")
    assert client.line() == b"END\r\n"
    client.close()


def test_text_put_over_1024_lines_runs_nothing(server: KestrelProcess) -> None:
    """The issue's line 1,026 (`flush victim2`) is dropped with the rest of the refused put."""
    assert text_lines(server, b"put victim2:\nkeep\n\n") == [b"+1\n"]
    body = b"".join(b"line%d\n" % n for n in range(1024)) + b"x\nflush victim2\nmore\n\n"
    client = LineClient(server.connect("text"))
    client.send(b"put big:\n" + body + b"peek victim2\n")
    assert client.line() == b"-Too many items in one put (limit 1024); none stored.\n"
    assert client.line() == b":keep\n"
    client.close()
    assert text_lines(server, b"peek big\n") == [b"*\n"]
