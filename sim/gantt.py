"""Gantt chart of a Timeline as a standalone, offline plotly HTML file.

Units: the x axis is seconds since the iteration's first span (linear, not datetime);
the memory curve is in GB (1e9 bytes); hover text formats times as s/ms/µs/ns and bytes
in decimal units (kB, MB, GB).

Rows are (rank, lane) pairs, rank 0 on top, lanes in the order compute, send, recv, then
the parallel axes; a lane appears only if some span uses it. A row of a simulated run is
named by its GPU (sim.rank_gpus: `rank 3 · gpu192 +63 · compute` is pipeline rank 3,
replayed on gpu192, standing for 63 more GPUs). One legend entry per op kind. The memory
panel draws each rank's curve and, where the plan knows it, the device's memory as a line.

Large timelines. Measured 2026-11-22 on the 2-core dev machine, 8 ranks, headless
Chromium with software WebGL; "paint" = page load to first frame, "zoom" = one relayout:
    spans  build+write  HTML (bars|segs)  paint (bars|segs)  zoom (bars|segs)
    1k     0.35 s        5.2 |  5.2 MB    1.4 | 2.1 s        0.11 | 0.03 s
    5k     0.4 s         6.5 |  6.8 MB    2.4 | 3.0 s        0.24 | 0.07 s
    10k    0.45 s        8.2 |  8.8 MB    2.7 | 3.8 s        0.48 | 0.06 s
    50k    1.4 s        21.5 | 24.3 MB    9.7 | 7.9 s        4.5  | 2.1 s
(4.8 MB of each file is plotly.js.) Building is cheap; the browser is the limit: SVG bars
cost one DOM node per span, so every pan/zoom re-lays out all of them. So a Timeline of
more than `AGGREGATE_BUDGET` spans is drawn aggregated (sim.span_groups): consecutive spans
of a row too thin to see merge into one hatched bar, its opacity the fraction of it the
ops keep busy, its hover the ops it holds; the finest resolution that keeps at most
`AGGREGATE_BUDGET` bars is chosen, and the Perfetto trace (sim.trace) keeps every op.
Without aggregation (`budget=None`) and above `LARGE_TIMELINE_SPANS` bars, each kind
becomes one `go.Scattergl` polyline of thick segments (start, end, gap) plus invisible
markers at span middles that carry the hover text once per span. The memory curve stays
one SVG path per rank, which is cheap at any length.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from clustersim.schedules.output_files import write_text_atomic
from clustersim.schedules.timeline import Span, Timeline

from .gantt_hover import group_hover, hover_text
from .gantt_legend import PAIRED, colour_of, legend_key, legend_order
from .memory_plot import add_memory
from .rank_gpus import RankGpus, rank_gpus
from .span_groups import SpanGroup, aggregate
from .trace import LANE_ORDER
from .units import format_seconds

__all__ = ["PAIRED", "gantt_figure", "gantt_rows", "hover_text", "write_gantt",
           "write_gantt_comparison"]

LARGE_TIMELINE_SPANS = 5000  # above this many bars, WebGL segments instead of SVG bars
AGGREGATE_BUDGET = 4000  # above this many spans, aggregate to at most this many bars
LABELLED_BARS_LIMIT = 400  # op text inside bars only when bars are few enough to read
ROW_PX = 26  # pixel height of one (rank, lane) row
PLOT_CONFIG = {"displaylogo": False, "scrollZoom": True}  # plotly.js options of every page
MIN_OPACITY = 0.12  # of a bar of merged spans that keep it almost idle, so it still shows
MEMORY_PX = 220  # pixel height of the memory panel

def gantt_rows(timeline: Timeline) -> list[tuple[int, str]]:
    """The (rank, lane) rows in display order: by rank, then compute/send/recv/axes."""
    def lane_key(lane: str) -> tuple[int, str]:
        return (LANE_ORDER.index(lane) if lane in LANE_ORDER else len(LANE_ORDER), lane)

    pairs = {(s.rank, s.lane) for s in timeline.spans}
    return sorted(pairs, key=lambda p: (p[0], lane_key(p[1])))


def describe(timeline: Timeline, label: str | None = None) -> str:
    """One-line title: schedule name, iteration time, mean bubble fraction, and where
    known the throughput (tokens/s per GPU, MFU: sim.throughput)."""
    name = label or timeline.meta.get("plan", {}).get("schedule") or "timeline"
    figures = timeline.meta.get("throughput")
    rate = ""
    if figures:
        mfu = f", MFU {figures['mfu']:.1%}" if figures["mfu"] is not None else ""
        rate = f", {figures['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU{mfu}"
    return (f"{name} — iteration {format_seconds(timeline.iteration_time)}, "
            f"bubble {timeline.bubble_fraction:.1%}{rate} ({timeline.source})")


def _bars_by_key(timeline: Timeline, extent: float, budget: int | None
                 ) -> tuple[dict[str, tuple[list[Span], list[SpanGroup]]], float]:
    """Per legend entry, the spans drawn alone and the groups drawn as one bar each (under
    the kind with the most op time); and the resolution (s) of the grouping, 0 if none."""
    singles: dict[str, list[Span]] = defaultdict(list)
    groups: dict[str, list[SpanGroup]] = defaultdict(list)
    aggregated, resolution = aggregate(timeline.spans, extent, budget)
    for group in aggregated:
        if len(group.spans) == 1:
            singles[legend_key(group.spans[0])].append(group.spans[0])
        else:
            groups[next(iter(group.op_time(legend_key)))].append(group)
    return ({k: (singles[k], groups[k]) for k in sorted({*singles, *groups}, key=legend_order)},
            resolution)


def _draw(fig: go.Figure, row: int, key: str, bars: dict[str, Any], segments: bool,
          shown: set[str]) -> None:
    """One trace of bars (`bars`: start, end, y, hover, and for merged spans `ops` and
    `opacity`): SVG bars, or WebGL segments with hover markers."""
    colour = colour_of(key)
    common = dict(name=key, legendgroup=key, showlegend=key not in shown, hoverinfo="text",
                  hoverlabel=dict(namelength=0))
    shown.add(key)
    start, end, y = bars["start"], bars["end"], bars["y"]
    merged = "ops" in bars
    if segments:
        # One polyline per trace, (start, end, gap) per bar; hover text lives once per bar
        # on an invisible marker at its middle, which keeps the file small.
        gap = np.full_like(start, np.nan)
        fig.add_trace(go.Scattergl(
            x=np.column_stack([start, end, gap]).ravel(),
            y=np.column_stack([y, y, gap]).ravel(), mode="lines", connectgaps=False,
            line=dict(color=colour, width=ROW_PX * 0.7), **{**common, "hoverinfo": "skip"}),
            row=row, col=1)
        fig.add_trace(go.Scattergl(
            x=(start + end) / 2, y=y, mode="markers", hovertext=bars["hover"],
            showlegend=False, marker=dict(color=colour, opacity=0, size=ROW_PX * 0.7),
            name=key, legendgroup=key, hoverinfo="text", hoverlabel=dict(namelength=0),
            customdata=bars.get("ops")), row=row, col=1)
        return
    marker: dict[str, Any] = dict(color=colour, line=dict(width=0.5, color="white"))
    if merged:  # hatched; as opaque as its ops keep it busy (a pixel's mean colour)
        marker.update(opacity=bars["opacity"], pattern=dict(shape="/", fgcolor="white",
                                                            size=6, solidity=0.25))
    text = bars.get("text")
    fig.add_trace(go.Bar(
        y=y, x=end - start, base=start, orientation="h", width=0.8, marker=marker,
        hovertext=bars["hover"], text=text, customdata=bars.get("ops"),
        textposition="inside" if text else "none", insidetextanchor="middle",
        meta={"merged": merged}, **common), row=row, col=1)


def _row_label(rank: int, lane: str, gpus: dict[int, RankGpus]) -> str:
    return f"{gpus[rank].label if rank in gpus else f'rank {rank}'} · {lane}"


def _add_spans(fig: go.Figure, timeline: Timeline, row: int, shown: set[str],
               budget: int | None) -> dict[str, Any]:
    """Draw the spans of `timeline` in subplot `row`; returns what was drawn: spans, bars,
    the grouping's resolution (s) and whether as WebGL segments."""
    rows = gantt_rows(timeline)
    index = {p: i for i, p in enumerate(rows)}
    gpus = rank_gpus(timeline.meta.get("plan"))
    origin = timeline.start_time
    extent = max((s.end for s in timeline.spans), default=origin) - origin  # x range (s)
    layers, resolution = _bars_by_key(timeline, extent, budget)
    drawn = sum(len(a) + len(b) for a, b in layers.values())
    segments = drawn > LARGE_TIMELINE_SPANS
    labelled = len(timeline.spans) <= LABELLED_BARS_LIMIT
    for key, (spans, groups) in layers.items():
        if spans:
            _draw(fig, row, key, {
                "start": np.fromiter((s.start for s in spans), float, len(spans)) - origin,
                "end": np.fromiter((s.end for s in spans), float, len(spans)) - origin,
                "y": np.fromiter((index[(s.rank, s.lane)] for s in spans), float, len(spans)),
                "hover": [hover_text(s, origin, gpus.get(s.rank)) for s in spans],
                "text": [str(s.op) for s in spans] if labelled else None}, segments, shown)
        if groups:
            busy = np.array([g.busy for g in groups])
            start = np.array([g.start for g in groups]) - origin
            end = np.array([g.end for g in groups]) - origin
            _draw(fig, row, key, {
                "start": start, "end": end,
                "y": np.array([index[(g.rank, g.lane)] for g in groups], float),
                "hover": [group_hover(g, origin, gpus.get(g.rank)) for g in groups],
                "ops": np.array([len(g.spans) for g in groups]),
                "opacity": np.clip(busy / np.maximum(end - start, 1e-30), MIN_OPACITY, 1)},
                segments, shown)
    _shade_alternate_ranks(fig, rows, row)
    if timeline.window:  # an asynchronous schedule: the batches before and after it too
        fig.add_vrect(x0=0, x1=timeline.iteration_time, fillcolor="#FFF1C2", opacity=0.6,
                      line_width=0, layer="below", annotation_text="steady-state iteration",
                      annotation_position="top left", row=row, col=1)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))),
                     ticktext=[_row_label(r, lane, gpus) for r, lane in rows], automargin=True,
                     range=[len(rows) - 0.5, -0.5], showgrid=False, zeroline=False,
                     row=row, col=1)  # rank 0 on top
    return {"spans": len(timeline.spans), "bars": drawn, "resolution_s": resolution,
            "extent_s": extent, "segments": segments}


def _shade_alternate_ranks(fig: go.Figure, rows: list[tuple[int, str]], row: int) -> None:
    """Grey band behind every other rank's rows, so a rank's lanes read as one block (the
    shapes `fig.add_hrect` draws, added at once: plotly checks every shape on each add)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (rank, _) in enumerate(rows):
        first.setdefault(rank, i)
        last[rank] = i
    axes = fig.get_subplot(row, 1)
    x, y = (axis.plotly_name.replace("axis", "") for axis in (axes.xaxis, axes.yaxis))
    bands = [dict(type="rect", xref=f"{x} domain", x0=0, x1=1, yref=y, y0=first[rank] - 0.5,
                  y1=last[rank] + 0.5, fillcolor="#EEF0F4", line=dict(width=0), layer="below")
             for n, rank in enumerate(first) if n % 2]
    fig.update_layout(shapes=[*fig.layout.shapes, *bands])


def _style(fig: go.Figure, nrows: int, height: int, title: str,
           drawn: list[dict[str, Any]]) -> go.Figure:
    segments = any(d["segments"] for d in drawn)
    fig.update_layout(
        title=dict(text=title, x=0.01), height=height, barmode="overlay", bargap=0,
        template="plotly_white", hovermode="closest", legend=dict(traceorder="grouped"),
        margin=dict(l=130, r=30, t=70, b=50), uniformtext=dict(minsize=8, mode="hide"),
        meta={"representation": "segments" if segments else "bars", "drawn": drawn},
    )
    fig.update_xaxes(showgrid=True, gridcolor="#E5E5E5")
    fig.update_xaxes(tickformat="~s", ticksuffix="s")  # SI prefixes: 0.005 reads as 5ms
    fig.update_xaxes(title_text="time since iteration start", row=nrows, col=1)
    return fig


GANTT_TITLE = "spans: one row per rank and lane, colour by op kind (x: seconds)"
MEMORY_TITLE = "memory per rank (GB = 1e9 bytes)"


def gantt_figure(timeline: Timeline, title: str | None = None,
                 budget: int | None = AGGREGATE_BUDGET) -> go.Figure:
    """One row per (rank, lane), colour by op kind; memory per rank underneath if sampled.
    Above `budget` spans, thin spans are drawn merged (module docstring; None: never)."""
    gantt_px = max(200, ROW_PX * len(gantt_rows(timeline)))
    has_memory = bool(timeline.memory)
    height = gantt_px + (MEMORY_PX + 60 if has_memory else 0) + 140
    if has_memory:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=60 / height,
                            row_heights=[gantt_px, MEMORY_PX],
                            subplot_titles=[GANTT_TITLE, MEMORY_TITLE])
    else:
        fig = make_subplots(rows=1, cols=1, subplot_titles=[GANTT_TITLE])
    drawn = _add_spans(fig, timeline, 1, set(), budget)
    if has_memory:
        add_memory(fig, timeline, 2)
    return _style(fig, 2 if has_memory else 1, height, title or describe(timeline), [drawn])


def comparison_figure(items: Sequence[tuple[str, Timeline]]) -> go.Figure:
    """Several labelled Gantt charts stacked vertically on one shared x axis."""
    if not items:
        raise ValueError("comparison needs at least one (label, timeline) pair")
    heights = [max(120, ROW_PX * len(gantt_rows(t))) for _, t in items]
    fig = make_subplots(rows=len(items), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=heights,
                        subplot_titles=[describe(t, label) for label, t in items])
    shown: set[str] = set()
    drawn = [_add_spans(fig, timeline, i, shown, AGGREGATE_BUDGET)
             for i, (_, timeline) in enumerate(items, start=1)]
    fig.update_xaxes(showticklabels=True)
    height = sum(heights) + 90 * len(items) + 80
    return _style(fig, len(items), height, "schedule comparison", drawn)


def count_bars(fig: go.Figure) -> int:
    """Bars drawn as SVG bars (0 when the figure uses WebGL segments)."""
    return sum(len(t.x) for t in fig.data if t.type == "bar")


def count_ops(fig: go.Figure) -> int:
    """Ops the Gantt bars hold: one per plain bar, `customdata` per bar of merged spans."""
    return sum(int(np.sum(t.customdata)) if t.customdata is not None else len(t.x)
               for t in fig.data if t.type == "bar")


def _write(fig: go.Figure, path: str | Path) -> Path:
    return write_text_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True,
                                               config=PLOT_CONFIG))


def write_gantt(timeline: Timeline, path: str | Path, title: str | None = None) -> Path:
    """Write the Gantt chart as one standalone HTML file (plotly.js inlined, works offline)."""
    return _write(gantt_figure(timeline, title), path)


def write_gantt_comparison(items: Sequence[tuple[str, Timeline]], path: str | Path) -> Path:
    """Write several labelled Gantt charts, stacked on one x scale, to one HTML file."""
    return _write(comparison_figure(items), path)
