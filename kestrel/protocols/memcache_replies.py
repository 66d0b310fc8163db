"""
What memcache's text dialect answers: a fetch's value, a stored item, and a
refused request.

A refusal (writes blocked, a bad queue name, too many open reads, a status
that may not be set, a journal that cannot be written, a server shutting
down) is answered and the connection kept; anything else is not a refusal,
and the connection that met it closes (L{kestrel.protocols.memcache}). The
binary dialect's own mapping is L{kestrel.protocols.binary.error_status}.
"""

from __future__ import annotations

from kestrel.errors import (
    AvailabilityError,
    ForbiddenStatus,
    InvalidQueueName,
    JournalUnavailable,
    ShuttingDown,
    TooManyOpenReads,
    UnknownStatus,
)
from kestrel.item import QItem
from kestrel.protocols.memcache_parser import encode_text

__all__ = ["DELETED", "END", "NOT_STORED", "STORED", "refusal_reply", "value_reply"]

END = b"END\r\n"
STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
DELETED = b"DELETED\r\n"


def value_reply(item: QItem | None, key: bytes) -> bytes:
    """The reply to a fetch: C{VALUE <key> 0 <len>} block with C{END}, or C{END} alone."""
    if item is None:
        return END
    data = item.data
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(data), data)


def refusal_reply(exc: BaseException | None) -> bytes | None:
    """The text reply to a request refused with C{exc}; C{None} if C{exc} is no refusal."""
    if isinstance(exc, AvailabilityError):
        return b"SERVER_ERROR %s\r\n" % encode_text(str(exc))
    if isinstance(exc, ShuttingDown):
        return b"SERVER_ERROR server is shutting down\r\n"
    if isinstance(exc, TooManyOpenReads):
        return b"ERROR too many open reads\r\n"
    if isinstance(exc, InvalidQueueName):
        return b"CLIENT_ERROR bad queue name: %s\r\n" % encode_text(str(exc))
    if isinstance(exc, (UnknownStatus, ForbiddenStatus)):
        return b"CLIENT_ERROR %s\r\n" % encode_text(str(exc))
    if isinstance(exc, JournalUnavailable):
        return b"SERVER_ERROR %s\r\n" % encode_text(str(exc))
    return None
