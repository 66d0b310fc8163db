"""
Authenticated control: the admin port's token, origin and content-type checks,
its own bind address, and control commands kept off the client ports.

Every test talks to a real server process over real sockets.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory

from tests.admin.test_admin_http import http, memcache
from tests.wire.conftest import ROOT, KestrelProcess, text_lines

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
client_thrift: Any = thriftpy2.load(str(ROOT / "thrift" / "kestrel.thrift"),
                                    module_name="kestrel_security_thrift")


def alive(server: KestrelProcess) -> bool:
    return server.running and http(server, "/ping")[:2] == (200, b"pong\n")


@pytest.fixture(scope="module")
def open_server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """No token: control commands work everywhere, the admin port refuses browser requests."""
    return kestrel_factory(protocols=("memcache", "text", "admin"))


@pytest.fixture(scope="module")
def token_server(kestrel_factory: Callable[..., KestrelProcess]) -> KestrelProcess:
    """A token: every admin POST needs it, control commands are admin-only."""
    return kestrel_factory(protocols=("memcache", "text", "thrift", "admin"),
                           config={"admin_token": TOKEN})


def test_foreign_origin_cannot_shut_down(open_server: KestrelProcess) -> None:
    """The issue's cross-site shutdown: refused with 403, the server keeps running."""
    code, body, _ = http(open_server, "/shutdown", "POST", None,
                         {"Origin": "http://evil.example"})
    assert code == 403 and b"cross-origin" in body
    code, _, _ = http(open_server, "/shutdown", "POST", None, {"Origin": "null"})
    assert code == 403
    code, _, _ = http(open_server, "/reload", "POST", None, {"Sec-Fetch-Site": "cross-site"})
    assert code == 403
    assert alive(open_server)


MULTIPART = (b"--xx\r\nContent-Disposition: form-data; name=\"status\"\r\n\r\n"
             b"quiescent\r\n--xx--\r\n")


@pytest.mark.parametrize(("content_type", "data"), [
    ("application/x-www-form-urlencoded", b"status=quiescent"),
    ("text/plain;charset=UTF-8", b"quiescent"),
    ("multipart/form-data; boundary=xx", MULTIPART)])
def test_form_bodies_need_a_token(open_server: KestrelProcess, content_type: str,
                                  data: bytes) -> None:
    """What an HTML form or a no-preflight fetch sends is refused without a token."""
    code, body, _ = http(open_server, "/status", "POST", data, {"Content-Type": content_type})
    assert code == 403 and b"query string" in body
    assert http(open_server, "/status")[1] == b"UP\n"


def test_dns_name_host_is_refused_without_token(open_server: KestrelProcess) -> None:
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 is same-origin, but named."""
    headers = {"Host": f"evil.example:{open_server.ports['admin']}",
               "Origin": f"http://evil.example:{open_server.ports['admin']}"}
    code, body, _ = http(open_server, "/status?status=quiescent", "POST", None, headers)
    assert code == 403 and b"IP address" in body
    assert http(open_server, "/status")[1] == b"UP\n"


def test_same_origin_commands_work_without_token(open_server: KestrelProcess) -> None:
    """curl-style and same-origin POSTs (no form body) still work, as do the client ports."""
    origin = {"Origin": f"http://127.0.0.1:{open_server.ports['admin']}"}
    assert http(open_server, "/status?status=readonly", "POST", None, origin)[:2] == \
        (200, b"READONLY\n")
    assert http(open_server, "/status?status=up", "POST", None)[:2] == (200, b"UP\n")
    assert memcache(open_server, b"flush_all\r\n") == [b"OK\r\n"]
    assert text_lines(open_server, b"status writeavoid\n", b"status up\n") == [b"+0\n", b"+0\n"]


def test_token_required_for_every_state_change(token_server: KestrelProcess) -> None:
    """401 without the token or with a wrong one; reports need none."""
    for path in ("/status?status=quiescent", "/quiesce", "/reload", "/shutdown"):
        code, _, _ = http(token_server, path, "POST", None)
        assert code == 401, path
        code, _, _ = http(token_server, path, "POST", None,
                          {"Authorization": "Bearer wrong-token-wrong-token"})
        assert code == 401, path
    assert alive(token_server)
    assert http(token_server, "/status")[1] == b"UP\n"
    assert http(token_server, "/stats.json")[0] == 200


def test_token_holder_may_post_forms(token_server: KestrelProcess) -> None:
    """With the token, a form body is fine; a foreign Origin is refused even with it."""
    code, body, _ = http(token_server, "/status", "POST", b"status=readonly",
                         {**AUTH, "Content-Type": "application/x-www-form-urlencoded"})
    assert (code, body) == (200, b"READONLY\n")
    code, _, _ = http(token_server, "/status?status=up", "POST", None,
                      {**AUTH, "Origin": "http://evil.example"})
    assert code == 403
    assert http(token_server, "/status?status=up", "POST", None, AUTH)[:2] == (200, b"UP\n")
    assert http(token_server, "/reload", "POST", None, AUTH)[:2] == (200, b"Reloaded config.\n")


def test_client_ports_refuse_control_with_a_token(token_server: KestrelProcess) -> None:
    """A token makes control admin-only: memcache, text and thrift refuse it and live on."""
    memcache(token_server, b"set keep 0 0 4\r\nkeep\r\n")
    replies = memcache(token_server, b"shutdown\r\n", b"flush_all\r\n", b"reload\r\n",
                       b"status quiescent\r\n", b"status\r\n", b"get keep/peek\r\n")
    assert all(r.startswith(b"CLIENT_ERROR ") and b"admin_only" in r for r in replies[:4])
    assert replies[4:] == [b"UP\r\n", b"VALUE keep/peek 0 4\r\nkeep\r\nEND\r\n"]
    replies = text_lines(token_server, b"shutdown\n", b"reload\n", b"flush_all\n",
                         b"status readonly\n", b"status\n", b"peek keep\n")
    assert all(r.startswith(b"-") and b"admin_only" in r for r in replies[:4])
    assert replies[4:] == [b":UP\n", b":keep\n"]
    client = make_client(client_thrift.Kestrel, token_server.host, token_server.ports["thrift"],
                         trans_factory=TFramedTransportFactory(),
                         proto_factory=TBinaryProtocolFactory(), timeout=15000)
    try:
        with pytest.raises(TApplicationException, match="admin_only"):
            client.set_status(client_thrift.Status.QUIESCENT)
        with pytest.raises(TApplicationException, match="admin_only"):
            client.flush_all_queues()
        assert client.current_status() == client_thrift.Status.UP
    finally:
        client.close()
    assert alive(token_server)


def test_admin_only_without_token(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """control_commands: admin_only alone keeps memcache shutdown off the client port."""
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"control_commands": "admin_only"})
    assert memcache(server, b"shutdown\r\n")[0].startswith(b"CLIENT_ERROR ")
    assert alive(server)


def test_token_file_and_shutdown(kestrel_factory: Callable[..., KestrelProcess],
                                 tmp_path: Path) -> None:
    """The token may come from a file; with it, POST /shutdown stops the server."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"admin_token_file": str(token_file)})
    assert http(server, "/shutdown", "POST", None)[0] == 401
    assert http(server, "/shutdown", "POST", None, AUTH)[:2] == (200, b"Shutting down.\n")
    assert server.wait_exit() == 0


def test_short_token_file_stops_the_start(kestrel_factory: Callable[..., KestrelProcess],
                                          tmp_path: Path) -> None:
    """A guessable token is a config error, not a silently open port."""
    token_file = tmp_path / "short"
    token_file.write_text("abc\n")
    server = kestrel_factory(protocols=("admin",), config={"admin_token_file": str(token_file)},
                             start=False)
    with pytest.raises(RuntimeError, match="at least 16 characters"):
        server.start()


def test_admin_binds_its_own_address(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """With listen_address 127.0.0.2, memcache is there, admin stays on 127.0.0.1."""
    server = kestrel_factory(protocols=("memcache", "admin"),
                             config={"listen_address": "127.0.0.2"})
    admin_port, memcache_port = server.ports["admin"], server.ports["memcache"]
    socket.create_connection(("127.0.0.2", memcache_port), timeout=5).close()
    socket.create_connection(("127.0.0.1", admin_port), timeout=5).close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", admin_port), timeout=5).close()
