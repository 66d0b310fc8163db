"""
The analysis job on Spark: journal folders in, Parquet tables, JSON summary and HTML report out.

Stages (each reports one progress line): scan the planned files on the
executors, write the files table (and the per-record events table when
asked), aggregate the per-minute flow, replay every queue (backlog, time in
queue, expiry), then write the summary and the report. Everything is written
into a fresh folder under C{OUT} and moved into place at the end
(L{kestrel.analytics.output}). See ``docs/analytics.md`` for every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from kestrel.analytics import layout, tables
from kestrel.analytics.layout import Plan
from kestrel.analytics.local import (
    analyse_group,
    combine,
    group_files,
    records_of,
    scan_files,
    write_outputs,
    write_table,
)
from kestrel.analytics.pipeline import Progress, finish, join_uri, plan_inputs, stage
from kestrel.analytics.replay import MINUTE_MS, NONE
from kestrel.analytics.scan import ADD_OPS, TRAILER_OP
from kestrel.journal.events import ABORT_OPCODES, CONFIRM_OPCODES, DEQUEUE_OPCODES, OPEN_OPCODES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

READERS = ("auto", "source", "binaryfile")

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Files per Arrow batch while C{binaryFile} feeds whole files to the scanner.
BINARY_FILE_BATCH = 4

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
    """The per-minute flow on Spark; equal to L{tables.queue_flow} on numpy."""
    from pyspark.sql import functions as sf

    op = sf.col("op")
    traffic = ~sf.col("snapshot")
    is_add = op.isin(*ADD_OPS)
    add_size = sf.when(traffic & is_add, sf.col("size"))

    def count(cond: Any) -> Any:
        return sf.sum(sf.when(cond, 1).otherwise(0)).cast("long")

    minute = (sf.floor(sf.col("event_ms") / MINUTE_MS) * MINUTE_MS).cast("long")
    sizes = sf.sort_array(sf.collect_list(add_size))
    n = sf.size(sf.col("_s"))

    def pct(p: float) -> Any:
        rank = sf.greatest(sf.lit(1), sf.ceil(n * sf.lit(p)).cast("int"))
        return sf.when(n > 0, sf.element_at(sf.col("_s"), rank))

    lb = sf.coalesce(sf.col("time_lb_ms"), sf.col("event_ms"))
    ub = sf.coalesce(sf.col("time_ub_ms"), sf.col("event_ms"))
    spans = sf.floor(lb / MINUTE_MS) != sf.floor(ub / MINUTE_MS)
    return (events.groupBy("server", "queue", minute.alias("minute_ms"))
            .agg(sf.min(sf.when(traffic, lb)).alias("first_ms"),
                 sf.max(sf.when(traffic, ub)).alias("last_ms"),
                 count(sf.lit(True)).alias("records"),
                 count(traffic & is_add).alias("enqueued"),
                 count(traffic & op.isin(*DEQUEUE_OPCODES)).alias("dequeued"),
                 count(traffic & op.isin(*OPEN_OPCODES)).alias("opened"),
                 count(traffic & op.isin(*CONFIRM_OPCODES)).alias("confirmed"),
                 count(traffic & op.isin(*ABORT_OPCODES)).alias("aborted"),
                 sf.coalesce(sf.sum(add_size), sf.lit(0)).cast("long").alias("bytes_enqueued"),
                 count(sf.col("snapshot")).alias("snapshot_records"),
                 count(sf.col("snapshot") & is_add & ~sf.col("filler")).alias("reemitted_adds"),
                 count(sf.col("filler")).alias("fillers"),
                 count(traffic & spans).alias("estimated"),
                 sizes.alias("_s"))
            .select(*tables.columns(tables.FLOW_DDL)[:16],
                    pct(0.5).alias("size_p50"), pct(0.9).alias("size_p90"),
                    pct(0.99).alias("size_p99"),
                    sf.when(n > 0, sf.element_at(sf.col("_s"), -1)).alias("size_max")))


def _analyse_dicts(files: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
    """A Spark task: analyse one group of whole queues (see L{kestrel.analytics.local})."""
    return analyse_group([layout.JournalFile.from_dict(d) for d in files])


def _write_events_part(item: tuple[int, list[dict[str, Any]], str]) -> int:
    """A Spark task: write one group's events as one Parquet part file; return its rows."""
    index, files, folder = item
    rows = records_of(scan_files([layout.JournalFile.from_dict(d) for d in files]))
    write_table(folder, "events", rows, part=index)
    return len(rows)


def uses_groups(plan: Plan | None, inputs: Sequence[tuple[str, str]],
                archives: Sequence[tuple[str, str]], out: str, reader: str) -> bool:
    """Return whether the job runs whole-queue tasks (local folders and output) or DataFrames."""
    paths = [p for _, p in [*inputs, *archives]] + [out]
    return reader != "binaryfile" and all(layout.is_local(p) for p in paths)


def run(spark: SparkSession, inputs: Sequence[tuple[str, str]], out: str, *,
        archives: Sequence[tuple[str, str]] = (), reader: str = "auto",
        progress: Progress | None = None, report: bool = True, events: bool = False,
        plan: Plan | None = None) -> dict[str, Any]:
    """
    Analyse the journal folders C{inputs} (C{(server, folder)} pairs) into C{out} on Spark.

    C{archives} are archive folders (their files count as traffic only);
    C{events} also writes the per-record C{events} table; C{plan}, if given,
    is the already checked plan of these folders. Local folders and a local
    C{out} run as whole-queue tasks (L{kestrel.analytics.local.analyse_group}:
    no shuffle of records, tables identical to C{--engine local}); Hadoop
    URIs and C{reader="binaryfile"} run as DataFrames.

    @return: the summary also written to C{out/summary.json}.
    @raise kestrel.analytics.layout.LayoutError: the inputs cannot be read as given.
    """
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, not {reader!r}")
    if not uses_groups(plan, inputs, archives, out, reader):
        return _run_dataframes(spark, inputs, out, archives=archives, reader=reader,
                               progress=progress, report=report, events=events, plan=plan)
    say = progress or Progress(4)
    if plan is None:
        say(f"planning {len(inputs) + len(archives)} folder(s)")
        plan = plan_inputs(spark, inputs, reader, archives)
    sc = spark.sparkContext
    target = max(2 * sc.defaultParallelism, plan.total_bytes // (256 << 20) + 1)
    groups = [[f.to_dict() for f in g] for g in group_files(plan, target)]
    say(f"scanning and replaying {len(plan.files)} file(s), {plan.total_bytes:,} bytes, "
        f"{len(plan.queues())} queue(s) in {len(groups)} Spark task(s); "
        f"{len(plan.skipped)} file(s) skipped")
    staging = stage(spark, out)
    try:
        parts = combine(sc.parallelize(groups, max(1, len(groups)))
                        .map(_analyse_dicts).collect()) if groups else combine([])

        def write_events() -> None:
            items = [(i, g, staging.path) for i, g in enumerate(groups)]
            sc.parallelize(items, max(1, len(items))).map(_write_events_part).collect()

        return write_outputs(say, spark, staging, inputs, archives, plan, parts, report,
                             write_events if events else None)
    except BaseException:
        staging.abandon()
        raise


def _run_dataframes(spark: SparkSession, inputs: Sequence[tuple[str, str]], out: str, *,
                    archives: Sequence[tuple[str, str]] = (), reader: str = "auto",
                    progress: Progress | None = None, report: bool = True,
                    events: bool = False, plan: Plan | None = None) -> dict[str, Any]:
    """L{run} for Hadoop URIs or the C{binaryFile} reader: scans and aggregates as DataFrames."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as sf

    say = progress or Progress(6)
    if plan is None:
        say(f"planning {len(inputs) + len(archives)} folder(s)")
        plan = plan_inputs(spark, inputs, reader, archives)
    say(f"scanning {len(plan.files)} file(s), {plan.total_bytes:,} bytes, "
        f"{len(plan.queues())} queue(s); {len(plan.skipped)} file(s) skipped")
    staging = stage(spark, out)
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
                "server", "queue", "file", "archive", "file_seq", "xid", "size", "offset",
                "add_ms", "expiry_ms", "problem").collect()
        finally:
            if binary:
                if saved is None:
                    spark.conf.unset(ARROW_BATCH)
                else:
                    spark.conf.set(ARROW_BATCH, saved)
        ev = (raw.filter(sf.col("op") != TRAILER_OP).drop("problem")
              .withColumn("event_ms", sf.coalesce("add_ms", "time_est_ms", "time_lb_ms",
                                                  "time_ub_ms")))
        records = sum(t.xid for t in trailers)
        cut = [t for t in trailers if t.problem]
        note = (f"; {len(cut)} file(s) end in a broken record: "
                + ", ".join(t.file for t in cut[:5]) + (", ..." if len(cut) > 5 else "")
                if cut else "")
        say(f"writing files table{' and events' if events else ''} "
            f"({records:,} records){note}")
        if events:
            ev.write.parquet(join_uri(staging.path, "events"))
        files_pdf = tables.files_table(plan, trailers)
        spark.createDataFrame(files_pdf, tables.FILES_DDL).coalesce(1).write.parquet(
            join_uri(staging.path, "files"))

        say("aggregating per-minute flow")
        flow = _flow(ev)
        flow.write.parquet(join_uri(staging.path, "flow"))
        flow_pdf = spark.read.parquet(join_uri(staging.path, "flow")).toPandas()
        sizes_pdf = (ev.filter(sf.col("op").isin(*ADD_OPS) & ~sf.col("snapshot"))
                     .groupBy("server", "queue",
                              sf.when(sf.col("size") == 0, 0)
                              .otherwise(sf.floor(sf.log2(sf.col("size"))).cast("int") + 1)
                              .alias("bin"))
                     .count().toPandas())

        say("replaying queues (backlog, time in queue, expiry)")
        # trailer rows go in too, so that a queue whose files are all empty gets its row
        filled = raw.filter(~sf.col("archive")).select(
            "server", "queue",
            *[sf.coalesce(sf.col(c), sf.lit(NONE if c in tables.REPLAY_TIMES else 0)).alias(c)
              for c in tables.REPLAY_INPUT if c not in tables.REPLAY_FLAGS],
            *tables.REPLAY_FLAGS)
        rep = (filled.groupBy("server", "queue")
               .applyInPandas(tables.replay_frame, tables.REPLAY_DDL)
               .persist(StorageLevel.MEMORY_AND_DISK))
        backlog = (rep.filter(sf.col("kind") == "backlog")
                   .select(*tables.columns(tables.BACKLOG_DDL)))
        backlog.write.parquet(join_uri(staging.path, "backlog"))
        backlog_pdf = (spark.read.parquet(join_uri(staging.path, "backlog")).toPandas()
                       if report else pd.DataFrame(columns=tables.columns(tables.BACKLOG_DDL)))
        queue_rows = rep.filter(sf.col("kind") == "queue").toPandas()
        rep.unpersist()
        tiq, expiry = tables.queue_tables(queue_rows)
        spark.createDataFrame(tiq, tables.TIQ_DDL).coalesce(1).write.parquet(
            join_uri(staging.path, "time_in_queue"))
        spark.createDataFrame(expiry, tables.EXPIRY_DDL).coalesce(1).write.parquet(
            join_uri(staging.path, "expiry"))
        return finish(say, spark, staging, inputs, archives, plan, files_pdf, flow_pdf,
                      queue_rows, backlog_pdf, sizes_pdf, report)
    except BaseException:
        staging.abandon()
        raise
    finally:
        raw.unpersist()
