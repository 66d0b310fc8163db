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
from typing import Any

import attrs
import pandas as pd

from kestrel.analytics.replay import MINUTE_MS

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


def charted_queues(summary: dict[str, Any], flow: pd.DataFrame) -> list[tuple[str, str]]:
    """
    Return the queues to chart: the busiest by traffic, then stuck quiet ones.

    A stuck queue holds items (state) whose oldest is the oldest among the
    queues; quiet ones are charted even with little traffic, as they are the
    ones an operator must look at. At most L{MAX_CHARTED_QUEUES} in all.
    """
    busy = []
    if len(flow):
        busy = (flow.groupby(["server", "queue"])["records"].sum()
                .sort_values(ascending=False, kind="stable").index.tolist())
    stuck = sorted(((s, q) for s, qs in summary["servers"].items() for q, v in qs.items()
                    if v["state"] and v["state"]["items_left"] > 0),
                   key=lambda k: (-(summary["servers"][k[0]][k[1]]["state"]
                                    ["oldest_item_age_ms"] or 0), k))
    half = MAX_CHARTED_QUEUES // 2
    chosen = [tuple(k) for k in busy[:half]]
    for k in stuck:
        if len(chosen) >= MAX_CHARTED_QUEUES - 2:
            break
        if k not in chosen:
            chosen.append(k)
    for k in busy:
        if len(chosen) >= MAX_CHARTED_QUEUES:
            break
        if tuple(k) not in chosen:
            chosen.append(tuple(k))
    return chosen


def report_data(summary: dict[str, Any], flow: pd.DataFrame, backlog: pd.DataFrame,
                sizes: pd.DataFrame) -> ReportData:
    """Gather the chart series (pandas in, pandas out) for L{charted_queues}."""
    chosen = charted_queues(summary, flow)
    if not chosen:
        return ReportData(MINUTE_MS, {}, {}, {})
    times = [int(x) for x in (flow["minute_ms"].dropna().tolist()
                              + backlog["minute_ms"].dropna().tolist())]
    width = bucket_width(min(times), max(times)) if times else MINUTE_MS
    f = flow.dropna(subset=["minute_ms"])
    f = f.assign(bucket=f["minute_ms"].astype("int64") // width * width)
    b = backlog.assign(bucket=backlog["minute_ms"].astype("int64") // width * width)
    b = b.sort_values("minute_ms", kind="stable")
    out_flow, out_backlog, out_sizes = {}, {}, {}
    for key in chosen:
        g = f[(f["server"] == key[0]) & (f["queue"] == key[1])]
        out_flow[key] = (g.groupby("bucket")[["enqueued", "dequeued", "confirmed"]].sum()
                         .astype("int64")
                         .reset_index().sort_values("bucket"))
        bg = b[(b["server"] == key[0]) & (b["queue"] == key[1])]
        out_backlog[key] = (bg.groupby("bucket")[["items", "open_reads"]].last()
                            .astype("int64").reset_index().sort_values("bucket"))
        sg = sizes[(sizes["server"] == key[0]) & (sizes["queue"] == key[1])]
        out_sizes[key] = sg.sort_values("bin")
    return ReportData(width, out_flow, out_backlog, out_sizes)


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


def _ticks(vmax: float) -> list[float]:
    """Return 0, the middle and the top of a value axis."""
    return [0.0, vmax / 2, float(vmax)]


#: Time-axis steps to choose from (ms): the smallest giving at most L{MAX_TICKS} ticks.
_TIME_STEPS = [m * MINUTE_MS for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440,
                                       2880, 10080, 20160, 40320)]
MAX_TICKS = 7


def time_ticks(x0: float, x1: float) -> list[tuple[float, str]]:
    """
    Return C{(ms, label)} ticks on whole steps between C{x0} and C{x1}, labels all distinct.

    The step is the smallest of 1, 2, 5, 10, 15, 30 minutes, 1, 2, 3, 6, 12
    hours, 1, 2, 7, 14, 28 days giving at most L{MAX_TICKS} ticks; labels
    are C{HH:MM}, with the date (C{MM-DD}) on the first tick and on each
    tick of a new day, and the date alone for steps of a day or more.
    """
    step = next((s for s in _TIME_STEPS if (x1 - x0) / s <= MAX_TICKS - 1), _TIME_STEPS[-1])
    first = math.ceil(x0 / step) * step
    ticks: list[tuple[float, str]] = []
    day = None
    t = first
    while t <= x1:
        when = datetime.fromtimestamp(t / 1000, UTC)
        if step >= 1440 * MINUTE_MS:
            label = when.strftime("%m-%d")
        elif when.date() != day:
            label = when.strftime("%m-%d %H:%M")
        else:
            label = when.strftime("%H:%M")
        day = when.date()
        ticks.append((t, label))
        t += step
    return ticks


def svg_steps(title: str, starts: Sequence[float], width_ms: int,
              series: dict[str, Sequence[float]], y_label: str = "items",
              window: tuple[float | None, float | None] = (None, None),
              width: int = 640, height: int = 230) -> str:
    """
    Return an inline SVG chart of C{series}, one flat step per time bucket.

    Bucket C{i} spans C{[starts[i], starts[i] + width_ms)}. A bucket only
    partly inside C{window} (the data's first and last time) is drawn dashed
    and marked "partial", so that the last minutes of a short run do not read
    as a drop. Axes: the values with C{y_label} and three values; the time
    with whole-step ticks (L{time_ticks}).
    """
    left, right, top, bottom = 70, 10, 24, 40
    pw, ph = width - left - right, height - top - bottom
    parts = _svg_open(title, width, height, left)
    if not starts:
        return _svg_empty(parts, left, top)
    x0, x1 = min(starts), max(starts) + width_ms
    ymax = max([max(v) for v in series.values() if len(v)] + [1])

    def px(x: float) -> float:
        return left + pw * (x - x0) / (x1 - x0)

    def py(y: float) -> float:
        return top + ph - ph * y / ymax

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                 f'stroke="#ccc"/>')
    for v in _ticks(ymax):
        parts.append(f'<line x1="{left - 3}" x2="{left}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                     f'stroke="#888"/><text x="{left - 5}" y="{py(v) + 3:.1f}" font-size="10" '
                     f'text-anchor="end">{v:,.0f}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.0f}" font-size="10" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + ph / 2:.0f})">{html.escape(y_label)}</text>')
    for t, label in time_ticks(x0, x1):
        # labels near an edge are anchored inside the chart
        anchor = ("start" if px(t) - left < 40 else "end" if left + pw - px(t) < 40
                  else "middle")
        parts.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top + ph}" '
                     f'y2="{top + ph + 3}" stroke="#888"/><text x="{px(t):.1f}" '
                     f'y="{top + ph + 14}" font-size="10" text-anchor="{anchor}">'
                     f'{html.escape(label)}</text>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" font-size="10" '
                 f'text-anchor="middle">time (UTC)</text>')
    lo, hi = window
    partial = [(lo is not None and s < lo) or (hi is not None and s + width_ms > hi + 1)
               for s in starts]
    for i, ys in enumerate(series.values()):
        color = _COLORS[i % len(_COLORS)]
        whole = []
        for s, y, part in zip(starts, ys, partial, strict=True):
            a, b, yy = px(s), px(s + width_ms), py(y)
            if part:
                parts.append(f'<line x1="{a:.1f}" x2="{b:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" '
                             f'stroke="{color}" stroke-width="1.5" stroke-dasharray="4 3"/>')
            else:
                whole.append(f"{a:.1f},{yy:.1f} {b:.1f},{yy:.1f}")
        if whole:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(whole)}"/>')
    # the legend sits in the title row, right-aligned, clear of the lines
    x = left + pw
    for i, name in reversed(list(enumerate(series))):
        color = _COLORS[i % len(_COLORS)]
        parts.append(f'<text x="{x}" y="16" font-size="11" text-anchor="end" '
                     f'fill="{color}">{html.escape(name)}</text>')
        x -= 7 * len(name) + 14
    for s, part in zip(starts, partial, strict=True):
        if part:
            parts.append(f'<text x="{(px(s) + px(s + width_ms)) / 2:.1f}" y="{top + 10}" '
                         f'font-size="9" text-anchor="middle" fill="#888">partial</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(title: str, labels: Sequence[str], values: Sequence[float],
             width: int = 640, height: int = 210, x_label: str = "item size (bytes)",
             y_label: str = "items") -> str:
    """Return an inline SVG bar chart of C{values}, both axes labelled with values."""
    left, top, bottom = 70, 24, 40
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
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{top + ph + 12}" font-size="9" '
                     f'text-anchor="middle">{html.escape(label)}</text>')
    for v in _ticks(vmax):
        y = top + ph - ph * v / vmax
        parts.append(f'<text x="{left - 5}" y="{y + 3:.1f}" font-size="10" '
                     f'text-anchor="end">{v:,.0f}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.0f}" font-size="10" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + ph / 2:.0f})">{html.escape(y_label)}</text>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" font-size="10" '
                 f'text-anchor="middle">{html.escape(x_label)}</text></svg>')
    return "".join(parts)


def _bytes(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n}"


def size_label(b: int) -> str:
    """Return the range of log2 size bucket C{b}: sizes from C{2**(b-1)} to C{2**b - 1}."""
    if b == 0:
        return "0"
    lo = 1 << (b - 1)
    return f"{lo}" if lo == 1 else f"{_bytes(lo)}-{_bytes(2 * lo)}"


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


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def _span(first: int, last: int) -> str:
    """A time window; the end shows only the time when it is the same day, and times
    show seconds when the window is under an hour."""
    if last - first < 3_600_000:
        a, b = (datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
                for t in (first, last))
    else:
        a, b = _fmt_time(first), _fmt_time(last)
    return f"{a} - {b[11:] if a[:10] == b[:10] else b}"


def _window(t: dict[str, Any]) -> str:
    if t["from_ms"] is None:
        return "no traffic"
    text = _span(t["from_ms"], t["to_ms"])
    if t["history_compacted"]:
        text += "<br><b class='warn'>(history before compacted)</b>"
    return text


def _age(state: dict[str, Any] | None) -> str:
    if not state or state["oldest_item_age_ms"] is None:
        return "-"
    return _duration(int(state["oldest_item_age_ms"]))


def render_report(summary: dict[str, Any], data: ReportData) -> str:
    """Return the whole report as one HTML page (no script, no external URL)."""
    esc = html.escape
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           "<title>kestrel-analyze report</title><style>",
           "body{font-family:sans-serif;margin:2em;color:#222}",
           "table{border-collapse:collapse;font-size:12px;margin-bottom:1em}",
           "td,th{border:1px solid #ccc;padding:3px 4px;text-align:right}",
           "td{white-space:nowrap}",
           "th{background:#f3f3f3}",
           "td.l,th.l{text-align:left}",
           ".note{background:#fff8dc;padding:.5em 1em;border-left:4px solid #e0b000}",
           ".warn{color:#b00}",
           "</style></head><body><h1>Kestrel journal analysis</h1>",
           f"<p class='note'><b>Traffic and state.</b> {esc(summary['definitions'])}</p>",
           f"<p class='note'><b>Estimates.</b> {esc(summary['estimates'])}</p>",
           "<h2>Inputs</h2><ul>"]
    for i in summary["inputs"]:
        out.append(f"<li>{esc(i['server'])} ({esc(i['role'])}): <code>{esc(i['path'])}</code></li>")
    out.append("</ul><h2>Servers</h2><table><tr><th class='l'>server</th><th>files</th>"
               "<th>records</th><th>traffic: enqueued</th><th>dequeued</th><th>opened</th>"
               "<th>confirmed</th><th>aborted</th><th class='l'>traffic window (UTC)</th>"
               "<th>state: items left</th><th>open reads</th><th>bytes left</th>"
               "<th>broken files</th></tr>")
    for server, t in sorted(summary["server_totals"].items()):
        tr, st = t["traffic"], t["state"]
        window = _span(tr["from_ms"], tr["to_ms"]) if tr["from_ms"] is not None else "no traffic"
        if tr["queues_compacted"]:
            window += f" <b class='warn'>({tr['queues_compacted']} queue(s) compacted)</b>"
        out.append(f"<tr><td class='l'>{esc(server)}</td><td>{t['files']:,}</td>"
                   f"<td>{t['records']:,}</td><td>{tr['enqueued']:,}</td>"
                   f"<td>{tr['dequeued']:,}</td><td>{tr['opened']:,}</td>"
                   f"<td>{tr['confirmed']:,}</td><td>{tr['aborted']:,}</td>"
                   f"<td class='l'>{window}</td>"
                   f"<td>{st['items_left']:,}</td><td>{st['open_reads']:,}</td>"
                   f"<td>{st['bytes_left']:,}</td><td>{t['broken_files']:,}</td></tr>")
    out.append("</table>")
    out.append("<h2>Queues</h2><table><tr><th class='l'>server</th><th class='l'>queue</th>"
               "<th class='l'>traffic window (UTC)</th><th>enqueued</th><th>dequeued</th>"
               "<th>opened</th><th>confirmed</th><th>aborted</th><th>bytes enqueued</th>"
               "<th>items left</th><th>open reads</th><th>bytes left</th>"
               "<th>oldest item left, age</th><th>time in queue p50 (est.)</th>"
               "<th>p99 (est.)</th><th>with expiry</th><th>expired when removed</th>"
               "<th>left, already expired</th><th>truncated bytes</th></tr>")
    for server, queues in sorted(summary["servers"].items()):
        for queue, q in sorted(queues.items()):
            t, st, ex = q["traffic"], q["state"], q.get("expiry") or {}
            waits = q.get("time_in_queue_ms") or {}
            out.append(f"<tr><td class='l'>{esc(server)}</td><td class='l'>{esc(queue)}</td>"
                       f"<td class='l'>{_window(t)}</td>")
            out.extend(f"<td>{t[k]:,}</td>" for k in ("enqueued", "dequeued", "opened",
                                                       "confirmed", "aborted", "bytes_enqueued"))
            for k in ("items_left", "open_reads", "bytes_left"):
                out.append(f"<td>{_n(st[k]) if st else '- (archive)'}</td>")
            out.append(f"<td>{_age(st)}</td>")
            for p in ("p50", "p99"):
                out.append(f"<td>{_wait(waits.get(f'lb_{p}'), waits.get(f'ub_{p}'))}</td>")
            for k in ("with_expiry", "expired_removed", "left_expired"):
                out.append(f"<td>{_n(ex.get(k))}</td>")
            out.append(f"<td>{q['truncated_bytes']:,}</td></tr>")
    out.append("</table>")
    if summary["broken_files"]:
        out.append(f"<h2 class='warn'>{len(summary['broken_files'])} file(s) with broken "
                   "records</h2><table><tr><th class='l'>server</th><th class='l'>file</th>"
                   "<th class='l'>problem</th><th>clean end</th><th>bytes cut</th></tr>")
        for b in summary["broken_files"]:
            out.append(f"<tr><td class='l'>{esc(b['server'])}</td><td class='l'>"
                       f"<code>{esc(b['path'])}</code></td><td class='l'>{esc(b['problem'])}"
                       f"</td><td>{b['clean_end']:,}</td><td>{b['truncated_bytes']:,}</td></tr>")
        out.append("</table>")
    if summary["skipped_files"]:
        out.append(f"<p>{len(summary['skipped_files'])} file(s) skipped: ")
        out.append(", ".join(f"{esc(s['server'])}/{esc(s['file'])} ({esc(s['reason'])})"
                             for s in summary["skipped_files"][:50]))
        out.append("</p>")
    minutes = data.bucket_ms // MINUTE_MS
    out.append(f"<h2>Charts</h2><p>Per {minutes}-minute bucket, for the busiest queues and "
               "the queues holding the oldest items (at most "
               f"{MAX_CHARTED_QUEUES}). Flow is client traffic; dequeue times are "
               "estimates. A dashed bucket, marked partial, is only partly inside the "
               "queue's traffic window (a run's first or last minutes).</p>")
    for key, flow in data.flow.items():
        server, queue = key
        q = summary["servers"].get(server, {}).get(queue)
        extra = f" (oldest item left: {_age(q['state'])})" if q and q["state"] else ""
        out.append(f"<h3>{esc(server)} / {esc(queue)}{esc(extra)}</h3>")
        traffic = q["traffic"] if q else {"from_ms": None, "to_ms": None}
        span = (traffic["from_ms"], traffic["to_ms"])
        out.append(svg_steps(f"traffic: items per {minutes}-minute bucket",
                             flow["bucket"].tolist(), data.bucket_ms,
                             {"enqueued": flow["enqueued"].tolist(),
                              "dequeued (est.)": flow["dequeued"].tolist(),
                              "confirmed": flow["confirmed"].tolist()},
                             y_label=f"items / {minutes} min", window=span))
        bl = data.backlog.get(key)
        if bl is not None:
            out.append(svg_steps("state: items a restart would hold, at each bucket's end",
                                 bl["bucket"].tolist(), data.bucket_ms,
                                 {"items": bl["items"].tolist(),
                                  "open reads": bl["open_reads"].tolist()},
                                 y_label="items held", window=span))
        sz = data.sizes.get(key)
        if sz is not None:
            out.append(svg_bars("sizes of items clients added (log2 buckets)",
                                [size_label(int(b)) for b in sz["bin"]], sz["count"].tolist(),
                                x_label="item size, bytes (a-b: from a up to, not "
                                        "including, b; K = 1024)"))
    out.append("</body></html>")
    return "\n".join(out)
