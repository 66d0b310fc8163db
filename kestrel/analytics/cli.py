"""
``kestrel-analyze``: analyse Kestrel journal folders with Spark.

Usage: ``kestrel-analyze DIR... --out OUT [--master URL]``. A folder is
given as ``PATH`` (server named after the folder) or ``NAME=PATH``. Without
``--master`` (and outside ``spark-submit``) the job runs on an embedded
``local[*]`` Spark. Progress goes to stderr, one line per stage.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser."""
    p = argparse.ArgumentParser(
        prog="kestrel-analyze",
        description="Analyse Kestrel journal folders (live queue folders or archives) with "
                    "Spark: Parquet tables, summary.json and report.html in --out.")
    p.add_argument("inputs", nargs="+", metavar="DIR",
                   help="a journal folder, local or any Hadoop URI; NAME=DIR names its server "
                        "(default: the folder's name)")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="output folder (local or Hadoop URI); existing tables are replaced")
    p.add_argument("--master", default=None, metavar="URL",
                   help="Spark master URL (default: local[*], or spark-submit's --master)")
    p.add_argument("--reader", choices=("auto", "source", "binaryfile"), default="auto",
                   help="auto: the Python data source for local folders, binaryFile for URIs")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration (repeatable)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--no-ship", action="store_true",
                   help="do not ship the kestrel package to a cluster's executors (it is "
                        "installed there); it is never shipped when --py-files gave files")
    return p


def package_zip(directory: str) -> str:
    """Zip the C{kestrel} package (Python files only) into C{directory}; return the zip's path."""
    import kestrel

    root = os.path.dirname(os.path.abspath(kestrel.__file__))
    parent = os.path.dirname(root)
    target = os.path.join(directory, "kestrel-package.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, _, names in os.walk(root):
            for name in names:
                if name.endswith((".py", ".thrift")):
                    full = os.path.join(folder, name)
                    zf.write(full, os.path.relpath(full, parent))
    return target


def is_local_master(master: str | None) -> bool:
    """Return whether C{master} runs Spark inside this machine's driver JVM."""
    return master is None or master.startswith("local")


def make_session(master: str | None, conf: dict[str, str] | None = None,
                 app_name: str = "kestrel-analyze") -> SparkSession:
    """
    Return a Spark session for the job.

    For a local master: C{SPARK_LOCAL_IP} defaults to 127.0.0.1 and the
    directory holding the C{kestrel} package joins the workers' C{PYTHONPATH}.
    """
    import kestrel

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # running under spark-submit
    local = is_local_master(master) if master is not None else not submitted
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        parent = os.path.dirname(os.path.dirname(os.path.abspath(kestrel.__file__)))
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if parent not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([parent, *paths])
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not submitted:
        builder = builder.master("local[*]")
    settings = {
        "spark.log.level": "WARN",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    if local:
        # the default of 200 shuffle partitions costs seconds on small inputs
        settings["spark.sql.shuffle.partitions"] = str(2 * (os.cpu_count() or 2))
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _installed(module: str) -> bool:
    """Whether C{module} can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the analysis; return the process exit status (0 on success)."""
    args = build_parser().parse_args(argv)
    missing = [m for m in ("pyspark", "pandas", "pyarrow", "numpy") if not _installed(m)]
    if missing:  # one line, not a traceback, when the [analytics] extra is not installed
        print(f"kestrel-analyze: the analytics extra is not installed (missing: "
              f"{', '.join(missing)}); pip install 'txkestrel[analytics]'", file=sys.stderr)
        return 1
    from kestrel.analytics.job import run
    from kestrel.analytics.layout import LayoutError, parse_input

    try:
        inputs = [parse_input(a) for a in args.inputs]
    except LayoutError as e:
        print(f"kestrel-analyze: {e}", file=sys.stderr)
        return 2
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"kestrel-analyze: --conf needs KEY=VALUE, not {item!r}", file=sys.stderr)
            return 2
        conf[key] = value
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()  # e.g. a notebook's: reuse it, never stop it
    spark = existing or make_session(args.master, conf)
    try:
        with tempfile.TemporaryDirectory(prefix="kestrel-analyze-") as tmp:
            shipped = spark.sparkContext.getConf().get("spark.submit.pyFiles", "")
            if not (args.no_ship or shipped or is_local_master(spark.sparkContext.master)):
                spark.sparkContext.addPyFile(package_zip(tmp))
            try:
                summary = run(spark, inputs, args.out, reader=args.reader,
                              report=not args.no_report)
            except LayoutError as e:
                print(f"kestrel-analyze: {e}", file=sys.stderr)
                return 2
    finally:
        if existing is None:
            spark.stop()
    t = summary["totals"]
    print(f"kestrel-analyze: {t['files']} files, {t['records']:,} records, "
          f"{t['enqueued']:,} enqueued, {t['dequeued']:,} dequeued, "
          f"{t['items_left']:,} items left, {t['truncated_bytes']:,} truncated bytes; "
          f"output in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
