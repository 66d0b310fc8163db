"""
Expected outputs of the analysis, computed from L{journals} logs with plain loops.

Nothing here imports the job's code: the definitions are restated from
``docs/analytics.md`` so that a wrong implementation cannot agree with itself.
"""

from __future__ import annotations

import math

from tests.analytics.journals import QueueWriter, Rec

MINUTE = 60_000
ADDS = {0, 2, 7, 8}


def nearest_rank(values: list[int], p: float) -> int | None:
    """The smallest value with at least a fraction p of the values at or below it."""
    if not values:
        return None
    s = sorted(values)
    k = math.ceil(p * len(s))
    return s[max(k, 1) - 1]


def pcts(values: list[int]) -> list[int | None]:
    """p50, p90, p99 and max."""
    return [nearest_rank(values, 0.5), nearest_rank(values, 0.9), nearest_rank(values, 0.99),
            max(values) if values else None]


class Truth:
    """Every expected table, for the generator's C{(server, queue) -> QueueWriter} (finished)."""

    def __init__(self, queues: dict[tuple[str, str], QueueWriter]) -> None:
        self.events: list[dict] = []
        self.files: list[dict] = []
        self.flow: dict[tuple, dict] = {}
        self.backlog: dict[tuple, dict] = {}
        self.queues: dict[tuple[str, str], dict] = {}
        for key, files in sorted(queues.items()):
            self._queue(key, files)

    def _queue(self, key: tuple[str, str], writer: QueueWriter) -> None:
        server, queue = key
        files = writer.files
        counted = [f for f in files if f.counted]
        rows: list[tuple[dict, Rec]] = []
        prev_end = None
        for seq, f in enumerate(counted):
            # a live file's mtime may lag its last write by a kernel tick: 20 ms of slack
            end = f.mtime_ms + 20 if f.kind == "live" else f.ts
            start = prev_end
            prev_end = end
            self.files.append(dict(server=server, queue=queue, file=f.name, kind=f.kind,
                                   file_seq=seq, counted=True, records=len(f.recs),
                                   truncated_bytes=f.truncated, bytes=len(f.data)))
            for i, r in enumerate(f.recs):
                if r.op in (2, 7, 8):
                    lb = ub = r.add_ms
                else:
                    lb = start
                    for q in f.recs[:i]:
                        if q.op in (2, 7, 8) and (lb is None or q.add_ms > lb):
                            lb = q.add_ms
                    ub = end
                    for q in f.recs[i + 1:]:
                        if q.op in (2, 7, 8):
                            ub = q.add_ms
                            break
                    if lb is not None and ub is not None and ub < lb:
                        ub = lb
                ev = dict(server=server, queue=queue, file=f.name, file_seq=seq,
                          archive=False, snapshot=r.packed, filler=r.filler, offset=r.offset,
                          op=r.op,
                          xid=r.xid, size=r.size if r.op in ADDS else None,
                          add_ms=r.add_ms if r.op in (2, 7, 8) else None,
                          expiry_ms=r.expiry_ms, time_lb_ms=lb, time_ub_ms=ub)
                self.events.append(ev)
                rows.append((ev, r))
            # estimates: a run of m untimed records between two bounds is spread evenly,
            # the k-th at lb + (ub - lb) * (k + 1) / (m + 1), or / m when the file ends the run
            file_evs = [ev for ev, _ in rows[len(rows) - len(f.recs):]]
            i = 0
            while i < len(file_evs):
                if file_evs[i]["add_ms"] is not None:
                    file_evs[i]["time_est_ms"] = file_evs[i]["add_ms"]
                    i += 1
                    continue
                j = i
                while j < len(file_evs) and file_evs[j]["add_ms"] is None:
                    j += 1
                m = j - i
                for k in range(m):
                    ev = file_evs[i + k]
                    lb, ub = ev["time_lb_ms"], ev["time_ub_ms"]
                    if lb is None or ub is None:
                        ev["time_est_ms"] = lb if lb is not None else ub
                    else:
                        frac = (k + 1) / (m + (0 if j == len(file_evs) else 1))
                        ev["time_est_ms"] = min(ub, lb + math.floor((ub - lb) * frac))
                i = j
            for ev in file_evs:
                ev["event_ms"] = ev["time_est_ms"]
        for f in files:
            if not f.counted:
                self.files.append(dict(server=server, queue=queue, file=f.name, kind=f.kind,
                                       file_seq=None, counted=False, records=None,
                                       truncated_bytes=None, bytes=len(f.data)))

        # flow
        for ev, r in rows:
            m = ev["event_ms"] // MINUTE * MINUTE
            fl = self.flow.setdefault((server, queue, m), dict(
                records=0, enqueued=0, dequeued=0, opened=0, confirmed=0, aborted=0,
                bytes_enqueued=0, snapshot_records=0, reemitted_adds=0, fillers=0,
                estimated=0, first_ms=None, last_ms=None, sizes=[]))
            fl["records"] += 1
            if not r.packed:
                lo = ev["time_lb_ms"] if ev["time_lb_ms"] is not None else ev["event_ms"]
                hi = ev["time_ub_ms"] if ev["time_ub_ms"] is not None else ev["event_ms"]
                fl["estimated"] += lo // MINUTE != hi // MINUTE
                fl["first_ms"] = lo if fl["first_ms"] is None else min(fl["first_ms"], lo)
                fl["last_ms"] = hi if fl["last_ms"] is None else max(fl["last_ms"], hi)
            fl["snapshot_records"] += r.packed
            fl["fillers"] += r.filler
            if r.packed:
                fl["reemitted_adds"] += r.op in ADDS and not r.filler
                continue
            if r.op in ADDS:
                fl["enqueued"] += 1
                fl["bytes_enqueued"] += ev["size"]
                fl["sizes"].append(ev["size"])
            fl["dequeued"] += r.op in (1, 6, 8)
            fl["opened"] += r.op in (3, 9)
            fl["confirmed"] += r.op in (6, 8)
            fl["aborted"] += r.op == 5

        # backlog: clock = running max of (lb or ub), leading unknowns take the first known
        clocks: list[int | None] = []
        best = None
        for ev, _ in rows:
            t = ev["time_est_ms"]
            if t is not None and (best is None or t > best):
                best = t
            clocks.append(best)
        first = next((c for c in clocks if c is not None), None)
        clocks = [c if c is not None else first for c in clocks]
        for (_, r), c in zip(rows, clocks, strict=True):
            if c is None:
                continue
            self.backlog[(server, queue, c // MINUTE * MINUTE)] = dict(
                queued=r.queued, open_reads=r.open_reads, items=r.queued + r.open_reads,
                bytes=r.nbytes)

        # time in queue and expiry, from the model's identities
        counted_items = {id(r.item) for _, r in rows if r.item is not None}
        lb_waits, ub_waits, expired_removed, expired_min = [], [], 0, 0
        for ev, r in rows:
            gone = r.removed
            if gone is None or id(gone) not in counted_items or gone.filler:
                continue
            # a REMOVE is an expiry when done after the expiry: possibly if before the
            # upper bound, certainly if after the lower one
            if gone.expiry_ms is not None and ev["op"] == 1:
                if ev["time_ub_ms"] is None or ev["time_ub_ms"] > gone.expiry_ms:
                    expired_removed += 1
                if ev["time_lb_ms"] is not None and ev["time_lb_ms"] > gone.expiry_ms:
                    expired_min += 1
            if gone.add_ms is None:
                continue
            lo = max(0, ev["time_lb_ms"] - gone.add_ms) if ev["time_lb_ms"] is not None else 0
            hi = max(0, ev["time_ub_ms"] - gone.add_ms) if ev["time_ub_ms"] is not None else lo
            lb_waits.append(lo)
            ub_waits.append(hi)
        adds = [r for _, r in rows if r.op in ADDS and not r.filler]
        ttl = [r.expiry_ms - r.add_ms for r in adds
               if r.expiry_ms is not None and r.add_ms is not None]
        last = rows[-1][1] if rows else None
        last_clock = clocks[-1] if clocks else None
        # the model's state after the last counted record is what a restart holds
        left_items = list(writer.items) + list(writer.open.values())
        left_exp = [i for i in left_items if i.expiry_ms is not None]
        traffic = [ev for ev, r in rows if not r.packed]
        self.queues[(server, queue)] = dict(
            enqueued=sum(1 for ev in traffic if ev["op"] in ADDS),
            dequeued=sum(1 for ev in traffic if ev["op"] in (1, 6, 8)),
            opened=sum(1 for ev in traffic if ev["op"] in (3, 9)),
            confirmed=sum(1 for ev in traffic if ev["op"] in (6, 8)),
            aborted=sum(1 for ev in traffic if ev["op"] == 5),
            bytes_enqueued=sum(ev["size"] for ev in traffic if ev["op"] in ADDS),
            snapshot_records=sum(1 for _, r in rows if r.packed),
            fillers=sum(1 for _, r in rows if r.filler),
            items_left=last.queued + last.open_reads if last else 0,
            queued=last.queued if last else 0,
            open_reads=last.open_reads if last else 0,
            bytes_left=last.nbytes if last else 0,
            truncated_bytes=sum(f.truncated for f in counted),
            records=len(rows), files=len(counted),
            dequeued_items=len(lb_waits), waits=pcts(lb_waits) + pcts(ub_waits),
            with_expiry=sum(1 for r in adds if r.expiry_ms is not None), ttl=pcts(ttl),
            expired_removed=expired_removed, expired_removed_min=expired_min,
            left_with_expiry=len(left_exp),
            left_expired=sum(1 for i in left_exp
                             if last_clock is not None and i.expiry_ms <= last_clock),
        )
