"""Gantt chart of a Timeline as a standalone, offline plotly HTML file.

Units: the x axis is seconds since the iteration's first span (linear, not datetime);
the memory curve is in GB (1e9 bytes); hover text formats times as s/ms/µs/ns and bytes
in decimal units (kB, MB, GB).

Rows are (rank, lane) pairs, rank 0 on top, lanes in the order compute, send, recv, then
the parallel axes; a lane appears only if some span uses it. One trace per op kind, so
the legend is the list of kinds.

Large timelines. Measured 2026-11-22 on the 2-core dev machine, 8 ranks, headless
Chromium with software WebGL; "paint" = page load to first frame, "zoom" = one relayout:
    spans  build+write  HTML (bars|segs)  paint (bars|segs)  zoom (bars|segs)
    1k     0.35 s        5.2 |  5.2 MB    1.4 | 2.1 s        0.11 | 0.03 s
    5k     0.4 s         6.5 |  6.8 MB    2.4 | 3.0 s        0.24 | 0.07 s
    10k    0.45 s        8.2 |  8.8 MB    2.7 | 3.8 s        0.48 | 0.06 s
    50k    1.4 s        21.5 | 24.3 MB    9.7 | 7.9 s        4.5  | 2.1 s
(4.8 MB of each file is plotly.js.) Building is cheap; the browser is the limit: SVG bars
cost one DOM node per span, so every pan/zoom re-lays out all of them. Above
`LARGE_TIMELINE_SPANS` each kind becomes one `go.Scattergl` polyline of thick segments
(start, end, gap) plus invisible markers at span middles that carry the hover text once
per span. The memory curve stays one SVG path per rank, which is cheap at any length.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from clustersim.schedules.ops import OpKind
from clustersim.schedules.output_files import write_text_atomic
from clustersim.schedules.timeline import Span, Timeline

from .trace import LANE_ORDER
from .units import format_bytes, format_seconds

LARGE_TIMELINE_SPANS = 5000  # above this, spans are WebGL segments instead of SVG bars
LABELLED_BARS_LIMIT = 400  # op text inside bars only when bars are few enough to read
ROW_PX = 26  # pixel height of one (rank, lane) row
MEMORY_PX = 220  # pixel height of the memory panel

KIND_COLOURS: dict[OpKind, str] = {
    OpKind.F: "#4C78A8",  # forward: blue
    OpKind.B: "#54A24B",  # full backward: green
    OpKind.I: "#F58518",  # input-grad backward: orange
    OpKind.W: "#72B7B2",  # weight-grad backward: teal
    OpKind.OPT_STEP: "#E45756",  # optimizer: red
    OpKind.SEND_F: "#8C8C8C",  # point-to-point: greys
    OpKind.RECV_F: "#BDBDBD",
    OpKind.SEND_B: "#6E6E6E",
    OpKind.RECV_B: "#A9A9A9",
    OpKind.ALL_REDUCE: "#7B4EA3",  # collectives: purples
    OpKind.ALL_GATHER: "#A87BC9",
    OpKind.REDUCE_SCATTER: "#9467BD",
    OpKind.ALL_TO_ALL: "#C5B0D5",
    OpKind.BROADCAST: "#5E3C99",
    OpKind.REDUCE: "#3F007D",
    OpKind.COPY_D2H: "#B279A2",  # host copies over PCIe: pinks
    OpKind.COPY_H2D: "#D6A5C9",
}
MEMORY_COLOURS = ("#1F77B4", "#D62728", "#2CA02C", "#FF7F0E", "#9467BD", "#8C564B",
                  "#E377C2", "#7F7F7F", "#BCBD22", "#17BECF")


def gantt_rows(timeline: Timeline) -> list[tuple[int, str]]:
    """The (rank, lane) rows in display order: by rank, then compute/send/recv/axes."""
    def lane_key(lane: str) -> tuple[int, str]:
        return (LANE_ORDER.index(lane) if lane in LANE_ORDER else len(LANE_ORDER), lane)

    pairs = {(s.rank, s.lane) for s in timeline.spans}
    return sorted(pairs, key=lambda p: (p[0], lane_key(p[1])))


def hover_text(span: Span, origin: float = 0.0) -> str:
    op = span.op
    lines = [f"<b>{op}</b> · rank {span.rank} · {span.lane}",
             f"stage {op.stage}" + ("" if op.microbatch is None else f" · microbatch {op.microbatch}"),
             f"{format_seconds(span.start - origin)} → {format_seconds(span.end - origin)}"
             f" (duration {format_seconds(span.duration)})"]
    if op.nbytes:
        lines.append(f"bytes: {format_bytes(op.nbytes)}")
    if op.flops:
        lines.append(f"flops: {op.flops:.3g}")
    if op.group:
        lines.append(f"group: {op.group}")
    if op.count != 1:
        lines.append(f"collectives: {op.count} back-to-back")
    if op.overlapped:
        lines.append("one op of an overlapped F&B pair (DualPipe; run F then B)")
    for key, value in (span.info or {}).items():
        lines.append(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    return "<br>".join(lines)


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


PAIRED = {OpKind.F: "F of F&B", OpKind.B: "B of F&B"}
"""Legend entries of the two ops of an overlapped pair (Op.overlapped: DualPipe's F&B),
drawn apart from plain F's and B's."""
PAIRED_COLOURS = {PAIRED[OpKind.F]: "#27456B", PAIRED[OpKind.B]: "#2E6B2A"}  # darker


def _spans_by_kind(timeline: Timeline) -> dict[str, list[Span]]:
    """Spans per legend entry: the op kind, or PAIRED's entry for an op of an overlapped
    pair (after its kind), in OpKind order."""
    groups: dict[str, list[Span]] = defaultdict(list)
    for s in timeline.spans:
        groups[PAIRED[s.op.kind] if s.op.overlapped else s.op.kind.value].append(s)
    order = [k.value for k in OpKind]
    return {k: groups[k] for k in sorted(groups, key=lambda k: order.index(k[0]) + 0.5
                                         if k in PAIRED_COLOURS else order.index(k))}


def _add_spans(fig: go.Figure, timeline: Timeline, row: int, shown: set[str]) -> bool:
    """Draw the spans of `timeline` in subplot `row`; returns True if drawn as segments."""
    rows = gantt_rows(timeline)
    index = {p: i for i, p in enumerate(rows)}
    origin = timeline.start_time
    large = len(timeline.spans) > LARGE_TIMELINE_SPANS
    labelled = len(timeline.spans) <= LABELLED_BARS_LIMIT
    for kind, spans in _spans_by_kind(timeline).items():
        start = np.fromiter((s.start for s in spans), float, len(spans)) - origin
        end = np.fromiter((s.end for s in spans), float, len(spans)) - origin
        y = np.fromiter((index[(s.rank, s.lane)] for s in spans), float, len(spans))
        hover = [hover_text(s, origin) for s in spans]
        common = dict(name=kind, legendgroup=kind, showlegend=kind not in shown,
                      hoverinfo="text", hoverlabel=dict(namelength=0))
        shown.add(kind)
        colour = PAIRED_COLOURS.get(kind) or KIND_COLOURS.get(OpKind(kind), "#333333")
        if large:
            # One polyline per kind, (start, end, gap) per span; hover text lives once per
            # span on an invisible marker at its middle, which keeps the file small.
            gap = np.full_like(start, np.nan)
            fig.add_trace(go.Scattergl(
                x=np.column_stack([start, end, gap]).ravel(),
                y=np.column_stack([y, y, gap]).ravel(), mode="lines", connectgaps=False,
                line=dict(color=colour, width=ROW_PX * 0.7), **{**common, "hoverinfo": "skip"}),
                row=row, col=1)
            fig.add_trace(go.Scattergl(
                x=(start + end) / 2, y=y, mode="markers", hovertext=hover, showlegend=False,
                marker=dict(color=colour, opacity=0, size=ROW_PX * 0.7), name=kind,
                legendgroup=kind, hoverinfo="text", hoverlabel=dict(namelength=0)),
                row=row, col=1)
        else:
            fig.add_trace(go.Bar(
                y=y, x=end - start, base=start, orientation="h", width=0.8,
                marker=dict(color=colour, line=dict(width=0.5, color="white")),
                hovertext=hover, text=[str(s.op) for s in spans] if labelled else None,
                textposition="inside" if labelled else "none", insidetextanchor="middle",
                **common), row=row, col=1)
    _shade_alternate_ranks(fig, rows, row)
    if timeline.window:  # an asynchronous schedule: the batches before and after it too
        fig.add_vrect(x0=0, x1=timeline.iteration_time, fillcolor="#FFF1C2", opacity=0.6,
                      line_width=0, layer="below", annotation_text="steady-state iteration",
                      annotation_position="top left", row=row, col=1)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))),
                     ticktext=[f"rank {r} · {lane}" for r, lane in rows],
                     autorange="reversed", showgrid=False, zeroline=False, row=row, col=1)
    return large


def _shade_alternate_ranks(fig: go.Figure, rows: list[tuple[int, str]], row: int) -> None:
    """Grey band behind every other rank's rows, so a rank's lanes read as one block."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (rank, _) in enumerate(rows):
        first.setdefault(rank, i)
        last[rank] = i
    for n, rank in enumerate(first):
        if n % 2:
            fig.add_hrect(y0=first[rank] - 0.5, y1=last[rank] + 0.5, fillcolor="#EEF0F4",
                          line_width=0, layer="below", row=row, col=1)


def _add_memory(fig: go.Figure, timeline: Timeline, row: int) -> None:
    origin, finish = timeline.start_time, timeline.start_time + timeline.iteration_time
    per_rank: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for m in timeline.memory:
        per_rank[m.rank].append((m.time, m.nbytes))
    for rank in sorted(per_rank):
        samples = sorted(per_rank[rank])
        if samples[-1][0] < finish:  # hold the last level to the end of the iteration
            samples.append((finish, samples[-1][1]))
        t = np.array([s[0] for s in samples]) - origin
        gb = np.array([s[1] for s in samples]) / 1e9
        fig.add_trace(go.Scatter(  # one SVG path per rank stays cheap at any length
            x=t, y=gb, mode="lines", line=dict(shape="hv", width=1.5,
                                               color=MEMORY_COLOURS[rank % len(MEMORY_COLOURS)]),
            name=f"memory rank {rank}", legendgroup="memory",
            hovertemplate=f"rank {rank}<br>%{{y:.3f}} GB at %{{x:.4g}} s<extra></extra>"),
            row=row, col=1)
    fig.update_yaxes(title_text="memory (GB)", rangemode="tozero", row=row, col=1)


def _style(fig: go.Figure, nrows: int, height: int, title: str, large: bool) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01), height=height, barmode="overlay", bargap=0,
        template="plotly_white", hovermode="closest", legend=dict(traceorder="grouped"),
        margin=dict(l=130, r=30, t=70, b=50), uniformtext=dict(minsize=8, mode="hide"),
        meta={"representation": "segments" if large else "bars"},
    )
    fig.update_xaxes(showgrid=True, gridcolor="#E5E5E5")
    fig.update_xaxes(tickformat="~s", ticksuffix="s")  # SI prefixes: 0.005 reads as 5ms
    fig.update_xaxes(title_text="time since iteration start", row=nrows, col=1)
    return fig


def gantt_figure(timeline: Timeline, title: str | None = None) -> go.Figure:
    """One row per (rank, lane), colour by op kind; memory per rank underneath if sampled."""
    gantt_px = max(200, ROW_PX * len(gantt_rows(timeline)))
    has_memory = bool(timeline.memory)
    if has_memory:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                            row_heights=[gantt_px, MEMORY_PX])
    else:
        fig = make_subplots(rows=1, cols=1)
    large = _add_spans(fig, timeline, 1, set())
    if has_memory:
        _add_memory(fig, timeline, 2)
    height = gantt_px + (MEMORY_PX if has_memory else 0) + 140
    return _style(fig, 2 if has_memory else 1, height, title or describe(timeline), large)


def comparison_figure(items: Sequence[tuple[str, Timeline]]) -> go.Figure:
    """Several labelled Gantt charts stacked vertically on one shared x axis."""
    if not items:
        raise ValueError("comparison needs at least one (label, timeline) pair")
    heights = [max(120, ROW_PX * len(gantt_rows(t))) for _, t in items]
    fig = make_subplots(rows=len(items), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=heights,
                        subplot_titles=[describe(t, label) for label, t in items])
    shown: set[str] = set()
    large = False
    for i, (_, timeline) in enumerate(items, start=1):
        large |= _add_spans(fig, timeline, i, shown)
    fig.update_xaxes(showticklabels=True)
    height = sum(heights) + 90 * len(items) + 80
    return _style(fig, len(items), height, "schedule comparison", large)


def count_bars(fig: go.Figure) -> int:
    """Spans drawn as SVG bars (0 when the figure uses WebGL segments)."""
    return sum(len(t.x) for t in fig.data if t.type == "bar")


def _write(fig: go.Figure, path: str | Path) -> Path:
    return write_text_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True,
                                               config={"displaylogo": False,
                                                       "scrollZoom": True}))


def write_gantt(timeline: Timeline, path: str | Path, title: str | None = None) -> Path:
    """Write the Gantt chart as one standalone HTML file (plotly.js inlined, works offline)."""
    return _write(gantt_figure(timeline, title), path)


def write_gantt_comparison(items: Sequence[tuple[str, Timeline]], path: str | Path) -> Path:
    """Write several labelled Gantt charts, stacked on one x scale, to one HTML file."""
    return _write(comparison_figure(items), path)
