"""The Gantt chart's legend: one entry per op kind, its colour, and the two entries of an
overlapped F&B pair, in OpKind order."""
from __future__ import annotations

from clustersim.schedules.ops import OpKind
from clustersim.schedules.timeline import Span

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

PAIRED = {OpKind.F: "F of F&B", OpKind.B: "B of F&B"}
"""Legend entries of the two ops of an overlapped pair (Op.overlapped: DualPipe's F&B),
drawn apart from plain F's and B's."""
PAIRED_COLOURS = {PAIRED[OpKind.F]: "#27456B", PAIRED[OpKind.B]: "#2E6B2A"}  # darker


def legend_key(span: Span) -> str:
    """The op kind, or PAIRED's entry for an op of an overlapped pair."""
    return PAIRED[span.op.kind] if span.op.overlapped else span.op.kind.value


def legend_order(key: str) -> float:
    """OpKind order; a paired entry right after its kind."""
    order = [k.value for k in OpKind]
    return order.index(key[0]) + 0.5 if key in PAIRED_COLOURS else order.index(key)


def colour_of(key: str) -> str:
    """The colour of a legend entry (an op kind's value or a PAIRED entry)."""
    return PAIRED_COLOURS.get(key) or KIND_COLOURS.get(OpKind(key), "#333333")
