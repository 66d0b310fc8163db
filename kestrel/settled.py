"""
The outcome a Deferred already holds, read without adding a callback.

Most requests are answered at once: the item is in memory, the append is
in the journal's buffer. Their Deferreds have fired before the caller sees
them, and a caller that replies or counts straight from the outcome saves
the cost of a callback chain on every request. L{settled} is the one place
that reads it: Twisted keeps it in C{Deferred.result}, an attribute its
documentation does not promise (and types as C{object}).
L{in_deferred} goes the other way: an answer given at once, without a
Deferred, put in one for a caller that needs it.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

__all__ = ["PENDING", "Pending", "in_deferred", "settled"]

_T = TypeVar("_T")


class _Pending(enum.Enum):
    PENDING = "pending"


#: What L{settled} returns for a Deferred whose outcome is not known yet.
PENDING: Final = _Pending.PENDING

#: The type of L{PENDING}.
Pending = Literal[_Pending.PENDING]


def settled(d: Deferred[_T]) -> _T | Failure | Pending:
    """
    The outcome C{d} holds now: its value, or the L{Failure} it failed
    with, once it has fired and no callback is waiting on another Deferred
    (C{d} is not paused); otherwise L{PENDING}. Reading it changes nothing:
    C{d}'s callbacks still get the outcome, and a Failure still counts as
    unhandled until one of them handles it.
    """
    if d.called and not d.paused:
        # Twisted types the attribute as object; a fired, unpaused Deferred[_T]
        # holds a _T (as its callbacks made it) or a Failure.
        return d.result  # type: ignore[return-value]
    return PENDING


def in_deferred(outcome: _T | Deferred[_T]) -> Deferred[_T]:
    """
    C{outcome} in a Deferred: itself if it is one, else a Deferred fired
    with it. For the callers of a method that answers at once without one
    (the hot path) but who need a Deferred either way.
    """
    if isinstance(outcome, Deferred):
        return outcome
    return succeed(outcome)
