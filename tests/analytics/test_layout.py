"""Which files an analysis reads, and in what order (no Spark needed)."""

from __future__ import annotations

import os

import pytest

from kestrel.analytics.layout import (
    LIVE,
    MTIME_SLACK_MS,
    PACK,
    ROTATED,
    LayoutError,
    Listing,
    classify,
    list_local,
    parse_input,
    plan_files,
    plan_local,
)


def _listing(name: str, server: str = "s", size: int = 10, mtime: int = 9_000) -> Listing:
    return Listing(server, name, f"/d/{server}/{name}", size, mtime)


def test_parse_input_names_servers() -> None:
    """A folder names its server unless NAME=PATH says otherwise."""
    assert parse_input("/data/kestrel1/") == ("kestrel1", "/data/kestrel1/")
    assert parse_input("east=/data/q") == ("east", "/data/q")
    assert parse_input("hdfs://nn:8020/arch/k2") == ("k2", "hdfs://nn:8020/arch/k2")
    assert parse_input("/data/a=b") == ("a=b", "/data/a=b")
    with pytest.raises(LayoutError):
        parse_input("east=")
    with pytest.raises(LayoutError):
        parse_input("/")


def test_classify_follows_the_server_naming() -> None:
    """Live, rotated and pack files are recognised; temp and stray names are not journals."""
    assert classify("jobs") == ("jobs", LIVE, None)
    assert classify("jobs+fan") == ("jobs+fan", LIVE, None)
    assert classify("jobs.1700000000000") == ("jobs", ROTATED, 1_700_000_000_000)
    assert classify("jobs.1700000000000.pack") == ("jobs", PACK, 1_700_000_000_000)
    assert classify("jobs~~1700000000000") == "temporary file (~~)"
    for stray in ("jobs.txt", ".hidden", "jobs.12.pack.old", "jobs.12.tmp"):
        assert isinstance(classify(stray), str), stray


def test_newest_pack_replaces_older_files_and_packs() -> None:
    """The newest pack wins over every rotated file and pack at or before its timestamp."""
    plan = plan_files([_listing(n) for n in (
        "q.100", "q.200", "q.200.pack", "q.300", "q.300.pack", "q.400", "q",
        "q~~500", "other.50")])
    assert [(f.queue, f.name) for f in plan.files] == [
        ("other", "other.50"), ("q", "q.300.pack"), ("q", "q.400"), ("q", "q")]
    skipped = {s.name: s.reason for s in plan.skipped}
    assert skipped == {
        "q.100": "replaced by pack q.300.pack", "q.200": "replaced by pack q.300.pack",
        "q.200.pack": "replaced by pack q.300.pack", "q.300": "replaced by pack q.300.pack",
        "q~~500": "temporary file (~~)"}


def test_replay_order_and_time_bounds() -> None:
    """Files replay by timestamp then the live file; each starts where the previous ended.
    The live file ends at its modification time plus the kernel's clock slack."""
    plan = plan_files([_listing("q"), _listing("q.300"), _listing("q.20"),
                       _listing("q.100.pack")])
    got = [(f.name, f.seq, f.start_ms, f.end_ms, f.kind) for f in plan.files]
    assert got == [("q.100.pack", 0, None, 100, PACK), ("q.300", 1, 100, 300, ROTATED),
                   ("q", 2, 300, 9_000 + MTIME_SLACK_MS, LIVE)]
    assert MTIME_SLACK_MS >= 11  # one tick at 100 Hz, plus the millisecond rounding
    assert [s.name for s in plan.skipped] == ["q.20"]


def test_servers_are_part_of_the_key() -> None:
    """The same queue on two servers is two queues; a pack on one does not touch the other."""
    plan = plan_files([_listing("q.1", "a"), _listing("q.1", "b"), _listing("q.2.pack", "b")])
    assert plan.queues() == [("a", "q"), ("b", "q")]
    assert [(f.server, f.name) for f in plan.files] == [("a", "q.1"), ("b", "q.2.pack")]


def test_same_file_twice_for_one_server_is_an_error() -> None:
    """Two folders of one server holding the same file name are refused, naming both."""
    with pytest.raises(LayoutError, match="two files named 'q.1'"):
        plan_files([Listing("s", "q.1", "/x/q.1", 1, 1), Listing("s", "q.1", "/y/q.1", 1, 1)])


def test_list_local_reads_folders(tmp_path: os.PathLike) -> None:
    """Regular files are listed with size and mtime; sub-folders are ignored."""
    folder = os.path.join(tmp_path, "srv")
    os.mkdir(folder)
    os.mkdir(os.path.join(folder, "sub"))
    with open(os.path.join(folder, "q"), "wb") as fh:
        fh.write(b"\x01\x01")
    os.utime(os.path.join(folder, "q"), ns=(5_000_000_000, 5_000_000_000))
    listed = list_local("srv", folder)
    assert [(entry.name, entry.size, entry.mtime_ms) for entry in listed] == [("q", 2, 5_000)]
    plan = plan_local([("srv", "file://" + folder)])
    assert plan.total_bytes == 2
    with pytest.raises(LayoutError, match="does not exist"):
        list_local("x", os.path.join(tmp_path, "missing"))


def test_source_reader_refuses_uris_before_starting_work() -> None:
    """The data-source reader opens local paths only; URIs get a clear error naming the fix."""
    pytest.importorskip("pyspark")
    from kestrel.analytics.job import scan

    plan = plan_files([Listing("s", "q", "hdfs://nn/k/q", 3, 1)])
    with pytest.raises(LayoutError, match="--reader binaryfile"):
        scan(None, plan, "source")


def test_archive_files_count_as_traffic_and_bound_the_live_snapshots() -> None:
    """Archive files all count (no pack rule), apart from the live ones even with the same
    name; a live file's snapshot bound is the newest archived timestamp at or before it."""
    plan = plan_files([_listing("q.100"), _listing("q.300"), _listing("q"),
                       Listing("s", "q.100", "/a/q.100", 1, 1, True),
                       Listing("s", "q.200", "/a/q.200", 1, 1, True),
                       Listing("s", "q.250.pack", "/a/q.250.pack", 1, 1, True)])
    got = [(f.name, f.archive, f.seq, f.bound_ms, f.bound_exact) for f in plan.files]
    assert got == [("q.100", False, 0, 100, True), ("q.300", False, 1, 250, True),
                   ("q", False, 2, 250, True), ("q.100", True, 0, 100, False),
                   ("q.200", True, 1, 200, False), ("q.250.pack", True, 2, 250, True)]
    alone = plan_files([_listing("q.100"), _listing("q"), _listing("q.200.pack")])
    # without the archive only a .pack name dates a snapshot: a rotated name may be a
    # rewritten live file's, whose adds came after its rewrite
    assert [(f.name, f.bound_ms, f.bound_exact) for f in alone.files] == [
        ("q.200.pack", 200, True), ("q", None, False)]
