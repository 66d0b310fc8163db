"""
Server life cycle over memcache against real processes: restart, kill -9,
reload, SIGHUP, SIGTERM, the `shutdown` command, and the README's `twistd`
command line.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.wire.conftest import KestrelProcess, LineClient
from tests.wire.test_memcache import get_value


def client(server: KestrelProcess) -> LineClient:
    """A raw-socket client of the server's memcache port."""
    return LineClient(server.connect())


def store(c: LineClient, queue: bytes, *items: bytes) -> None:
    """Set every item and check each was STORED."""
    c.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (queue, len(i), i) for i in items))
    for _ in items:
        assert c.line() == b"STORED\r\n"


def drain(c: LineClient, queue: bytes) -> list[bytes]:
    """Every item left in the queue, in order."""
    items = []
    while (value := get_value(c, b"get %s\r\n" % queue)) is not None:
        items.append(value)
    return items


def test_restart_keeps_items_and_open_reads(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """After a clean restart every item is back, the open read first, and SIGTERM exits 0."""
    server = kestrel_factory()
    c = client(server)
    store(c, b"keep", b"one", b"two", b"three")
    assert get_value(c, b"get keep/open\r\n") == b"one"
    assert server.restart() == 0
    assert "kestrel stopped" in server.log()
    c2 = client(server)
    assert drain(c2, b"keep") == [b"one", b"two", b"three"]
    c.close()
    c2.close()


def test_kill_9_loses_nothing_acknowledged(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """With sync_journal always, every STORED item survives kill -9."""
    server = kestrel_factory(config={"default": {"sync_journal": "always"}})
    c = client(server)
    items = [b"item-%03d" % i for i in range(50)]
    store(c, b"durable", *items)
    assert get_value(c, b"get durable/open\r\n") == items[0]
    server.kill()
    server.start()
    c2 = client(server)
    assert drain(c2, b"durable") == items
    c.close()
    c2.close()


def test_reload_applies_edited_config(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """Editing the config file then `reload` changes queue limits in place."""
    server = kestrel_factory()
    c = client(server)
    store(c, b"limited", b"a", b"b")
    server.write_config({"queues": {"limited": {"max_items": 2}}})
    c.send(b"reload\r\n")
    assert c.line() == b"Reloaded config.\r\n"
    c.send(b"set limited 0 0 1\r\nc\r\n")
    assert c.line() == b"NOT_STORED\r\n"
    server.write_config({"queues": {"limited": {"max_items": "lots"}}})
    c.send(b"reload\r\nset limited 0 0 1\r\nc\r\n")
    reply = c.line()
    assert reply.startswith(b"ERROR reload failed: ") and b"max_items" in reply
    assert c.line() == b"NOT_STORED\r\n"
    c.close()


def test_sighup_reloads(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """SIGHUP rereads the config file."""
    server = kestrel_factory()
    c = client(server)
    store(c, b"hup", b"a")
    server.write_config({"queues": {"hup": {"max_items": 1}}})
    server.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "Config reloaded on SIGHUP" not in server.new_log():
        assert time.monotonic() < deadline, server.new_log()
        time.sleep(0.05)
    c.send(b"set hup 0 0 1\r\nb\r\n")
    assert c.line() == b"NOT_STORED\r\n"
    c.close()


def test_shutdown_command_stops_cleanly(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """`shutdown` closes the connection without a reply and the server exits 0."""
    server = kestrel_factory()
    c = client(server)
    store(c, b"bye", b"x")
    c.send(b"shutdown\r\n")
    assert c.closed()
    assert server.wait_exit() == 0
    assert "kestrel stopped" in server.log()
    server.start()
    c2 = client(server)
    assert drain(c2, b"bye") == [b"x"]
    c.close()
    c2.close()


def test_all_listeners_start(kestrel: KestrelProcess) -> None:
    """The module server accepts connections on every enabled port."""
    for name, port in kestrel.ports.items():
        if port:
            kestrel.connect(name).close()
    assert "kestrel ready" in kestrel.log()


def test_readme_twistd_command(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """
    The README's `twistd -n kestrel ...` starts a server that serves, keeps
    twistd's pid file in its own working directory, and exits 0 on SIGTERM.
    """
    server = kestrel_factory(launcher="twistd")
    assert server.running
    command = server.proc.args
    assert Path(command[0]).name == "twistd"
    assert command[1:3] == ["-n", "kestrel"]
    assert (server.root / "twistd.pid").read_text().strip() == str(server.proc.pid)
    c = client(server)
    store(c, b"readme", b"hello")
    assert drain(c, b"readme") == [b"hello"]
    c.close()
    assert server.stop() == 0
    assert "kestrel stopped" in server.log()
    assert not (server.root / "twistd.pid").exists()
