"""The HTML report, produced by the one-process engine (no Spark needed)."""

from __future__ import annotations

import os
import random
import re

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from kestrel.analytics.local import run_local  # noqa: E402
from kestrel.analytics.report import (  # noqa: E402
    MAX_CHARTED_QUEUES,
    MAX_POINTS,
    bucket_width,
    size_label,
    svg_steps,
    time_ticks,
)
from tests.analytics.journals import QueueWriter  # noqa: E402


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    rng = random.Random(5)
    root = str(tmp_path_factory.mktemp("report"))
    folder = os.path.join(root, "s<1>")
    # many busy queues, one stuck quiet queue, one packed queue, one broken file
    for i in range(14):
        w = QueueWriter("s<1>", f"busy{i}", rng)
        w.random_ops(200)
        while w.items:
            w.remove()
        w.write(folder)
    stuck = QueueWriter("s<1>", "q&a", rng)
    stuck.add(size=100)
    stuck.add(size=100)
    stuck.now += 3_600_000
    stuck.add(size=10)
    stuck.remove()
    stuck.write(folder)
    packed = QueueWriter("s<1>", "packed", rng)
    packed.random_ops(60)
    packed.rotate()
    packed.pack(fillers=1)
    packed.random_ops(20)
    packed.truncate_tail()
    packed.write(folder)
    out = os.path.join(root, "out")
    summary = run_local([("s<1>", folder)], out)
    with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
        return fh.read(), summary


def test_report_is_self_contained_and_escaped(page: tuple[str, dict]) -> None:
    """Names are escaped, charts are inline SVG, no URL and no script."""
    html, _ = page
    assert "s&lt;1&gt;" in html and "q&amp;a" in html and "<1>" not in html
    assert "http" not in html and "<script" not in html and "src=" not in html


def test_report_has_totals_state_windows_and_broken_files(page: tuple[str, dict]) -> None:
    """Per-server totals; per queue bytes left, oldest item's age, expiry, traffic window
    with a visible note where history was compacted; broken files named with their path."""
    html, summary = page
    assert "<h2>Servers</h2>" in html
    q = summary["servers"]["s<1>"]["q&a"]
    assert q["state"]["items_left"] == 2 and q["state"]["bytes_left"] == 110
    assert q["state"]["oldest_item_age_ms"] >= 3_600_000
    row = re.search(r"<tr><td class='l'>s&lt;1&gt;</td><td class='l'>q&amp;a</td>.*?</tr>",
                    html, re.S).group(0)
    assert "<td>110</td>" in row and "<td>60.0 min</td>" in row  # bytes left, oldest age
    assert summary["servers"]["s<1>"]["packed"]["traffic"]["history_compacted"] is True
    packed = re.search(r"<td class='l'>packed</td>.*?</tr>", html, re.S).group(0)
    assert "history before compacted" in packed
    assert "file(s) with broken records" in html
    broken = summary["broken_files"]
    assert [b["file"] for b in broken] == ["packed"]
    assert broken[0]["path"].replace("<", "&lt;").replace(">", "&gt;") in html
    assert "with expiry" in html and "expired when removed" in html


def test_charts_include_stuck_quiet_queues_with_labelled_axes(page: tuple[str, dict]) -> None:
    """The quiet queue holding the oldest item is charted even though 15 queues are busier;
    every chart has labelled axes with values."""
    html, _ = page
    charted = re.findall(r"<h3>(.*?)</h3>", html)
    assert len(charted) == MAX_CHARTED_QUEUES
    assert any(h.startswith("s&lt;1&gt; / q&amp;a") for h in charted)
    assert html.count("<svg") == 3 * MAX_CHARTED_QUEUES
    assert html.count("time (UTC)") == 2 * MAX_CHARTED_QUEUES
    assert html.count(">item size, bytes (a-b: from a up to") == MAX_CHARTED_QUEUES
    assert re.search(r">items / 1 min</text>", html)
    assert re.search(r'text-anchor="end">[0-9,]+</text>', html)  # value ticks
    assert re.search(r">01-01 \d\d:\d\d</text>", html)  # time ticks, the date on the first
    assert ">confirmed</text>" in html and "<th>confirmed</th>" in html


def test_charts_handle_no_data_and_wide_spans() -> None:
    """An empty series says so; long spans get wider buckets, at most MAX_POINTS of them."""
    assert "no data" in svg_steps("t", [], 60_000, {})
    day = 24 * 60 * 60_000
    width = bucket_width(0, 10 * day)
    assert width % 60_000 == 0 and 10 * day // width + 1 <= MAX_POINTS
    assert bucket_width(0, 0) == 60_000 and bucket_width(None, None) == 60_000


def test_time_ticks_are_whole_steps_with_distinct_labels() -> None:
    """A two-minute window gets one tick per minute, not three equal labels; a day gets hours
    and the date where it changes; weeks get dates."""
    t0 = 1_767_225_600_000 + 10 * 60_000  # 2026-01-01 00:10
    two = time_ticks(t0, t0 + 120_000)
    assert [label for _, label in two] == ["01-01 00:10", "00:11", "00:12"]
    day = time_ticks(t0, t0 + 24 * 3_600_000)
    labels = [label for _, label in day]
    assert len(set(labels)) == len(labels) <= 7 and "01-02 00:00" in labels
    weeks = [label for _, label in time_ticks(t0, t0 + 20 * 86_400_000)]
    assert len(set(weeks)) == len(weeks) and all(len(w) == 5 for w in weeks)
    for a, b in (two[0], two[1]), (day[0], day[1]):
        assert b[0] - a[0] in (60_000, 4 * 3_600_000, 6 * 3_600_000, 3 * 3_600_000)


def test_partial_buckets_are_dashed_and_marked() -> None:
    """A bucket only partly inside the traffic window is dashed and says partial."""
    t0 = 1_767_225_600_000
    svg = svg_steps("t", [t0, t0 + 60_000], 60_000, {"enqueued": [10, 4]},
                    window=(t0, t0 + 75_000))
    assert svg.count('stroke-dasharray="4 3"') == 1 and ">partial</text>" in svg
    assert "partial" not in svg_steps("t", [t0], 60_000, {"e": [1]}, window=(t0, t0 + 59_999))


def test_size_buckets_are_labelled_by_range() -> None:
    """4,000-byte items fall in the bucket labelled 2K-4K; small buckets show their range."""
    b = 4000 .bit_length()  # the bucket of floor(log2(4000)) + 1
    assert size_label(b) == "2K-4K"
    assert [size_label(i) for i in range(5)] == ["0", "1", "2-4", "4-8", "8-16"]
