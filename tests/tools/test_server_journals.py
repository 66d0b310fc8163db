"""qdump and qpack on journals written by the real server, and the server replaying a packed one."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable

from kestrel.tools import qdump, qpack
from tests.wire.conftest import KestrelProcess, LineClient


def session(server: KestrelProcess, *commands: bytes) -> list[bytes]:
    client = LineClient(server.connect())
    replies = []
    for command in commands:
        client.send(command)
        replies.append(client.until(b"END\r\n" if command.startswith(b"get") else b"\r\n"))
    client.close()
    return replies


def test_dump_and_pack_a_server_journal(kestrel_factory: Callable[..., KestrelProcess]) -> None:
    """The server's journal dumps as Kestrel's tool would, packs, and replays after packing."""
    server = kestrel_factory(protocols=("memcache",), config={"max_open_transactions": 10})
    session(server, b"set q 0 0 5\r\nhello\r\n", b"set q 0 0 5\r\nworld\r\n",
            b"set q 0 0 3\r\nabc\r\n", b"set q 0 0 4\r\nlast\r\n",
            b"get q/open\r\n", b"get q/close/open\r\n", b"get q/abort\r\n", b"get q\r\n")
    # Leave one read open when the server stops: it is journaled as open.
    client = LineClient(server.connect())
    client.send(b"get q/open\r\n")
    assert client.until(b"END\r\n") == b"VALUE q/open 0 3\r\nabc\r\nEND\r\n"
    server.kill()  # no clean close: the open read stays open in the journal
    client.close()
    journal = server.queue_path / "q"

    out, err = io.BytesIO(), io.BytesIO()
    assert qdump.main([str(journal)], out, err) == 0
    assert out.getvalue().decode().split("\n") == [
        f"Queue: {journal}",
        "00000000  ADD 5     ",
        "0000001a  ADD 5     ",
        "00000034  ADD 3     ",
        "0000004c  ADD 4     ",
        "00000065  RSV 1",
        "0000006a  ACK 1",
        "0000006f  RSV 2",
        "00000074  CAN 2",
        "00000079  REM",
        "0000007a  RSV 3",
        "\r" + " " * 30,
        "Journal size: 127 bytes, with 10 operations.",
        "2 items totalling 7 bytes.",
        "",
    ]

    packed = server.root / "packed"
    out = io.BytesIO()
    assert qpack.main(["-f", str(packed), str(journal)], out, io.BytesIO()) == 0
    out = io.BytesIO()
    assert qdump.main(["-d", str(packed)], out, io.BytesIO()) == 0
    assert out.getvalue().decode().split("\n")[1:8] == [
        "00000000  XID 3", "00000005  ADD 3     ", "    abc", "0000001d  RSV 3",
        "00000022  ADD 4     ", "    last", "\r" + " " * 30,
    ]

    shutil.copy(packed, journal)
    server.start()
    # The open read comes back to the head on replay, then the rest in order.
    assert session(server, b"get q\r\n", b"get q\r\n", b"get q\r\n") == [
        b"VALUE q 0 3\r\nabc\r\nEND\r\n", b"VALUE q 0 4\r\nlast\r\nEND\r\n", b"END\r\n"]
