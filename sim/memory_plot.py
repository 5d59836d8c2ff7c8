"""The memory panel of the Gantt chart: each rank's memory over the iteration, and the
device's memory as a line, so a rank that does not fit shows above it.

Units: seconds since the iteration's first span (x), GB = 1e9 bytes (y). Curves are steps
(`shape="hv"`) through the Timeline's memory samples, held to the iteration's end.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import plotly.graph_objects as go

from clustersim.schedules.timeline import Timeline

from .rank_gpus import rank_gpus

MEMORY_COLOURS = ("#1F77B4", "#D62728", "#2CA02C", "#FF7F0E", "#9467BD", "#8C564B",
                  "#E377C2", "#7F7F7F", "#BCBD22", "#17BECF")


def device_memory(timeline: Timeline) -> tuple[float | None, str | None]:
    """The device's memory (bytes) and name from the plan; (None, None) if unknown."""
    plan = timeline.meta.get("plan") or {}
    return plan.get("device_memory_bytes"), plan.get("device")


def add_memory(fig: go.Figure, timeline: Timeline, row: int) -> None:
    """Each rank's memory curve (GB) in subplot `row`, named by its GPUs, and the device's
    memory as a dashed line where the plan knows it."""
    origin, finish = timeline.start_time, timeline.start_time + timeline.iteration_time
    gpus = rank_gpus(timeline.meta.get("plan"))
    per_rank: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for m in timeline.memory:
        per_rank[m.rank].append((m.time, m.nbytes))
    for rank in sorted(per_rank):
        samples = sorted(per_rank[rank])
        if samples[-1][0] < finish:  # hold the last level to the end of the iteration
            samples.append((finish, samples[-1][1]))
        t = np.array([s[0] for s in samples]) - origin
        gb = np.array([s[1] for s in samples]) / 1e9
        name = gpus[rank].label if rank in gpus else f"rank {rank}"
        fig.add_trace(go.Scatter(  # one SVG path per rank stays cheap at any length
            x=t, y=gb, mode="lines", line=dict(shape="hv", width=1.5,
                                               color=MEMORY_COLOURS[rank % len(MEMORY_COLOURS)]),
            name=f"memory {name}", legendgroup="memory",
            hovertemplate=f"{name}<br>%{{y:.3f}} GB at %{{x:.4g}} s<extra></extra>"),
            row=row, col=1)
    capacity, device = device_memory(timeline)
    if capacity:
        label = f"device memory {capacity / 1e9:.1f} GB" + (f" ({device})" if device else "")
        fig.add_trace(go.Scatter(
            x=[0.0, max(finish - origin, max((m.time for m in timeline.memory), default=0.0)
                        - origin)], y=[capacity / 1e9] * 2, mode="lines", name=label,
            line=dict(color="#B00020", dash="dash", width=2), legendgroup="memory",
            hovertemplate=f"{label}<extra></extra>", meta={"device_memory": True}),
            row=row, col=1)
    fig.update_yaxes(title_text="memory (GB)", rangemode="tozero", row=row, col=1)
