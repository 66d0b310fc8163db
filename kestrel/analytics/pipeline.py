"""
What both engines share around the analysis: progress lines, the plan, the
staging of C{OUT} (local or a Hadoop URI), and the summary and report.

L{kestrel.analytics.local} (one process, and the Spark tasks' whole-queue
analysis) and L{kestrel.analytics.job} (the Spark driver) both build on this
module; neither imports the other at module level for it.
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

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def join_uri(out: str, name: str) -> str:
    """Return C{out/name} for a local path or a URI."""
    return out.rstrip("/") + "/" + name


class HadoopStaging:
    """L{Staging} for an C{OUT} given as a Hadoop URI, through Hadoop's C{FileSystem} API."""

    def __init__(self, spark: SparkSession, out: str) -> None:
        import uuid

        self.spark = spark
        self.out = out.rstrip("/")
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - Hadoop FS is only reachable via the JVM
        assert jvm is not None  # (a started SparkContext has its JVM gateway)
        self._path = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
        self.fs = self._path(self.out).getFileSystem(conf)
        self.path = join_uri(self.out, STAGING_PREFIX + uuid.uuid4().hex[:12])
        self.fs.mkdirs(self._path(self.path))

    def _read_owned(self) -> set[str]:
        from kestrel.analytics.output import MARKER

        marker = self._path(join_uri(self.out, MARKER))
        if not self.fs.exists(marker):
            return set()
        stream = self.fs.open(marker)
        try:
            jvm = self.spark.sparkContext._jvm  # noqa: SLF001 - commons-io lives in the JVM
            assert jvm is not None
            raw = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
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
            if self.fs.exists(self._path(join_uri(self.out, name))) and name not in owned:
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
        trash = join_uri(self.path, ".replaced")
        self.fs.mkdirs(self._path(trash))
        for name in staged:
            target = self._path(join_uri(self.out, name))
            if self.fs.exists(target):
                if name not in owned:
                    raise layout.LayoutError(f"{join_uri(self.out, name)!r} appeared while the job "
                                             f"ran; the results are in {self.path!r}")
                self.fs.rename(target, self._path(join_uri(trash, name)))
            self.fs.rename(self._path(join_uri(self.path, name)), target)
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
    assert jvm is not None  # (a started SparkContext has its JVM gateway)
    path = jvm.org.apache.hadoop.fs.Path(join_uri(out, name))
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


