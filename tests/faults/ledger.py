"""
The fault ledger: the crash harness's L{Ledger} plus what a fault adds.

Besides acknowledged adds, deliveries and confirmations it records refused
adds (an error reply: the item must never be served), when each add and
confirmation was acknowledged, the fault windows, and the problems the
scenario saw on the server (memory that disagrees with the journal, reads
left open when no client holds them).

What the ledger allows follows what journal.md promises per sync policy.
A failed C{write} never undoes anything acknowledged (an add or confirmation
is answered only once its record was written; the file is cut back to its
last whole record only). A failed C{fsync} makes the server cut the journal
back to its last successful fsync (except under C{never}, which cuts
nothing), undoing the records written since; so, for a fault that fails
fsyncs, a I{doubt window} runs from one sync period plus L{SLACK_SECONDS}
before the fault began until it ended, and:

  - an add acknowledged in it may be missing (C{undone}) only under a
    policy that answers adds before their fsync (a period without
    C{durable_acks}); under C{always} or with C{durable_acks} adds wait;
  - a confirmation acknowledged in it may be undone, the item delivered once
    more (C{undone_confirms}), only under a policy that does not acknowledge
    durably (a period without C{durable_acks}): under C{always} or with
    C{durable_acks} a client's confirmation is answered only once its record
    is durable, and one undone counts as C{reappeared};
  - under C{never} nothing may be undone.

One more window, under the policies that do not acknowledge durably: while
a journal cannot be written the server keeps confirmations in memory and
acknowledges them (they never wait for the disk); a restart before they
could be written (a kill, or a stop with the disk still full) may undo them,
each item delivered once more I{after} that restart. So a restart during a
fault opens a window for confirmations from the fault's start to the restart
(L{restarted_in_fault}); an item confirmed there and delivered again before
the restart is not excused by it. Under a durable policy such a
confirmation is refused (an error reply: the consumer holds the read still,
not confirmed).

One kind of confirmation is not a durable acknowledgement under any policy:
the text protocol's implicit one (the next C{get} on the queue confirms what
the connection held, once that reply is in the kernel; protocols.md). Those
are recorded with C{durable=False} and judged as under a non-durable policy.

Outside the windows nothing may be undone, under any policy.

Items are bytes that are unique within a run; a scenario that delivers the
same item on several queues (fanout) keys it by queue (L{key}).

A refused add to a fanout master is the one refusal that may leave copies:
the queues that took it (the master, the children that accepted) keep it
(reliability.md, "Fanout: all or nothing for the producer"). Such a refusal
is recorded with L{FaultLedger.refused_fanout}: on each queue that may have
taken it the item may be delivered once per refused attempt (C{kept}); on
the child whose journal the fault failed it is refused as any other
(L{FaultLedger.refused_adds}: never served). A retried add (the same item
refused, then acknowledged) may likewise be delivered once per attempt.

No other refusal may reach a reader: under a policy whose adds wait for
their fsync, no reader sees an added item before that fsync succeeded
(journal.md, "Visibility under a durable policy"), so an add refused because
it failed was never served; any delivery of it is C{refused_served}.
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
    #: Seconds between fsyncs (0 under C{always}; unused under C{never}).
    period: float = 0.0

    @property
    def fsyncs(self) -> bool:
        """Whether the server fsyncs (and, after a failed fsync, cuts back) journals."""
        return self.queue_config.get("sync_journal") != "never"

    @property
    def confirms_durably(self) -> bool:
        """Whether a client's confirmation is answered only once durable (C{acks_durably})."""
        return self.fsyncs and (self.period == 0 or bool(self.queue_config.get("durable_acks")))

    @property
    def adds_before_fsync(self) -> bool:
        """Whether an add is acknowledged before its fsync (a period without durable_acks)."""
        return self.fsyncs and self.period > 0 and not self.queue_config.get("durable_acks")


POLICIES: dict[str, Policy] = {p.name: p for p in [
    Policy("never", {"sync_journal": "never"}),
    Policy("always+durable", {"sync_journal": "always", "durable_acks": True}),
    Policy("period", {"sync_journal": "50ms"}, 0.05),
    Policy("always", {"sync_journal": "always"}),
    Policy("period+durable", {"sync_journal": "50ms", "durable_acks": True}, 0.05),
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
        #: Per item, the refused fanout adds that may have left a copy of it (see the docstring).
        self.kept: Counter[bytes] = Counter()
        #: When each refused item was first refused, and each item first delivered.
        self.refused_at: dict[bytes, float] = {}
        self.first_delivery: dict[bytes, float] = {}
        self.ack_time: dict[bytes, float] = {}
        #: Per item, each acknowledged confirmation: [when, deliveries after it (until the
        #: next confirmation), when the first of them came].
        self.confirms: dict[bytes, list[list[float]]] = {}
        #: The faults that failed fsyncs: (began, ended).
        self.windows: list[tuple[float, float]] = []
        #: From a fault's start to a restart during it: confirmations kept in memory.
        self.confirm_windows: list[tuple[float, float]] = []
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
        now = time.monotonic()
        with self._lock:
            self.refused.update(ids)
            for item in ids:
                self.refused_at.setdefault(item, now)

    def refused_fanout(self, ids: list[bytes]) -> None:
        """
        These adds to a fanout master got an error reply, but their queues
        may have taken them (and keep them): each may be delivered once more
        per such refusal, and never more.
        """
        now = time.monotonic()
        with self._lock:
            self.refused.update(ids)
            self.kept.update(ids)
            for item in ids:
                self.refused_at.setdefault(item, now)

    def delivered(self, item: bytes) -> None:
        """A client received C{item}."""
        with self._lock:
            self.first_delivery.setdefault(item, time.monotonic())
            if item in self.confirms:
                last = self.confirms[item][-1]
                last[1] += 1
                if last[1] == 1:
                    last[2] = time.monotonic()
        super().delivered(item)

    def confirmed_all(self, items: list[bytes], durable: bool = True) -> None:
        """
        The confirmations of these reads were acknowledged (now); C{durable}
        false for one the server never makes durable first (text's implicit one).
        """
        now = time.monotonic()
        with self._lock:
            for item in items:
                self.confirms.setdefault(item, []).append([now, 0, 0.0, float(durable)])
        super().confirmed_all(items)

    def fault(self, started: float, ended: float, injected: int, fsync: bool) -> None:
        """
        A fault lasted from C{started} to C{ended} and failed C{injected}
        calls; C{fsync}: it failed fsyncs (only those open a doubt window).
        """
        with self._lock:
            if fsync:
                self.windows.append((started, ended))
            self.injected += injected

    def restarted_in_fault(self, started: float) -> None:
        """The server was restarted (stopped or killed) during a fault that began at C{started}."""
        with self._lock:
            self.confirm_windows.append((started, time.monotonic()))

    def faulted(self, count: int) -> None:
        """C{count} faults that allow nothing (a client vanished) were made."""
        with self._lock:
            self.injected += count

    def in_doubt(self, when: float | None, confirm: bool = False,
                 again: float | None = None, durable: bool = True) -> bool:
        """
        Whether the policy allows undoing an add (or C{confirm}ation)
        acknowledged at C{when} (for a confirmation: whose item came C{again}
        at that time; C{durable}: one the server makes durable first under
        a durable policy).
        """
        if when is None or (confirm and durable and self.policy.confirms_durably):
            return False
        if confirm and again is not None and any(
                start <= when <= restart <= again for start, restart in self.confirm_windows):
            return True
        allowed = self.policy.fsyncs if confirm else self.policy.adds_before_fsync
        before = self.policy.period + SLACK_SECONDS
        return allowed and any(start - before <= when <= end for start, end in self.windows)

    def copies(self, item: bytes) -> int:
        """
        How many copies of C{item} the server may hold: one, plus one per
        refused fanout add that may have left one when the item was (also)
        acknowledged.
        """
        return max(1, self.kept[item] + (item in self.acked))

    def _back(self) -> tuple[set[bytes], Counter[bytes]]:
        """
        Items delivered after confirmations the policy does not let undo
        (or more than once after one it does) more often than their extra
        copies explain, and per item the count of confirmations it let undo.
        """
        reappeared: set[bytes] = set()
        undone: Counter[bytes] = Counter()
        for item, confirms in self.confirms.items():
            unexcused = 0
            for when, after, again, durable in confirms:
                if after == 1 and self.in_doubt(when, confirm=True, again=again,
                                                durable=bool(durable)):
                    undone[item] += 1
                else:
                    unexcused += int(after)
            if unexcused > self.copies(item) - 1:
                reappeared.add(item)
        return reappeared, undone

    def _refused_served(self, undone: Counter[bytes]) -> set[bytes]:
        """
        Refused items that were delivered: any delivery of one no queue may
        have kept, or more deliveries than its kept copies (and their reads
        reopened or confirmations undone) explain.
        """
        return {item for item in self.refused - self.acked if self.deliveries[item] and (
            self.deliveries[item] > self._allowed(item, undone)
            or not self.kept[item])}

    def _allowed(self, item: bytes, undone: Counter[bytes]) -> int:
        """How often C{item} may be delivered: once per copy, read reopened, undone confirm."""
        return self.copies(item) + self.open_at_crash[item] + undone[item]

    def examples(self, count: int = 3) -> list[str]:
        """A few items of each kind of failure, to look for in the server's log."""
        with self._lock:
            lost = sorted(i for i in self.acked if self.deliveries[i] == 0
                          and not self.in_doubt(self.ack_time.get(i)))
            back_set, undone = self._back()
            served = sorted(self._refused_served(undone))
            back = sorted(back_set)
        out = []
        for name, items in (("lost", lost), ("refused but served", served),
                            ("confirmed, then delivered again", back)):
            if items:
                shown = b", ".join(i[:40] for i in items[:count]).decode("latin-1")
                out.append(f"{name}: {len(items)}, e.g. {shown}")
        for item in served[:count]:
            out.append(f"  {item[:40].decode('latin-1')}: {self._when_served(item)}")
        return out

    def _when_served(self, item: bytes) -> str:
        """When a refused C{item} was refused and served, against the doubt windows."""
        refused = self.refused_at[item]
        windows = ", ".join(f"{start - refused:+.2f}..{end - refused:+.2f} s"
                            for start, end in self.windows) or "none"
        first = self.first_delivery[item] - refused
        return (f"served {self.deliveries[item]}x, first {first:+.2f} s after its refusal; "
                f"fsync windows {windows}")

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
            reappeared, undone_confirms = self._back()
            duplicated = sum(1 for item, n in self.deliveries.items()
                             if n > self._allowed(item, undone_confirms))
            served = self._refused_served(undone_confirms)
            return {
                "acknowledged": len(self.acked),
                "refused": len(self.refused),
                "delivered": len(self.deliveries),
                "lost": lost,
                "undone": undone,
                "reappeared": len(reappeared),
                "undone_confirms": sum(undone_confirms.values()),
                "duplicated": duplicated,
                "refused_served": len(served),
                "refused_kept": sum(1 for item in self.refused - self.acked - served
                                    if self.deliveries[item] and self.kept[item]),
                "memory_vs_journal": len(self.problems.memory_vs_journal),
                "stuck_open": len(self.problems.stuck_open),
                "injected": self.injected,
            }


#: The verdict keys that must be 0 (the acceptance).
MUST_BE_ZERO = ("lost", "reappeared", "duplicated", "refused_served", "memory_vs_journal",
                "stuck_open", "not_recovered")


def failures(verdict: dict[str, Any]) -> list[str]:
    """What in a verdict breaks the acceptance (an empty list: nothing)."""
    where = f"{verdict['scenario']} under {verdict['policy']}"
    out = [f"{where}: {k} = {verdict[k]}" for k in MUST_BE_ZERO if verdict.get(k)]
    if not verdict.get("injected"):
        out.append(f"{where}: the fault never hit (0 calls failed): the run proves nothing")
    return out
