"""The kestrel-analyze command line: checks before any work, safe output, both engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kestrel.analytics.cli import build_parser, is_local_master, main, package_zip
from kestrel.journal import records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _journal(folder: str, name: str = "q") -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as fh:
        fh.write(records.encode_add(b"abc", 1_767_225_600_000) + records.REMOVE_BYTES
                 + records.encode_add(b"de", 1_767_225_660_000) + b"\x09\x01")
    return folder


def _tree(folder: str) -> dict[str, bytes]:
    out = {}
    for base, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(base, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and documents DIR, --out, --master, --engine, --archive and --events."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in ("DIR", "--out", "--master", "NAME=DIR", "--reader", "--engine", "--archive",
                 "--events"):
        assert word in text


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_user_errors_are_one_line_before_any_work(tmp_path: os.PathLike, engine: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Every user error exits 2 with one line naming the problem, before Spark would start."""
    tmp = str(tmp_path)
    srv = _journal(os.path.join(tmp, "srv"))
    os.makedirs(os.path.join(tmp, "empty"))
    _journal(os.path.join(tmp, "stray"), "notes.txt")
    with open(os.path.join(tmp, "afile"), "w") as fh:
        fh.write("x")
    out = os.path.join(tmp, "out")
    cases = [
        (["east=", "--out", out], "names server 'east' but no folder"),
        ([srv, "--out", out, "--conf", "novalue"], "KEY=VALUE"),
        ([os.path.join(tmp, "missing"), "--out", out], "does not exist"),
        ([os.path.join(tmp, "empty"), "--out", out], "is empty: it holds no journal files"),
        ([os.path.join(tmp, "stray"), "--out", out], "holds no journal files (1 other file(s)"),
        ([os.path.join(tmp, "afile"), "--out", out], "is not a folder"),
        ([srv, "--out", srv], "is the input folder"),
        ([srv, "--out", os.path.join(srv, "q")], "is inside the input folder"),
        ([srv, "--out", tmp], "contains the input folder"),
        ([srv, f"west={srv}", "--out", out], "is given twice"),
        ([srv, "--archive", f"other={tmp}/empty", "--out", out], "which no input names"),
        ([srv, "--out", os.path.join(tmp, "afile")], "is a file, not a folder"),
    ]
    before = _tree(tmp)
    for argv, message in cases:
        started = time.monotonic()
        assert main([*argv, "--engine", engine]) == 2, argv
        assert time.monotonic() - started < 5, argv  # no Spark was started
        err = [line for line in capsys.readouterr().err.splitlines()
               if not line.startswith("kestrel-analyze [")]
        assert len(err) == 1 and err[0].startswith("kestrel-analyze: "), (argv, err)
        assert message in err[0], (argv, err)
    assert _tree(tmp) == before  # nothing written, nothing deleted
    assert not os.path.exists(out)


def test_errors_print_no_traceback_from_the_console_script(tmp_path: os.PathLike) -> None:
    """The installed command's errors are one line, never a Python traceback."""
    proc = subprocess.run([sys.executable, "-m", "kestrel.analytics.cli", str(tmp_path),
                           "--out", str(tmp_path) + "-out"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"kestrel-analyze: input folder {str(tmp_path)!r} is empty: it holds no journal files")


def test_output_never_deletes_what_the_tool_did_not_write(tmp_path: os.PathLike,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """A user's OUT/events is refused and kept; OUT's other files survive; reruns replace
    only the tool's own entries (listed in the marker file)."""
    srv = _journal(os.path.join(str(tmp_path), "srv"))
    out = os.path.join(str(tmp_path), "out")
    os.makedirs(os.path.join(out, "events"))
    with open(os.path.join(out, "events", "mine.txt"), "w") as fh:
        fh.write("precious")
    with open(os.path.join(out, "notes.md"), "w") as fh:
        fh.write("keep me")
    assert main([srv, "--out", out, "--engine", "local"]) == 2
    assert "already holds 'events', which kestrel-analyze did not write" in \
        capsys.readouterr().err
    os.rename(os.path.join(out, "events"), os.path.join(str(tmp_path), "moved"))
    assert main([srv, "--out", out, "--engine", "local"]) == 0
    first = sorted(os.listdir(out))
    assert first == [".kestrel-analyze-owned", "backlog", "expiry", "files", "flow",
                     "notes.md", "report.html", "summary.json", "time_in_queue"]
    with open(os.path.join(out, ".kestrel-analyze-owned")) as fh:
        owned = json.load(fh)["owned"]
    assert "notes.md" not in owned and "summary.json" in owned
    assert main([srv, "--out", out, "--engine", "local", "--events"]) == 0
    assert sorted(os.listdir(out)) == sorted([*first, "events"])
    with open(os.path.join(out, "notes.md")) as fh:
        assert fh.read() == "keep me"
    with open(os.path.join(srv, "q"), "rb") as fh:
        assert len(fh.read()) == 50  # the input is untouched


def test_local_masters() -> None:
    """Only local masters run executors inside this process's JVM."""
    assert is_local_master(None) and is_local_master("local[2]")
    assert not is_local_master("spark://127.0.0.1:7077")


def test_package_zip_ships_the_codec(tmp_path: os.PathLike) -> None:
    """The zip shipped to executors holds the kestrel package with the record codec."""
    import zipfile

    with zipfile.ZipFile(package_zip(str(tmp_path))) as zf:
        names = set(zf.namelist())
    assert {"kestrel/__init__.py", "kestrel/journal/records.py",
            "kestrel/analytics/scan.py"} <= names


def test_local_engine_end_to_end(tmp_path: os.PathLike,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--engine local analyses a folder without Spark and prints traffic and state apart."""
    srv = _journal(os.path.join(str(tmp_path), "srv"))
    out = os.path.join(str(tmp_path), "out")
    assert main([f"east={srv}", "--out", out, "--engine", "local"]) == 0
    err = capsys.readouterr().err
    assert "kestrel-analyze [1/4] checking and planning 1 folder(s)" in err
    assert ("1 files, 3 records, 1 file(s) with broken records; traffic: 2 enqueued, "
            "1 dequeued; state: 1 items left; 2 truncated bytes") in err
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    q = summary["servers"]["east"]["q"]
    assert (q["traffic"]["enqueued"], q["traffic"]["dequeued"], q["state"]["items_left"],
            q["traffic"]["bytes_enqueued"]) == (2, 1, 1, 5)
    assert summary["broken_files"][0]["path"] == os.path.join(srv, "q")


@pytest.mark.spark
def test_main_runs_the_job(spark: object, tmp_path: os.PathLike,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """main() on Spark checks the executors, writes every output, leaves the session running."""
    srv = _journal(os.path.join(str(tmp_path), "srv"))
    out = os.path.join(str(tmp_path), "out")
    assert main([f"east={srv}", "--out", out, "--events"]) == 0
    err = capsys.readouterr().err
    assert "traffic: 2 enqueued, 1 dequeued; state: 1 items left" in err
    assert sorted(os.listdir(out)) == [".kestrel-analyze-owned", "backlog", "events", "expiry",
                                       "files", "flow", "report.html", "summary.json",
                                       "time_in_queue"]
    assert spark.range(3).count() == 3


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no second Python here")
def test_executors_without_pyarrow_are_reported(tmp_path: os.PathLike) -> None:
    """Executors on a Python without pyarrow: one line saying what is missing and how to fix."""
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pyarrow"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("/usr/bin/python3 has pyarrow")
    srv = _journal(os.path.join(str(tmp_path), "srv"))
    env = {**os.environ, "PYTHONPATH": ROOT, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": "/usr/bin/python3"}
    proc = subprocess.run(
        [sys.executable, "-m", "kestrel.analytics.cli", srv, "--out", str(tmp_path) + "-out",
         "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.memory=512m"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kestrel-analyze: executors cannot run the scan"), last
    assert "No module named" in last and "PYSPARK_PYTHON" in last
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(str(tmp_path) + "-out")


@pytest.mark.spark
@pytest.mark.slow
def test_spark_stays_quiet_unless_verbose(tmp_path: os.PathLike) -> None:
    """A master nobody listens on: stderr is the progress line and the one-line error naming
    Spark's log file (not Spark's hundred lines); with --verbose Spark's own log shows."""
    srv = _journal(os.path.join(str(tmp_path), "srv"))
    env = {**os.environ, "PYTHONPATH": ROOT, "SPARK_LOCAL_IP": "127.0.0.1"}
    runs = {}
    for flag in ([], ["--verbose"]):
        proc = subprocess.run(
            [sys.executable, "-m", "kestrel.analytics.cli", srv, "--out",
             os.path.join(str(tmp_path), f"out{len(flag)}"), "--master",
             "spark://127.0.0.1:1", *flag],
            capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        runs[bool(flag)] = proc.stderr.strip().splitlines()
    quiet = runs[False]
    assert len(quiet) == 2, quiet
    assert quiet[0].startswith("kestrel-analyze [1/4] checking")
    assert quiet[1].startswith("kestrel-analyze: Spark did not start") and "Spark's log: " in \
        quiet[1]
    log = quiet[1].split("Spark's log: ")[1].split(")")[0]
    assert os.path.getsize(log) > 0  # what Spark said is kept there
    os.unlink(log)
    assert len(runs[True]) > 5 and runs[True][-1].startswith("kestrel-analyze: Spark did not")
