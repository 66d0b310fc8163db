"""kestrel-qdump on hand-built journals: Kestrel's exact output lines."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kestrel
from kestrel.journal import records as rec
from kestrel.tools import qdump
from kestrel.tools.journal_file import bytes_to_human, duration_to_text, iter_journal

NOW_MS = 1_767_225_600_000
CLEAR = "\r" + " " * 30 + "\n"


def write_journal(path: Path, *records: rec.Record) -> Path:
    path.write_bytes(b"".join(r.encode() for r in records))
    return path


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.BytesIO()
    status = qdump.main(list(args), out, err, now_ms=NOW_MS)
    return status, out.getvalue().decode("latin-1"), err.getvalue().decode("latin-1")


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """Two adds, a read opened and confirmed, one aborted, a plain remove."""
    return write_journal(
        tmp_path / "q",
        rec.Add(b"hello kitty", NOW_MS - 5000),
        rec.Add(b"second", NOW_MS - 4000, NOW_MS + 3_723_004),
        rec.Add(b"gone", NOW_MS - 4000, NOW_MS - 1),
        rec.RemoveTentativeXid(1),
        rec.ConfirmRemove(1),
        rec.RemoveTentativeXid(2),
        rec.Unremove(2),
        rec.Remove(),
        rec.SaveXid(7),
    )


def test_describes_every_operation(journal: Path) -> None:
    """Each record is one line: 8-hex-digit offset, two spaces, Kestrel's mnemonic."""
    status, out, err = run(str(journal))
    assert status == 0
    assert err == ""
    assert out == (
        f"Queue: {journal}\n"
        "00000000  ADD 11    \n"
        "00000020  ADD 6      exp=1.hours+2.minutes+3.seconds+4.milliseconds\n"
        "0000003b  ADD 4      expired\n"
        "00000054  RSV 1\n"
        "00000059  ACK 1\n"
        "0000005e  RSV 2\n"
        "00000063  CAN 2\n"
        "00000068  REM\n"
        "00000069  XID 7\n"
        + CLEAR
        + "Journal size: 110 bytes, with 9 operations.\n"
        "1 items totalling 4 bytes.\n"
    )


def test_quiet_prints_only_the_summary(journal: Path) -> None:
    """-q drops the per-operation lines and the "Queue:" header."""
    status, out, _ = run("-q", str(journal))
    assert status == 0
    assert out == CLEAR + ("Journal size: 110 bytes, with 9 operations.\n"
                           "1 items totalling 4 bytes.\n")


def test_dump_prints_data_under_each_add(journal: Path) -> None:
    """-d adds the data of each add, indented four spaces."""
    _, out, _ = run("-d", str(journal))
    lines = out.splitlines()
    assert lines[1:3] == ["00000000  ADD 11    ", "    hello kitty"]


def test_raw_dump_prints_only_data(journal: Path) -> None:
    """-A prints the raw data of every add back to back, and nothing else."""
    _, out, _ = run("-A", str(journal))
    assert out == "hello kittysecondgone"


def test_queue_dump_prints_remaining_items(tmp_path: Path) -> None:
    """-Q prints the summary, then each item still queued on its own line (open reads not)."""
    path = write_journal(tmp_path / "q", rec.Add(b"a", 1), rec.Add(b"bb", 1), rec.Add(b"ccc", 1),
                         rec.RemoveTentativeXid(4))
    _, out, _ = run("-Q", str(path))
    assert out == CLEAR + ("Journal size: 74 bytes, with 4 operations.\n"
                           "3 items totalling 6 bytes.\n" "bb\nccc\n")


def test_legacy_and_xid_records(tmp_path: Path) -> None:
    """Legacy ADD, ADD_XID (shows its xid), xid-less RSV (next counter value) and CONTINUE."""
    path = write_journal(
        tmp_path / "old",
        rec.SaveXid(41),
        rec.LegacyAdd(b"old", 0),
        rec.AddXid(9, b"xid", NOW_MS, 0),
        rec.RemoveTentative(),
        rec.Continue(42, b"next", NOW_MS, 0),
    )
    _, out, _ = run(str(path))
    assert out.splitlines()[1:6] == [
        "00000000  XID 41",
        "00000005  ADD 3     ",
        "00000011  ADD 3      xid=9",
        "0000002d  RSV 42",
        "0000002e  CON 4     ",
    ]
    assert out.endswith("2 items totalling 7 bytes.\n")


def test_xidless_reads_wrap_like_the_server(tmp_path: Path) -> None:
    """Xid-less RSVs are numbered as the server would: after 2^31-1 comes 1, or 2 if 1 is open."""
    path = write_journal(
        tmp_path / "old",
        rec.Add(b"a", NOW_MS), rec.Add(b"b", NOW_MS), rec.Add(b"c", NOW_MS),
        rec.SaveXid(rec.MAX_XID - 1),
        rec.RemoveTentative(),
        rec.RemoveTentativeXid(1),
        rec.RemoveTentative(),
    )
    _, out, _ = run(str(path))
    assert [line.split("  ", 1)[1] for line in out.splitlines()[4:8]] == [
        f"XID {rec.MAX_XID - 1}", f"RSV {rec.MAX_XID}", "RSV 1", "RSV 2"]


def test_missing_file_is_reported(tmp_path: Path) -> None:
    """A file that cannot be opened gets Kestrel's message on stderr and exit status 1."""
    status, out, err = run(str(tmp_path / "nope"))
    assert status == 1
    assert out == f"Queue: {tmp_path / 'nope'}\n"
    assert err == f"Can't open journal file: {tmp_path / 'nope'}\n"


def test_truncated_tail_is_reported_after_the_good_records(tmp_path: Path) -> None:
    """Records before a truncated one are described; the error names the file and offset."""
    path = tmp_path / "q"
    path.write_bytes(rec.Add(b"ok", 1).encode() + rec.Add(b"broken", 1).encode()[:-2])
    status, out, err = run(str(path))
    assert status == 1
    assert out == f"Queue: {path}\n00000000  ADD 2     \n"
    assert err.startswith(f"Exception reading journal file: {path}\n")
    assert "truncated record at offset 23" in err


def test_corrupt_opcode_is_reported(tmp_path: Path) -> None:
    """An invalid opcode stops the dump with an error, and the next file is still dumped."""
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x63")
    good = write_journal(tmp_path / "good", rec.Add(b"x", 1))
    status, out, err = run("-q", str(bad), str(good))
    assert status == 1
    assert "invalid opcode 99 at offset 1" in err
    assert out == CLEAR + "Journal size: 22 bytes, with 1 operations.\n1 items totalling 1 bytes.\n"


def test_help_names_the_tool() -> None:
    """--help prints the usage under the tool's own name, every option, and status 0."""
    status, out, err = run("--help")
    assert (status, err) == (0, "")
    assert out.startswith("usage: kestrel-qdump ")
    for option in ("-q", "-d", "-A", "-Q", "--version", "JOURNAL_FILE"):
        assert option in out


def test_version_is_not_a_file_name() -> None:
    """--version prints the txkestrel version; it is never taken for a journal file."""
    status, out, err = run("--version")
    assert (status, err) == (0, "")
    assert out == f"kestrel-qdump (txkestrel) {kestrel.__version__}\n"


def test_no_files_is_a_usage_error() -> None:
    """With no file the usage line and the problem go to stderr, status 1, nothing on stdout."""
    status, out, err = run("-q")
    assert (status, out) == (1, "")
    assert err.startswith("usage: kestrel-qdump ")
    assert err.endswith("kestrel-qdump: error: the following arguments are required: "
                        "JOURNAL_FILE\n")


def test_options_after_files(journal: Path) -> None:
    """Options may follow the files, as Kestrel's tool allowed."""
    assert run(str(journal), "-q") == run("-q", str(journal))


def test_quiet_progress_goes_to_stderr(tmp_path: Path) -> None:
    """On a journal over 1 MiB, -q shows "Reading journal:" progress on stderr only."""
    item = rec.Add(b"x" * 100_000, 1)
    path = write_journal(tmp_path / "big", *([item] * 12))
    status, out, err = run("-q", str(path))
    assert status == 0
    assert "\rReading journal: 1.0M  " in err
    assert "Reading" not in out
    assert out.endswith("12 items totalling 1200000 bytes.\n")


def test_console_script_entry_point(journal: Path) -> None:
    """The module runs as a program and prints the same summary."""
    done = subprocess.run([sys.executable, "-m", "kestrel.tools.qdump", "-q", str(journal)],
                          capture_output=True, check=True, cwd=Path(__file__).parents[2])
    assert done.stdout.endswith(b"1 items totalling 4 bytes.\n")


@pytest.mark.parametrize(("size", "text"), [
    (0, "0"), (1, "0.0K"), (512, "0.5K"), (1024, "1.0K"), (1536, "1.5K"),
    (1024 * 1024 * 95 // 100, "0.9M"), (150 * 1024, "150K"), (5 * 1024 ** 3, "5.0G"),
])
def test_bytes_to_human(size: int, text: str) -> None:
    """Sizes are formatted as Kestrel's Util.bytesToHuman."""
    assert bytes_to_human(size) == text


def test_duration_to_text() -> None:
    """Durations are formatted as Twitter util's Duration.toString."""
    assert duration_to_text(0) == "0.seconds"
    assert duration_to_text(90_061_001) == "1.days+1.hours+1.minutes+1.seconds+1.milliseconds"
    assert duration_to_text(2000) == "2.seconds"


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(1, 64))
def test_streaming_reader_is_independent_of_chunk_size(items: list[bytes], chunk: int) -> None:
    """Records decoded through small chunks equal those decoded from the whole buffer."""
    blob = b"".join(rec.encode_add(d, 5, 0) + rec.REMOVE_BYTES for d in items)
    got = list(iter_journal(io.BytesIO(blob), chunk_size=chunk))
    expected = list(rec.iter_records(blob))
    assert [(off, r) for off, r, _ in got] == expected
    assert sum(size for _, _, size in got) == len(blob)
