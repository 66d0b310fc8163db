"""The columnar scanner agrees with the server's record codec (no Spark needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

np = pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

from kestrel.analytics import scan as scan_module  # noqa: E402
from kestrel.analytics.layout import JournalFile  # noqa: E402
from kestrel.analytics.scan import (  # noqa: E402
    TRAILER_OP,
    frame_records,
    scan_buffer,
    scan_file,
    snapshot_masks,
    time_bounds,
)
from kestrel.journal import records  # noqa: E402

NONE = np.iinfo(np.int64).min
xids = st.integers(0, 2**31 - 1)
times = st.integers(0, 2**42)
data = st.binary(max_size=40)

record = st.one_of(
    st.builds(records.Add, data, times, st.one_of(st.just(0), times)),
    st.builds(records.LegacyAdd, data, st.integers(0, 2**31 - 1)),
    st.builds(records.AddXid, xids, data, times, times),
    st.builds(records.Continue, xids, data, times, times),
    st.just(records.REMOVE),
    st.just(records.RemoveTentative()),
    st.builds(records.RemoveTentativeXid, xids),
    st.builds(records.SaveXid, xids),
    st.builds(records.Unremove, xids),
    st.builds(records.ConfirmRemove, xids),
)

_OPS = {records.Add: 2, records.LegacyAdd: 0, records.AddXid: 7, records.Continue: 8,
        records.Remove: 1, records.RemoveTentative: 3, records.RemoveTentativeXid: 9,
        records.SaveXid: 4, records.Unremove: 5, records.ConfirmRemove: 6}


def _expected(rec: records.Record) -> tuple[int, int, int, int, int]:
    """(op, xid, size, add_ms, expiry_ms) as the scanner should report a record."""
    op = _OPS[type(rec)]
    xid = getattr(rec, "xid", 0)
    size = len(rec.data) if hasattr(rec, "data") else 0
    add = getattr(rec, "add_time_ms", NONE)
    if isinstance(rec, records.LegacyAdd):
        exp = rec.expiry_s * 1000 if rec.expiry_s else NONE
    else:
        exp = getattr(rec, "expiry_ms", 0) or NONE
    return op, xid, size, add, exp


@given(st.lists(record, max_size=30))
def test_scan_reports_every_field(recs: list) -> None:
    """Each record's opcode, xid, payload size, add time and expiry land in the columns."""
    buf = b"".join(r.encode() for r in recs)
    scan = scan_buffer(buf)
    assert scan.truncated_bytes == 0 and scan.problem is None and scan.clean_end == len(buf)
    got = list(zip(scan.op.tolist(), scan.xid.tolist(), scan.size.tolist(),
                   scan.add_ms.tolist(), scan.expiry_ms.tolist(), strict=True))
    assert got == [_expected(r) for r in recs]
    assert scan.offset.tolist() == records.decode_prefix(buf).offsets


@given(st.lists(record, min_size=1, max_size=20), st.data())
def test_truncated_tail_is_counted_not_fatal(recs: list, draw: st.DataObject) -> None:
    """Any prefix scans to the codec's clean end; the rest is truncated bytes."""
    buf = b"".join(r.encode() for r in recs)
    cut = draw.draw(st.integers(0, len(buf)))
    scan = scan_buffer(buf[:cut])
    prefix = records.decode_prefix(buf[:cut])
    assert scan.clean_end == prefix.end
    assert scan.truncated_bytes == cut - prefix.end
    assert scan.count == len(prefix.records)
    assert (scan.problem is None) == (cut == prefix.end)


@given(st.lists(record, max_size=40), st.integers(1, 64), st.binary(max_size=12),
       st.data())
def test_the_bulk_framer_agrees_with_the_codec(recs: list, window: int, tail: bytes,
                                               draw: st.DataObject) -> None:
    """Whatever the window and chunk (records crossing them, payloads full of opcode bytes,
    a cut or garbage at the end), the framer finds the codec's records, clean end and
    problem."""
    buf = b"".join(r.encode() for r in recs) + tail
    buf = buf[:draw.draw(st.integers(0, len(buf)))]
    saved = scan_module.WINDOW, scan_module.CHUNK, scan_module.SMALL
    scan_module.WINDOW, scan_module.CHUNK = window, draw.draw(st.integers(1, 200))
    scan_module.SMALL = draw.draw(st.sampled_from([0, 1 << 24]))  # both size filters
    try:
        offsets, end, problem = frame_records(buf)
    finally:
        scan_module.WINDOW, scan_module.CHUNK, scan_module.SMALL = saved
    want = records.decode_prefix(buf)
    assert (offsets.tolist(), end, problem) == (want.offsets, want.end, want.problem)


@pytest.mark.parametrize("chunk", [None, 10_000])
def test_payloads_of_opcode_bytes_frame_in_bulk(chunk: int | None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal whose payloads are all REMOVE and xid bytes (every byte could start a record)
    frames like the codec, over many windows and chunks."""
    if chunk is not None:
        monkeypatch.setattr(scan_module, "CHUNK", chunk)
    parts = []
    for i in range(3000):
        parts.append(records.encode_add(bytes([1, 9, 4, 0, 2]) * (i % 50), i))
        parts.append(records.REMOVE_BYTES if i % 3 else records.encode_xid(9, i))
    buf = b"".join(parts)
    offsets, end, problem = frame_records(buf)
    assert offsets.tolist() == records.decode_prefix(buf).offsets
    assert (end, problem) == (len(buf), None)


def test_corrupt_record_stops_the_scan_with_a_reason() -> None:
    """An unknown opcode ends the scan there; the bytes after it are reported, not raised."""
    buf = records.encode_add(b"ok", 5) + b"\x0c\x00\x00" + records.REMOVE_BYTES
    scan = scan_buffer(buf)
    assert scan.count == 1
    assert scan.truncated_bytes == 4
    assert scan.problem == "invalid opcode 12"


def _naive_bounds(adds: list[int | None], start: int | None,
                  end: int | None) -> list[tuple[int | None, int | None]]:
    out = []
    for i, a in enumerate(adds):
        if a is not None:
            out.append((a, a))
            continue
        before = [x for x in adds[:i] if x is not None] + ([start] if start is not None else [])
        lb = max(before) if before else None
        ub = next((x for x in adds[i + 1:] if x is not None), end)
        if lb is not None and ub is not None and ub < lb:
            ub = lb
        out.append((lb, ub))
    return out


@given(st.lists(st.one_of(st.none(), st.integers(0, 10**6)), max_size=25),
       st.one_of(st.none(), st.integers(0, 10**6)), st.one_of(st.none(), st.integers(0, 10**6)))
def test_time_bounds_bracket_untimed_records(adds: list, start: int | None,
                                             end: int | None) -> None:
    """Untimed records lie after the latest earlier add time and before the next one."""
    recs = [records.Add(b"", a) if a is not None else records.REMOVE for a in adds]
    scan = scan_buffer(b"".join(r.encode() for r in recs))
    lb, ub = time_bounds(scan, start, end)
    got = [(None if x == NONE else x, None if y == NONE else y)
           for x, y in zip(lb.tolist(), ub.tolist(), strict=True)]
    assert got == _naive_bounds(adds, start, end)


def test_batch_has_one_trailer_row_per_file() -> None:
    """The batch holds the records, then a trailer with the clean end and truncated bytes."""
    jf = JournalFile("s", "q", "q.5", "/x", 0, "rotated", 5, 0, None, 5, False, 5)
    buf = (records.encode_xid(4, 4) + records.encode_add(b"", 3) + records.encode_add(b"", 9)
           + records.encode_add(b"a", 4) + records.encode_xid(9, 5) + b"\x02\x01")
    batch = scan_file(jf, buf).to_pydict()
    assert batch["op"] == [4, 2, 2, 2, 9, TRAILER_OP]
    assert batch["filler"] == [False, False, True, False, False, False]
    assert batch["snapshot"] == [True, True, True, True, False, False]
    assert batch["archive"] == [False] * 6
    assert batch["xid"] == [4, None, None, None, 5, 5]
    assert batch["size"] == [None, 0, 0, 1, None, 2]
    assert batch["add_ms"][-1] == 4  # the trailer counts the snapshot records
    assert batch["offset"][-1] == len(buf) - 2
    assert batch["problem"] == [None] * 5 + ["truncated record"]
    assert batch["time_lb_ms"][4] == 9 and batch["time_ub_ms"][4] == 9
    empty = scan_file(jf, b"").to_pydict()
    assert empty["op"] == [TRAILER_OP] and empty["size"] == [0] and empty["xid"] == [0]


def _masks(recs: list, bound: int | None) -> tuple[list[bool], list[bool]]:
    s = scan_buffer(b"".join(r.encode() for r in recs))
    snap, fill = snapshot_masks(s.op, s.xid, s.size, s.add_ms, bound)
    return snap.tolist(), fill.tolist()


def test_a_pack_is_recognised_by_its_content() -> None:
    """SAVE_XID, open reads (ADDX + REMOVE_TENTATIVE_XID at or below the counter), fillers
    (0 bytes, at or after the bound) and re-emitted items: all snapshot, nothing after."""
    pack = [records.SaveXid(7), records.Add(b"o", 50), records.RemoveTentativeXid(7),
            records.Add(b"p", 40), records.RemoveTentativeXid(3),
            records.Add(b"", 120), records.Add(b"", 121), records.Add(b"i", 60),
            records.Add(b"", 70)]
    snap, fill = _masks(pack, 100)
    assert snap == [True] * 9
    assert fill == [False] * 5 + [True, True, False, False]  # an old empty item is no filler


def test_a_rewrite_ends_where_client_traffic_starts() -> None:
    """After a rewrite's snapshot, the first other record or later add is client traffic;
    a client read opens an xid above the saved counter."""
    rewrite = [records.SaveXid(7), records.Add(b"o", 50), records.RemoveTentativeXid(6),
               records.Add(b"i", 60), records.Add(b"new", 150), records.REMOVE,
               records.Add(b"x", 160)]
    assert _masks(rewrite, 100)[0] == [True] * 4 + [False] * 3
    assert _masks(rewrite, None)[0] == [True] * 5 + [False] * 2  # no bound: adds up to REMOVE
    opened = [records.SaveXid(7), records.Add(b"a", 150), records.RemoveTentativeXid(8)]
    assert _masks(opened, 100)[0] == [True, False, False]
    # without a bound, an add right after the snapshot cannot be told from a re-emitted one
    assert _masks(opened, None)[0] == [True, True, False]
    plain = [records.Add(b"a", 1), records.SaveXid(3), records.Add(b"b", 2)]
    assert _masks(plain, 10) == ([False] * 3, [False] * 3)
