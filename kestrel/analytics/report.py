"""
The self-contained HTML report: tables plus inline SVG charts, no external URL.

L{report_data} gathers small aggregates with Spark (flow and backlog per time
bucket, payload-size histogram); L{render_report} is pure and turns them and
the summary into one HTML page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import pandas as pd

from kestrel.analytics.replay import MINUTE_MS
from kestrel.analytics.scan import ADD_OPS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: At most this many points per chart line.
MAX_POINTS = 300
#: Charts are drawn for at most this many queues (the busiest).
MAX_CHARTED_QUEUES = 12

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


@attrs.frozen
class ReportData:
    """Small per-queue series for the charts, keyed by C{(server, queue)}."""

    bucket_ms: int
    flow: dict[tuple[str, str], pd.DataFrame]
    backlog: dict[tuple[str, str], pd.DataFrame]
    sizes: dict[tuple[str, str], pd.DataFrame]


def bucket_width(first_ms: int | None, last_ms: int | None) -> int:
    """Return a whole number of minutes so that the span fits in L{MAX_POINTS} buckets."""
    if first_ms is None or last_ms is None:
        return MINUTE_MS
    minutes = (last_ms - first_ms) // MINUTE_MS + 1
    return MINUTE_MS * max(1, math.ceil(minutes / MAX_POINTS))


def report_data(spark: SparkSession, events: DataFrame, backlog_path: str,
                flow: pd.DataFrame) -> ReportData:
    """Gather the chart series for the busiest queues."""
    from pyspark.sql import functions as sf

    if len(flow) == 0:
        return ReportData(MINUTE_MS, {}, {}, {})
    busiest = (flow.groupby(["server", "queue"])["records"].sum()
               .sort_values(ascending=False).head(MAX_CHARTED_QUEUES).index.tolist())
    width = bucket_width(int(flow["minute_ms"].min()), int(flow["minute_ms"].max()))
    f = flow.assign(bucket=flow["minute_ms"] // width * width)
    flow_series = {}
    for key in busiest:
        g = f[(f["server"] == key[0]) & (f["queue"] == key[1])]
        flow_series[key] = (g.groupby("bucket")[["enqueued", "dequeued"]].sum()
                            .reset_index().sort_values("bucket"))
    wanted = sf.struct("server", "queue").isin(*[sf.struct(sf.lit(s), sf.lit(q))
                                                for s, q in busiest])
    bl = (spark.read.parquet(backlog_path).filter(wanted)
          .groupBy("server", "queue",
                   (sf.floor(sf.col("minute_ms") / width) * width).cast("long").alias("bucket"))
          .agg(sf.max_by("items", "minute_ms").alias("items"),
               sf.max_by("open_reads", "minute_ms").alias("open_reads"))
          .toPandas())
    sizes = (events.filter(sf.col("op").isin(*ADD_OPS) & wanted)
             .groupBy("server", "queue",
                      sf.when(sf.col("size") == 0, 0)
                      .otherwise(sf.floor(sf.log2(sf.col("size"))).cast("int") + 1).alias("bin"))
             .count().toPandas())
    return ReportData(
        width, flow_series,
        {k: bl[(bl["server"] == k[0]) & (bl["queue"] == k[1])].sort_values("bucket")
         for k in busiest},
        {k: sizes[(sizes["server"] == k[0]) & (sizes["queue"] == k[1])].sort_values("bin")
         for k in busiest})


def _fmt_time(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def _svg_open(title: str, width: int, height: int, left: int) -> list[str]:
    """The opening of a chart: the C{<svg>} element and its title."""
    return [f'<svg width="{width}" height="{height}" '
            f'role="img" aria-label="{html.escape(title)}">',
            f'<text x="{left}" y="16" font-size="13">{html.escape(title)}</text>']


def _svg_empty(parts: list[str], left: int, top: int) -> str:
    """Close a chart that has nothing to draw with a "no data" note."""
    parts.append(f'<text x="{left}" y="{top + 20}" font-size="12">no data</text></svg>')
    return "".join(parts)


def svg_lines(title: str, xs: Sequence[float], series: dict[str, Sequence[float]],
              width: int = 640, height: int = 220) -> str:
    """Return an inline SVG line chart of C{series} over time C{xs} (epoch ms)."""
    left, right, top, bottom = 60, 10, 24, 30
    pw, ph = width - left - right, height - top - bottom
    parts = _svg_open(title, width, height, left)
    if not xs:
        return _svg_empty(parts, left, top)
    x0, x1 = min(xs), max(xs)
    ymax = max([max(v) for v in series.values() if len(v)] + [1])

    def px(x: float) -> float:
        return left + (pw * (x - x0) / (x1 - x0) if x1 > x0 else pw / 2)

    def py(y: float) -> float:
        return top + ph - ph * y / ymax

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                 f'stroke="#ccc"/>')
    parts.append(f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">'
                 f'{ymax:,.0f}</text>')
    parts.append(f'<text x="{left - 4}" y="{top + ph}" font-size="10" text-anchor="end">0</text>')
    parts.append(f'<text x="{left}" y="{height - 8}" font-size="10">{_fmt_time(x0)}</text>')
    parts.append(f'<text x="{left + pw}" y="{height - 8}" font-size="10" text-anchor="end">'
                 f'{_fmt_time(x1)} UTC</text>')
    for i, (name, ys) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{points}"/>')
        parts.append(f'<text x="{left + pw - 4}" y="{top + 14 + 12 * i}" font-size="11" '
                     f'text-anchor="end" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(title: str, labels: Sequence[str], values: Sequence[float],
             width: int = 640, height: int = 200) -> str:
    """Return an inline SVG bar chart of C{values}."""
    left, top, bottom = 60, 24, 30
    pw, ph = width - left - 10, height - top - bottom
    parts = _svg_open(title, width, height, left)
    if not values:
        return _svg_empty(parts, left, top)
    vmax = max(max(values), 1)
    bw = pw / len(values)
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        h = ph * v / vmax
        x = left + i * bw
        parts.append(f'<rect x="{x + 1:.1f}" y="{top + ph - h:.1f}" width="{max(bw - 2, 1):.1f}" '
                     f'height="{h:.1f}" fill="#1f77b4"><title>{html.escape(label)}: {v:,.0f}'
                     f'</title></rect>')
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{height - 8}" font-size="9" '
                     f'text-anchor="middle">{html.escape(label)}</text>')
    parts.append(f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">'
                 f'{vmax:,.0f}</text></svg>')
    return "".join(parts)


def _size_label(b: int) -> str:
    if b == 0:
        return "0"
    lo = 1 << (b - 1)
    return f"{lo}" if lo < 1024 else f"{lo // 1024}K"


def _duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _wait(low: int | None, high: int | None) -> str:
    """Return a wait bracket such as C{1.2 s - 3.0 s}, or a dash when nothing was dequeued."""
    if low is None or high is None:
        return "-"
    return _duration(low) if low == high else f"{_duration(low)} - {_duration(high)}"


_COLUMNS = ("enqueued", "dequeued", "opened", "confirmed", "aborted", "bytes_enqueued",
            "items_left", "open_reads", "truncated_bytes", "files", "records")


def render_report(summary: dict[str, Any], data: ReportData) -> str:
    """Return the whole report as one HTML page."""
    esc = html.escape
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           "<title>kestrel-analyze report</title><style>",
           "body{font-family:sans-serif;margin:2em;color:#222}",
           "table{border-collapse:collapse;font-size:13px}",
           "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}",
           "th:first-child,td:first-child,td:nth-child(2){text-align:left}",
           ".note{background:#fff8dc;padding:.5em 1em;border-left:4px solid #e0b000}",
           "</style></head><body><h1>Kestrel journal analysis</h1>",
           f"<p class='note'><b>Estimates.</b> {esc(summary['estimates'])}</p>",
           "<h2>Inputs</h2><ul>"]
    for i in summary["inputs"]:
        out.append(f"<li>{esc(i['server'])}: <code>{esc(i['path'])}</code></li>")
    out.append("</ul><h2>Queues</h2><table><tr><th>server</th><th>queue</th>")
    out.extend(f"<th>{c}</th>" for c in _COLUMNS)
    out.append("<th>time in queue p50 (est.)</th><th>p99 (est.)</th></tr>")
    for server, queues in sorted(summary["servers"].items()):
        for queue, q in sorted(queues.items()):
            out.append(f"<tr><td>{esc(server)}</td><td>{esc(queue)}</td>")
            out.extend(f"<td>{q.get(c, 0):,}</td>" for c in _COLUMNS)
            waits = q.get("time_in_queue_ms") or {}
            for p in ("p50", "p99"):
                out.append(f"<td>{_wait(waits.get(f'lb_{p}'), waits.get(f'ub_{p}'))}</td>")
            out.append("</tr>")
    out.append("</table>")
    if summary["skipped_files"]:
        out.append(f"<p>{len(summary['skipped_files'])} file(s) skipped: ")
        out.append(", ".join(f"{esc(s['server'])}/{esc(s['file'])} ({esc(s['reason'])})"
                             for s in summary["skipped_files"][:50]))
        out.append("</p>")
    minutes = data.bucket_ms // MINUTE_MS
    out.append(f"<h2>Charts</h2><p>Per {minutes}-minute bucket; the busiest "
               f"{MAX_CHARTED_QUEUES} queues at most. Dequeue times are estimates.</p>")
    for key, flow in data.flow.items():
        server, queue = key
        out.append(f"<h3>{esc(server)} / {esc(queue)}</h3>")
        xs = flow["bucket"].tolist()
        out.append(svg_lines("flow: items per bucket", xs,
                             {"enqueued": flow["enqueued"].tolist(),
                              "dequeued (est.)": flow["dequeued"].tolist()}))
        bl = data.backlog.get(key)
        if bl is not None:
            out.append(svg_lines("backlog: items a restart would hold", bl["bucket"].tolist(),
                                 {"items": bl["items"].tolist(),
                                  "open reads": bl["open_reads"].tolist()}))
        sz = data.sizes.get(key)
        if sz is not None:
            out.append(svg_bars("item sizes (bytes, log2 buckets)",
                                [_size_label(int(b)) for b in sz["bin"]], sz["count"].tolist()))
    out.append("</body></html>")
    return "\n".join(out)
