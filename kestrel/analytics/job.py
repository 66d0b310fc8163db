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

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any

import pandas as pd

from kestrel.analytics import layout, tables
from kestrel.analytics.layout import Plan
from kestrel.analytics.output import OUTPUT_NAMES, STAGING_PREFIX, Staging
from kestrel.analytics.replay import MINUTE_MS, NONE
from kestrel.analytics.scan import ADD_OPS, TRAILER_OP
from kestrel.journal.events import ABORT_OPCODES, CONFIRM_OPCODES, DEQUEUE_OPCODES, OPEN_OPCODES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

READERS = ("auto", "source", "binaryfile")

ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Files per Arrow batch while C{binaryFile} feeds whole files to the scanner.
BINARY_FILE_BATCH = 4

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


def plan_inputs(spark: SparkSession | None, inputs: Sequence[tuple[str, str]], reader: str,
                archives: Sequence[tuple[str, str]] = ()) -> Plan:
    """Plan the files to read: listed locally, or through Spark for URIs or C{binaryfile}."""
    everything = [*inputs, *archives]
    if spark is None or (reader != "binaryfile" and all(layout.is_local(p) for _, p in everything)):
        return layout.plan_local(inputs, archives)
    from kestrel.analytics.source import list_with_spark

    listings = []
    for role, pairs in ((False, inputs), (True, archives)):
        for server, folder in pairs:
            found = [layout.Listing(server, name, uri, size, mtime, role)
                     for name, uri, size, mtime in list_with_spark(spark, folder)]
            layout.check_listing(folder, found)
            listings.extend(found)
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
    """The per-minute flow on Spark; equal to L{tables.flow_table} on pandas."""
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

    return (events.groupBy("server", "queue", minute.alias("minute_ms"))
            .agg(sf.min(sf.when(traffic, sf.col("event_ms"))).alias("first_ms"),
                 sf.max(sf.when(traffic, sf.col("event_ms"))).alias("last_ms"),
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
                 sizes.alias("_s"))
            .select(*tables.columns(tables.FLOW_DDL)[:15],
                    pct(0.5).alias("size_p50"), pct(0.9).alias("size_p90"),
                    pct(0.99).alias("size_p99"),
                    sf.when(n > 0, sf.element_at(sf.col("_s"), -1)).alias("size_max")))


def _join(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


class HadoopStaging:
    """L{Staging} for an C{OUT} given as a Hadoop URI, through Hadoop's C{FileSystem} API."""

    def __init__(self, spark: SparkSession, out: str) -> None:
        import uuid

        self.spark = spark
        self.out = out.rstrip("/")
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - Hadoop FS is only reachable via the JVM
        self._path = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
        self.fs = self._path(self.out).getFileSystem(conf)
        self.path = _join(self.out, STAGING_PREFIX + uuid.uuid4().hex[:12])
        self.fs.mkdirs(self._path(self.path))

    def _read_owned(self) -> set[str]:
        from kestrel.analytics.output import MARKER

        marker = self._path(_join(self.out, MARKER))
        if not self.fs.exists(marker):
            return set()
        stream = self.fs.open(marker)
        try:
            raw = bytes(self.spark.sparkContext._jvm.org.apache.commons.io.IOUtils  # noqa: SLF001
                        .toByteArray(stream))
        finally:
            stream.close()
        try:
            return {n for n in json.loads(raw).get("owned", []) if n in OUTPUT_NAMES}
        except ValueError:
            return set()

    def check(self) -> None:
        """Refuse an C{OUT} holding an output name the tool did not write."""
        owned = self._read_owned()
        for name in OUTPUT_NAMES:
            if self.fs.exists(self._path(_join(self.out, name))) and name not in owned:
                self.abandon()
                raise layout.LayoutError(
                    f"--out {self.out!r} already holds {name!r}, which kestrel-analyze did not "
                    "write; move it away or choose another --out")

    def commit(self) -> list[str]:
        """Move the staged outputs into C{OUT}, replacing only entries the marker lists."""
        from kestrel.analytics.output import MARKER

        owned = self._read_owned()
        staged = [st.getPath().getName() for st in self.fs.listStatus(self._path(self.path))]
        staged = sorted(n for n in staged if n in OUTPUT_NAMES)
        trash = _join(self.path, ".replaced")
        self.fs.mkdirs(self._path(trash))
        for name in staged:
            target = self._path(_join(self.out, name))
            if self.fs.exists(target):
                if name not in owned:
                    raise layout.LayoutError(f"{_join(self.out, name)!r} appeared while the job "
                                             f"ran; the results are in {self.path!r}")
                self.fs.rename(target, self._path(_join(trash, name)))
            self.fs.rename(self._path(_join(self.path, name)), target)
            owned.add(name)
        write_text(self.spark, self.out, MARKER, json.dumps({"owned": sorted(owned)}))
        self.fs.delete(self._path(self.path), True)
        return staged

    def abandon(self) -> None:
        """Remove the staging folder."""
        self.fs.delete(self._path(self.path), True)


def write_text(spark: SparkSession | None, out: str, name: str, text: str) -> None:
    """Write a text file into the output folder (local, or any Hadoop URI)."""
    if layout.is_local(out):
        folder = layout.local_path(out)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    assert spark is not None
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - Hadoop FS is only reachable via the JVM
    path = jvm.org.apache.hadoop.fs.Path(_join(out, name))
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def stage(spark: SparkSession | None, out: str) -> Any:
    """Return a staging folder under C{out} (local, or a Hadoop URI through C{spark})."""
    if layout.is_local(out):
        return Staging(out)
    assert spark is not None
    st = HadoopStaging(spark, out)
    st.check()
    return st


def finish(say: Progress, spark: SparkSession | None, staging: Any,
           inputs: Sequence[tuple[str, str]], archives: Sequence[tuple[str, str]], plan: Plan,
           files_pdf: pd.DataFrame, flow_pdf: pd.DataFrame, queue_rows: pd.DataFrame,
           backlog_pdf: pd.DataFrame, sizes_pdf: pd.DataFrame, report: bool) -> dict[str, Any]:
    """Write C{summary.json} and the report into the staging folder and commit it."""
    say("writing summary.json" + (" and report.html" if report else ""))
    summary = tables.build_summary(inputs, archives, plan, files_pdf, flow_pdf, queue_rows)
    write_text(spark, staging.path, "summary.json",
               json.dumps(summary, indent=2, sort_keys=True))
    if report:
        from kestrel.analytics.report import render_report, report_data

        data = report_data(summary, flow_pdf, backlog_pdf, sizes_pdf)
        write_text(spark, staging.path, "report.html", render_report(summary, data))
    staging.commit()
    say.done()
    return summary


def _analyse_dicts(files: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
    """A Spark task: analyse one group of whole queues (see L{kestrel.analytics.local})."""
    from kestrel.analytics.local import analyse_group

    return analyse_group([layout.JournalFile.from_dict(d) for d in files])


def _write_events_part(item: tuple[int, list[dict[str, Any]], str]) -> int:
    """A Spark task: write one group's events as one Parquet part file; return its rows."""
    from kestrel.analytics.local import records_of, scan_files, write_table

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
    from kestrel.analytics.local import combine, group_files, write_outputs

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
                "add_ms", "problem").collect()
        finally:
            if binary:
                if saved is None:
                    spark.conf.unset(ARROW_BATCH)
                else:
                    spark.conf.set(ARROW_BATCH, saved)
        ev = (raw.filter(sf.col("op") != TRAILER_OP).drop("problem")
              .withColumn("event_ms", sf.coalesce("add_ms", "time_lb_ms", "time_ub_ms")))
        records = sum(t.xid for t in trailers)
        cut = [t for t in trailers if t.problem]
        note = (f"; {len(cut)} file(s) end in a broken record: "
                + ", ".join(t.file for t in cut[:5]) + (", ..." if len(cut) > 5 else "")
                if cut else "")
        say(f"writing files table{' and events' if events else ''} "
            f"({records:,} records){note}")
        if events:
            ev.write.parquet(_join(staging.path, "events"))
        files_pdf = tables.files_table(plan, trailers)
        spark.createDataFrame(files_pdf, tables.FILES_DDL).coalesce(1).write.parquet(
            _join(staging.path, "files"))

        say("aggregating per-minute flow")
        flow = _flow(ev)
        flow.write.parquet(_join(staging.path, "flow"))
        flow_pdf = spark.read.parquet(_join(staging.path, "flow")).toPandas()
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
            *[sf.coalesce(sf.col(c), sf.lit(NONE if c in ("add_ms", "expiry_ms", "time_lb_ms",
                                                        "time_ub_ms") else 0)).alias(c)
              for c in tables.REPLAY_INPUT if c not in tables.REPLAY_FLAGS],
            *tables.REPLAY_FLAGS)
        rep = (filled.groupBy("server", "queue")
               .applyInPandas(tables.replay_frame, tables.REPLAY_DDL)
               .persist(StorageLevel.MEMORY_AND_DISK))
        backlog = (rep.filter(sf.col("kind") == "backlog")
                   .select(*tables.columns(tables.BACKLOG_DDL)))
        backlog.write.parquet(_join(staging.path, "backlog"))
        backlog_pdf = (spark.read.parquet(_join(staging.path, "backlog")).toPandas()
                       if report else pd.DataFrame(columns=tables.columns(tables.BACKLOG_DDL)))
        queue_rows = rep.filter(sf.col("kind") == "queue").toPandas()
        rep.unpersist()
        tiq, expiry = tables.queue_tables(queue_rows)
        spark.createDataFrame(tiq, tables.TIQ_DDL).coalesce(1).write.parquet(
            _join(staging.path, "time_in_queue"))
        spark.createDataFrame(expiry, tables.EXPIRY_DDL).coalesce(1).write.parquet(
            _join(staging.path, "expiry"))
        return finish(say, spark, staging, inputs, archives, plan, files_pdf, flow_pdf,
                      queue_rows, backlog_pdf, sizes_pdf, report)
    except BaseException:
        staging.abandon()
        raise
    finally:
        raw.unpersist()
