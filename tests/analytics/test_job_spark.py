"""
The real Spark job, in local mode, against journals with known truth.

One scenario (two servers, many queues, rotations, a pack beside the files it
replaced, truncated tails, empty files, temp and stray files) is generated
once per module; the job runs on it with each reader, and every output table
is compared with L{tests.analytics.truth}.
"""

from __future__ import annotations

import io
import json
import os
import random

import pytest

from tests.analytics.journals import QueueWriter
from tests.analytics.truth import Truth

pytestmark = pytest.mark.spark

pd = pytest.importorskip("pandas")


def _scenario(root: str) -> tuple[list[tuple[str, str]], dict]:
    rng = random.Random(20261121)
    writers: dict[tuple[str, str], QueueWriter] = {}

    def writer(server: str, queue: str) -> QueueWriter:
        w = QueueWriter(server, queue, rng)
        writers[(server, queue)] = w
        return w

    alpha = os.path.join(root, "alpha")
    beta = os.path.join(root, "beta-dir")

    w = writer("alpha", "jobs")
    for _ in range(3):
        w.random_ops(80)
        w.rotate()
    w.random_ops(80)

    w = writer("alpha", "mail")
    w.random_ops(60)
    w.rotate()
    w.random_ops(60)
    while len(w.open) < 2 and w.items:
        w.open_read()
    w.rotate()
    w.pack(fillers=2)
    w.remove()
    w.remove()
    w.random_ops(60)
    w.rotate()
    w.random_ops(40)
    w.truncate_tail()

    writer("alpha", "empty")

    w = writer("alpha", "idle")
    w.random_ops(30)
    w.rotate()

    w = writer("alpha", "trunc_mid")
    w.random_ops(40)
    w.truncate_tail()
    w.rotate()
    w.random_ops(40)

    for i in range(5):
        writer("alpha", f"q{i}").random_ops(rng.randint(20, 60))

    w = writer("beta", "jobs")
    w.random_ops(70)
    w.rotate()
    w.random_ops(70)

    w = writer("beta", "mail")
    for _ in range(40):
        w.tick()
        w.legacy_add() if rng.random() < 0.5 else w.add()
    w.random_ops(30)

    for (server, _), wr in writers.items():
        wr.write(alpha if server == "alpha" else beta)
    with open(os.path.join(alpha, "jobs~~1767225600000"), "wb") as fh:
        fh.write(b"\x02half")
    with open(os.path.join(alpha, "notes.txt"), "wb") as fh:
        fh.write(b"not a journal")
    os.mkdir(os.path.join(alpha, "subdir"))
    return [("alpha", alpha), ("beta", beta)], writers


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Truth]:
    root = str(tmp_path_factory.mktemp("journals"))
    inputs, writers = _scenario(root)
    return inputs, Truth(writers)


@pytest.fixture(scope="module", params=["source", "binaryfile", "local"])
def result(request: pytest.FixtureRequest, scenario: tuple,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, str, str]:
    from kestrel.analytics.job import Progress, run

    inputs, _ = scenario
    out = str(tmp_path_factory.mktemp(f"out-{request.param}"))
    stream = io.StringIO()
    if request.param == "local":
        from kestrel.analytics.local import run_local

        summary = run_local(inputs, out, progress=Progress(4, stream), events=True)
    else:
        spark = request.getfixturevalue("spark")
        stages = 6 if request.param == "binaryfile" else 4
        summary = run(spark, inputs, out, reader=request.param,
                      progress=Progress(stages, stream),
                      report=request.param == "source", events=True)
    return out, summary, stream.getvalue(), request.param


def _none(v: object) -> object:
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float):
        return None if v != v else int(v)
    if hasattr(v, "item"):
        return v.item()
    return v


def _rows(path: str, keys: list[str]) -> list[dict]:
    df = pd.read_parquet(path)
    return [{k: _none(v) for k, v in r.items()}
            for r in df.sort_values(keys).to_dict("records")]


def test_summary_counts_match_truth(result: tuple, scenario: tuple) -> None:
    """summary.json holds, per server and queue, the counts the generator wrote."""
    out, summary, _, _ = result
    truth = scenario[1]
    with open(os.path.join(out, "summary.json")) as fh:
        on_disk = json.load(fh)
    assert on_disk == json.loads(json.dumps(summary))
    got = {(s, q): v for s, qs in on_disk["servers"].items() for q, v in qs.items()}
    assert set(got) == set(truth.queues)
    for key, want in truth.queues.items():
        q = got[key]
        for k in ("enqueued", "dequeued", "opened", "confirmed", "aborted", "bytes_enqueued"):
            assert q["traffic"][k] == want[k], (key, k)
        for k in ("items_left", "queued", "open_reads", "bytes_left"):
            assert q["state"][k] == want[k], (key, k)
        for k in ("truncated_bytes", "records", "files", "dequeued_items"):
            assert q[k] == want[k], (key, k)
        assert q["snapshot"]["records"] == want["snapshot_records"], key
        assert q["snapshot"]["fillers"] == want["fillers"], key
    mail = got[("alpha", "mail")]
    assert mail["snapshot"]["fillers"] == 2
    assert mail["traffic"]["history_compacted"] is True
    assert mail["traffic"]["from_ms"] is not None
    assert got[("alpha", "jobs")]["traffic"]["history_compacted"] is False
    broken = {(b["server"], b["file"]) for b in on_disk["broken_files"]}
    assert ("alpha", "mail") in broken and ("alpha", "trunc_mid") not in broken
    assert any(f.startswith("trunc_mid.") for s, f in broken if s == "alpha")
    assert got[("alpha", "mail")]["truncated_bytes"] > 0
    assert got[("alpha", "trunc_mid")]["truncated_bytes"] > 0
    assert got[("alpha", "empty")]["records"] == 0
    assert "estimate" in on_disk["estimates"]
    skipped = {(s["server"], s["file"]): s["reason"] for s in on_disk["skipped_files"]}
    assert skipped[("alpha", "jobs~~1767225600000")].startswith("temporary")
    assert ("alpha", "notes.txt") in skipped
    assert sum(1 for s, f in skipped if f.startswith("mail.")) == 2


def test_events_table_matches_truth(result: tuple, scenario: tuple) -> None:
    """Every counted record appears once in the events table, with its fields and bounds."""
    out = result[0]
    keys = ["server", "queue", "file_seq", "offset"]
    got = _rows(os.path.join(out, "events"), keys)
    want = sorted(scenario[1].events, key=lambda r: tuple(r[k] for k in keys))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert {k: g[k] for k in w} == w


def test_files_table_lists_counted_and_skipped(result: tuple, scenario: tuple) -> None:
    """The files table lists every file: counted ones with records and truncated bytes, others
    with the reason they were skipped."""
    out = result[0]
    got = {(r["server"], r["file"]): r for r in _rows(os.path.join(out, "files"),
                                                      ["server", "file"])}
    for want in scenario[1].files:
        g = got[(want["server"], want["file"])]
        for k, v in want.items():
            assert g[k] == v, (want["file"], k)
    mail_pack = [r for r in got.values() if r["file"].endswith(".pack")]
    assert len(mail_pack) == 1 and mail_pack[0]["counted"]
    replaced = [r for r in got.values() if r["reason"] and r["reason"].startswith("replaced")]
    assert len(replaced) == 2


def test_flow_matches_truth(result: tuple, scenario: tuple) -> None:
    """Per-minute flow: counts, bytes and nearest-rank size percentiles per queue."""
    out = result[0]
    got = {(r["server"], r["queue"], r["minute_ms"]): r
           for r in _rows(os.path.join(out, "flow"), ["server", "queue", "minute_ms"])}
    from tests.analytics.truth import pcts

    assert set(got) == set(scenario[1].flow)
    for key, want in scenario[1].flow.items():
        g = got[key]
        for k, v in want.items():
            if k != "sizes":
                assert g[k] == v, (key, k)
        assert [g["size_p50"], g["size_p90"], g["size_p99"], g["size_max"]] == \
            pcts(want["sizes"]), key


def test_backlog_matches_truth(result: tuple, scenario: tuple) -> None:
    """Backlog per minute is the model's state after the last record of that minute."""
    out = result[0]
    got = {(r["server"], r["queue"], r["minute_ms"]): r
           for r in _rows(os.path.join(out, "backlog"), ["server", "queue", "minute_ms"])}
    assert set(got) == set(scenario[1].backlog)
    for key, want in scenario[1].backlog.items():
        assert {k: got[key][k] for k in want} == want, key


def test_time_in_queue_and_expiry_match_truth(result: tuple, scenario: tuple) -> None:
    """Time-in-queue bounds and the expiry summary per queue match the model."""
    out = result[0]
    tiq = {(r["server"], r["queue"]): r
           for r in _rows(os.path.join(out, "time_in_queue"), ["server", "queue"])}
    exp = {(r["server"], r["queue"]): r
           for r in _rows(os.path.join(out, "expiry"), ["server", "queue"])}
    assert set(tiq) == set(exp) == set(scenario[1].queues)
    for key, want in scenario[1].queues.items():
        t = tiq[key]
        assert t["dequeued_items"] == want["dequeued_items"], key
        assert [t[f"wait_{b}_{p}_ms"] for b in ("lb", "ub")
                for p in ("p50", "p90", "p99", "max")] == want["waits"], key
        assert t["estimate"] is True
        e = exp[key]
        assert [e["ttl_p50_ms"], e["ttl_p90_ms"], e["ttl_p99_ms"], e["ttl_max_ms"]] == \
            want["ttl"], key
        for k in ("with_expiry", "expired_removed", "expired_removed_min", "left_with_expiry",
                  "left_expired"):
            assert e[k] == want[k], (key, k)
    assert tiq[("alpha", "jobs")]["dequeued_items"] > 50
    # each figure says its window, and whether history before it was compacted away
    assert tiq[("alpha", "mail")]["history_compacted"] is True
    assert exp[("alpha", "mail")]["history_compacted"] is True
    assert tiq[("alpha", "jobs")]["history_compacted"] is False
    assert tiq[("alpha", "jobs")]["from_ms"] <= tiq[("alpha", "jobs")]["to_ms"]


def test_report_and_progress(result: tuple, scenario: tuple) -> None:
    """One progress line per stage; the report is one self-contained HTML page with charts."""
    out, _, progress, reader = result
    lines = progress.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == \
        ([f"[{i}/6]" for i in range(1, 7)] if reader == "binaryfile"
         else [f"[{i}/4]" for i in range(1, 5)])
    assert lines[-1].startswith("kestrel-analyze done")
    if reader == "binaryfile":
        assert not os.path.exists(os.path.join(out, "report.html"))
        return
    with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
        page = fh.read()
    busy = sum(1 for q in scenario[1].queues.values() if q["records"])
    assert page.count("<svg") == 3 * min(busy, 12)
    assert "http" not in page and "src=" not in page
    assert "estimates" in page.lower()
    assert "alpha" in page and "beta" in page


@pytest.mark.parametrize("result", ["source"], indirect=True)
def test_one_process_tables_equal_spark_tables(result: tuple, scenario: tuple,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """--engine local writes the very tables the Spark job writes (same rows, same types)."""
    out, summary, _, reader = result
    assert reader == "source"
    from kestrel.analytics.local import run_local

    local_out = str(tmp_path_factory.mktemp("out-local-compare"))
    local_summary = run_local(scenario[0], local_out, events=True)
    assert json.loads(json.dumps(local_summary)) == json.loads(json.dumps(summary))
    keys = {"events": ["server", "queue", "archive", "file_seq", "offset"],
            "files": ["server", "file", "path"], "flow": ["server", "queue", "minute_ms"],
            "backlog": ["server", "queue", "minute_ms"], "time_in_queue": ["server", "queue"],
            "expiry": ["server", "queue"]}
    for table, key in keys.items():
        a = pd.read_parquet(os.path.join(out, table)).sort_values(key).reset_index(drop=True)
        b = pd.read_parquet(os.path.join(local_out, table)).sort_values(key).reset_index(
            drop=True)
        pd.testing.assert_frame_equal(a, b, check_dtype=True, obj=table)


def test_arrow_batch_size_is_restored(result: tuple, spark: object) -> None:
    """The binaryFile reader's small Arrow batches apply to the scan only, not to later jobs."""
    from kestrel.analytics.job import ARROW_BATCH

    assert spark.conf.get(ARROW_BATCH) == "4096"
