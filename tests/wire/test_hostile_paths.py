"""
Journals cannot escape their folder and are private: symbolic links planted in
the queue folder, and the modes of what the server creates. A real server
process, clients on 127.0.0.1.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from tests.wire.conftest import KestrelProcess, LineClient

OUTSIDE = b"do not touch\n"


def memcache(server: KestrelProcess, *commands: bytes) -> list[bytes]:
    client = LineClient(server.connect())
    try:
        replies = []
        for command in commands:
            client.send(command)
            reply = client.line()
            if command.startswith(b"get") and reply.startswith(b"VALUE "):
                reply += client.until(b"END\r\n")
            replies.append(reply)
        return replies
    finally:
        client.close()


def mode(path: os.PathLike[str] | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_symlinks_in_the_queue_folder_are_never_followed(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """The issue's links: skipped at start with a warning, refused at use, targets untouched."""
    server = kestrel_factory(protocols=("memcache", "text"), start=False)
    queues = server.queue_path
    queues.mkdir(mode=0o700)
    target = server.root / "outside-target.txt"
    target.write_bytes(OUTSIDE)
    outside_dir = server.root / "outside-dir"
    outside_dir.mkdir()
    (queues / "linked").symlink_to(target)
    (queues / "dirlink").symlink_to(outside_dir)
    (queues / "rotated").write_bytes(b"")
    (queues / "rotated.1700000000000").symlink_to(target)
    server.start()
    log = server.new_log()
    assert "Ignoring symbolic link 'linked'" in log
    assert "Ignoring symbolic link 'dirlink'" in log
    for name in (b"linked", b"dirlink"):
        reply = memcache(server, b"set %s 0 0 5\r\nhello\r\n" % name)[0]
        assert reply.startswith(b"CLIENT_ERROR bad queue name") and b"regular file" in reply
        reply = memcache(server, b"get %s\r\n" % name)[0]
        assert reply.startswith(b"CLIENT_ERROR bad queue name")
    client = LineClient(server.connect("text"))
    client.send(b"put linked:\nx\n\n")
    assert client.line().startswith(b"-")
    client.close()
    assert memcache(server, b"set rotated 0 0 2\r\nok\r\n", b"get rotated\r\n") == [
        b"STORED\r\n", b"VALUE rotated 0 2\r\nok\r\nEND\r\n"]
    assert server.stop() == 0
    assert target.read_bytes() == OUTSIDE
    assert os.listdir(outside_dir) == []
    assert "is a symbolic link; not followed" in server.log()


def test_journal_files_are_private_by_default(
        kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """A folder the server creates is 0700, its journal files 0600."""
    server = kestrel_factory(protocols=("memcache",))
    assert memcache(server, b"set jobs 0 0 1\r\nx\r\n") == [b"STORED\r\n"]
    assert mode(server.queue_path) == 0o700
    assert mode(server.queue_path / "jobs") == 0o600


def test_modes_are_configurable(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """journal_file_mode and queue_path_mode (octal strings) set what is created."""
    server = kestrel_factory(protocols=("memcache",),
                             config={"journal_file_mode": "0640", "queue_path_mode": "0750"})
    assert memcache(server, b"set jobs 0 0 1\r\nx\r\n") == [b"STORED\r\n"]
    assert mode(server.queue_path) == 0o750
    assert mode(server.queue_path / "jobs") == 0o640
