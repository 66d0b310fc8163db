"""
The Spark job on journals written by the real server classes.

C{PersistentQueue} over C{FileJournal} (under a fake clock) writes the
journals, rotating, reading behind and packing with small limits; the job's
counts must match the operations performed, and its C{items_left} must match
what a restarted queue actually holds.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

pytestmark = pytest.mark.spark

pd = pytest.importorskip("pandas")
queue_mod = pytest.importorskip("kestrel.queue")
journal_mod = pytest.importorskip("kestrel.journal.journal")

from twisted.internet.task import Clock  # noqa: E402

from kestrel.config import QueueConfig  # noqa: E402

T0 = 1_767_225_600.0

SMALL = QueueConfig(max_memory_size=2048, default_journal_size=4096, max_journal_size=12_288,
                    min_journal_compact_delay=None)


def _open(folder: str, name: str, config: QueueConfig, clock: Clock,
          archive: str | None) -> object:
    journal = journal_mod.FileJournal(folder, name, clock, None, archive_path=archive)
    queue = queue_mod.PersistentQueue(name, config, journal, clock)
    queue.setup()
    return queue


def _drive(queue: object, clock: Clock, rng: random.Random, ops: int) -> dict[str, int]:
    """Random adds, removes and reliable reads; return what was done."""
    done = dict(enqueued=0, dequeued=0, opened=0, confirmed=0, aborted=0, bytes_enqueued=0)
    open_xids: list[int] = []
    for _ in range(ops):
        clock.advance(rng.uniform(0, 3))
        r = rng.random()
        if r < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 10, 100, 400])))
            queue.add(data, expiry_ms=0)
            done["enqueued"] += 1
            done["bytes_enqueued"] += len(data)
        elif r < 0.7:
            if queue.remove(False) is not None:
                done["dequeued"] += 1
        elif r < 0.85 and len(open_xids) < 3:
            item = queue.remove(True)
            if item is not None:
                done["opened"] += 1
                open_xids.append(item.xid)
        elif open_xids:
            xid = open_xids.pop(rng.randrange(len(open_xids)))
            if rng.random() < 0.7:
                queue.confirm_remove(xid)
                done["confirmed"] += 1
                done["dequeued"] += 1
            else:
                queue.unremove(xid)
                done["aborted"] += 1
    return done


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = str(tmp_path_factory.mktemp("server"))
    folder = os.path.join(root, "kestrel1")
    archive = os.path.join(root, "archive1")
    os.makedirs(folder)
    clock = Clock()
    clock.advance(T0)
    rng = random.Random(7)
    plain = _open(folder, "plain", QueueConfig(), clock, archive)
    busy = _open(folder, "busy", SMALL, clock, archive)
    done_plain = _drive(plain, clock, rng, 300)
    done_busy = _drive(busy, clock, rng, 1500)
    rotations = busy.journal_rotations + busy.journal_rewrites
    for q in (plain, busy):
        q.close()
    # A crash between writing a pack and putting it in place leaves the pack beside the
    # files it replaces: rebuild that from the archive (the originals) and the live folder
    # (whose oldest rotated file is the last pack's output, under the checkpoint's name).
    crashed = os.path.join(root, "crashed")
    os.makedirs(crashed)
    live = sorted((n for n in os.listdir(folder) if n.startswith("busy.")),
                  key=lambda n: int(n.split(".")[1]))
    for name in os.listdir(archive):
        if name.startswith("busy."):
            shutil.copy(os.path.join(archive, name), crashed)
    for name in [*live, "busy"]:
        target = name + ".pack" if name == live[0] else name
        shutil.copy(os.path.join(folder, name), os.path.join(crashed, target))
    return dict(folder=folder, archive=archive, crashed=crashed, clock=clock,
                done_plain=done_plain, done_busy=done_busy, rotations=rotations,
                packs=busy.journal_rotations, rewrites=busy.journal_rewrites,
                pack=live[0] + ".pack")


@pytest.fixture(scope="module")
def analysed(spark: object, written: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from kestrel.analytics.job import run
    from kestrel.analytics.local import run_local

    out = str(tmp_path_factory.mktemp("out"))
    # the documented recipe: the live folder plus its server's archive folder
    inputs = [("kestrel1", written["folder"]), ("crashed", written["crashed"])]
    summary = run(spark, inputs, out, archives=[("kestrel1", written["archive"])],
                  report=False)
    summary["files"] = pd.read_parquet(os.path.join(out, "files"))
    live_only = str(tmp_path_factory.mktemp("out-live"))
    summary["live_only"] = run_local([("kestrel1", written["folder"])], live_only,
                                     report=False)
    return summary


def test_counts_match_the_operations_performed(written: dict, analysed: dict) -> None:
    """A queue that never rotated: every count equals what the client did."""
    got = analysed["servers"]["kestrel1"]["plain"]
    for k, v in written["done_plain"].items():
        assert got["traffic"][k] == v, k
    assert got["truncated_bytes"] == 0
    assert got["traffic"]["history_compacted"] is False


def test_live_plus_archive_counts_each_client_operation_once(written: dict,
                                                             analysed: dict) -> None:
    """A queue that rotated, packed and was rewritten: live + archive traffic is exact."""
    got = analysed["servers"]["kestrel1"]["busy"]
    assert written["rotations"] > 5
    for k, v in written["done_busy"].items():
        assert got["traffic"][k] == v, k
    assert got["traffic"]["history_compacted"] is False
    assert got["snapshot"]["records"] > 0
    # the live folder alone: history before its oldest snapshot was compacted away, and says so
    alone = analysed["live_only"]["servers"]["kestrel1"]["busy"]
    assert alone["traffic"]["history_compacted"] is True
    assert alone["traffic"]["enqueued"] < written["done_busy"]["enqueued"]
    assert alone["state"] == got["state"]


def test_items_left_is_what_a_restart_holds(written: dict, analysed: dict) -> None:
    """items_left and bytes_left equal the length and bytes of the queues after a real restart."""
    assert written["rotations"] > 0
    for name, config in (("plain", QueueConfig()), ("busy", SMALL)):
        got = analysed["servers"]["kestrel1"][name]["state"]
        queue = _open(written["folder"], name, config, written["clock"], None)
        try:
            assert (got["items_left"], got["bytes_left"]) == (queue.length, queue.bytes), name
        finally:
            queue.close()


def test_a_pack_beside_its_originals_counts_once(written: dict, analysed: dict) -> None:
    """With a .pack and every file it replaces present, only the pack counts: same result."""
    archived = set(os.listdir(written["archive"]))
    assert written["pack"][: -len(".pack")] in archived  # the checkpoint file was packed
    crashed = analysed["servers"]["crashed"]["busy"]
    live = analysed["live_only"]["servers"]["kestrel1"]["busy"]
    # the same records; the pack's name dates its snapshot, while a renamed pack without its
    # archive could also be a rewritten live file rotated later: its adds may be clients'
    varies = ("enqueued_uncertain", "to_ms")
    assert ({k: v for k, v in crashed["traffic"].items() if k not in varies}
            == {k: v for k, v in live["traffic"].items() if k not in varies})
    assert crashed["traffic"]["enqueued_uncertain"] == 0
    assert 0 < live["traffic"]["enqueued_uncertain"] <= live["snapshot"]["reemitted_adds"]
    # to_ms is an upper bound: the live file's modification time (each copy has its own)
    assert abs(crashed["traffic"]["to_ms"] - live["traffic"]["to_ms"]) < 5_000
    clock = ("as_of_ms", "last_record_ms", "oldest_item_age_ms")  # up to the file's mtime
    assert ({k: v for k, v in crashed["state"].items() if k not in clock}
            == {k: v for k, v in live["state"].items() if k not in clock})
    for k in ("records", "files"):
        assert crashed[k] == live[k], k
    files = analysed["files"]
    skipped = files[(files["server"] == "crashed") & ~files["counted"]]
    assert len(skipped) == len(archived)
    assert set(skipped["reason"]) == {f"replaced by pack {written['pack']}"}
    assert "archive1" not in analysed["servers"]  # the archive is part of kestrel1
