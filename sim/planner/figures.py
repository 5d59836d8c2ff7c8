"""The plots of the planner's HTML report (sim.planner.html): the Pareto front of
throughput against peak memory per GPU, and against GPUs over a sweep of GPU counts, and
the search funnel.

Units: throughput in tokens/s of the whole job (global batch x seq length / iteration,
sim.throughput), peak memory in GB (1e9 bytes) per GPU (the replay's busiest rank; for a
layout only bounded, the memory model's peak, sim.planner.inflight), GPUs as counts,
funnel stages as layout counts (log axis). A bounded-out layout's throughput is an upper
bound: global batch x seq length / its lower bound on the iteration (sim.planner.bound),
never a result; it is drawn apart and labelled so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from ..units import format_seconds
from .inflight import peak_memory
from .pareto import pareto_front
from .search import Candidate

GB = 1e9
FRONT = "#D62728"
DOMINATED = "#8A94A6"
BOUND = "#9ECAE1"
WEBGL_POINTS = 2000  # above this many bound points, WebGL markers (cheap to pan)


def _hover(rank: int, candidate: Candidate) -> str:
    """A replayed candidate's hover: its rank, layout and figures."""
    r = candidate.result
    mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
    return (f"#{rank} {candidate.layout.describe()}<br>"
            f"iteration {format_seconds(r['iteration_time'])}, "
            f"{r['tokens_per_s']:,.0f} tokens/s, MFU {mfu}<br>"
            f"peak memory {r['peak_memory'] / GB:.1f} GB per GPU, "
            f"{candidate.plan.world_size} GPUs")


def bound_point(candidate: Candidate) -> tuple[float, float]:
    """(peak memory in bytes by the memory model, throughput upper bound in tokens/s) of a
    candidate the search bounded out (module docstring)."""
    plan = candidate.plan
    tokens = plan.parallel.global_batch_size * plan.model.seq_length
    return max(peak_memory(plan)), tokens / candidate.bound


def _scatter(xs, ys, hover, ranks, name: str, role: str, **style) -> go.Scatter:
    return go.Scatter(x=xs, y=ys, hovertext=hover, customdata=ranks, name=name,
                      hoverinfo="text", hoverlabel=dict(namelength=0), meta={"role": role},
                      **style)


def _front_traces(xs: list[float], ys: list[float], hover: list[str], ranks: list[int],
                  what: str) -> list[go.Scatter]:
    """The dominated points, and the front as markers on a staircase (the best
    throughput reachable within each x: a step up at each front point)."""
    front = pareto_front(list(zip(xs, ys)))
    on = set(front)
    rest = [i for i in range(len(xs)) if i not in on]
    pick = (lambda seq, idx: [seq[i] for i in idx])
    return [
        _scatter(pick(xs, rest), pick(ys, rest), pick(hover, rest), pick(ranks, rest),
                 "replayed, dominated", "dominated", mode="markers",
                 marker=dict(color=DOMINATED, size=8, opacity=0.7)),
        _scatter(pick(xs, front), pick(ys, front), pick(hover, front), pick(ranks, front),
                 f"Pareto front (replayed): no layout has more tokens/s at {what}",
                 "front", mode="lines+markers", line=dict(color=FRONT, shape="hv", width=2),
                 marker=dict(color=FRONT, size=10, line=dict(color="white", width=1)))]


def _leaders(xs: list[float], ys: list[float]) -> list[go.Scatter]:
    """The winner and runner-up (the first two points) marked and labelled."""
    return [go.Scatter(x=[xs[i]], y=[ys[i]], mode="markers+text", name=name,
                       text=[f"#{i + 1}"], textposition="top center", hoverinfo="skip",
                       meta={"role": f"#{i + 1}"},
                       marker=dict(symbol=symbol, size=18, color="rgba(0,0,0,0)",
                                   line=dict(color="#222", width=2)))
            for i, (name, symbol) in enumerate((("#1 winner", "star-open"),
                                                ("#2 runner-up", "diamond-open")))
            if i < len(xs)]


def _style(fig: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    fig.update_layout(title=dict(text=title, x=0.01), template="plotly_white", height=520,
                      hovermode="closest", margin=dict(l=80, r=30, t=60, b=60),
                      legend=dict(orientation="h", yanchor="top", y=-0.14))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, tickformat=",.0f")
    return fig


def memory_front_figure(candidates: Sequence[Candidate], capacity_bytes: float,
                        bounded: Sequence[Candidate] = ()) -> go.Figure:
    """Throughput against peak memory per GPU of the replayed `candidates` (ranked,
    fastest first), their Pareto front, the winner and runner-up, the memory limit as a
    line and, where given, the `bounded` candidates' throughput upper bounds."""
    fig = go.Figure()
    if bounded:
        points = [(c, *bound_point(c)) for c in bounded if c.bound > 0]
        kind = go.Scattergl if len(points) > WEBGL_POINTS else go.Scatter
        fig.add_trace(kind(
            x=[m / GB for _, m, _ in points], y=[t for _, _, t in points],
            hovertext=[f"{c.layout.describe()}<br>bounded out, not simulated: at most "
                       f"{t:,.0f} tokens/s (iteration >= {format_seconds(c.bound)})<br>"
                       f"peak memory {m / GB:.1f} GB per GPU (memory model)"
                       for c, m, t in points],
            mode="markers", name="bounded out, not simulated: throughput at most this "
                                 "(an upper bound, not a result)",
            hoverinfo="text", hoverlabel=dict(namelength=0), meta={"role": "bound"},
            marker=dict(symbol="triangle-down-open", color=BOUND, size=7)))
    xs = [c.result["peak_memory"] / GB for c in candidates]
    ys = [c.result["tokens_per_s"] for c in candidates]
    ranks = list(range(1, len(candidates) + 1))
    hover = [_hover(i, c) for i, c in zip(ranks, candidates)]
    for trace in _front_traces(xs, ys, hover, ranks, "no more memory") + _leaders(xs, ys):
        fig.add_trace(trace)
    fig.add_vline(x=capacity_bytes / GB, line=dict(color="#B00020", dash="dash", width=1),
                  annotation_text=f"memory limit {capacity_bytes / GB:.1f} GB per GPU",
                  annotation_position="top left")
    return _style(fig, "throughput vs peak memory per GPU (replayed layouts)",
                  "peak memory per GPU (GB = 1e9 bytes)", "throughput (tokens/s)")


def gpus_front_figure(sweep: Mapping[int, Sequence[Candidate]]) -> go.Figure:
    """Throughput against GPUs: every replayed candidate of each GPU count of `sweep`
    (GPUs -> its ranked candidates) and the front (fewer GPUs, more tokens/s)."""
    items = [(gpus, rank, c) for gpus in sorted(sweep)
             for rank, c in enumerate(sweep[gpus], start=1)]
    xs = [float(g) for g, _, _ in items]
    ys = [c.result["tokens_per_s"] for _, _, c in items]
    hover = [_hover(rank, c) + f"<br>{c.result['tokens_per_s'] / g:,.0f} tokens/s per GPU"
             for g, rank, c in items]
    fig = go.Figure(_front_traces(xs, ys, hover, [r for _, r, _ in items], "no more GPUs"))
    fig.update_xaxes(type="log", tickvals=sorted(sweep), ticktext=[str(g) for g in sorted(sweep)])
    return _style(fig, "throughput vs GPUs (replayed layouts of each GPU count)",
                  "GPUs (log scale)", "throughput (tokens/s)")


FUNNEL_STAGES = (("enumerated", "enumerated"),
                 ("rejected", "rejected (checks, memory, lowering, replay)"),
                 ("fit_in_memory", "fit in memory"),
                 ("bounded_out", "bounded out (lower bound cannot enter the top)"),
                 ("simulated", "simulated event by event"))


def funnel_counts(funnel: Mapping) -> list[tuple[str, str, int]]:
    """(key, label, count) of each funnel stage from the JSON's funnel (report.funnel);
    'rejected' sums its reasons."""
    return [(key, label, sum(funnel[key].values()) if key == "rejected" else funnel[key])
            for key, label in FUNNEL_STAGES]


def funnel_figure(funnel: Mapping) -> go.Figure:
    """The funnel's counts as horizontal bars on a log axis (the stages span orders of
    magnitude), each stage's label with its count, the stages kept blue, the drops grey."""
    stages = funnel_counts(funnel)
    fig = go.Figure(go.Bar(  # a count of 0 has no bar on a log axis: its label says 0
        y=[f"{label}: {n:,}" for _, label, n in stages], x=[n or None for *_, n in stages],
        text=[f"{n:,}" if n else "" for *_, n in stages], textposition="outside",
        orientation="h",
        customdata=[n for *_, n in stages], hoverinfo="y+text", meta={"role": "funnel"},
        marker=dict(color=[DOMINATED if key in ("rejected", "bounded_out") else "#1F77B4"
                           for key, _, _ in stages])))
    fig.update_layout(title=dict(text="search funnel (layouts; log scale)", x=0.01),
                      template="plotly_white", height=320, showlegend=False,
                      margin=dict(l=330, r=60, t=50, b=50))
    fig.update_xaxes(type="log", title_text="layouts (log scale)")
    fig.update_yaxes(autorange="reversed")
    return fig
