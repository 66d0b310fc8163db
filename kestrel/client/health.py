"""
Server health: a server that failed is left out for a backoff period, then retried.

The pause after the n-th failure in a row is C{base * 2**(n-1)}, capped at
C{cap}, then scaled by a random factor in C{[1 - jitter, 1]} so that many
clients do not come back to a recovering server at the same instant. One
success resets the count.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IReactorTime


@attrs.frozen
class Backoff:
    """An exponential, capped, jittered backoff policy (seconds)."""

    base: float = 0.1
    cap: float = 10.0
    jitter: float = 0.5

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """The pause after C{failures} failures in a row (at least 1)."""
        raw = min(self.cap, self.base * (2 ** max(0, failures - 1)))
        return raw * (1.0 - self.jitter * rand())


@attrs.define
class _State:
    failures: int = 0
    down_until: float = 0.0
    reason: str = ""


class Health:
    """
    The health of every server a client talks to, by name (C{host:port}).

    C{clock} gives the time (C{seconds()}); C{rand} the jitter.
    """

    def __init__(self, clock: IReactorTime, backoff: Backoff | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.clock = clock
        self.backoff = backoff or Backoff()
        self.rand = rand
        self._states: dict[str, _State] = {}

    def _now(self) -> float:
        return self.clock.seconds()

    def healthy(self, server: str) -> bool:
        """Whether C{server} may be used now (never failed, or its backoff is over)."""
        state = self._states.get(server)
        return state is None or state.down_until <= self._now()

    def failed(self, server: str, reason: str) -> float:
        """Record a failure of C{server}; return how long it is left out."""
        state = self._states.setdefault(server, _State())
        state.failures += 1
        pause = self.backoff.delay(state.failures, self.rand)
        state.down_until = self._now() + pause
        state.reason = reason
        return pause

    def succeeded(self, server: str) -> None:
        """Record a success of C{server}: its failure count starts again."""
        self._states.pop(server, None)

    def failures(self, server: str) -> int:
        """How many failures in a row C{server} has had."""
        state = self._states.get(server)
        return 0 if state is None else state.failures

    def retry_at(self, server: str) -> float:
        """When C{server} may be used again (0 for a healthy one)."""
        state = self._states.get(server)
        return 0.0 if state is None else state.down_until

    def left_out(self, server: str) -> str:
        """Why and for how long C{server} is left out (for error messages); "" when it is not."""
        state = self._states.get(server)
        if state is None or state.down_until <= self._now():
            return ""
        return (f"left out for {state.down_until - self._now():.2f}s more after "
                f"{state.failures} failure(s) in a row ({state.reason})")

    def split(self, servers: list[str]) -> tuple[list[str], list[str]]:
        """C{servers} as (healthy, left out), the left-out ones soonest back first."""
        if not self._states:
            return list(servers), []
        healthy = [s for s in servers if self.healthy(s)]
        out = sorted((s for s in servers if not self.healthy(s)), key=self.retry_at)
        return healthy, out
