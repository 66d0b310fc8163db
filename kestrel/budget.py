"""
The memory clients may make the server hold: one budget shared by every connection.

L{ClientMemory} counts the input bytes connections hold (unanswered request
lines, the declared data of a memcache C{set}, a text C{put} body) against
C{max_client_memory}. A connection asks before it holds more
(L{ClientMemory.grow}); a request that would go over the cap is refused
before it is read, instead of growing the process until the kernel kills it.

Memory Python frees is not always given back to the system: glibc keeps freed
heap pages for reuse, and a closed connection's protocol may wait in a
reference cycle for the garbage collector. After a connection that held a lot
(input, or replies its client did not read) ends, L{ClientMemory.schedule_trim}
collects garbage and asks glibc to return the free pages (C{malloc_trim(0)}),
at most once per L{TRIM_DELAY} seconds. Elsewhere (or if
the C library has no C{malloc_trim}) that step is skipped. No sockets here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

__all__ = ["ClientMemory", "TRIM_AFTER", "TRIM_DELAY", "malloc_trim"]

#: A connection that held at least this many bytes asks for a trim when it lets them go.
TRIM_AFTER = 4 * 1024 * 1024
#: Seconds between the first large release and the trim (releases meanwhile share it).
TRIM_DELAY = 0.2

_log = Logger()


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's C{malloc_trim}, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()


def malloc_trim() -> bool:
    """Give free heap pages back to the system; return whether there was a way to."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


class ClientMemory:
    """
    How many bytes of client input every connection together holds, capped at C{limit}.

    @ivar used: bytes held now, all connections together.
    @ivar refused: requests refused because they would have gone over C{limit}.
    """

    def __init__(self, limit: int, clock: IReactorTime | None = None, *,
                 trim: Callable[[], object] = malloc_trim) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0
        self._clock = clock
        self._trim = trim
        self._trim_call: IDelayedCall | None = None

    def grow(self, held: int, wanted: int) -> bool:
        """
        A connection holding C{held} bytes wants to hold C{wanted}: return
        whether it may (then C{used} counts C{wanted}); shrinking always may.
        """
        delta = wanted - held
        if delta > 0 and self.used + delta > self.limit:
            self.refused += 1
            return False
        self.used += delta
        return True

    def released(self, held: int) -> None:
        """A connection lets go of the C{held} bytes it still counted."""
        self.used -= held

    def schedule_trim(self) -> None:
        """
        A connection that held much memory (input or unread replies) ended:
        in L{TRIM_DELAY} seconds, collect garbage cycles (a closed protocol
        may sit in one with its transport's buffers) and give free heap pages
        back to the system. Requests meanwhile share that one trim.
        """
        if self._clock is not None and self._trim_call is None:
            self._trim_call = self._clock.callLater(TRIM_DELAY, self._run_trim)

    def _run_trim(self) -> None:
        self._trim_call = None
        try:
            gc.collect()
            self._trim()
        except Exception:
            _log.failure("Returning memory to the system failed")
