"""kestrel-qpack: the packed journal replays to the same queue, and Kestrel's output."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import kestrel
from kestrel.journal import records as rec
from kestrel.tools import qpack

NOW_MS = 1_767_225_600_000


def replay(blob: bytes) -> tuple[list[bytes], dict[int, bytes], int]:
    """
    Replay journal bytes with Kestrel's rules: (queue data, open reads by xid, xid counter).

    A reference model written for these tests, independent of the packer.
    """
    queue: list[bytes] = []
    open_reads: dict[int, bytes] = {}
    xid_counter = 0
    for _, r in rec.iter_records(blob):
        if isinstance(r, rec.Add | rec.AddXid | rec.LegacyAdd):
            queue.append(r.data)
        elif isinstance(r, rec.Remove):
            queue.pop(0)
        elif isinstance(r, rec.RemoveTentativeXid):
            open_reads[r.xid] = queue.pop(0)
            xid_counter = r.xid
        elif isinstance(r, rec.SaveXid):
            xid_counter = r.xid
        elif isinstance(r, rec.Unremove):
            queue.insert(0, open_reads.pop(r.xid))
        elif isinstance(r, rec.ConfirmRemove):
            del open_reads[r.xid]
        elif isinstance(r, rec.Continue):
            del open_reads[r.xid]
            queue.append(r.data)
    return queue, open_reads, xid_counter


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.BytesIO()
    status = qpack.main(list(args), out, err, now_ms=NOW_MS)
    return status, out.getvalue().decode("latin-1"), err.getvalue().decode("latin-1")


def write(path: Path, *records: rec.Record) -> str:
    path.write_bytes(b"".join(r.encode() for r in records))
    return str(path)


def test_packs_across_files_with_kestrel_output(tmp_path: Path) -> None:
    """Two files pack into SAVE_XID, open reads (ADDX + RTX), then the queue; stdout as Kestrel."""
    first = write(tmp_path / "q.1", rec.Add(b"a", 10), rec.Add(b"b", 11), rec.Add(b"c", 12, 99),
                  rec.RemoveTentativeXid(3), rec.Remove())
    second = write(tmp_path / "q", rec.Add(b"d", 13), rec.RemoveTentativeXid(5), rec.Unremove(5),
                   rec.Continue(3, b"e", 14))
    new = tmp_path / "packed"
    status, out, err = run("-f", str(new), first, second)
    assert status == 0, err
    assert err == ""
    expected = (rec.SaveXid(5).encode() + rec.encode_add(b"c", 12, 99) + rec.encode_add(b"d", 13)
                + rec.encode_add(b"e", 14))
    assert new.read_bytes() == expected
    assert out == ("Packing journals...\n"
                   "\rWriting new journal..." + " " * 40 + "\n"
                   "\r" + " " * 40 + "\n"
                   f"Done. New journal size: {len(expected)}\n")
    assert not list(tmp_path.glob("*~~*"))


def test_open_reads_are_kept_open(tmp_path: Path) -> None:
    """Reads still open at the end are written as ADDX + REMOVE_TENTATIVE_XID, ascending xid."""
    src = write(tmp_path / "q", rec.Add(b"a", 1), rec.Add(b"b", 2), rec.Add(b"c", 3),
                rec.RemoveTentativeXid(9), rec.RemoveTentativeXid(4))
    new = tmp_path / "packed"
    assert run("-f", str(new), src)[0] == 0
    records = [r for _, r in rec.iter_records(new.read_bytes())]
    assert records == [rec.SaveXid(9), rec.Add(b"b", 2), rec.RemoveTentativeXid(4),
                       rec.Add(b"a", 1), rec.RemoveTentativeXid(9), rec.Add(b"c", 3)]
    assert replay(new.read_bytes())[:2] == replay((tmp_path / "q").read_bytes())[:2]


def test_legacy_records(tmp_path: Path) -> None:
    """Legacy ADD gets the pack time as add time; an xid-less RSV gets the next counter value."""
    src = write(tmp_path / "q", rec.SaveXid(6), rec.LegacyAdd(b"old", 1_800_000_000),
                rec.LegacyAdd(b"older", 0), rec.RemoveTentative())
    new = tmp_path / "packed"
    assert run("-f", str(new), src)[0] == 0
    records = [r for _, r in rec.iter_records(new.read_bytes())]
    assert records == [rec.SaveXid(7), rec.Add(b"old", NOW_MS, 1_800_000_000_000),
                       rec.RemoveTentativeXid(7), rec.Add(b"older", NOW_MS, 0)]


def test_usage_error_without_target_or_files(tmp_path: Path) -> None:
    """Missing -f or missing files is a usage error on stderr, status 1, writing nothing."""
    for args, missing in ((["a"], "-f"), (["-f", str(tmp_path / "x")], "JOURNAL_FILE")):
        status, out, err = run(*args)
        assert (status, out) == (1, "")
        assert err.startswith("usage: kestrel-qpack ")
        assert err.endswith(f"kestrel-qpack: error: the following arguments are required: "
                            f"{missing}\n")
    assert not (tmp_path / "x").exists()


def test_help_and_version_name_the_tool() -> None:
    """--help and --version print under the tool's own name, status 0."""
    status, out, err = run("--help")
    assert (status, err) == (0, "")
    assert out.startswith("usage: kestrel-qpack ") and "-f FILE" in out
    status, out, err = run("--version")
    assert (status, out, err) == (0, f"kestrel-qpack (txkestrel) {kestrel.__version__}\n", "")


def test_corrupt_input_writes_nothing(tmp_path: Path) -> None:
    """A corrupt input fails with the file named on stderr, status 1, and no output file."""
    bad = tmp_path / "q"
    bad.write_bytes(rec.encode_add(b"a", 1) + b"\x42")
    new = tmp_path / "packed"
    status, _, err = run("-f", str(new), str(bad))
    assert status == 1
    assert f"Exception reading journal file: {bad}" in err
    assert "invalid opcode 66" in err
    assert not new.exists()
    assert not list(tmp_path.glob("*~~*"))


def test_missing_input(tmp_path: Path) -> None:
    """A missing input file is named on stderr."""
    status, _, err = run("-f", str(tmp_path / "p"), str(tmp_path / "missing"))
    assert status == 1
    assert f"Can't open journal file: {tmp_path / 'missing'}" in err


def test_inconsistent_journal_is_refused(tmp_path: Path) -> None:
    """A REMOVE with nothing left to remove is an error, not a crash."""
    src = write(tmp_path / "q", rec.Add(b"a", 1), rec.Remove(), rec.Remove())
    status, _, err = run("-f", str(tmp_path / "p"), src)
    assert status == 1
    assert "REMOVE with no item in the queue" in err


def test_progress_on_stderr_for_big_journals(tmp_path: Path) -> None:
    """Over 1 MiB of journal shows "Packing:" progress on stderr; stdout stays Kestrel's."""
    item = rec.Add(b"y" * 200_000, 1)
    src = write(tmp_path / "q", *([item] * 8), *([rec.Remove()] * 7))
    new = tmp_path / "p"
    status, out, err = run("-f", str(new), src)
    assert status == 0
    assert "\rPacking: 1.1M   " in err
    assert "Packing:" not in out
    assert replay(new.read_bytes())[0] == [b"y" * 200_000]


@st.composite
def journals(draw: st.DrawFn) -> list[bytes]:
    """Valid journals (split into files) from random queue operations."""
    queue = 0
    open_xids: list[int] = []
    xid = 0
    out: list[bytes] = []
    for _ in range(draw(st.integers(0, 40))):
        choice = draw(st.sampled_from(["add", "add", "rem", "open", "ack", "abort", "cont"]))
        if choice == "add":
            out.append(rec.encode_add(draw(st.binary(max_size=8)), draw(st.integers(0, 99))))
            queue += 1
        elif choice == "rem" and queue:
            out.append(rec.REMOVE_BYTES)
            queue -= 1
        elif choice == "open" and queue:
            xid += 1
            out.append(rec.RemoveTentativeXid(xid).encode())
            open_xids.append(xid)
            queue -= 1
        elif choice in ("ack", "abort", "cont") and open_xids:
            x = open_xids.pop(draw(st.integers(0, len(open_xids) - 1)))
            if choice == "ack":
                out.append(rec.ConfirmRemove(x).encode())
            elif choice == "abort":
                out.append(rec.Unremove(x).encode())
                queue += 1
            else:
                out.append(rec.Continue(x, b"c%d" % x, 7).encode())
                queue += 1
    cut = sorted(draw(st.lists(st.integers(0, len(out)), max_size=2)))
    bounds = [0, *cut, len(out)]
    return [b"".join(out[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=60)
@given(journals())
def test_packed_journal_replays_to_the_same_state(parts: list[bytes]) -> None:
    """Whatever the operations, the packed journal replays to the same queue and open reads."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, blob in enumerate(parts):
            p = Path(d) / f"q.{i}"
            p.write_bytes(blob)
            paths.append(str(p))
        new = Path(d) / "packed"
        size = qpack.JournalPacker(paths, str(new), now_ms=NOW_MS).pack()
        packed = new.read_bytes()
    assert size == len(packed)
    queue, open_reads, _ = replay(b"".join(parts))
    assert replay(packed)[:2] == (queue, open_reads)
    # The file is minimal: SAVE_XID, two records per open read, one per queued item.
    assert len(list(rec.iter_records(packed))) == 1 + 2 * len(open_reads) + len(queue)
