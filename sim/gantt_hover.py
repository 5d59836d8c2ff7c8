"""Hover text of the Gantt chart's bars: one span, or a group of spans drawn as one bar.

Units: times as s/ms/µs/ns since the iteration's start (`origin`), bytes in decimal units
(kB, MB, GB): sim.units. Rows name their GPUs (sim.rank_gpus) where the plan placed them.
"""
from __future__ import annotations

from clustersim.schedules.timeline import Span

from .rank_gpus import RankGpus
from .span_groups import SpanGroup
from .units import format_bytes, format_seconds

DETAIL_WHERE = "each op: the Perfetto trace (--trace-json)"


def _place(rank: int, lane: str, gpus: RankGpus | None) -> list[str]:
    return [f"rank {rank} · {lane}", *([f"GPU {gpus.describe()}"] if gpus else [])]


def hover_text(span: Span, origin: float = 0.0, gpus: RankGpus | None = None) -> str:
    """The op, its rank and GPU(s), stage and microbatch, times, bytes, FLOPs, group and the
    span's extra info."""
    op = span.op
    place = _place(span.rank, span.lane, gpus)
    lines = [f"<b>{op}</b> · {place[0]}", *place[1:],
             f"stage {op.stage}"
             + ("" if op.microbatch is None else f" · microbatch {op.microbatch}"),
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


def group_hover(group: SpanGroup, origin: float = 0.0, gpus: RankGpus | None = None) -> str:
    """A bar of several spans: how many ops of each kind, their summed time, the bar's
    extent and how busy the ops keep it, and where each op is."""
    place = _place(group.rank, group.lane, gpus)
    kinds = " · ".join(f"{kind} ×{count}: {format_seconds(t)}"
                       for kind, (count, t) in group.op_tally().items())
    extent = group.end - group.start
    busy = group.busy
    return "<br>".join([
        f"<b>{len(group.spans)} ops in one bar</b> · {place[0]}", *place[1:],
        f"{kinds} (op time summed)",
        f"{format_seconds(group.start - origin)} → {format_seconds(group.end - origin)} "
        f"(extent {format_seconds(extent)}; ops busy {busy / extent:.0%} of it)"
        if extent > 0 else f"at {format_seconds(group.start - origin)}",
        DETAIL_WHERE])
