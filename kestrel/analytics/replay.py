"""
FIFO replay of one queue's records, as the server replays its journal.

This module is Spark-free. L{replay_queue} takes one queue's records in
replay order (columns as produced by L{kestrel.analytics.scan}) and runs the
server's replay rules on item positions instead of item data:

- ADD, ADDX, ADD_XID append the item; CONTINUE(xid) drops open read C{xid}
  (a confirm) and appends its new item;
- REMOVE pops the head for good; REMOVE_TENTATIVE_XID(xid) pops the head
  into open read C{xid} and sets the xid counter (an open read with the same
  xid is overwritten and its item lost, as in the server); the legacy
  REMOVE_TENTATIVE (opcode 3, no xid) takes the next free xid after the
  counter (L{kestrel.journal.records.next_xid}), as txkestrel's replay does
  (Kestrel used xid 0, a latent bug); SAVE_XID sets the counter;
- UNREMOVE(xid) puts open read C{xid} back at the head; CONFIRM_REMOVE(xid)
  drops it; records about an unknown xid, or a pop of an empty queue, do
  nothing.

What a restart would hold (C{items_left}) is every queued item plus every
still-open read, which the server puts back at the head.

These are the events of L{kestrel.journal.events.QueueEvents}, and which
opcode is which event comes from there (its C{*_OPCODES} groups and
L{kestrel.journal.records.Opcode}). The loop is that table applied to opcode
columns and item positions rather than L{kestrel.journal.events.event_applier}
applied to record objects: the scanner never builds a record object (numpy
reads every field of all records at once), and building one per row, plus a
method call per event, only to replay positions would cost more than the
rest of the replay. C{tests/analytics/test_replay.py} checks the loop
against C{event_applier} on random record streams, so the two cannot drift.

Times: each record's clock is the running maximum of its estimated time
(L{kestrel.analytics.scan.time_estimates}), so backlog minutes never go
backwards.
An item's time in queue runs from its add time to the record that removed it
for good; since that record carries no time, both the lower and the upper
bound of the wait are reported. Percentiles are nearest-rank: the smallest
value with at least the fraction p of values at or below it (the same rule
as Spark's C{percentile_approx} on small groups).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from kestrel.journal.events import ADD_OPCODES
from kestrel.journal.records import Opcode, next_xid

ADD, ADDX, ADD_XID, CONTINUE = (int(Opcode.ADD), int(Opcode.ADDX), int(Opcode.ADD_XID),
                                int(Opcode.CONTINUE))
REMOVE, REMOVE_TENTATIVE, REMOVE_TENTATIVE_XID = (int(Opcode.REMOVE), int(Opcode.REMOVE_TENTATIVE),
                                                  int(Opcode.REMOVE_TENTATIVE_XID))
SAVE_XID, UNREMOVE, CONFIRM_REMOVE = (int(Opcode.SAVE_XID), int(Opcode.UNREMOVE),
                                      int(Opcode.CONFIRM_REMOVE))

#: Marks an absent value in the integer columns.
NONE = np.iinfo(np.int64).min

_ADD_OPS = [int(o) for o in ADD_OPCODES]
#: The records the replay steps through one at a time: all but the plain adds.
_STEPPED_OPS = [REMOVE, REMOVE_TENTATIVE, SAVE_XID, UNREMOVE, CONFIRM_REMOVE, CONTINUE,
                REMOVE_TENTATIVE_XID]

MINUTE_MS = 60_000

#: The percentiles every summary reports.
PERCENTILES = (0.5, 0.9, 0.99)


def nearest_rank(values: np.ndarray, p: float) -> int | None:
    """Return the nearest-rank C{p} percentile of C{values}, or C{None} if empty."""
    n = len(values)
    if n == 0:
        return None
    ordered = np.sort(values)
    return int(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))])


def percentiles(values: np.ndarray) -> list[int | None]:
    """Return the L{PERCENTILES} of C{values} followed by their maximum."""
    out = [nearest_rank(values, p) for p in PERCENTILES]
    out.append(int(values.max()) if len(values) else None)
    return out


@attrs.frozen
class QueueReplay:
    """
    The outcome of replaying one queue.

    @ivar backlog_minute_ms: start of each minute in which records fall.
    @ivar backlog_queued: items queued after the last record of that minute.
    @ivar backlog_open: open reads after the last record of that minute.
    @ivar backlog_bytes: payload bytes of queued items and open reads then.
    @ivar wait_lb_ms: per item removed for good, the lower bound of its wait.
    @ivar wait_ub_ms: the matching upper bounds.
    @ivar expired_removed: items with an expiry removed by a REMOVE whose time's
        upper bound is past the expiry (discarded as expired, at most);
        C{expired_removed_min} those whose lower bound is (certainly).
    """

    backlog_minute_ms: np.ndarray
    backlog_queued: np.ndarray
    backlog_open: np.ndarray
    backlog_bytes: np.ndarray
    queued: int
    open_reads: int
    bytes_left: int
    lost_open_reads: int
    wait_lb_ms: np.ndarray
    wait_ub_ms: np.ndarray
    with_expiry: int
    ttl_ms: np.ndarray
    expired_removed: int
    left_with_expiry: int
    left_expired: int
    last_clock_ms: int | None
    oldest_left_ms: int | None = None
    first_clock_ms: int | None = None
    expired_removed_min: int = 0

    @property
    def items_left(self) -> int:
        """Return what a restart would hold: queued items plus open reads."""
        return self.queued + self.open_reads


def record_clock(est: np.ndarray) -> np.ndarray:
    """
    Return a non-decreasing clock per record from its estimated time.

    Records before the first known time take the first known time; if no
    record has any time, every clock is L{NONE}.
    """
    clock = np.maximum.accumulate(est) if len(est) else est
    known = clock != NONE
    if known.any() and not known.all():
        clock = np.where(known, clock, clock[np.argmax(known)])
    return clock


@attrs.frozen
class _Fifo:
    """What the replay rules leave: who removed each item, and the state at some records."""

    removed_at: np.ndarray
    queued_after: np.ndarray
    open_after: np.ndarray
    bytes_after: np.ndarray
    left: list[int]
    queued: int
    open_reads: int
    bytes_left: int
    lost: int


def _fifo(op: np.ndarray, xid: np.ndarray, size: np.ndarray, emit: np.ndarray) -> _Fifo:
    """
    Apply the replay rules (module docstring) to item positions; report the state at C{emit}.

    The queue is the items put back at the head by UNREMOVE (a short stack),
    then the added items from the C{ptr}-th on, in record order: an add needs
    no step (the number of adds before each record is counted in bulk), so only
    the other records take a Python step each. Bytes are summed in bulk from
    what each record added and removed.

    @return: C{removed_at[j]}, the record that removed item C{j} for good (-1:
        none), and after each row of C{emit} (sorted record indices) the queued
        items, open reads and bytes.
    """
    n = len(op)
    o64 = op.astype(np.int64)
    is_add = np.isin(o64, _ADD_OPS)
    adds = np.flatnonzero(is_add)
    is_stepped = np.isin(o64, _STEPPED_OPS)
    stepped = np.flatnonzero(is_stepped)
    added = np.cumsum(is_add)  # adds at or before each record
    before: np.ndarray = (added - is_add)[stepped]
    # the last stepped record at or before each emitted row: the state is taken after it
    last = np.maximum.accumulate(np.where(is_stepped, np.arange(n), -1))[emit] if n else \
        np.zeros(0, np.int64)
    flag = np.zeros(n, bool)
    flag[last[last >= 0]] = True

    removed_at = [-1] * n
    adds_list = adds.tolist()
    snap_at: list[int] = []
    snap_gone: list[int] = []
    snap_open: list[int] = []
    lost_at: list[int] = []
    lost_item: list[int] = []
    head: list[int] = []  # items put back at the head; the last one is first out
    open_reads: dict[int, int] = {}
    counter = ptr = 0
    remove, open_xid, open_legacy = REMOVE, REMOVE_TENTATIVE_XID, REMOVE_TENTATIVE
    confirm, unremove, cont = CONFIRM_REMOVE, UNREMOVE, CONTINUE
    a: int
    for i, o, x, a, e in zip(stepped.tolist(), o64[stepped].tolist(),
                             xid[stepped].tolist(), before.tolist(), flag[stepped].tolist(),
                             strict=True):
        if o == remove:  # removed
            if head:
                removed_at[head.pop()] = i
            elif ptr < a:
                removed_at[adds_list[ptr]] = i
                ptr += 1
        elif o == open_xid or o == open_legacy:  # opened
            x = counter = x if o == open_xid else next_xid(counter, open_reads)
            if head:
                j = head.pop()
            elif ptr < a:
                j = adds_list[ptr]
                ptr += 1
            else:
                j = -1
            if j >= 0:
                old = open_reads.get(x)
                if old is not None:
                    lost_at.append(i)
                    lost_item.append(old)
                open_reads[x] = j
        elif o == confirm or o == cont:  # confirmed (and added, for CONTINUE)
            j = open_reads.pop(x, -1)
            if j >= 0:
                removed_at[j] = i
        elif o == unremove:  # unremoved
            j = open_reads.pop(x, -1)
            if j >= 0:
                head.append(j)
        else:  # xid_saved
            counter = x
        if e:
            snap_at.append(i)
            snap_gone.append(ptr - len(head))
            snap_open.append(len(open_reads))

    removed = np.asarray(removed_at, np.int64)
    delta = np.zeros(n, np.int64)
    delta[adds] = size[adds]
    gone = np.flatnonzero(removed >= 0)
    delta[removed[gone]] -= size[gone]
    if lost_at:
        delta[lost_at] -= size[lost_item]
    nbytes = np.cumsum(delta)
    gone_at = np.zeros(n, np.int64)
    open_at = np.zeros(n, np.int64)
    gone_at[snap_at] = snap_gone
    open_at[snap_at] = snap_open
    has = last >= 0
    at = np.maximum(last, 0)
    total = len(adds)
    return _Fifo(removed, added[emit] - np.where(has, gone_at[at], 0),
                 np.where(has, open_at[at], 0), nbytes[emit],
                 head + adds_list[ptr:] + list(open_reads.values()),
                 len(head) + total - ptr, len(open_reads), int(nbytes[-1]) if n else 0,
                 len(lost_at))


def replay_queue(op: np.ndarray, xid: np.ndarray, size: np.ndarray, add_ms: np.ndarray,
                 expiry_ms: np.ndarray, time_lb_ms: np.ndarray, time_ub_ms: np.ndarray,
                 time_est_ms: np.ndarray, filler: np.ndarray) -> QueueReplay:
    """
    Replay one queue's records, given in replay order.

    Absent values are L{NONE} in C{add_ms}, C{expiry_ms} and the time bounds.
    Rows with any other opcode (such as the scanner's trailer rows) change nothing.
    Rows marked C{filler} (a pack's stand-ins for pent-up deletes) replay as
    items but are left out of wait and expiry figures.
    """
    n = len(op)
    clock = record_clock(time_est_ms)
    minute = np.where(clock != NONE, clock // MINUTE_MS * MINUTE_MS, NONE)
    last_of_minute = np.ones(n, dtype=bool)
    if n > 1:
        last_of_minute[:-1] = minute[:-1] != minute[1:]

    fifo = _fifo(op, xid, size, np.flatnonzero(last_of_minute))
    removed = fifo.removed_at
    is_add = np.isin(op, ADD_OPCODES)
    real = is_add & ~filler.astype(bool)
    done = real & (removed >= 0) & (add_ms != NONE)
    by = removed[done]
    added = add_ms[done]
    lb = time_lb_ms[by]
    ub = time_ub_ms[by]
    wait_lb = np.where(lb != NONE, np.maximum(lb - added, 0), 0)
    wait_ub = np.where(ub != NONE, np.maximum(ub - added, 0), wait_lb)

    left = np.zeros(n, dtype=bool)
    left[fifo.left] = True
    has_exp = real & (expiry_ms != NONE)
    timed_exp = has_exp & (add_ms != NONE)
    ttl = (expiry_ms - add_ms)[timed_exp]
    # The server discards an item as expired (a REMOVE) when its expiry is before
    # the time of removal, and never hands an expired item to a client: a REMOVE
    # of an item is an expiry exactly when its time is past the item's expiry.
    # That time is only bracketed: an expiry before its lower bound is certain,
    # before its upper bound possible.
    by_remove = removed >= 0
    by_remove[by_remove] = op[removed[by_remove]] == REMOVE
    exp_done = has_exp & by_remove
    at = np.maximum(removed, 0)
    removed_lb = np.where(by_remove, time_lb_ms[at], NONE)
    removed_ub = np.where(by_remove, time_ub_ms[at], NONE)
    expired_min = int((exp_done & (removed_lb != NONE) & (removed_lb > expiry_ms)).sum())
    expired_removed = int((exp_done & ((removed_ub == NONE) | (removed_ub > expiry_ms))).sum())
    last_clock = int(clock[-1]) if n and clock[-1] != NONE else None
    first_clock = int(clock[0]) if n and clock[0] != NONE else None
    left_exp = has_exp & left
    left_timed = left & real & (add_ms != NONE)
    oldest_left = int(add_ms[left_timed].min()) if left_timed.any() else None
    left_expired = (int((left_exp & (expiry_ms <= last_clock)).sum())
                    if last_clock is not None else 0)

    idx = np.flatnonzero(last_of_minute)
    return QueueReplay(
        backlog_minute_ms=minute[idx],
        backlog_queued=fifo.queued_after.astype(np.int64),
        backlog_open=fifo.open_after.astype(np.int64),
        backlog_bytes=fifo.bytes_after.astype(np.int64),
        queued=fifo.queued,
        open_reads=fifo.open_reads,
        bytes_left=fifo.bytes_left,
        lost_open_reads=fifo.lost,
        wait_lb_ms=wait_lb.astype(np.int64),
        wait_ub_ms=wait_ub.astype(np.int64),
        with_expiry=int(has_exp.sum()),
        ttl_ms=ttl.astype(np.int64),
        expired_removed=expired_removed,
        expired_removed_min=expired_min,
        left_with_expiry=int(left_exp.sum()),
        left_expired=left_expired,
        last_clock_ms=last_clock,
        oldest_left_ms=oldest_left,
        first_clock_ms=first_clock,
    )
