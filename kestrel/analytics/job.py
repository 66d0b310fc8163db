"""
The analysis job: journal folders in, Parquet tables, JSON summary and HTML report out.

Stages (each reports one progress line): plan the files, scan them on the
executors, write the events and files tables, aggregate the per-minute flow,
replay every queue (backlog, time in queue, expiry), then write the summary
and the report. See ``docs/analytics.md`` for every table's columns.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kestrel.analytics import layout
from kestrel.analytics.layout import Plan
from kestrel.analytics.replay import MINUTE_MS, NONE, percentiles, replay_queue
from kestrel.analytics.scan import ADD_OPS, TRAILER_OP

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Readers: the Python Data Source, the binaryFile fallback, or pick by input.
READERS = ("auto", "source", "binaryfile")

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Files per Arrow batch while C{binaryFile} feeds whole files to the scanner.
BINARY_FILE_BATCH = 4

ESTIMATE_NOTE = (
    "REMOVE, REMOVE_TENTATIVE, UNREMOVE and CONFIRM_REMOVE records carry no time: "
    "their times are estimates, bracketed between the neighbouring timestamped records "
    "(or the file's rotation time, or the live file's modification time). Dequeue minutes "
    "use the lower bound; time in queue is given as a lower and an upper bound.")

SUMMARY_KEYS = ("enqueued", "dequeued", "opened", "confirmed", "aborted", "bytes_enqueued",
                "items_left", "truncated_bytes")

_WAIT_COLS = [f"wait_{b}_{p}_ms" for b in ("lb", "ub") for p in ("p50", "p90", "p99", "max")]
_TTL_COLS = [f"ttl_{p}_ms" for p in ("p50", "p90", "p99", "max")]

REPLAY_DDL = ", ".join(
    ["server string", "queue string", "kind string", "minute_ms long", "queued long",
     "open_reads long", "items long", "bytes long", "lost_open_reads long",
     "dequeued_items long"]
    + [f"{c} long" for c in _WAIT_COLS]
    + ["with_expiry long"] + [f"{c} long" for c in _TTL_COLS]
    + ["expired_removed long", "left_with_expiry long", "left_expired long",
       "last_clock_ms long"])
"""Rows of the replay: C{kind} 'backlog' (one per minute) or 'queue' (one per queue)."""

_REPLAY_INPUT = ["file_seq", "offset", "op", "xid", "size", "add_ms", "expiry_ms",
                 "time_lb_ms", "time_ub_ms", "filler"]


class Progress:
    """Writes one line per stage: C{kestrel-analyze [i/n] message (elapsed)}."""

    def __init__(self, total: int, stream: IO[str] | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.now = now
        self.started = now()
        self.stage = 0

    def __call__(self, message: str) -> None:
        """Report that the next stage starts."""
        self.stage += 1
        self._write(f"[{self.stage}/{self.total}] {message}")

    def done(self) -> None:
        """Report that the job finished."""
        self._write("done")

    def _write(self, text: str) -> None:
        elapsed = self.now() - self.started
        self.stream.write(f"kestrel-analyze {text} ({elapsed:.1f}s)\n")
        self.stream.flush()


def replay_frame(pdf: pd.DataFrame) -> pd.DataFrame:
    """
    Replay one queue given as a pandas frame of scanned rows (any order).

    This is the C{applyInPandas} function: absent values are L{NONE}; the
    result has L{REPLAY_DDL}'s columns.
    """
    server, queue = pdf["server"].iat[0], pdf["queue"].iat[0]
    pdf = pdf.sort_values(["file_seq", "offset"], kind="stable")
    r = replay_queue(*(pdf[c].to_numpy() for c in
                       ("op", "xid", "size", "add_ms", "expiry_ms", "time_lb_ms",
                        "time_ub_ms", "filler")))
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
        "left_with_expiry": r.left_with_expiry, "left_expired": r.left_expired,
        "last_clock_ms": r.last_clock_ms,
    }
    row.update(zip(_WAIT_COLS, percentiles(r.wait_lb_ms) + percentiles(r.wait_ub_ms),
                   strict=True))
    row.update(zip(_TTL_COLS, percentiles(r.ttl_ms), strict=True))
    out = pd.concat([backlog, pd.DataFrame([row])], ignore_index=True)
    columns = [c.split(" ")[0] for c in REPLAY_DDL.split(", ")]
    for c in columns:
        if c not in out:
            out[c] = None
    return out[columns].astype({c: "Int64" for c in columns[3:]})


def plan_inputs(spark: SparkSession, inputs: Sequence[tuple[str, str]], reader: str) -> Plan:
    """Plan the files to read: listed locally, or through Spark for URIs or C{binaryfile}."""
    if reader != "binaryfile" and all(layout.is_local(p) for _, p in inputs):
        return layout.plan_local(inputs)
    from kestrel.analytics.source import list_with_spark

    listings = []
    for server, folder in inputs:
        for name, uri, size, mtime in list_with_spark(spark, folder):
            listings.append(layout.Listing(server, name, uri, size, mtime))
    return layout.plan_files(listings)


def uses_binary_file(plan: Plan, reader: str) -> bool:
    """Return whether L{scan} reads C{plan} with C{binaryFile} (else the data source)."""
    local = all(layout.is_local(f.path) for f in plan.files)
    return reader == "binaryfile" or (reader == "auto" and not local)


def scan(spark: SparkSession, plan: Plan, reader: str) -> DataFrame:
    """Return the scanned rows of every planned file (records and trailers)."""
    from kestrel.analytics.source import read_binary_files, read_journal_source

    if uses_binary_file(plan, reader):
        return read_binary_files(spark, plan.files)
    if not all(layout.is_local(f.path) for f in plan.files):
        raise layout.LayoutError("the 'source' reader opens local paths only; "
                                 "use --reader binaryfile (or auto) for Hadoop URIs")
    parallelism = spark.sparkContext.defaultParallelism
    target = max(parallelism * 2, plan.total_bytes // (64 << 20) + 1)
    return read_journal_source(spark, plan.files, target)


def _flow(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as sf

    op = sf.col("op")
    is_add = op.isin(*ADD_OPS)
    add_size = sf.when(is_add, sf.col("size"))

    def count(cond: Any) -> Any:
        return sf.sum(sf.when(cond, 1).otherwise(0)).cast("long")

    minute = (sf.floor(sf.col("event_ms") / MINUTE_MS) * MINUTE_MS).cast("long")
    return (events.groupBy("server", "queue", minute.alias("minute_ms"))
            .agg(count(sf.lit(True)).alias("records"),
                 count(is_add).alias("enqueued"),
                 count(op.isin(1, 6, 8)).alias("dequeued"),
                 count(op.isin(3, 9)).alias("opened"),
                 count(op.isin(6, 8)).alias("confirmed"),
                 count(op == 5).alias("aborted"),
                 sf.coalesce(sf.sum(add_size), sf.lit(0)).cast("long").alias("bytes_enqueued"),
                 count(sf.col("packed") & is_add).alias("packed_adds"),
                 count(sf.col("filler")).alias("pack_fillers"),
                 sf.percentile_approx(add_size, [0.5, 0.9, 0.99]).alias("_p"),
                 sf.max(add_size).alias("size_max"))
            .select("server", "queue", "minute_ms", "records", "enqueued", "dequeued", "opened",
                    "confirmed", "aborted", "bytes_enqueued", "packed_adds", "pack_fillers",
                    sf.col("_p")[0].alias("size_p50"), sf.col("_p")[1].alias("size_p90"),
                    sf.col("_p")[2].alias("size_p99"), "size_max"))


def _join(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


def write_text(spark: SparkSession, out: str, name: str, text: str) -> None:
    """Write a text file into the output folder (local, or any Hadoop URI)."""
    if layout.is_local(out):
        folder = layout.local_path(out)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - Hadoop FS is only reachable via the JVM
    path = jvm.org.apache.hadoop.fs.Path(_join(out, name))
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def run(spark: SparkSession, inputs: Sequence[tuple[str, str]], out: str, *,
        reader: str = "auto", progress: Progress | None = None,
        report: bool = True) -> dict[str, Any]:
    """
    Analyse the journal folders C{inputs} (C{(server, folder)} pairs) into C{out}.

    @return: the summary also written to C{out/summary.json}.
    @raise kestrel.analytics.layout.LayoutError: the inputs cannot be read as given.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as sf

    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, not {reader!r}")
    say = progress or Progress(7 if report else 6)
    say(f"planning {len(inputs)} folder(s)")
    plan = plan_inputs(spark, inputs, reader)
    say(f"scanning {len(plan.files)} file(s), {plan.total_bytes:,} bytes, "
        f"{len(plan.queues())} queue(s); {len(plan.skipped)} file(s) skipped")
    raw = scan(spark, plan, reader).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # binaryFile rows are whole files: while the scan runs (this first action fills the
        # cache), Arrow batches must hold few of them; the replay wants big batches after.
        binary = uses_binary_file(plan, reader)
        saved = spark.conf.get(ARROW_BATCH, None)
        if binary:
            spark.conf.set(ARROW_BATCH, str(BINARY_FILE_BATCH))
        try:
            trailers = raw.filter(sf.col("op") == TRAILER_OP).select(
                "server", "queue", "file", "file_seq", "xid", "size", "offset",
                "problem").collect()
        finally:
            if binary:
                if saved is None:
                    spark.conf.unset(ARROW_BATCH)
                else:
                    spark.conf.set(ARROW_BATCH, saved)
        events = (raw.filter(sf.col("op") != TRAILER_OP).drop("problem")
                  .withColumn("event_ms", sf.coalesce("add_ms", "time_lb_ms", "time_ub_ms")))
        records = sum(t.xid for t in trailers)
        cut = [t for t in trailers if t.size]
        note = (f"; {len(cut)} file(s) end in a broken record, "
                f"{sum(t.size for t in cut):,} truncated bytes" if cut else "")
        say(f"writing events ({records:,} records) and files tables{note}")
        events.write.mode("overwrite").parquet(_join(out, "events"))
        files_pdf = _files_table(plan, trailers)
        spark.createDataFrame(files_pdf, _FILES_DDL).coalesce(1).write.mode(
            "overwrite").parquet(_join(out, "files"))

        say("aggregating per-minute flow")
        flow = _flow(events)
        flow.write.mode("overwrite").parquet(_join(out, "flow"))
        flow_pdf = spark.read.parquet(_join(out, "flow")).toPandas()

        say("replaying queues (backlog, time in queue, expiry)")
        # trailer rows go in too, so that a queue whose files are all empty gets its row
        filled = raw.select(
            "server", "queue",
            *[sf.coalesce(sf.col(c), sf.lit(NONE if c in ("add_ms", "expiry_ms", "time_lb_ms",
                                                        "time_ub_ms") else 0)).alias(c)
              for c in _REPLAY_INPUT if c != "filler"],
            "filler")
        rep = (filled.groupBy("server", "queue").applyInPandas(replay_frame, REPLAY_DDL)
               .persist(StorageLevel.MEMORY_AND_DISK))
        (rep.filter(sf.col("kind") == "backlog")
         .select("server", "queue", "minute_ms", "queued", "open_reads", "items", "bytes")
         .write.mode("overwrite").parquet(_join(out, "backlog")))
        queue_rows = rep.filter(sf.col("kind") == "queue").toPandas()
        tiq = queue_rows[["server", "queue", "dequeued_items", *_WAIT_COLS]].copy()
        tiq["estimate"] = True
        spark.createDataFrame(tiq, _TIQ_DDL).coalesce(1).write.mode("overwrite").parquet(
            _join(out, "time_in_queue"))
        expiry = queue_rows[["server", "queue", "with_expiry", *_TTL_COLS, "expired_removed",
                             "left_with_expiry", "left_expired"]]
        spark.createDataFrame(expiry, _EXPIRY_DDL).coalesce(1).write.mode(
            "overwrite").parquet(_join(out, "expiry"))

        rep.unpersist()

        say("writing summary.json")
        summary = build_summary(inputs, plan, files_pdf, flow_pdf, queue_rows)
        write_text(spark, out, "summary.json", json.dumps(summary, indent=2, sort_keys=True))
        if report:
            from kestrel.analytics.report import render_report, report_data

            say("writing report.html")
            data = report_data(spark, events, _join(out, "backlog"), flow_pdf)
            write_text(spark, out, "report.html", render_report(summary, data))
        say.done()
        return summary
    finally:
        raw.unpersist()


_FILES_DDL = ("server string, queue string, file string, path string, kind string, "
              "file_seq int, counted boolean, reason string, bytes long, records long, "
              "clean_end long, truncated_bytes long, problem string")
_TIQ_DDL = ", ".join(["server string", "queue string", "dequeued_items long"]
                     + [f"{c} long" for c in _WAIT_COLS] + ["estimate boolean"])
_EXPIRY_DDL = ", ".join(["server string", "queue string", "with_expiry long"]
                        + [f"{c} long" for c in _TTL_COLS]
                        + ["expired_removed long", "left_with_expiry long", "left_expired long"])


def _files_table(plan: Plan, trailers: Sequence[Any]) -> pd.DataFrame:
    by_key = {(t.server, t.file): t for t in trailers}
    rows = []
    for f in plan.files:
        t = by_key[(f.server, f.name)]
        rows.append({"server": f.server, "queue": f.queue, "file": f.name, "path": f.path,
                     "kind": f.kind, "file_seq": f.seq, "counted": True, "reason": None,
                     "bytes": f.size, "records": t.xid, "clean_end": t.offset,
                     "truncated_bytes": t.size, "problem": t.problem})
    for s in plan.skipped:
        got = layout.classify(s.name)
        rows.append({"server": s.server, "queue": got[0] if isinstance(got, tuple) else None,
                     "file": s.name, "path": s.path,
                     "kind": got[1] if isinstance(got, tuple) else None,
                     "file_seq": None, "counted": False, "reason": s.reason, "bytes": s.size,
                     "records": None, "clean_end": None, "truncated_bytes": None,
                     "problem": None})
    columns = [c.split(" ")[0] for c in _FILES_DDL.split(", ")]
    pdf = pd.DataFrame(rows, columns=columns)
    for c in ("file_seq", "bytes", "records", "clean_end", "truncated_bytes"):
        pdf[c] = pdf[c].astype("Int64")
    return pdf


def _int(v: Any) -> int | None:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return int(v)


def build_summary(inputs: Sequence[tuple[str, str]], plan: Plan, files: pd.DataFrame,
                  flow: pd.DataFrame, queue_rows: pd.DataFrame) -> dict[str, Any]:
    """Assemble C{summary.json}: per server and queue, counts, what is left, and notes."""
    servers: dict[str, dict[str, dict[str, Any]]] = {}
    counted = files[files["counted"]]
    for (server, queue), g in counted.groupby(["server", "queue"]):
        servers.setdefault(server, {})[queue] = {
            "files": len(g), "bytes": int(g["bytes"].sum()), "records": int(g["records"].sum()),
            "truncated_bytes": int(g["truncated_bytes"].sum()),
            "enqueued": 0, "dequeued": 0, "opened": 0, "confirmed": 0, "aborted": 0,
            "bytes_enqueued": 0, "packed_adds": 0, "pack_fillers": 0,
            "items_left": 0, "queued": 0, "open_reads": 0, "bytes_left": 0,
            "first_minute_ms": None, "last_minute_ms": None,
        }
    sums = ("enqueued", "dequeued", "opened", "confirmed", "aborted", "bytes_enqueued",
            "packed_adds", "pack_fillers")
    if len(flow):
        for (server, queue), g in flow.groupby(["server", "queue"]):
            q = servers[server][queue]
            for k in sums:
                q[k] = int(g[k].sum())
            q["first_minute_ms"] = _int(g["minute_ms"].min())
            q["last_minute_ms"] = _int(g["minute_ms"].max())
    for r in queue_rows.itertuples():
        q = servers[r.server][r.queue]
        q["items_left"] = int(r.items)
        q["queued"] = int(r.queued)
        q["open_reads"] = int(r.open_reads)
        q["bytes_left"] = int(r.bytes)
        q["lost_open_reads"] = int(r.lost_open_reads)
        q["dequeued_items"] = int(r.dequeued_items)
        q["time_in_queue_ms"] = {c[5:-3]: _int(getattr(r, c)) for c in _WAIT_COLS}
    totals = {k: sum(q[k] for s in servers.values() for q in s.values())
              for k in (*SUMMARY_KEYS, "records", "files")}
    return {
        "inputs": [{"server": s, "path": p} for s, p in inputs],
        "servers": servers,
        "totals": totals,
        "skipped_files": [{"server": s.server, "file": s.name, "reason": s.reason}
                          for s in plan.skipped],
        "estimates": ESTIMATE_NOTE,
    }
