"""
Queue names: which strings may name a queue, and the fanout naming rule.

A queue name becomes the stem of its journal files (C{<q>}, C{<q>.<ms>},
C{<q>~~<ms>}), so a name that is accepted here can never reach a path outside
the queue directory, nor be mistaken for another queue's rotated or temporary
file.

Names are C{str}. The wire protocols decode them from bytes as ISO-8859-1
(Kestrel decodes command lines that way), so every byte maps to exactly one
character and decoding never fails; thrift strings arrive already decoded. The
200-byte limit is measured on the UTF-8 encoding, which is how the name is
written to the file system.

Kestrel rejects only C{.}, C{/} and C{~}; we also reject empty names, names
longer than 200 bytes, whitespace, control characters (NUL included), lone
surrogates, and fanout names with nothing before or after the C{+}
(see C{docs/config.md} and C{docs/differences.md}).
"""

from __future__ import annotations

import unicodedata

from kestrel.errors import InvalidQueueName

#: The characters Kestrel refuses in a queue name, in Kestrel's order.
ILLEGAL_CHARACTERS = "~./"

#: The longest accepted name, in bytes of its UTF-8 encoding.
MAX_QUEUE_NAME_BYTES = 200

#: Separates a fanout master from its child: C{parent+child}.
FANOUT_SEPARATOR = "+"


def validate_queue_name(name: str) -> str:
    """
    Return C{name} unchanged if it may name a queue, else raise L{InvalidQueueName}.

    The exception message says what is wrong (and, for C{. / ~}, lists
    Kestrel's illegal characters). Every accepted name is a single, non-empty
    path component other than C{.} and C{..}: it contains no path separator.
    """
    if not isinstance(name, str):
        raise InvalidQueueName(f"Queue name must be a string, not {type(name).__name__}.")
    if not name:
        raise InvalidQueueName("Queue name is empty.")
    if any(c in ILLEGAL_CHARACTERS for c in name):
        raise InvalidQueueName(
            f"Queue name contains illegal characters (one of: {' '.join(ILLEGAL_CHARACTERS)})."
        )
    for c in name:
        if c == "\0":
            raise InvalidQueueName("Queue name contains a NUL character.")
        category = unicodedata.category(c)
        if category == "Cc":
            raise InvalidQueueName(f"Queue name contains a control character ({c!r}).")
        if c.isspace():
            raise InvalidQueueName(f"Queue name contains whitespace ({c!r}).")
        if category == "Cs":
            raise InvalidQueueName("Queue name contains a lone surrogate (not valid Unicode).")
    size = len(name.encode("utf-8"))
    if size > MAX_QUEUE_NAME_BYTES:
        raise InvalidQueueName(
            f"Queue name is {size} bytes long; the limit is {MAX_QUEUE_NAME_BYTES} bytes (UTF-8)."
        )
    if name.startswith(FANOUT_SEPARATOR):
        raise InvalidQueueName("Fanout queue name has no master queue before '+'.")
    if name.endswith(FANOUT_SEPARATOR):
        raise InvalidQueueName("Fanout queue name has no child name after '+'.")
    return name


def decode_queue_name(raw: bytes) -> str:
    """
    Decode a queue name read from the wire (ISO-8859-1) and validate it.

    Raises L{InvalidQueueName} as L{validate_queue_name} does.
    """
    return validate_queue_name(raw.decode("iso-8859-1"))


def is_fanout(name: str) -> bool:
    """Return whether C{name} names a fanout child queue (C{parent+child})."""
    return FANOUT_SEPARATOR in name


def master_name(name: str) -> str:
    """
    Return the master queue of C{name}: the text before its first C{+}.

    A name without C{+} is its own master.
    """
    return name.split(FANOUT_SEPARATOR, 1)[0]
