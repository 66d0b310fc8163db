"""
The fault ledger: the crash harness's L{Ledger} plus what a fault adds.

Besides acknowledged adds, deliveries and confirmations it records refused
adds (an error reply: the item must never be served), when each add and
confirmation was acknowledged, the fault windows, and the problems the
scenario saw on the server (memory that disagrees with the journal, reads
left open when no client holds them).

What the ledger allows depends on the sync policy (L{Policy}):

  - a durable policy (C{sync_journal: always} with C{durable_acks}) allows
    nothing: every acknowledged add is delivered, no acknowledged
    confirmation is undone;
  - a policy that acknowledges before the fsync (C{never}, or a period
    without C{durable_acks}) may undo what was not yet durable when the
    fault struck, once: an add or confirmation acknowledged inside a fault's
    I{doubt window} may be undone (the add lost, the confirmed item
    delivered once more). The window starts one sync period plus
    L{SLACK_SECONDS} before the fault (C{never}: L{SLACK_SECONDS}) and ends
    when the fault ends. Outside the windows nothing may be undone.

Items are bytes that are unique within a run; a scenario that delivers the
same item on several queues (fanout) keys it by queue (L{key}).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.harness import Ledger

#: Added before a window: an acknowledgement may precede the fsync that failed by this much
#: more than the sync period (threads and strace slow the server down).
SLACK_SECONDS = 0.5


@dataclass(frozen=True)
class Policy:
    """A sync policy the scenarios run under (the queue settings under C{default})."""

    name: str
    queue_config: dict[str, Any]
    #: Seconds an acknowledged write may wait for its fsync (0 when durable before the ack);
    #: C{None} under C{never} (no fsync promised at all).
    doubt: float | None

    @property
    def durable(self) -> bool:
        """Whether an acknowledgement promises the write is on disk."""
        return self.doubt == 0

    @property
    def fsyncs(self) -> bool:
        """Whether the server fsyncs journals under this policy (fsync faults apply)."""
        return self.queue_config.get("sync_journal") != "never"


POLICIES: dict[str, Policy] = {p.name: p for p in [
    Policy("never", {"sync_journal": "never"}, None),
    Policy("always+durable", {"sync_journal": "always", "durable_acks": True}, 0.0),
    Policy("period", {"sync_journal": "50ms"}, 0.05),
    Policy("always", {"sync_journal": "always"}, 0.0),
    Policy("period+durable", {"sync_journal": "50ms", "durable_acks": True}, 0.0),
]}
#: The policies CI runs (the brief's three: none, every write durable, a period).
DEFAULT_POLICIES = ("never", "always+durable", "period")


def key(queue: str, item: bytes) -> bytes:
    """The ledger's name of C{item} on C{queue} (for items delivered on several queues)."""
    return queue.encode() + b":" + item


@dataclass
class Problems:
    """What the scenario saw wrong on the server itself, by kind."""

    memory_vs_journal: list[str] = field(default_factory=list)
    stuck_open: list[str] = field(default_factory=list)


class FaultLedger(Ledger):
    """L{Ledger} with refusals, acknowledgement times, fault windows and server problems."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        self.refused: set[bytes] = set()
        self.ack_time: dict[bytes, float] = {}
        self.confirm_time: dict[bytes, float] = {}
        self.after_confirm: Counter[bytes] = Counter()
        self.windows: list[tuple[float, float]] = []
        self.injected = 0
        self.problems = Problems()

    def acknowledged(self, ids: list[bytes]) -> None:
        """These adds were acknowledged (now)."""
        now = time.monotonic()
        with self._lock:
            self.acked.update(ids)
            for item in ids:
                self.ack_time.setdefault(item, now)

    def refused_adds(self, ids: list[bytes]) -> None:
        """These adds got an error reply: they must never be served."""
        with self._lock:
            self.refused.update(ids)

    def delivered(self, item: bytes) -> None:
        """A client received C{item}."""
        with self._lock:
            if item in self.confirmed:
                self.after_confirm[item] += 1
        super().delivered(item)

    def confirmed_all(self, items: list[bytes]) -> None:
        """The confirmations of these reads were acknowledged (now)."""
        now = time.monotonic()
        with self._lock:
            for item in items:
                self.confirm_time[item] = now
        super().confirmed_all(items)

    def fault(self, started: float, ended: float, injected: int) -> None:
        """A fault lasted from C{started} to C{ended} and failed C{injected} calls."""
        with self._lock:
            self.windows.append((started, ended))
            self.injected += injected

    def faulted(self, count: int) -> None:
        """C{count} faults that allow nothing (a client vanished) were made."""
        with self._lock:
            self.injected += count

    def in_doubt(self, when: float | None) -> bool:
        """Whether the policy allows undoing what was acknowledged at C{when}."""
        if when is None or self.policy.durable:
            return False
        before = (self.policy.doubt or 0.0) + SLACK_SECONDS
        return any(start - before <= when <= end for start, end in self.windows)

    def examples(self, count: int = 3) -> list[str]:
        """A few items of each kind of failure, to look for in the server's log."""
        with self._lock:
            lost = sorted(i for i in self.acked if self.deliveries[i] == 0
                          and not self.in_doubt(self.ack_time.get(i)))
            served = sorted(self.refused & set(self.deliveries))
            back = sorted(i for i, n in self.after_confirm.items()
                          if n > 1 or not self.in_doubt(self.confirm_time.get(i)))
        out = []
        for name, items in (("lost", lost), ("refused but served", served),
                            ("confirmed, then delivered again", back)):
            if items:
                shown = b", ".join(i[:40] for i in items[:count]).decode("latin-1")
                out.append(f"{name}: {len(items)}, e.g. {shown}")
        return out

    def verdict(self) -> dict[str, int]:
        """The counts of the check (see the module docstring)."""
        with self._lock:
            lost = undone = 0
            for item in self.acked:
                if self.deliveries[item] == 0:
                    if self.in_doubt(self.ack_time.get(item)):
                        undone += 1
                    else:
                        lost += 1
            reappeared = undone_confirms = duplicated = 0
            for item, times in self.after_confirm.items():
                if times == 1 and self.in_doubt(self.confirm_time.get(item)):
                    undone_confirms += 1
                else:
                    reappeared += 1
            for item, n in self.deliveries.items():
                allowed = 1 + self.open_at_crash[item] + (self.after_confirm[item] == 1)
                if n > allowed:
                    duplicated += 1
            return {
                "acknowledged": len(self.acked),
                "refused": len(self.refused),
                "delivered": len(self.deliveries),
                "lost": lost,
                "undone": undone,
                "reappeared": reappeared,
                "undone_confirms": undone_confirms,
                "duplicated": duplicated,
                "refused_served": len(self.refused & set(self.deliveries)),
                "memory_vs_journal": len(self.problems.memory_vs_journal),
                "stuck_open": len(self.problems.stuck_open),
                "injected": self.injected,
            }


#: The verdict keys that must be 0 (the acceptance).
MUST_BE_ZERO = ("lost", "reappeared", "duplicated", "refused_served", "memory_vs_journal",
                "stuck_open")
