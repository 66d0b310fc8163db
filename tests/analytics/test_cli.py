"""The kestrel-analyze command line."""

from __future__ import annotations

import json
import os

import pytest

from kestrel.analytics.cli import build_parser, is_local_master, main, package_zip
from kestrel.journal import records


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and documents DIR, --out and --master."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in ("DIR", "--out", "--master", "NAME=DIR", "--reader"):
        assert word in text


def test_bad_inputs_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    """An input that names no folder, or a malformed --conf, exits 2 with a message."""
    assert main(["east=", "--out", "/nonexistent"]) == 2
    assert "names server 'east' but no folder" in capsys.readouterr().err
    assert main(["/tmp", "--out", "/nonexistent", "--conf", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


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


@pytest.mark.spark
def test_main_runs_the_job(spark: object, tmp_path: os.PathLike,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """main() analyses a folder, writes every output, and leaves the caller's session running."""
    folder = os.path.join(tmp_path, "srv")
    os.makedirs(folder)
    with open(os.path.join(folder, "q"), "wb") as fh:
        fh.write(records.encode_add(b"abc", 1_767_225_600_000) + records.REMOVE_BYTES
                 + records.encode_add(b"de", 1_767_225_660_000) + b"\x09\x01")
    out = os.path.join(tmp_path, "out")
    assert main([f"east={folder}", "--out", out]) == 0
    err = capsys.readouterr().err
    assert "kestrel-analyze [1/7] planning 1 folder(s)" in err
    assert "1 files, 3 records, 2 enqueued, 1 dequeued, 1 items left, 2 truncated bytes" in err
    with open(os.path.join(out, "summary.json")) as fh:
        q = json.load(fh)["servers"]["east"]["q"]
    assert (q["enqueued"], q["dequeued"], q["items_left"], q["bytes_enqueued"]) == (2, 1, 1, 5)
    assert sorted(os.listdir(out)) == ["backlog", "events", "expiry", "files", "flow",
                                       "report.html", "summary.json", "time_in_queue"]
    assert spark.range(3).count() == 3
    assert main([os.path.join(tmp_path, "missing"), "--out", out]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.spark
def test_a_folder_without_journals_gives_empty_outputs(spark: object, tmp_path: os.PathLike,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A folder holding only skipped files yields empty tables and a summary naming them."""
    folder = os.path.join(tmp_path, "srv")
    os.makedirs(folder)
    with open(os.path.join(folder, "q~~12"), "wb") as fh:
        fh.write(b"\x01")
    out = os.path.join(tmp_path, "out")
    assert main([folder, "--out", out, "--no-report"]) == 0
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    assert summary["servers"] == {}
    assert summary["skipped_files"] == [{"server": "srv", "file": "q~~12",
                                         "reason": "temporary file (~~)"}]
    assert "0 files, 0 records" in capsys.readouterr().err
