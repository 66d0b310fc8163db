"""Hostile input below the wire: the HTTP line detector, journal paths and modes, config."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from kestrel.budget import TRIM_DELAY, ClientMemory, malloc_trim
from kestrel.config import parse_config
from kestrel.errors import ConfigError
from kestrel.item import QItem
from kestrel.journal.journal import FileJournal
from kestrel.protocols.base import looks_like_http
from kestrel.protocols.memcache import MemcacheFactory
from kestrel.protocols.text import TextFactory
from kestrel.protocols.thrift import ThriftFactory
from kestrel.server import KestrelServer
from tests.support import StringClient, make_server

COMMANDS = ["get", "set", "put", "peek", "monitor", "confirm", "flush", "flush_all", "delete",
            "status", "version", "reload", "shutdown", "quit", "stats", "dump_stats",
            "dump_config", "gets", "flush_expired", "flush_all_expired"]


@pytest.mark.parametrize("line", [b"GET / HTTP/1.1", b"POST /shutdown HTTP/1.1", b"GET /",
                                  b"HEAD /x HTTP/1.0", b"OPTIONS * HTTP/1.1",
                                  b"CONNECT example.com:443 HTTP/1.1", b"PRI * HTTP/2.0",
                                  b"GET http://example.com/ HTTP/1.1", b"PROPFIND /d HTTP/1.1"])
def test_http_request_lines(line: bytes) -> None:
    assert looks_like_http(line)


@given(st.sampled_from(COMMANDS), st.sampled_from(["lower", "upper", "title"]),
       st.lists(st.from_regex(r"[A-Za-z0-9_.+=/-]{1,20}", fullmatch=True), max_size=4))
def test_kestrel_commands_are_not_http(command: str, case: str, args: list[str]) -> None:
    """No Kestrel request line, in any case, with queue names and options, is taken for HTTP."""
    word = getattr(command, case)()
    args = [a for a in args if not a.startswith("/")]
    line = " ".join([word, *args]).encode()
    assert not looks_like_http(line)
    assert not looks_like_http(line + b":")


# -- journal files: modes and symbolic links ---------------------------------------------------


def _journal(tmp_path: Path, file_mode: int = 0o600) -> FileJournal:
    clock = Clock()
    clock.advance(1_700_000_000)
    journal = FileJournal(str(tmp_path), "q", clock, None, file_mode=file_mode)
    journal.replay(lambda record: None)
    return journal


def test_rewritten_journal_keeps_the_mode(tmp_path: Path) -> None:
    """The current file and the file a rewrite puts in its place are both C{file_mode}."""
    journal = _journal(tmp_path, 0o640)
    journal.add(QItem(b"x", 1))
    assert stat.S_IMODE(os.stat(tmp_path / "q").st_mode) == 0o640
    journal.rewrite([], [QItem(b"x", 1)])
    assert stat.S_IMODE(os.stat(tmp_path / "q").st_mode) == 0o640
    journal.close()


def test_current_file_symlink_is_not_opened(tmp_path: Path) -> None:
    """A symbolic link where C{<q>} goes is refused (ELOOP); its target is never written."""
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    folder = tmp_path / "queues"
    folder.mkdir()
    (folder / "q").symlink_to(target)
    with pytest.raises(OSError) as raised:
        _journal(folder)
    assert raised.value.errno == errno.ELOOP
    assert target.read_bytes() == b"keep"
    assert FileJournal.queue_names_in(str(folder)) == set()


@pytest.mark.parametrize(("text", "expected"), [('"0600"', 0o600), ("0640", 0o640),
                                                ('"750"', 0o750), ("0o700", 0o700)])
def test_file_modes_parse(text: str, expected: int) -> None:
    assert parse_config(f"journal_file_mode: {text}\n").journal_file_mode == expected


@pytest.mark.parametrize("text", ["600", '"0999"', "rw", "true"])
def test_bad_file_modes_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="journal_file_mode"):
        parse_config(f"journal_file_mode: {text}\n")


def test_control_commands_default_follows_the_token() -> None:
    assert not parse_config("").control_admin_only
    assert parse_config("admin_token: 0123456789abcdef\n").control_admin_only
    assert parse_config("admin_token_file: /etc/token\n").control_admin_only
    assert not parse_config("admin_token: 0123456789abcdef\ncontrol_commands: all\n"
                            ).control_admin_only
    assert parse_config("control_commands: admin_only\n").control_admin_only


@pytest.mark.parametrize("text", ["admin_token: short\n", "control_commands: some\n",
                                  "admin_token: 0123456789abcdef\nadmin_token_file: /x\n",
                                  "max_client_memory: 1MiB\n"])
def test_bad_control_settings_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_config(text)


# -- the client memory budget -------------------------------------------------------------------


def test_client_memory_caps_the_sum() -> None:
    """Growing past the limit is refused (and counted); shrinking and release always work."""
    memory = ClientMemory(100)
    assert memory.grow(0, 60)
    assert not memory.grow(0, 41)
    assert memory.refused == 1
    assert memory.grow(0, 40)
    assert memory.used == 100
    assert memory.grow(60, 10)
    memory.released(10)
    memory.released(40)
    assert memory.used == 0


def test_trims_are_shared_and_delayed(clock: Clock) -> None:
    """Several large closes in a row cause one trim, TRIM_DELAY seconds later."""
    trims: list[float] = []
    memory = ClientMemory(100, clock, trim=lambda: trims.append(clock.seconds()))
    memory.schedule_trim()
    memory.schedule_trim()
    clock.advance(TRIM_DELAY)
    assert trims == [clock.seconds()]
    memory.schedule_trim()
    clock.advance(TRIM_DELAY)
    assert len(trims) == 2


def test_malloc_trim_runs_here() -> None:
    """On glibc (the CI platform) the trim is available and harmless."""
    assert malloc_trim() in (True, False)


# -- protocols over a StringTransport: input budget and back-pressure ----------------------------


def test_memcache_set_over_the_budget_is_refused_before_its_data(
        clock: Clock, tmp_path: Path) -> None:
    server = make_server(clock, tmp_path, max_request_size=1000, max_client_memory=1500)
    first = StringClient(MemcacheFactory(server))
    assert first.send(b"set a 0 0 1000\r\n" + b"x" * 10) == b""
    # the request line (16 bytes), kept until its data block is whole, and that block
    assert server.client_memory.used == 16 + 1002
    second = StringClient(MemcacheFactory(server))
    assert second.send(b"set b 0 0 600\r\n") == (
        b"SERVER_ERROR out of memory for client requests (max_client_memory); retry\r\n")
    assert not second.connected
    first.close()
    assert server.client_memory.used == 0
    third = StringClient(MemcacheFactory(server))
    assert third.send(b"set b 0 0 600\r\n" + b"y" * 600 + b"\r\n") == b"STORED\r\n"
    assert server.client_memory.used == 0


def test_text_input_over_the_budget_is_refused(clock: Clock, tmp_path: Path) -> None:
    server = make_server(clock, tmp_path, max_request_size=1000, max_client_memory=1000)
    first = StringClient(TextFactory(server))
    assert first.send(b"put q:\n" + b"a" * 500 + b"\n" + b"b" * 200) == b""
    assert server.client_memory.used == 700
    second = StringClient(TextFactory(server))
    assert second.send(b"c" * 400) == (
        b"-Out of memory for client requests (max_client_memory); retry later.\n")
    assert not second.connected
    assert first.send(b"\n\n") == b"+2\n"
    assert server.client_memory.used == 0


def test_thrift_frame_over_the_budget_is_refused_before_it_is_read(
        clock: Clock, tmp_path: Path) -> None:
    """A frame counts at its declared size from its header on; over the cap, it closes."""
    server = make_server(clock, tmp_path, max_request_size=1000, max_client_memory=1500)
    first = StringClient(ThriftFactory(server))
    assert first.send((1000).to_bytes(4, "big") + b"x" * 10) == b""
    assert server.client_memory.used == 1004
    second = StringClient(ThriftFactory(server))
    assert second.send((600).to_bytes(4, "big")) == b""
    assert not second.connected
    assert server.client_memory.used == 1004
    first.close()
    assert server.client_memory.used == 0
    third = StringClient(ThriftFactory(server))
    third.send((600).to_bytes(4, "big") + b"y" * 100)
    assert third.connected
    assert server.client_memory.used == 604


@pytest.mark.parametrize(("factory", "request_", "reply"), [
    (MemcacheFactory, b"get q/peek\r\n", b"VALUE q/peek 0 1\r\nx\r\nEND\r\n"),
    (TextFactory, b"peek q\n", b":x\n")])
def test_blocked_output_stops_serving_until_the_client_reads(
        server: KestrelServer, factory: Any, request_: bytes, reply: bytes) -> None:
    """
    While the transport holds too much unread output (it calls
    pauseProducing), buffered requests wait and reading pauses; when the
    client has read (resumeProducing), they are answered, in order.
    """
    assert StringClient(MemcacheFactory(server)).send(b"set q 0 0 1\r\nx\r\n") == b"STORED\r\n"
    client = StringClient(factory(server))
    assert client.transport.producer is client.protocol
    client.protocol.pauseProducing()
    assert client.transport.producerState == "paused"
    assert client.send(request_ * 3) == b""
    client.protocol.resumeProducing()
    assert client.transport.producerState == "producing"
    assert client.take() == reply * 3
