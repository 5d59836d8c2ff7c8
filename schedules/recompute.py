"""Activation recomputation: which layers of a stage rerun their forward in the backward,
and what each layer keeps from its forward (Megatron-LM's --recompute-granularity,
--recompute-method, --recompute-num-layers; Megatron-Core TransformerBlock's checkpointed
forward and TransformerConfig's rules).

- 'selective' (Korthikanti et al. 2022, K22): every layer keeps all but its core attention
  (QK^T, softmax, attention over V), which the backward recomputes. No method or layer
  count applies (Megatron-Core refuses them).
- 'full', method 'uniform', N layers (--recompute-num-layers): a stage's layers are split
  into consecutive chunks of N; each chunk keeps only its input and the backward reruns
  all of its layers' forward (every layer recomputed; ceil(L/N) inputs kept).
- 'full', method 'block', N layers: the first N layers of the stage keep only their input
  and are recomputed, one layer per checkpoint; the others keep everything and are not
  recomputed (N >= L recomputes every layer).
A stage here is one virtual pipeline stage (one Megatron model chunk: its own
TransformerBlock). `recompute='full'` alone means uniform with N = 1, each layer its own
checkpoint (what K22 section 5 calls full recomputation, 2sbh kept per layer); it is
printed in the summary. The embedding and the head are never recomputed.

Working set: the backward of one checkpointed region regenerates that region's full
activations before it frees them: N layers' worth under uniform, one layer's under block
(RECOMPUTED region's activations, counted once per rank by schedules.memory_model).

Roles of a layer, by its position p (0-based) in its stage:
KEPT (keeps everything, not recomputed), CHECKPOINT (keeps its input, recomputed),
INSIDE (keeps nothing, recomputed: a uniform chunk's later layers).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from .errors import ConfigError

KEPT, CHECKPOINT, INSIDE = "kept", "checkpoint", "inside"
METHODS = ("uniform", "block")


def normalised_options(recompute: str, method: Any, num_layers: Any) -> tuple:
    """(recompute_method, recompute_num_layers) as a ParallelConfig keeps them: 'uniform'
    and 1 for full recompute when not given, None and None otherwise; ConfigError when
    given where they cannot act (Megatron-Core's TransformerConfig rules)."""
    if recompute != "full":
        for name, value in (("recompute_method", method), ("recompute_num_layers", num_layers)):
            if value is not None:
                raise ConfigError(f"{name}={value!r} needs recompute='full' (Megatron's "
                                  f"--recompute-granularity full), got recompute="
                                  f"{recompute!r}: a recompute method and layer count "
                                  f"choose which layers a full recompute checkpoints")
        return None, None
    method = "uniform" if method is None else method
    if method not in METHODS:
        raise ConfigError(f"recompute_method={method!r} must be one of {', '.join(METHODS)}")
    num_layers = 1 if num_layers is None else num_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ConfigError(f"recompute_num_layers must be an integer >= 1, got {num_layers!r}")
    return method, num_layers


def check_fits(parallel: Any, stage_layers: Iterable[int]) -> None:
    """ConfigError when recompute_num_layers exceeds the layers of every stage (Megatron-
    Core: 'between 1 and num_layers_per_pipeline_rank')."""
    most = max(stage_layers, default=0)
    if parallel.recompute == "full" and parallel.recompute_num_layers > most:
        raise ConfigError(f"recompute_num_layers={parallel.recompute_num_layers} must be at "
                          f"most the layers of a (virtual) pipeline stage, {most} here")


class Recompute(NamedTuple):
    """A run's recompute options (ParallelConfig's recompute, recompute_method,
    recompute_num_layers), for code that has no ParallelConfig (the kernels' stages)."""

    granularity: str = "none"
    method: str | None = None
    num_layers: int | None = None

    @classmethod
    def of(cls, parallel: Any) -> Recompute:
        return cls(parallel.recompute, parallel.recompute_method,
                   parallel.recompute_num_layers)

    @classmethod
    def named(cls, granularity: str) -> Recompute:
        """'none', 'selective' or 'full' with full's defaults (uniform, 1 layer)."""
        return cls(granularity, *normalised_options(granularity, None, None))

    def role(self, position: int) -> str:
        """The role (module docstring) of the layer at `position` of its stage."""
        if self.granularity != "full":
            return KEPT
        if self.method == "uniform":
            return CHECKPOINT if position % self.num_layers == 0 else INSIDE
        return CHECKPOINT if position < self.num_layers else KEPT


def layer_role(parallel: Any, position: int) -> str:
    """The role (module docstring) of the layer at `position` of its stage."""
    return Recompute.of(parallel).role(position)


def roles(parallel: Any, positions: Iterable[int]) -> dict[str, int]:
    """How many of the layers at `positions` have each role."""
    counts = dict.fromkeys((KEPT, CHECKPOINT, INSIDE), 0)
    for p in positions:
        counts[layer_role(parallel, p)] += 1
    return counts


def rerun_layers(parallel: Any, positions: Iterable[int]) -> int:
    """How many of the layers at `positions` rerun their whole forward in the backward
    (full recompute only; selective reruns only the core attention of every layer)."""
    return sum(layer_role(parallel, p) != KEPT for p in positions)


def working_layers(parallel: Any, stage_layers: int) -> int:
    """Layers whose full activations one checkpointed region regenerates at once in the
    backward of a stage of `stage_layers` layers: min(N, L) under uniform, 1 under block,
    0 without full recompute."""
    if parallel.recompute != "full" or stage_layers == 0:
        return 0
    if parallel.recompute_method == "uniform":
        return min(parallel.recompute_num_layers, stage_layers)
    return 1


def describe(recompute: str, method: str | None = None, num_layers: int | None = None
             ) -> str:
    """'full (uniform, 1 layer per checkpoint)', 'selective', 'none' (a ParallelConfig's
    recompute, recompute_method, recompute_num_layers)."""
    if recompute != "full":
        return recompute
    n = num_layers
    if method == "uniform":
        return f"full (uniform, {n} layer{'s' if n > 1 else ''} per checkpoint)"
    return f"full (block: the first {n} layer{'s' if n > 1 else ''} of each stage)"
