"""What one compute op covers, and one aggregated intra-layer collective it posts.

Shared by the intra-layer passes (schedules.tp_comms, cp_comms, ep_comms; put together
by schedules.intra_layer). Units: bytes, counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ops import INPUT_GRAD_KINDS, OpKind


@dataclass(frozen=True)
class Covered:
    """The part of the model one compute op runs: its kind (F, B, I or W), its transformer
    layers (`moe_layers` of them MoE layers), whether it holds the embedding (first layer
    group of stage 0) and the head (final norm, output layer, cross-entropy: last layer
    group of the last stage), and of its layers those a full recompute reruns in B / I,
    forward communication included (`rerun_layers`, `rerun_moe_layers` of them MoE
    layers; schedules.recompute)."""

    kind: OpKind
    layers: int
    moe_layers: int = 0
    embedding: bool = False
    head: bool = False
    rerun_layers: int = 0
    rerun_moe_layers: int = 0

    @property
    def forward_layers(self) -> int:
        """Layers whose forward the op runs: all for F, the recomputed ones for B / I."""
        if self.kind is OpKind.F:
            return self.layers
        return self.rerun_layers if self.kind in INPUT_GRAD_KINDS else 0

    @property
    def forward_moe_layers(self) -> int:
        """MoE layers whose forward the op runs (as forward_layers)."""
        if self.kind is OpKind.F:
            return self.moe_layers
        return self.rerun_moe_layers if self.kind in INPUT_GRAD_KINDS else 0

    @property
    def backward(self) -> bool:
        """Whether the op runs the input-gradient backward (B or I; W runs none)."""
        return self.kind in INPUT_GRAD_KINDS


@dataclass(frozen=True)
class Comm:
    """`count` back-to-back collectives `kind` on group axis `group`, `nbytes` in total
    (nbytes / count each, nccl-tests' size S): one Op with this count and nbytes.
    `in_linear`: a collective inside a linear layer that can run beside its GEMMs:
    Transformer Engine's sequence-parallel gathers and scatters (its userbuffers), SUMMA's
    broadcasts and reduces (schedules.tp_2d); schedules.intra_layer places them."""

    kind: OpKind
    group: str
    nbytes: int
    count: int
    in_linear: bool = False


def comms(kind: OpKind, group: str, nbytes: float, count: int, in_linear: bool = False
          ) -> list[Comm]:
    """[Comm] of `nbytes` in total when count > 0 and nbytes > 0, else [] (so callers can
    add terms freely)."""
    if count <= 0 or nbytes <= 0:
        return []
    return [Comm(kind, group, max(1, round(nbytes)), count, in_linear)]


def merged(out: list[Comm]) -> list[Comm]:
    """Collectives of one kind, group and `in_linear` added up, in first-seen order."""
    total: dict[tuple, Comm] = {}
    for c in out:
        key = (c.kind, c.group, c.in_linear)
        seen = total.get(key)
        total[key] = c if seen is None else Comm(c.kind, c.group, seen.nbytes + c.nbytes,
                                                 seen.count + c.count, c.in_linear)
    return list(total.values())
