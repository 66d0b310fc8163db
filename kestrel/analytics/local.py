"""
The analysis of whole queues, in one process (``--engine local``) or in Spark tasks.

L{analyse_group} takes every file of some queues (each queue with all its
live and archive files), decodes them into numpy columns with the bulk
scanner and computes that group's part of every table with
L{kestrel.analytics.tables}: flow, size histogram, replay (backlog, time in
queue, expiry) and file trailers. Since
a queue never spans two groups, the parts only need concatenating.

L{run_local} runs the groups one after the other in this process; the Spark
job (L{kestrel.analytics.job.run}) runs them as tasks on the executors for
local folders, with no shuffle of records. Both then write the same tables
with the same code (L{write_outputs}), so their outputs are identical.
"""

from __future__ import annotations

import ctypes
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kestrel.analytics import tables
from kestrel.analytics.layout import JournalFile, LayoutError, Plan, is_local
from kestrel.analytics.pipeline import Progress, finish, plan_inputs, stage
from kestrel.analytics.scan import SCHEMA, TRAILER_OP, Decoded, decode_local, read_local

#: glibc's mallopt parameters: allocations up to 32 MiB come from the heap, and up to
#: 256 MiB freed at its top is kept for the next allocation.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD, _TRIM_THRESHOLD = 32 << 20, 256 << 20


def reuse_freed_memory() -> None:
    """
    Let this process reuse the memory of freed numpy temporaries (glibc only; else nothing).

    Decoding allocates and frees arrays of a few MiB per chunk and per queue; by
    default glibc maps each one afresh and the kernel zero-fills every page of it,
    which cost a fifth of the engine's CPU time. Held memory grows by at most the
    trim threshold.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        pass


_TRAILER_COLS = ["server", "queue", "file", "archive", "file_seq", "xid", "size", "offset",
                 "add_ms", "expiry_ms", "problem"]
_SORT = {"flow": ["server", "queue", "minute_ms"], "sizes": ["server", "queue", "bin"],
         "backlog": ["server", "queue", "minute_ms"], "queues": ["server", "queue"],
         "trailers": ["server", "queue", "archive", "file"]}


def write_table(folder: str, name: str, pdf_or_table: pd.DataFrame | pa.Table,
                ddl: str | None = None, part: int = 0) -> None:
    """Write one Parquet table (or one part of it) as C{folder/name/part-NNNNN.parquet}."""
    table = pdf_or_table if ddl is None else tables.to_arrow(pdf_or_table, ddl)
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    pq.write_table(table, os.path.join(folder, name, f"part-{part:05d}.parquet"))


def group_files(plan: Plan, count: int) -> list[list[JournalFile]]:
    """
    Split the planned files into at most C{count} groups of whole queues, by bytes.

    Largest queue first, each into the lightest group; files keep plan order.
    """
    by_queue: dict[tuple[str, str], list[JournalFile]] = defaultdict(list)
    for f in plan.files:
        by_queue[(f.server, f.queue)].append(f)
    count = max(1, min(count, len(by_queue)))
    bins: list[list[JournalFile]] = [[] for _ in range(count)]
    loads = [0] * count
    for key in sorted(by_queue, key=lambda k: (-sum(f.size + 1 for f in by_queue[k]), k)):
        i = loads.index(min(loads))
        bins[i].extend(by_queue[key])
        loads[i] += sum(f.size + 1 for f in by_queue[key])
    return [b for b in bins if b]


def scan_files(files: Sequence[JournalFile]) -> pa.Table:
    """Scan C{files} into one table of L{SCHEMA} (records and one trailer per file)."""
    batches = [read_local(jf) for jf in files]
    return pa.Table.from_batches(batches, schema=SCHEMA) if batches else SCHEMA.empty_table()


def records_of(scanned: pa.Table) -> pa.Table:
    """Return the record rows of a scan (no trailers, no C{problem}) with C{event_ms}."""
    rows = scanned.filter(pc.not_equal(scanned["op"], TRAILER_OP)).drop_columns(["problem"])
    event_ms = pc.coalesce(rows["add_ms"], rows["time_est_ms"], rows["time_lb_ms"],
                           rows["time_ub_ms"])
    return rows.append_column("event_ms", event_ms)


def analyse_group(files: Sequence[JournalFile]) -> dict[str, pd.DataFrame]:
    """
    Return this group's parts: C{trailers, flow, sizes, backlog, queues} (pandas).

    The queues of the group are analysed one at a time (memory holds one
    queue's records; sorts and groupings stay small), then concatenated.
    """
    reuse_freed_memory()
    by_queue: dict[tuple[str, str], list[JournalFile]] = defaultdict(list)
    for f in files:
        by_queue[(f.server, f.queue)].append(f)
    parts = [analyse_queue(q) for q in by_queue.values()]
    return {k: pd.concat([p[k] for p in parts], ignore_index=True) for k in parts[0]} \
        if parts else combine([])


def analyse_queue(files: Sequence[JournalFile]) -> dict[str, pd.DataFrame]:
    """
    Return the parts of one queue (its live and archive files, in plan order).

    Everything runs on the numpy columns of the decoded files: the flow and
    size histogram over every record, the replay over the live files' records
    and one trailer row per live file (which changes nothing but carries the
    clock, as in the DataFrame job).
    """
    server, queue = files[0].server, files[0].queue
    decoded = [(jf, decode_local(jf)) for jf in files]
    trailers = pd.DataFrame({
        "server": server, "queue": queue, "file": [jf.name for jf, _ in decoded],
        "archive": [jf.archive for jf, _ in decoded],
        "file_seq": np.array([jf.seq for jf, _ in decoded], np.int32),
        "xid": np.array([d.scan.count for _, d in decoded], np.int32),
        "size": np.array([d.scan.truncated_bytes for _, d in decoded], np.int32),
        "offset": np.array([d.scan.clean_end for _, d in decoded], np.int64),
        "add_ms": np.array([int(d.snapshot.sum()) for _, d in decoded], np.int64),
        "expiry_ms": np.array([d.uncertain for _, d in decoded], np.int64),
        "problem": [d.scan.problem for _, d in decoded],
    }, columns=_TRAILER_COLS)

    def cat(ds: list[Decoded], get: Callable[[Decoded], np.ndarray],
            trailer: Callable[[Decoded], Any] | None = None) -> np.ndarray:
        if trailer is None:
            arrays = [get(d) for d in ds]
        else:
            arrays = [a for d in ds for a in (get(d), np.array([trailer(d)]))]
        return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)

    every = [d for _, d in decoded]
    flow_cols = {"op": cat(every, lambda d: d.scan.op), "size": cat(every, lambda d: d.scan.size),
                 "snapshot": cat(every, lambda d: d.snapshot),
                 "filler": cat(every, lambda d: d.filler), "est": cat(every, lambda d: d.est),
                 "lb": cat(every, lambda d: d.lb), "ub": cat(every, lambda d: d.ub)}
    flow = tables.queue_flow(server, queue, flow_cols)
    sizes = tables.queue_sizes(server, queue, flow_cols["op"], flow_cols["size"],
                               flow_cols["snapshot"])
    del flow_cols
    live = [d for jf, d in decoded if not jf.archive]
    if live:
        none = tables.NONE
        cols = {
            "op": cat(live, lambda d: d.scan.op.astype(np.int64), lambda d: TRAILER_OP),
            "xid": cat(live, lambda d: d.scan.xid.astype(np.int64), lambda d: d.scan.count),
            "size": cat(live, lambda d: d.scan.size.astype(np.int64),
                        lambda d: d.scan.truncated_bytes),
            "add_ms": cat(live, lambda d: d.scan.add_ms, lambda d: int(d.snapshot.sum())),
            "expiry_ms": cat(live, lambda d: d.scan.expiry_ms, lambda d: d.uncertain),
            "time_lb_ms": cat(live, lambda d: d.lb, lambda d: none),
            "time_ub_ms": cat(live, lambda d: d.ub, lambda d: none),
            "time_est_ms": cat(live, lambda d: d.est, lambda d: none),
            "filler": cat(live, lambda d: d.filler, lambda d: False).astype(bool),
            "snapshot": cat(live, lambda d: d.snapshot, lambda d: False).astype(bool),
        }
        rep = tables.replay_arrays(server, queue, cols)
    else:
        rep = pd.DataFrame(columns=tables.columns(tables.REPLAY_DDL))
    return {"trailers": trailers, "flow": flow, "sizes": sizes,
            "backlog": rep[rep["kind"] == "backlog"][tables.columns(tables.BACKLOG_DDL)],
            "queues": rep[rep["kind"] == "queue"]}


def combine(parts: Iterable[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Concatenate the groups' parts, each table sorted by its key."""
    got: dict[str, list[pd.DataFrame]] = defaultdict(list)
    for p in parts:
        for k, v in p.items():
            if len(v):
                got[k].append(v)
    empty = {"trailers": pd.DataFrame(columns=_TRAILER_COLS),
             "flow": pd.DataFrame(columns=tables.columns(tables.FLOW_DDL)),
             "sizes": pd.DataFrame(columns=["server", "queue", "bin", "count"]),
             "backlog": pd.DataFrame(columns=tables.columns(tables.BACKLOG_DDL)),
             "queues": pd.DataFrame(columns=tables.columns(tables.REPLAY_DDL))}
    out = {}
    for k, e in empty.items():
        frame = pd.concat(got[k], ignore_index=True) if got[k] else e
        out[k] = frame.sort_values(_SORT[k], kind="stable").reset_index(drop=True)
    return out


def write_outputs(say: Progress, spark: Any, staging: Any, inputs: Sequence[tuple[str, str]],
                  archives: Sequence[tuple[str, str]], plan: Plan,
                  parts: dict[str, pd.DataFrame], report: bool,
                  write_events: Callable[[], None] | None) -> dict[str, Any]:
    """Write every table from the combined parts, then the summary and the report."""
    trailers = parts["trailers"]
    cut = trailers[trailers["problem"].notna()]
    note = (f"; {len(cut)} file(s) end in a broken record: "
            + ", ".join(cut["file"].head(5)) + (", ..." if len(cut) > 5 else "")
            if len(cut) else "")
    say(f"writing tables ({int(trailers['xid'].sum()):,} records"
        f"{', and events' if write_events else ''}){note}")
    if write_events is not None:
        write_events()
    files_pdf = tables.files_table(plan, list(trailers.itertuples()))
    write_table(staging.path, "files", files_pdf, tables.FILES_DDL)
    write_table(staging.path, "flow", parts["flow"], tables.FLOW_DDL)
    write_table(staging.path, "backlog", parts["backlog"], tables.BACKLOG_DDL)
    queue_rows = parts["queues"].reset_index(drop=True)
    tiq, expiry = tables.queue_tables(queue_rows)
    write_table(staging.path, "time_in_queue", tiq, tables.TIQ_DDL)
    write_table(staging.path, "expiry", expiry, tables.EXPIRY_DDL)
    return finish(say, spark, staging, inputs, archives, plan, files_pdf, parts["flow"],
                  queue_rows, parts["backlog"], parts["sizes"], report)


def run_local(inputs: Sequence[tuple[str, str]], out: str, *,
              archives: Sequence[tuple[str, str]] = (), progress: Progress | None = None,
              report: bool = True, events: bool = False,
              plan: Plan | None = None) -> dict[str, Any]:
    """
    Analyse local journal folders into C{out} in this process; return the summary.

    Same arguments and outputs as L{kestrel.analytics.job.run}. Queues are
    analysed one after the other, so memory holds one queue's records at a time.

    @raise LayoutError: an input is not a local folder, or cannot be read.
    """
    if not all(is_local(p) for _, p in [*inputs, *archives]) or not is_local(out):
        raise LayoutError("--engine local reads and writes local folders only")
    say = progress or Progress(4)
    if plan is None:
        say(f"planning {len(inputs) + len(archives)} folder(s)")
        plan = plan_inputs(None, inputs, "source", archives)
    groups = group_files(plan, len(plan.files))
    say(f"scanning and replaying {len(plan.files)} file(s), {plan.total_bytes:,} bytes, "
        f"{len(plan.queues())} queue(s) in this process; {len(plan.skipped)} file(s) skipped")
    staging = stage(None, out)
    try:
        parts = combine(analyse_group(g) for g in groups)

        def write_events() -> None:
            for i, g in enumerate(groups):
                write_table(staging.path, "events", records_of(scan_files(g)), part=i)

        return write_outputs(say, None, staging, inputs, archives, plan, parts, report,
                             write_events if events else None)
    except BaseException:
        staging.abandon()
        raise
