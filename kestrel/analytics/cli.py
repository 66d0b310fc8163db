"""
``kestrel-analyze``: analyse Kestrel journal folders with Spark.

Usage: ``kestrel-analyze DIR... --out OUT [--master URL]``. A folder is
given as ``PATH`` (server named after the folder) or ``NAME=PATH``. Without
``--master`` (and outside ``spark-submit``) the job runs on an embedded
``local[*]`` Spark; ``--engine local`` runs it in this process without Spark.
Every input and the output folder are checked before Spark starts; a user
error is one line on stderr and exit status 2. Progress goes to stderr, one
line per stage.
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

    from kestrel.analytics.layout import Plan
    from kestrel.analytics.pipeline import Progress


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser."""
    p = argparse.ArgumentParser(
        prog="kestrel-analyze",
        description="Analyse Kestrel journal folders (live queue folders, plus their archives "
                    "with --archive) with Spark or in one process: client traffic and server "
                    "state as Parquet tables, summary.json and report.html in --out. Inputs and "
                    "--out are checked first; errors are one line, exit status 2.")
    p.add_argument("inputs", nargs="+", metavar="DIR",
                   help="a live journal folder (a server's queue_path), local or any Hadoop "
                        "URI; NAME=DIR names its server (default: the folder's name)")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="output folder (local or Hadoop URI), outside every input; only "
                        "outputs an earlier run wrote there are replaced")
    p.add_argument("--master", default=None, metavar="URL",
                   help="Spark master URL (default: local[*], or spark-submit's --master)")
    p.add_argument("--reader", choices=("auto", "source", "binaryfile"), default="auto",
                   help="auto: whole-queue tasks for local folders, binaryFile for URIs")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration (repeatable)")
    p.add_argument("--archive", action="append", default=[], metavar="[NAME=]DIR",
                   help="a server's archive_path folder: its files count as that server's "
                        "traffic only (repeatable); NAME must match the live input's name")
    p.add_argument("--engine", choices=("spark", "local"), default="spark",
                   help="spark (default), or local: the same analysis in this one process, "
                        "for local folders")
    p.add_argument("--events", action="store_true",
                   help="also write the per-record events table (large)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--verbose", action="store_true",
                   help="show Spark's own log (its warnings and errors); quiet by default")
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
                 app_name: str = "kestrel-analyze", quiet: bool = False) -> SparkSession:
    """
    Return a Spark session for the job.

    For a local master: C{SPARK_LOCAL_IP} defaults to 127.0.0.1 and the
    directory holding the C{kestrel} package joins the workers' C{PYTHONPATH}.
    With C{quiet}, everything the Spark JVM (and the Python workers it
    starts) writes to stderr goes to a temporary file instead, from its
    first line: a master that cannot be reached would otherwise print a
    hundred lines before the error is raised. If the session does not
    start, the error names that file; otherwise the file is removed.
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
        # the driver JVM does little work for local folders (Python tasks do it): its
        # optimising JIT compiler would take CPU from them on a small machine
        settings["spark.driver.extraJavaOptions"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    if not quiet:
        return builder.getOrCreate()
    fd, log_path = tempfile.mkstemp(prefix="kestrel-analyze-spark-", suffix=".log")
    saved = os.dup(2)
    os.dup2(fd, 2)  # the JVM started now inherits it as its stderr, and keeps it
    try:
        session = builder.getOrCreate()
    except Exception as e:
        raise SparkStartError(f"{_one_line(e)} (Spark's log: {log_path})") from e
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    os.unlink(log_path)
    return session


class SparkStartError(RuntimeError):
    """The Spark session did not start; the message names Spark's log file."""


def _installed(module: str) -> bool:
    """Whether C{module} can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:
        return False


class UserError(Exception):
    """A problem the user can fix; reported as one line, exit status 2."""


EXECUTOR_FIX = (
    "give the executors a Python with numpy, pandas<3 and pyarrow (set PYSPARK_PYTHON to it, "
    "or spark.pyspark.python) and the kestrel package (--py-files kestrel.zip, or let "
    "kestrel-analyze ship it: drop --no-ship)")


def _probe(_: object) -> list[str]:
    """Runs on an executor: return the Python and the versions it can import."""
    import sys as _sys

    import numpy
    import pandas
    import pyarrow

    import kestrel.analytics.scan  # noqa: F401 - the codec and scanner must import

    return [_sys.executable, numpy.__version__, pandas.__version__, pyarrow.__version__]


def check_executors(spark: SparkSession) -> None:
    """
    Run one small task that imports what the scan needs on an executor.

    @raise UserError: it failed, with how to fix it.
    """
    sc = spark.sparkContext
    level = sc.getConf().get("spark.log.level", "WARN")
    sc.setLogLevel("OFF")  # a failed probe's task trace is noise: one line says it all
    try:
        sc.parallelize([0], 1).map(_probe).collect()
    except Exception as e:  # noqa: BLE001 - any failure here means the executors are not set up
        text = str(e)
        missing = ""
        for line in text.splitlines():
            if "ModuleNotFoundError" in line or "ImportError" in line:
                missing = line.strip().split("Error: ", 1)[-1]
                break
        raise UserError(f"executors cannot run the scan ({missing or text.splitlines()[0]}); "
                        f"{EXECUTOR_FIX}") from None
    finally:
        sc.setLogLevel(level)


def _inputs(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    from kestrel.analytics.layout import parse_input

    inputs = [parse_input(a) for a in args.inputs]
    archives = [parse_input(a) for a in args.archive]
    return inputs, archives


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the analysis; return the process exit status (0 on success, 2 on a user error)."""
    args = build_parser().parse_args(argv)
    missing = [m for m in ("pyspark", "pandas", "pyarrow", "numpy") if not _installed(m)]
    if missing:  # one line, not a traceback, when the [analytics] extra is not installed
        print(f"kestrel-analyze: the analytics extra is not installed (missing: "
              f"{', '.join(missing)}); pip install 'txkestrel[analytics]'", file=sys.stderr)
        return 1
    try:
        return _main(args)
    except UserError as e:
        print(f"kestrel-analyze: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kestrel-analyze: interrupted; nothing was moved into --out", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    from kestrel.analytics.job import Progress, plan_inputs
    from kestrel.analytics.layout import LayoutError, is_local
    from kestrel.analytics.output import check_output

    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--conf needs KEY=VALUE, not {item!r}")
        conf[key] = value
    try:
        inputs, archives = _inputs(args)
        names = {s for s, _ in inputs}
        for server, folder in archives:
            if server not in names and inputs:
                raise LayoutError(f"--archive {folder!r} belongs to server {server!r}, which "
                                  f"no input names (inputs: {', '.join(sorted(names))}); "
                                  "use --archive NAME=DIR")
        everything = [p for _, p in [*inputs, *archives]]
        seen: dict[str, str] = {}
        for folder in everything:
            key = os.path.realpath(folder) if is_local(folder) else folder.rstrip("/")
            if key in seen:
                raise LayoutError(f"folder {folder!r} is given twice (also as {seen[key]!r}); "
                                  "its records would count twice")
            seen[key] = folder
        check_output(args.out, everything)
        local = all(is_local(p) for p in everything)
        if args.engine == "local" and not (local and is_local(args.out)):
            raise LayoutError("--engine local reads and writes local folders only")
        from kestrel.analytics.job import uses_groups

        say = Progress(4 if args.engine == "local"
                       or uses_groups(None, inputs, archives, args.out, args.reader) else 6)
        plan = None
        if local and args.reader != "binaryfile":
            # every local input is checked (exists, readable, holds journal files) before
            # Spark starts
            say(f"checking and planning {len(everything)} folder(s)")
            plan = plan_inputs(None, inputs, args.reader, archives)
    except (LayoutError, OSError) as e:
        raise UserError(_one_line(e)) from None

    if args.engine == "local":
        from kestrel.analytics.local import run_local

        try:
            summary = run_local(inputs, args.out, archives=archives, progress=say,
                                report=not args.no_report, events=args.events, plan=plan)
        except (LayoutError, OSError) as e:
            raise UserError(_one_line(e)) from None
    else:
        summary = _run_spark(args, conf, inputs, archives, plan, say)
    _print_totals(summary, args.out)
    return 0


def _run_spark(args: argparse.Namespace, conf: dict[str, str],
               inputs: list[tuple[str, str]], archives: list[tuple[str, str]],
               plan: Plan | None, say: Progress) -> dict:
    from kestrel.analytics.job import run
    from kestrel.analytics.layout import LayoutError

    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UserError("pyspark is not installed: pip install 'txkestrel[analytics]', "
                        "or use --engine local") from None
    existing = SparkSession.getActiveSession()  # e.g. a notebook's: reuse it, never stop it
    try:
        spark = existing or make_session(args.master, conf, quiet=not args.verbose)
    except Exception as e:  # noqa: BLE001 - Spark start-up failures are user-fixable
        raise UserError(f"Spark did not start: {_one_line(e)} (is Java 17 or 21 installed, "
                        "and the --master URL right?)") from None
    try:
        with tempfile.TemporaryDirectory(prefix="kestrel-analyze-") as tmp:
            shipped = spark.sparkContext.getConf().get("spark.submit.pyFiles", "")
            if not (args.no_ship or shipped or is_local_master(spark.sparkContext.master)):
                spark.sparkContext.addPyFile(package_zip(tmp))
            check_executors(spark)
            try:
                return run(spark, inputs, args.out, archives=archives, reader=args.reader,
                           report=not args.no_report, events=args.events, plan=plan,
                           progress=say)
            except LayoutError as e:
                raise UserError(_one_line(e)) from None
    finally:
        if existing is None:
            spark.stop()


def _print_totals(summary: dict, out: str) -> None:
    t = summary["totals"]
    tr, st = t["traffic"], t["state"]
    compacted = (f" ({tr['queues_compacted']} queue(s) with history compacted away)"
                 if tr["queues_compacted"] else "")
    broken = f", {t['broken_files']} file(s) with broken records" if t["broken_files"] else ""
    print(f"kestrel-analyze: {t['files']} files, {t['records']:,} records{broken}; "
          f"traffic: {tr['enqueued']:,} enqueued, {tr['dequeued']:,} dequeued{compacted}; "
          f"state: {st['items_left']:,} items left; "
          f"{t['truncated_bytes']:,} truncated bytes; output in {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
