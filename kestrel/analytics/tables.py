"""
The output tables and the summary, from scanned rows, with pandas only.

Both engines use this module: the Spark job (L{kestrel.analytics.job}) for
the per-queue replay, the small tables and the summary; the one-process
engine (L{kestrel.analytics.local}) for everything. Column names and types
are given once, as Spark DDL strings, so that both engines write identical
Parquet tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from kestrel.analytics import layout
from kestrel.analytics.layout import Plan
from kestrel.analytics.replay import MINUTE_MS, NONE, percentiles, replay_queue
from kestrel.analytics.scan import ADD_OPS
from kestrel.journal.events import ABORT_OPCODES, CONFIRM_OPCODES, DEQUEUE_OPCODES, OPEN_OPCODES

ESTIMATE_NOTE = (
    "REMOVE, REMOVE_TENTATIVE, UNREMOVE and CONFIRM_REMOVE records carry no time: "
    "each is bracketed between the neighbouring timestamped records (or the file's "
    "rotation time, or the live file's modification time plus 20 ms). Minutes place "
    "them at an estimate inside the bracket (untimed records spread evenly between "
    "their bounds; the flow's estimated column counts them); the traffic window, time "
    "in queue and expired items are given from the bounds.")

TRAFFIC_NOTE = (
    "traffic: what clients did (adds, removes, reads opened, confirmed, aborted), counted "
    "once per client operation; the records a pack or rewrite re-emitted (its snapshot: "
    "re-emitted items, fillers, re-opened reads) are left out. state: what a restart of the "
    "server would hold, from the live folders only. Each queue says the window its traffic "
    "covers and whether history before it was compacted away (its oldest file is a "
    "snapshot), in which case earlier traffic is not counted.")

TRAFFIC_KEYS = ("enqueued", "dequeued", "opened", "confirmed", "aborted", "bytes_enqueued")
STATE_KEYS = ("items_left", "queued", "open_reads", "bytes_left")

WAIT_COLS = [f"wait_{b}_{p}_ms" for b in ("lb", "ub") for p in ("p50", "p90", "p99", "max")]
TTL_COLS = [f"ttl_{p}_ms" for p in ("p50", "p90", "p99", "max")]

REPLAY_DDL = ", ".join(
    ["server string", "queue string", "kind string", "minute_ms long", "queued long",
     "open_reads long", "items long", "bytes long", "lost_open_reads long",
     "dequeued_items long"]
    + [f"{c} long" for c in WAIT_COLS]
    + ["with_expiry long"] + [f"{c} long" for c in TTL_COLS]
    + ["expired_removed long", "expired_removed_min long", "left_with_expiry long",
       "left_expired long", "last_clock_ms long", "oldest_left_ms long",
       "first_clock_ms long", "compacted long"])
"""Rows of the replay: C{kind} 'backlog' (one per minute) or 'queue' (one per queue)."""

REPLAY_INPUT = ["file_seq", "offset", "op", "xid", "size", "add_ms", "expiry_ms",
                "time_lb_ms", "time_ub_ms", "time_est_ms", "filler", "snapshot"]
#: The boolean columns of L{REPLAY_INPUT}.
REPLAY_FLAGS = ("filler", "snapshot")
#: The time columns of L{REPLAY_INPUT}: absent values are L{NONE}, not 0.
REPLAY_TIMES = ("add_ms", "expiry_ms", "time_lb_ms", "time_ub_ms", "time_est_ms")

FLOW_DDL = ("server string, queue string, minute_ms long, first_ms long, last_ms long, "
            "records long, enqueued long, dequeued long, opened long, confirmed long, "
            "aborted long, bytes_enqueued long, snapshot_records long, reemitted_adds long, "
            "fillers long, estimated long, size_p50 int, size_p90 int, size_p99 int, size_max int")
BACKLOG_DDL = ("server string, queue string, minute_ms long, queued long, open_reads long, "
               "items long, bytes long")
FILES_DDL = ("server string, queue string, file string, path string, kind string, "
             "archive boolean, file_seq int, counted boolean, reason string, bytes long, "
             "records long, snapshot_records long, uncertain_adds long, clean_end long, "
             "truncated_bytes long, problem string")
_WINDOW = ["from_ms long", "to_ms long", "history_compacted boolean"]
TIQ_DDL = ", ".join(["server string", "queue string", "dequeued_items long"]
                    + [f"{c} long" for c in WAIT_COLS] + ["estimate boolean", *_WINDOW])
EXPIRY_DDL = ", ".join(["server string", "queue string", "with_expiry long"]
                       + [f"{c} long" for c in TTL_COLS]
                       + ["expired_removed long", "expired_removed_min long",
                          "left_with_expiry long", "left_expired long",
                          *_WINDOW])
SIZES_DDL = "server string, queue string, bin int, count long"

_ARROW = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "byte": pa.int8(),
          "boolean": pa.bool_()}


def columns(ddl: str) -> list[str]:
    """Return the column names of a DDL string."""
    return [c.split(" ")[0] for c in ddl.split(", ")]


def arrow_schema(ddl: str) -> pa.Schema:
    """Return the Arrow schema of a DDL string (every column nullable, as Spark writes)."""
    return pa.schema([(name, _ARROW[typ]) for name, typ in
                      (c.split(" ") for c in ddl.split(", "))])


def to_arrow(pdf: pd.DataFrame, ddl: str) -> pa.Table:
    """Return C{pdf}'s columns of C{ddl} as an Arrow table of that schema."""
    schema = arrow_schema(ddl)
    arrays = []
    for field in schema:
        col = pdf[field.name] if field.name in pdf else pd.Series([None] * len(pdf))
        if pa.types.is_string(field.type) or pa.types.is_boolean(field.type):
            arrays.append(pa.array(col.astype(object).where(col.notna(), None).tolist(),
                                   type=field.type))
        else:
            values = pd.array(col, dtype="Int64")
            arrays.append(pa.array(values.to_numpy(dtype="int64", na_value=0),
                                   type=field.type, mask=values.isna()))
    return pa.Table.from_arrays(arrays, schema=schema)


def replay_frame(pdf: pd.DataFrame) -> pd.DataFrame:
    """
    Replay one queue given as a pandas frame of scanned rows (any order).

    This is the C{applyInPandas} function: absent values are L{NONE}; the
    result has L{REPLAY_DDL}'s columns.
    """
    server, queue = pdf["server"].iat[0], pdf["queue"].iat[0]
    pdf = pdf.sort_values(["file_seq", "offset"], kind="stable")
    return replay_arrays(server, queue, {c: pdf[c].to_numpy() for c in REPLAY_INPUT})


def replay_arrays(server: str, queue: str, cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """Replay one queue given as numpy columns of L{REPLAY_INPUT}, in replay order."""
    r = replay_queue(*(cols[c] for c in
                       ("op", "xid", "size", "add_ms", "expiry_ms", "time_lb_ms",
                        "time_ub_ms", "time_est_ms", "filler")))
    known = r.backlog_minute_ms != NONE
    backlog = pd.DataFrame({
        "server": server, "queue": queue, "kind": "backlog",
        "minute_ms": r.backlog_minute_ms[known],
        "queued": r.backlog_queued[known], "open_reads": r.backlog_open[known],
        "items": (r.backlog_queued + r.backlog_open)[known],
        "bytes": r.backlog_bytes[known],
    })
    row: dict[str, Any] = {
        "server": server, "queue": queue, "kind": "queue", "minute_ms": None,
        "queued": r.queued, "open_reads": r.open_reads, "items": r.items_left,
        "bytes": r.bytes_left, "lost_open_reads": r.lost_open_reads,
        "dequeued_items": len(r.wait_lb_ms),
        "with_expiry": r.with_expiry, "expired_removed": r.expired_removed,
        "expired_removed_min": r.expired_removed_min,
        "left_with_expiry": r.left_with_expiry, "left_expired": r.left_expired,
        "last_clock_ms": r.last_clock_ms, "oldest_left_ms": r.oldest_left_ms,
        "first_clock_ms": r.first_clock_ms,
        # the live files start with a snapshot: what came before was compacted away
        "compacted": int(len(cols["snapshot"]) > 0 and bool(cols["snapshot"][0])),
    }
    row.update(zip(WAIT_COLS, percentiles(r.wait_lb_ms) + percentiles(r.wait_ub_ms),
                   strict=True))
    row.update(zip(TTL_COLS, percentiles(r.ttl_ms), strict=True))
    out = pd.concat([backlog, pd.DataFrame([row])], ignore_index=True)
    names = columns(REPLAY_DDL)
    for c in names:
        if c not in out:
            out[c] = None
    return out[names].astype({c: "Int64" for c in names[3:]})


def queue_flow(server: str, queue: str, c: dict[str, np.ndarray]) -> pd.DataFrame:
    """
    Return the per-minute flow of one queue's records (numpy columns).

    C{c} holds C{op, size, snapshot, filler, est, lb, ub} (times L{NONE} where
    unknown), one entry per record, live and archive files alike. Traffic
    columns count records outside snapshots; item sizes are those of traffic
    adds, exact nearest-rank percentiles. Records count in the minute of their
    estimated time; C{estimated} counts the traffic records whose bracket
    spans more than that minute, and C{first_ms}/C{last_ms} are the lowest
    lower bound and the highest upper bound of the minute's traffic records,
    so that they enclose them.
    """
    op, est = c["op"], c["est"]
    if len(op) == 0:
        return pd.DataFrame({k: [] for k in columns(FLOW_DDL)})
    snap = c["snapshot"].astype(bool)
    fill = c["filler"].astype(bool)
    traffic = ~snap
    is_add = np.isin(op, ADD_OPS)
    known = est != NONE
    lb = np.where(c["lb"] != NONE, c["lb"], est)
    ub = np.where(c["ub"] != NONE, c["ub"], est)
    minute = np.where(known, est // MINUTE_MS * MINUTE_MS, NONE)
    # an unknown minute is its own group, last (as pandas puts a missing key)
    key = np.where(known, minute, np.iinfo(np.int64).max)
    if (key[1:] >= key[:-1]).all():  # the usual case: one stretch of time
        change = np.concatenate(([True], key[1:] != key[:-1]))
        keys, g = key[change], np.cumsum(change) - 1
    else:
        order = np.argsort(key, kind="stable")
        keys, group = np.unique(key[order], return_inverse=True)
        g = np.empty(len(op), np.int64)
        g[order] = group
    groups = len(keys)

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(g, weights=mask, minlength=groups).astype(np.int64)

    t_add = traffic & is_add
    sizes = c["size"].astype(np.int64)
    out = pd.DataFrame({
        "server": server, "queue": queue,
        "minute_ms": pd.array(np.where(keys == np.iinfo(np.int64).max, 0, keys),
                              dtype="Int64"),
        "records": np.bincount(g, minlength=groups).astype(np.int64),
        "enqueued": count(t_add),
        "dequeued": count(traffic & np.isin(op, DEQUEUE_OPCODES)),
        "opened": count(traffic & np.isin(op, OPEN_OPCODES)),
        "confirmed": count(traffic & np.isin(op, CONFIRM_OPCODES)),
        "aborted": count(traffic & np.isin(op, ABORT_OPCODES)),
        "bytes_enqueued": np.bincount(g, weights=np.where(t_add, sizes, 0),
                                      minlength=groups).astype(np.int64),
        "snapshot_records": count(snap),
        "reemitted_adds": count(snap & is_add & ~fill),
        "fillers": count(fill),
        "estimated": count(traffic & (lb // MINUTE_MS != ub // MINUTE_MS)),
    })
    out.loc[keys == np.iinfo(np.int64).max, "minute_ms"] = pd.NA
    hi = np.iinfo(np.int64).max
    first = np.full(groups, hi, np.int64)
    last = np.full(groups, NONE, np.int64)
    np.minimum.at(first, g[traffic], lb[traffic])
    np.maximum.at(last, g[traffic], ub[traffic])
    out["first_ms"] = pd.array(np.where(first == hi, 0, first), dtype="Int64")
    out["last_ms"] = pd.array(np.where(last == NONE, 0, last), dtype="Int64")
    out.loc[first == hi, "first_ms"] = pd.NA
    out.loc[last == NONE, "last_ms"] = pd.NA
    # nearest-rank size percentiles of every minute at once: sort by (minute, size)
    codes, vals = g[t_add], sizes[t_add]
    if len(vals) and vals.min() >= 0 and (groups + 1) * (int(vals.max()) + 1) < 2**62:
        # one sort of a combined key (sizes are never negative)
        span = int(vals.max()) + 1
        both = np.sort(codes * span + vals)
        codes, vals = both // span, both % span
    else:
        o = np.lexsort((vals, codes))
        codes, vals = codes[o], vals[o]
    counts = np.bincount(codes, minlength=groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    for name, p in (("size_p50", 0.5), ("size_p90", 0.9), ("size_p99", 0.99), ("size_max", 1)):
        rank = np.maximum(1, np.ceil(p * counts).astype(np.int64))
        got = np.zeros(groups, np.int64)
        got[has] = vals[(starts + rank - 1)[has]]
        out[name] = pd.array(got, dtype="Int64")
        out.loc[~has, name] = pd.NA
    return out[columns(FLOW_DDL)]


def queue_sizes(server: str, queue: str, op: np.ndarray, size: np.ndarray,
                snapshot: np.ndarray) -> pd.DataFrame:
    """Return one queue's histogram of traffic add sizes: C{server, queue, bin, count}
    (log2 bins: 0 for empty items, then C{floor(log2(size)) + 1})."""
    adds = np.isin(op, ADD_OPS) & ~snapshot.astype(bool)
    sz = size[adds].astype(np.int64)
    bins = np.where(sz == 0, 0, np.floor(np.log2(np.maximum(sz, 1))).astype(np.int64) + 1)
    counts = np.bincount(bins) if len(bins) else np.zeros(0, np.int64)
    present = np.flatnonzero(counts)
    return pd.DataFrame({"server": server, "queue": queue, "bin": present,
                         "count": counts[present].astype(np.int64)})


def files_table(plan: Plan, trailers: Sequence[Any]) -> pd.DataFrame:
    """
    Return the C{files} table from the plan and the scanner's trailer rows.

    A trailer row has C{xid} = records, C{offset} = clean end, C{size} =
    truncated bytes, C{add_ms} = snapshot records, C{expiry_ms} = uncertain
    adds, C{problem}.
    """
    by_key = {(t.server, bool(t.archive), t.file): t for t in trailers}
    rows = []
    for f in plan.files:
        t = by_key[(f.server, f.archive, f.name)]
        rows.append({"server": f.server, "queue": f.queue, "file": f.name, "path": f.path,
                     "kind": f.kind, "archive": f.archive, "file_seq": f.seq, "counted": True,
                     "reason": None, "bytes": f.size, "records": t.xid,
                     "snapshot_records": t.add_ms, "uncertain_adds": t.expiry_ms,
                     "clean_end": t.offset,
                     "truncated_bytes": t.size, "problem": t.problem})
    for s in plan.skipped:
        got = layout.classify(s.name)
        rows.append({"server": s.server, "queue": got[0] if isinstance(got, tuple) else None,
                     "file": s.name, "path": s.path,
                     "kind": got[1] if isinstance(got, tuple) else None, "archive": None,
                     "file_seq": None, "counted": False, "reason": s.reason, "bytes": s.size,
                     "records": None, "snapshot_records": None, "uncertain_adds": None,
                     "clean_end": None,
                     "truncated_bytes": None, "problem": None})
    pdf = pd.DataFrame(rows, columns=columns(FILES_DDL))
    for c in ("file_seq", "bytes", "records", "snapshot_records", "uncertain_adds",
              "clean_end", "truncated_bytes"):
        pdf[c] = pdf[c].astype("Int64")
    pdf = pdf.sort_values(["server", "queue", "archive", "file"], na_position="last",
                          kind="stable").reset_index(drop=True)
    return pdf


def queue_tables(queue_rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """
    Return the C{time_in_queue} and C{expiry} tables from the replay's queue rows.

    Both say the window their data covers: the live files' first and last
    record time, and whether history before it was compacted into a snapshot.
    """
    window = queue_rows[["first_clock_ms", "last_clock_ms"]].rename(
        columns={"first_clock_ms": "from_ms", "last_clock_ms": "to_ms"})
    compacted = queue_rows["compacted"].fillna(0).astype(int).astype(bool)
    tiq = queue_rows[["server", "queue", "dequeued_items", *WAIT_COLS]].copy()
    tiq["estimate"] = True
    expiry = queue_rows[["server", "queue", "with_expiry", *TTL_COLS, "expired_removed",
                         "expired_removed_min",
                         "left_with_expiry", "left_expired"]].copy()
    for frame in (tiq, expiry):
        frame["from_ms"] = window["from_ms"].to_numpy()
        frame["to_ms"] = window["to_ms"].to_numpy()
        frame["history_compacted"] = compacted.to_numpy()
    key = ["server", "queue"]
    return (tiq.sort_values(key).reset_index(drop=True),
            expiry.sort_values(key).reset_index(drop=True))


def _int(v: Any) -> int | None:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return int(v)


def _new_queue() -> dict[str, Any]:
    return {
        "files": 0, "bytes": 0, "records": 0, "truncated_bytes": 0, "broken_files": [],
        "traffic": {**{k: 0 for k in TRAFFIC_KEYS}, "from_ms": None, "to_ms": None,
                    "history_compacted": False, "compacted_before_ms": None,
                    "enqueued_uncertain": 0},
        "snapshot": {"files": 0, "records": 0, "reemitted_adds": 0, "fillers": 0},
        "state": None,
    }


def build_summary(inputs: Sequence[tuple[str, str]], archives: Sequence[tuple[str, str]],
                  plan: Plan, files: pd.DataFrame, flow: pd.DataFrame,
                  queue_rows: pd.DataFrame) -> dict[str, Any]:
    """Assemble C{summary.json}: per server and queue, traffic, state, windows and notes."""
    servers: dict[str, dict[str, dict[str, Any]]] = {}
    counted = files[files["counted"]]
    for r in counted.itertuples():
        q = servers.setdefault(r.server, {}).setdefault(r.queue, _new_queue())
        q["files"] += 1
        q["bytes"] += int(r.bytes)
        q["records"] += int(r.records)
        q["truncated_bytes"] += int(r.truncated_bytes)
        if r.problem is not None and not pd.isna(r.problem):
            q["broken_files"].append({"file": r.file, "path": r.path, "problem": r.problem,
                                      "truncated_bytes": int(r.truncated_bytes),
                                      "clean_end": int(r.clean_end)})
    # the oldest file of a queue, over its live and archive folders, tells compaction
    oldest: dict[tuple[str, str], tuple[int, Any]] = {}
    for f in plan.files:
        key = (f.server, f.queue)
        rank = f.ts_ms if f.ts_ms is not None else (1 << 62)
        if key not in oldest or rank < oldest[key][0]:
            oldest[key] = (rank, f)
    snap_files = set()
    for r in counted.itertuples():
        if _int(r.snapshot_records) and int(r.records) > 0:
            snap_files.add((r.server, bool(r.archive), r.file))
            q = servers[r.server][r.queue]
            q["snapshot"]["files"] += 1
            # adds of the snapshot that may be a client's (scan.uncertain_adds)
            q["traffic"]["enqueued_uncertain"] += _int(r.uncertain_adds) or 0
    if len(flow):
        for (server, queue), g in flow.groupby(["server", "queue"]):
            q = servers[server][queue]
            t = q["traffic"]
            for k in TRAFFIC_KEYS:
                t[k] = int(g[k].sum())
            t["from_ms"] = _int(g["first_ms"].min())
            t["to_ms"] = _int(g["last_ms"].max())
            s = q["snapshot"]
            s["records"] = int(g["snapshot_records"].sum())
            s["reemitted_adds"] = int(g["reemitted_adds"].sum())
            s["fillers"] = int(g["fillers"].sum())
    for (server, queue), (_, f) in oldest.items():
        t = servers[server][queue]["traffic"]
        if (f.server, f.archive, f.name) in snap_files:
            t["history_compacted"] = True
            t["compacted_before_ms"] = t["from_ms"] if t["from_ms"] is not None else f.bound_ms
    # a stuck queue's own last record is old: ages are taken at the server's
    # last record (over all its live queues), the closest the journals come to
    # the moment they were read or copied
    server_as_of: dict[str, int] = {}
    for r in queue_rows.itertuples():
        last = _int(r.last_clock_ms)
        if last is not None:
            server_as_of[r.server] = max(last, server_as_of.get(r.server, last))
    for r in queue_rows.itertuples():
        q = servers[r.server][r.queue]
        as_of = server_as_of.get(r.server)
        oldest_ms = _int(r.oldest_left_ms)
        q["state"] = {
            "items_left": int(r.items), "queued": int(r.queued),
            "open_reads": int(r.open_reads), "bytes_left": int(r.bytes),
            "lost_open_reads": int(r.lost_open_reads), "as_of_ms": as_of,
            "last_record_ms": _int(r.last_clock_ms),
            "from_ms": _int(r.first_clock_ms),
            "history_compacted": bool(_int(r.compacted)),
            "oldest_item_ms": oldest_ms,
            "oldest_item_age_ms": (as_of - oldest_ms if as_of is not None
                                   and oldest_ms is not None else None),
        }
        q["dequeued_items"] = int(r.dequeued_items)
        q["time_in_queue_ms"] = {c[5:-3]: _int(getattr(r, c)) for c in WAIT_COLS}
        q["expiry"] = {"with_expiry": int(r.with_expiry),
                       **{c[:-3]: _int(getattr(r, c)) for c in TTL_COLS},
                       "expired_removed": int(r.expired_removed),
                       "expired_removed_min": int(r.expired_removed_min),
                       "left_with_expiry": int(r.left_with_expiry),
                       "left_expired": int(r.left_expired)}
    per_server = {}
    for server, queues in servers.items():
        per_server[server] = _totals(queues.values())
    return {
        "inputs": [{"server": s, "path": p, "role": "live"} for s, p in inputs]
        + [{"server": s, "path": p, "role": "archive"} for s, p in archives],
        "servers": servers,
        "server_totals": per_server,
        "totals": _totals([q for s in servers.values() for q in s.values()]),
        "skipped_files": [{"server": s.server, "file": s.name, "reason": s.reason}
                          for s in plan.skipped],
        "broken_files": [{"server": server, "queue": queue, **b}
                         for server, qs in sorted(servers.items())
                         for queue, q in sorted(qs.items()) for b in q["broken_files"]],
        "definitions": TRAFFIC_NOTE,
        "estimates": ESTIMATE_NOTE,
    }


def _totals(queues: Any) -> dict[str, Any]:
    qs = list(queues)
    froms = [q["traffic"]["from_ms"] for q in qs if q["traffic"]["from_ms"] is not None]
    tos = [q["traffic"]["to_ms"] for q in qs if q["traffic"]["to_ms"] is not None]
    states = [q["state"] for q in qs if q["state"] is not None]
    return {
        "files": sum(q["files"] for q in qs), "records": sum(q["records"] for q in qs),
        "truncated_bytes": sum(q["truncated_bytes"] for q in qs),
        "broken_files": sum(len(q["broken_files"]) for q in qs),
        "traffic": {**{k: sum(q["traffic"][k] for q in qs) for k in TRAFFIC_KEYS},
                    "from_ms": min(froms) if froms else None,
                    "to_ms": max(tos) if tos else None,
                    "queues_compacted": sum(q["traffic"]["history_compacted"] for q in qs),
                    "enqueued_uncertain": sum(q["traffic"]["enqueued_uncertain"] for q in qs)},
        "state": {k: sum(s[k] for s in states) for k in STATE_KEYS},
    }
