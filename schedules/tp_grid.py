"""The grids of multi-dimensional tensor parallelism (`ParallelConfig.tp_mode` '2d', '2.5d',
'3d'): how a TP group's ranks are laid out, what each holds, and the layouts refused.
Sources and line numbers: docs/research/tensor_parallel_nd.md (Colossal-AI's legacy
2D/2.5D/3D layers and process-group initializers, which put tensor rank t on the
coordinates below).

- '2d', Optimus (Xu et al. 2021): tp = q^2, t = col + q row. Group 'tp_row' holds the q
  ranks of one row, 'tp_col' those of one column. Weights in q x q blocks, activations too
  (the micro-batch over rows, the hidden dimension over columns). Norm weights and
  biases: 1/q^2 per GPU.
- '2.5d', Tesseract (Wang et al. 2021): tp = d q^2 (`tp_depth` d >= 2),
  t = col + q row + q^2 dep: d depth slices, each a 2D grid on 1/d of the micro-batch's
  samples ('tp_dep' holds the d ranks of one (row, col)). The weights' q x q blocks are
  replicated on the d slices (each GPU 1/q^2 = d/tp of every matrix; norm weights and
  biases 1/q), so their gradients are summed over the slices as data parallelism sums
  its replicas': once per iteration, over the 'dp_dep' group (dp x d ranks, DP_DEP).
  Colossal-AI's current code splits the batch only q ways and never sums over depth
  (research note, section 1.2); this follows the paper.
- '3d' (Bian et al. 2021, Colossal-AI's 3D): tp = q^3, t = i + q j + q^2 k with groups
  'tp_weight' (i varies), 'tp_input' (j), 'tp_output' (k), and the planes
  'tp_input_weight' (i, j) and 'tp_output_weight' (i, k). A matrix is 1/q^3 per GPU,
  norm weights and biases 1/q (replicated over a plane), activations 1/q^3 (the
  micro-batch split q^2 ways, the hidden dimension q ways).
Every mode splits every activation over all tp ranks (`ParallelConfig.activations_split`)
and every GEMM's FLOPs by tp. Modelled for dense models without sequence or context
parallelism, expert parallelism, FP8 or LoRA: those are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError, require_positive_int
from .names import (TP_COL, TP_DEP, TP_INPUT, TP_INPUT_WEIGHT, TP_OUTPUT, TP_OUTPUT_WEIGHT,
                    TP_ROW, TP_WEIGHT)
from .ops import OpKind

TP_MODES = ("1d", "2d", "2.5d", "3d")
STAT_BYTES = 4  # an fp32 per-token statistic or loss value

_GROUPS = {  # group -> the grid coordinates that vary along it (module docstring)
    "2d": {TP_ROW: (0,), TP_COL: (1,)},
    "2.5d": {TP_ROW: (0,), TP_COL: (1,), TP_DEP: (2,)},
    "3d": {TP_WEIGHT: (0,), TP_INPUT: (1,), TP_OUTPUT: (2,), TP_INPUT_WEIGHT: (0, 1),
           TP_OUTPUT_WEIGHT: (0, 2)},
}


@dataclass(frozen=True)
class TpGrid:
    """The grid of a tp group: `mode`, side `q`, `depth` (2.5D's d, else 1)."""

    mode: str
    q: int
    depth: int = 1

    @property
    def sizes(self) -> tuple[int, ...]:
        """Coordinate sizes, innermost first (module docstring)."""
        return {"2d": (self.q, self.q), "2.5d": (self.q, self.q, self.depth),
                "3d": (self.q, self.q, self.q)}[self.mode]

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(_GROUPS[self.mode])

    @property
    def matrix_shards(self) -> int:
        """GPUs one weight matrix is split over: q^2 (2D, 2.5D: replicated on d slices)
        or q^3 (3D)."""
        return self.q ** 3 if self.mode == "3d" else self.q ** 2

    @property
    def vector_shards(self) -> int:
        """GPUs a norm weight or bias is split over: q^2 (2D), q (2.5D, 3D)."""
        return self.q ** 2 if self.mode == "2d" else self.q

    @property
    def position_shards(self) -> int:
        """GPUs a learned position table is split over: q^2 (Embedding2D, 2p5D), q
        (Embedding3D: h/q, replicated on a plane)."""
        return self.q if self.mode == "3d" else self.q ** 2

    def gemm_steps(self, tokens: float, h_in: float, h_out: float
                   ) -> tuple[int, tuple[float, float, float]]:
        """How one GPU runs its share of a (tokens x h_in) @ (h_in x h_out) GEMM: the
        number of local GEMMs and their (m, n, k) — q SUMMA steps of
        (T/q x h_in/q) @ (h_in/q x h_out/q) in 2D (T/(d q) rows in 2.5D: one depth
        slice's), one (T/q x h_in/q) @ (h_in/q x h_out/q) in 3D (tp_3d). Either way
        2 T h_in h_out / tp FLOPs."""
        q = self.q
        if self.mode == "3d":
            return 1, (tokens / q, h_out / q, h_in / q)
        return q, (tokens / (self.depth * q), h_out / q, h_in / q)

    def members(self, group: str, t: int) -> list[int]:
        """Tensor ranks of `t`'s `group`, in coordinate order."""
        if group not in _GROUPS[self.mode]:
            raise ConfigError(f"tp_mode={self.mode!r} has no group {group!r}: its groups are "
                              f"{', '.join(self.groups)}")
        sizes, strides = self.sizes, [math.prod(self.sizes[:i]) for i in range(len(self.sizes))]
        coords = [t // s % n for s, n in zip(strides, sizes)]
        base = t - sum(coords[a] * strides[a] for a in _GROUPS[self.mode][group])
        out = [base]
        for axis in _GROUPS[self.mode][group]:
            out = [r + k * strides[axis] for k in range(sizes[axis]) for r in out]
        return sorted(out)


def tp_grid(parallel) -> TpGrid | None:
    """The grid of `parallel`'s tp group, or None for 1D; ConfigError where tp does not
    fit the mode's grid."""
    mode, tp = parallel.tp_mode, parallel.tp
    if mode == "1d":
        return None
    if mode == "2.5d":
        d = parallel.tp_depth
        q = math.isqrt(tp // d) if d and tp % d == 0 else 0
        if q < 2 or d * q * q != tp:
            raise ConfigError(f"tp_mode='2.5d' lays the TP group out as d grids of q x q: tp "
                              f"must be tp_depth * q^2 with q >= 2, got tp={tp} "
                              f"tp_depth={d}")
        return TpGrid(mode, q, d)
    q = math.isqrt(tp) if mode == "2d" else round(tp ** (1 / 3))
    if q < 2 or q ** (2 if mode == "2d" else 3) != tp:
        shape, examples = (("a square", "4, 9, 16") if mode == "2d"
                           else ("a cube", "8, 27, 64"))
        raise ConfigError(f"tp_mode={mode!r} lays the TP group out as a q x q"
                          f"{'' if mode == '2d' else ' x q'} grid: tp must be {shape} of "
                          f"q >= 2 ({examples}, ...), got tp={tp}")
    return TpGrid(mode, q)


def check_tp_mode(parallel) -> None:
    """The layout rules of the tp modes on a ParallelConfig (module docstring)."""
    if parallel.tp_mode not in TP_MODES:
        raise ConfigError(f"tp_mode={parallel.tp_mode!r} must be one of {', '.join(TP_MODES)}")
    if parallel.tp_depth is not None:
        require_positive_int("tp_depth", parallel.tp_depth)
    if parallel.tp_depth is not None and parallel.tp_mode != "2.5d":
        raise ConfigError(f"tp_depth={parallel.tp_depth} is the depth of tp_mode='2.5d''s "
                          f"grid: leave it out with tp_mode={parallel.tp_mode!r}")
    if parallel.tp_mode == "2.5d" and (parallel.tp_depth is None or parallel.tp_depth < 2):
        raise ConfigError(f"tp_mode='2.5d' needs tp_depth >= 2 (its d; d = 1 is "
                          f"tp_mode='2d'), got tp_depth={parallel.tp_depth}")
    if tp_grid(parallel) is None:
        return
    found = [name for name in ("sequence_parallel", "tp_comm_overlap", "scatter_gather",
                               "partition_activations") if getattr(parallel, name)]
    found += [f"{name}={getattr(parallel, name)}" for name in ("cp", "ep")
              if getattr(parallel, name) != 1]
    if parallel.etp != parallel.tp:
        found.append(f"etp={parallel.etp}")
    if parallel.tp_mode == "2.5d":  # its depth slices' gradients reduce as DDP's do
        found += [f"{name}={getattr(parallel, name)!r}" for name, off in
                  (("zero_stage", 0), ("fsdp", "none"), ("offload", False))
                  if getattr(parallel, name) != off]
    if found:
        ddp = ", with DDP" if parallel.tp_mode == "2.5d" else ""
        raise ConfigError(f"tp_mode={parallel.tp_mode!r} already splits every activation "
                          f"over the grid and is modelled for dense layers without context "
                          f"or expert parallelism{ddp}: leave out {', '.join(found)}")


def check_model_grid(model, parallel) -> None:
    """The model splits evenly over the grid (Colossal-AI's asserts, research note section
    4); MoE, FP8 and LoRA are not modelled with it."""
    grid = tp_grid(parallel)
    if grid is None:
        return
    mode, q = grid.mode, grid.q
    if model.is_moe or model.fp8 or model.lora:
        raise ConfigError(f"tp_mode={mode!r} is modelled for dense bf16/fp16/fp32 models: "
                          f"no MoE, FP8 or LoRA")
    cube = mode == "3d"  # a linear's input features split q^2 ways, its outputs q ways
    rules = {"hidden_size": q * q if cube else q, "ffn_hidden_size": q * q if cube else q,
             "num_attention_heads": q, "num_query_groups": q,
             "vocab_size": q * q if cube else q,
             "micro_batch_size": {"2d": q, "2.5d": grid.depth * q, "3d": q * q}[mode]}
    for name, divisor in rules.items():
        if getattr(model, name) % divisor:
            raise ConfigError(f"{name}={getattr(model, name)} is not divisible by {divisor}, "
                              f"as tp_mode={mode!r} with tp={parallel.tp} (q={q}"
                              f"{f', d={grid.depth}' if grid.depth > 1 else ''}) splits it "
                              f"(Colossal-AI's grid asserts)")


def layer_linears(model) -> list[tuple[float, float]]:
    """(h_in, h_out) of a layer's QKV, projection, fc1 and fc2."""
    h, f = model.hidden_size, model.ffn_hidden_size
    return [(h, h + 2 * model.kv_hidden_size), (h, h), (h, (2 if model.swiglu else 1) * f),
            (f, h)]


def layer_biases(model) -> list[float]:
    """Elements of each bias of a layer's linears (none without add_bias_linear)."""
    return [h_out for _, h_out in layer_linears(model)] if model.add_bias_linear else []


def layer_vectors(model) -> float:
    """Elements of a layer's norm weights and linear biases."""
    per_norm = 2 if model.normalization == "LayerNorm" else 1
    return 2 * per_norm * model.hidden_size + sum(layer_biases(model))


def norm_passes(cov) -> tuple[int, int, int]:
    """Norm forwards, backwards and weight gradients of the compute op `cov` (a
    comm_spec.Covered) describes: two norms per layer (recomputed forwards included), and
    the final norm with the head."""
    weight_grad = cov.kind in (OpKind.B, OpKind.W)
    head = int(cov.head)
    return (2 * cov.forward_layers + head * (cov.kind is OpKind.F),
            (2 * cov.layers + head) * cov.backward, (2 * cov.layers + head) * weight_grad)


def grid_layer_params(model, grid: TpGrid) -> float:
    """Parameters of one layer on one GPU: its matrices / matrix_shards, its norm weights
    and biases / vector_shards."""
    vectors = layer_vectors(model)
    return (model.layer_param_count() - vectors) / grid.matrix_shards + vectors / grid.vector_shards


def tp_grid_notes(parallel) -> list[str]:
    """What a run on a grid assumes (tp_2d, tp_3d module docstrings)."""
    grid = tp_grid(parallel)
    if grid is None:
        return []
    if grid.mode == "3d":
        return ["tp_mode='3d': every all-gather and reduce-scatter runs after its compute, "
                "blocking (Colossal-AI overlaps the backward's reduce-scatters with the next "
                "GEMM: not credited)"]
    return [f"tp_mode={grid.mode!r}: SUMMA's broadcasts and reduces of steps 2..q run beside "
            f"the GEMMs without slowing them (the SMs NCCL takes are not charged), and its "
            f"double-buffered receive blocks are not counted in memory"]
