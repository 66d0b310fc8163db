"""The HTML report is one self-contained page (no Spark needed)."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from kestrel.analytics.report import (  # noqa: E402
    MAX_POINTS,
    ReportData,
    bucket_width,
    render_report,
    svg_lines,
)


def _summary() -> dict:
    q = dict(enqueued=3, dequeued=2, opened=1, confirmed=1, aborted=0, bytes_enqueued=30,
             items_left=1, open_reads=0, truncated_bytes=5, files=1, records=6,
             time_in_queue_ms={"lb_p50": 1500, "ub_p50": 4000, "lb_p99": 60_000,
                               "ub_p99": 60_000})
    return {"inputs": [{"server": "s<1>", "path": "/d/s1"}], "servers": {"s<1>": {"q&a": q}},
            "skipped_files": [{"server": "s<1>", "file": "q~~1", "reason": "temporary file (~~)"}],
            "estimates": "Dequeue times are estimates."}


def test_report_is_self_contained_and_escaped() -> None:
    """Names are escaped, charts are inline SVG, waits show as estimated brackets, no URL."""
    key = ("s<1>", "q&a")
    data = ReportData(
        60_000,
        {key: pd.DataFrame({"bucket": [0, 60_000], "enqueued": [2, 1], "dequeued": [1, 1]})},
        {key: pd.DataFrame({"bucket": [0, 60_000], "items": [1, 1], "open_reads": [0, 0]})},
        {key: pd.DataFrame({"bin": [0, 4], "count": [1, 2]})})
    page = render_report(_summary(), data)
    assert page.count("<svg") == 3
    assert "s&lt;1&gt;" in page and "q&amp;a" in page and "<1>" not in page
    assert "1.5 s - 4.0 s" in page and "<td>60.0 s</td>" in page
    assert "Dequeue times are estimates." in page
    assert "http" not in page and "<script" not in page
    assert "q~~1 (temporary file (~~))" in page


def test_charts_handle_no_data_and_wide_spans() -> None:
    """An empty series says so; long spans get wider buckets, at most MAX_POINTS of them."""
    assert "no data" in svg_lines("t", [], {})
    day = 24 * 60 * 60_000
    width = bucket_width(0, 10 * day)
    assert width % 60_000 == 0 and 10 * day // width + 1 <= MAX_POINTS
    assert bucket_width(0, 0) == 60_000 and bucket_width(None, None) == 60_000
