"""The HTTP request-line detector the memcache and text protocols share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.protocols.base import looks_like_http

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
