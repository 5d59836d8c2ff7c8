"""The serving run's page (`clustersim serve --html`): a Gantt of every GPU's engine steps
and each replica's KV-cache usage over time, one standalone HTML file (plotly.js inlined).

Rows: one per GPU (replica r, sequence shard j, pipeline stage s, GPU g of its
tensor-parallel group; the shards' and the group's GPUs run the same steps), or one per
stage of a replica when that would draw more than MAX_BARS bars (the label says so). A
step is a prefill (it feeds only prompt tokens), a decode (one token per sequence) or mixed
(chunked prefill: both), drawn as its compute, followed by its communication: the step's
TP and SP collectives and EP all-to-alls, which run between its layers, and swap
preemption's KV copies, drawn together at the step's end so that their share shows. Hover
a bar for the step's prompt tokens, decoding sequences and seconds.
"""
from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from clustersim.schedules.output_files import write_text_atomic

from ..gantt import PLOT_CONFIG
from ..units import format_seconds
from . import ServingResult
from .engine import ServingRun, Step

MAX_BARS = 100_000
COLOURS = {"prefill": "#1f77b4", "decode": "#2ca02c", "mixed": "#9467bd",
           "communication": "#d62728"}


def step_kind(step: Step) -> str:
    if step.prompt_tokens and step.decodes:
        return "mixed"
    return "prefill" if step.prompt_tokens else "decode"


def rows(run: ServingRun, tp: int, pp: int = 1, sp: int = 1) -> list[tuple[str, int, int]]:
    """(label, replica, stage) of each drawn row (module docstring)."""
    bars = sum(len(log) for log in run.step_log) * 2 * tp * sp
    stage = (lambda s: f" stage {s}") if pp > 1 else (lambda s: "")
    shard = (lambda j: f" shard {j}") if sp > 1 else (lambda j: "")
    if bars > MAX_BARS:
        return [(f"replica {r}{stage(s)} (GPUs x{tp * sp})", r, s)
                for r in range(len(run.step_log)) for s in range(pp)]
    return [(f"replica {r}{shard(j)}{stage(s)} GPU {g}", r, s)
            for r in range(len(run.step_log)) for j in range(sp) for s in range(pp)
            for g in range(tp)]


def serving_figure(result: ServingResult, title: str) -> go.Figure:
    """The Gantt of a run's steps and its KV-cache usage (module docstring)."""
    run, cost = result.run, result.cost
    drawn = rows(run, cost.tp, len(result.stage_costs), cost.sp)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25],
                        vertical_spacing=0.06)
    bars: dict[str, dict[str, list]] = {k: {"x": [], "base": [], "y": [], "text": []}
                                        for k in COLOURS}
    for label, replica, stage in drawn:
        for step in (s for s in run.step_log[replica] if s.stage == stage):
            kind = step_kind(step)
            compute = step.end - step.start - step.communication
            hover = (f"{kind}: {step.prompt_tokens} prompt tokens, {step.decodes} decoding"
                     f"<br>compute {format_seconds(compute)}, communication "
                     f"{format_seconds(step.communication)}")
            parts = [(kind, step.start, compute)]
            if step.communication > 0:
                parts.append(("communication", step.end - step.communication,
                              step.communication))
            for key, base, width in parts:
                bar = bars[key]
                bar["x"].append(width)
                bar["base"].append(base)
                bar["y"].append(label)
                bar["text"].append(hover)
    for key, bar in bars.items():
        if bar["x"]:
            fig.add_trace(go.Bar(orientation="h", name=key, marker_color=COLOURS[key],
                                 hovertext=bar["text"], hoverinfo="text", **{
                                     k: bar[k] for k in ("x", "base", "y")}), row=1, col=1)
    for replica, samples in enumerate(run.kv_usage):
        if samples:
            fig.add_trace(go.Scatter(x=[t for t, _ in samples], y=[u for _, u in samples],
                                     mode="lines", line_shape="hv",
                                     name=f"KV cache in use, replica {replica}"),
                          row=2, col=1)
    fig.update_layout(title=title, barmode="overlay", height=max(400, 60 + 28 * len(drawn)),
                      legend={"orientation": "h"})
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="KV blocks used", tickformat=".0%", range=[0, 1], row=2,
                     col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    return fig


def write_serving_html(result: ServingResult, title: str, path: str | Path) -> Path:
    """Write the page (atomically); returns its path."""
    fig = serving_figure(result, title)
    return write_text_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True,
                                               config=PLOT_CONFIG))
