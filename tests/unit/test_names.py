"""Queue-name validation and the fanout naming rule (kestrel.names)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel.errors import InvalidQueueName
from kestrel.names import (
    MAX_QUEUE_NAME_BYTES,
    decode_queue_name,
    is_fanout,
    master_name,
    validate_queue_name,
)


@pytest.mark.parametrize("name", [
    "q", "weather_updates", "jobs-2026", "UPPER", "q+fanout", "a+b+c", "a++b",
    "caf\u00e9", "\u6f22\u5b57", "x" * MAX_QUEUE_NAME_BYTES, "@#$%^&*()=[]{}:;'\"<>,?!|`\\",
])
def test_accepts_ordinary_names(name: str) -> None:
    """Ordinary names, fanout names and non-ASCII names are accepted unchanged."""
    assert validate_queue_name(name) == name


@pytest.mark.parametrize("name", ["a.b", ".", "..", "../etc", "a/b", "/abs", "~home", "q~~123"])
def test_rejects_kestrels_illegal_characters_naming_them(name: str) -> None:
    """Names with '.', '/' or '~' are refused with Kestrel's message listing the three."""
    with pytest.raises(InvalidQueueName) as e:
        validate_queue_name(name)
    assert str(e.value) == "Queue name contains illegal characters (one of: ~ . /)."


def test_rejects_empty_name() -> None:
    """The empty string is refused as empty."""
    with pytest.raises(InvalidQueueName, match="empty"):
        validate_queue_name("")


def test_length_limit_is_in_utf8_bytes() -> None:
    """200 bytes of UTF-8 pass; 201 are refused even when that is fewer characters."""
    assert validate_queue_name("\u00e9" * 100) == "\u00e9" * 100  # 200 bytes
    with pytest.raises(InvalidQueueName, match="201 bytes"):
        validate_queue_name("x" * 201)
    with pytest.raises(InvalidQueueName, match="202 bytes"):
        validate_queue_name("\u00e9" * 101)  # 101 characters, 202 bytes


@pytest.mark.parametrize("name, reason", [
    ("a b", "whitespace"), (" q", "whitespace"), ("q\u00a0", "whitespace"),
    ("q\u2003x", "whitespace"), ("q\u2028", "whitespace"),
    ("q\tx", "control"), ("q\r", "control"), ("q\n", "control"), ("q\x7f", "control"),
    ("q\x85", "control"), ("\x01", "control"),
    ("q\0", "NUL"), ("\0", "NUL"),
    ("q\ud800", "surrogate"),
])
def test_rejects_whitespace_and_control_characters(name: str, reason: str) -> None:
    """Whitespace, control characters, NUL and lone surrogates are refused, saying which."""
    with pytest.raises(InvalidQueueName, match=reason):
        validate_queue_name(name)


@pytest.mark.parametrize("name", ["+", "+child", "master+"])
def test_rejects_fanout_names_with_an_empty_side(name: str) -> None:
    """A '+' with nothing before or after it names no master or no child."""
    with pytest.raises(InvalidQueueName, match="Fanout"):
        validate_queue_name(name)


def test_rejects_non_strings() -> None:
    """Bytes are not names: the caller must decode them first."""
    with pytest.raises(InvalidQueueName, match="string"):
        validate_queue_name(b"q")  # type: ignore[arg-type]


def test_invalid_queue_name_is_a_value_error() -> None:
    """Callers catching ValueError also catch a bad name."""
    assert issubclass(InvalidQueueName, ValueError)


def test_decode_queue_name_uses_iso_8859_1() -> None:
    """Every wire byte becomes the character of the same code point."""
    assert decode_queue_name(b"caf\xe9") == "caf\u00e9"
    assert decode_queue_name(b"q+f") == "q+f"
    with pytest.raises(InvalidQueueName):
        decode_queue_name(b"a/../b")
    with pytest.raises(InvalidQueueName, match="control"):
        decode_queue_name(b"q\x9b")


def test_fanout_rule() -> None:
    """The master of a fanout name is the text before the first '+'."""
    assert not is_fanout("q")
    assert master_name("q") == "q"
    assert is_fanout("q+f")
    assert master_name("q+f") == "q"
    assert master_name("q+f+g") == "q"
    assert is_fanout("q+f+g")


@given(st.text())
def test_no_accepted_name_escapes_the_queue_directory(name: str) -> None:
    """
    Whatever the string, an accepted name is one path component that stays
    inside the queue directory, and no journal file name of it has a separator.
    """
    folder = "/srv/kestrel/queues"
    try:
        validate_queue_name(name)
    except InvalidQueueName:
        return
    assert os.sep not in name and (os.altsep is None or os.altsep not in name)
    assert name not in (".", "..")
    joined = os.path.normpath(os.path.join(folder, name))
    assert os.path.dirname(joined) == folder
    assert os.path.basename(joined) == name
    for journal_file in (name, f"{name}.1767225600000", f"{name}~~1767225600000"):
        assert os.path.dirname(os.path.normpath(os.path.join(folder, journal_file))) == folder


@given(st.binary(max_size=300))
def test_decoding_never_fails_and_accepted_names_escape_nothing(raw: bytes) -> None:
    """Any wire bytes give a valid, contained name or InvalidQueueName; never another error."""
    try:
        name = decode_queue_name(raw)
    except InvalidQueueName:
        return
    assert name.encode("iso-8859-1") == raw
    assert "/" not in name and "." not in name and "\0" not in name
    assert len(name.encode("utf-8")) <= MAX_QUEUE_NAME_BYTES


@given(st.text(alphabet=st.characters(categories=["L", "N"]), min_size=1, max_size=50))
def test_letters_and_digits_are_always_accepted(name: str) -> None:
    """Names of letters and digits alone (at most 50 characters, so at most 200 bytes) pass."""
    assert validate_queue_name(name) == name
