"""2D tensor parallelism: Optimus (Xu et al., "An Efficient 2D Method for Training
Super-Large Deep Learning Models", 2021), SUMMA on a q x q grid, as Colossal-AI runs it
(`ParallelConfig.tp_mode` '2d'; tp = q^2). Sources and line numbers:
docs/research/tensor_parallel_nd.md, sections 1.1 and 6.1.

Tensor rank t of a TP group sits at (row, col) = divmod(t, q). Group 'tp_row' holds the q
ranks of one row, 'tp_col' those of one column. Every weight W (h_in x h_out) is split in
q x q blocks, every activation X (T x h_in, T = b s tokens) too (the micro-batch over rows,
the hidden dimension over columns): each GPU holds 1/q^2 = 1/tp of each, activations
included, so a layer's memory is Korthikanti et al.'s with every term divided by tp (as
Megatron's with sequence parallelism) and its FLOPs are 1/tp of the layer's.

A linear layer Y = XW is q SUMMA steps. Per step (sizes in elements per broadcast / reduce):
- forward: broadcast an X block over 'tp_row' (T h_in / q^2) and a W block over 'tp_col'
  (h_in h_out / q^2), then a local (T/q x h_in/q) @ (h_in/q x h_out/q) GEMM;
- input gradient dX = dY W^T: broadcast a W block over 'tp_col', reduce a dX block over
  'tp_row' (T h_in / q^2);
- weight gradient dW = X^T dY: broadcast an X block over 'tp_row', reduce a dW block over
  'tp_col' (h_in h_out / q^2).
So a layer's forward moves (7 T h + 12 h^2) / q elements per rank (GPT: h_in sums to 7h and
h_in h_out to 12 h^2 over QKV, projection, fc1, fc2), Optimus' per-layer forward term before
its log(p) tree factor, and its backward twice that. Colossal-AI double-buffers the steps:
the broadcasts and reduces of steps 2..q run beside the GEMMs (`alongside`), the first
step's are exposed.
Around them: a LayerNorm all-reduces its per-token statistics over 'tp_row' (T/q fp32 values
each: mean and variance, RMSNorm its one sum of squares) in forward and again in backward;
a bias or norm weight is all-gathered over 'tp_col' (h_out/q output) in forward and its
gradient reduce-scattered there in backward. The vocabulary-parallel embedding
(V/q x h/q per GPU) reduce-scatters its T h / q output over 'tp_col' in forward and
all-gathers its output gradient in backward; the output layer is one more SUMMA product
with h_out = V (Colossal-AI's VocabParallelClassifier2D: its forward broadcasts W blocks over
'tp_col' and reduces output blocks over 'tp_row'), and the vocabulary-parallel
cross-entropy all-reduces 3 T/q fp32 values over 'tp_row' and a scalar over 'tp_col'.
Not modelled, and said in the run's notes (`tp_2d_notes`): the SMs the SUMMA collectives
beside the GEMMs take from them (no slowdown is charged), and the receive buffers
(transient, 2 (T h_in + h_in h_out) / q^2 elements). 2.5D and 3D: to come (same note).
"""
from __future__ import annotations

import math

from .comm_spec import Comm, Covered, comms
from .errors import ConfigError
from .names import TP_COL, TP_ROW
from .ops import OpKind

TP_MODES = ("1d", "2d")
STAT_BYTES = 4  # an fp32 per-token statistic or loss value


def grid_side(tp: int) -> int:
    """q with q * q = tp, or ConfigError."""
    q = math.isqrt(tp)
    if q * q != tp or q < 2:
        raise ConfigError(f"tp_mode='2d' lays the TP group out as a q x q grid: tp must be a "
                          f"square of q >= 2 (4, 9, 16, ...), got tp={tp}")
    return q


def check_tp_mode(parallel) -> None:
    """The layout rules of 2D tensor parallelism on a ParallelConfig (module docstring)."""
    if parallel.tp_mode not in TP_MODES:
        raise ConfigError(f"tp_mode={parallel.tp_mode!r} must be one of {', '.join(TP_MODES)}")
    if parallel.tp_mode == "1d":
        return
    grid_side(parallel.tp)
    found = [name for name in ("sequence_parallel", "tp_comm_overlap", "scatter_gather",
                               "partition_activations") if getattr(parallel, name)]
    found += [f"{name}={getattr(parallel, name)}" for name in ("cp", "ep")
              if getattr(parallel, name) != 1]
    if parallel.etp != parallel.tp:
        found.append(f"etp={parallel.etp}")
    if found:
        raise ConfigError(f"tp_mode='2d' (Optimus' SUMMA grid) already splits every "
                          f"activation over the grid and is modelled for dense layers "
                          f"without context or expert parallelism: leave out "
                          f"{', '.join(found)}")


def check_model_2d(model, parallel) -> None:
    """The model splits evenly over the grid (Colossal-AI's asserts: weights in q x q
    blocks, the micro-batch over rows, heads over columns); MoE, FP8 and LoRA are not
    modelled with it."""
    if parallel.tp_mode != "2d":
        return
    q = grid_side(parallel.tp)
    if model.is_moe or model.fp8 or model.lora:
        raise ConfigError("tp_mode='2d' is modelled for dense bf16/fp16/fp32 models: no MoE, "
                          "FP8 or LoRA")
    for name in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                 "micro_batch_size", "vocab_size"):
        if getattr(model, name) % q:
            raise ConfigError(f"{name}={getattr(model, name)} is not divisible by q={q}, the "
                              f"side of tp_mode='2d''s grid (tp={parallel.tp}): Colossal-AI "
                              f"splits it over the grid's rows or columns")


def layer_linears(model) -> list[tuple[float, float]]:
    """(h_in, h_out) of a layer's QKV, projection, fc1 and fc2."""
    h, f = model.hidden_size, model.ffn_hidden_size
    return [(h, h + 2 * model.kv_hidden_size), (h, h), (h, (2 if model.swiglu else 1) * f),
            (f, h)]


def tp_2d_comms(model, parallel, cov: Covered) -> list[Comm]:
    """The 2D tensor-parallel collectives of the compute op `cov` describes (module
    docstring): SUMMA's first, then the norms' and biases', then the embedding's and the
    head's."""
    q = grid_side(parallel.tp)
    d = model.dtype_bytes
    tokens = model.micro_batch_size * model.seq_length
    linears = layer_linears(model)
    x = sum(tokens * h_in for h_in, _ in linears) / q ** 2  # one step of every linear
    w = sum(h_in * h_out for h_in, h_out in linears) / q ** 2
    forward = cov.forward_layers  # recomputed forwards included
    input_grad = cov.layers if cov.backward else 0
    weight_grad = cov.layers if cov.kind in (OpKind.B, OpKind.W) else 0
    steps = len(linears) * q
    out = [*comms(OpKind.BROADCAST, TP_ROW, forward * q * x * d, forward * steps),
           *comms(OpKind.BROADCAST, TP_COL, forward * q * w * d, forward * steps),
           *comms(OpKind.BROADCAST, TP_COL, input_grad * q * w * d, input_grad * steps),
           *comms(OpKind.REDUCE, TP_ROW, input_grad * q * x * d, input_grad * steps),
           *comms(OpKind.BROADCAST, TP_ROW, weight_grad * q * x * d, weight_grad * steps),
           *comms(OpKind.REDUCE, TP_COL, weight_grad * q * w * d, weight_grad * steps)]
    stats = 2 if model.normalization == "LayerNorm" else 1  # statistics, weights per norm
    small = 2 * stats * model.hidden_size + (
        sum(h_out for _, h_out in linears) if model.add_bias_linear else 0)
    gathers = 2 * stats + (len(linears) if model.add_bias_linear else 0)
    passes = forward + input_grad  # two norms per layer, each pass
    out += comms(OpKind.ALL_REDUCE, TP_ROW, passes * 2 * stats * tokens / q * STAT_BYTES,
                 passes * 2 * stats)
    out += comms(OpKind.ALL_GATHER, TP_COL, forward * small / q * d, forward * gathers)
    out += comms(OpKind.REDUCE_SCATTER, TP_COL, weight_grad * small / q * d,
                 weight_grad * gathers)
    return out + _embedding_and_head(model, cov, q, tokens, d)


def _embedding_and_head(model, cov: Covered, q: int, tokens: int, d: int) -> list[Comm]:
    """The vocabulary-parallel embedding, output layer and cross-entropy (module
    docstring)."""
    out: list[Comm] = []
    f = cov.kind is OpKind.F
    input_grad = cov.backward
    weight_grad = cov.kind in (OpKind.B, OpKind.W)
    if cov.embedding:
        x = tokens * model.hidden_size / q * d
        if f:
            out += comms(OpKind.REDUCE_SCATTER, TP_COL, x, 1)
        if weight_grad:  # its weight gradient needs the gathered output gradient
            out += comms(OpKind.ALL_GATHER, TP_COL, x, 1)
    if cov.head:
        v, h = model.vocab_size, model.hidden_size
        logits, w = tokens * v / q ** 2, v * h / q ** 2  # per step
        if f:
            out += comms(OpKind.BROADCAST, TP_COL, q * w * d, q)
            out += comms(OpKind.REDUCE, TP_ROW, q * logits * d, q)
            out += comms(OpKind.ALL_REDUCE, TP_ROW, 3 * tokens / q * STAT_BYTES, 3)
            out += comms(OpKind.ALL_REDUCE, TP_COL, STAT_BYTES, 1)
        if input_grad:  # dX = dY W: dY blocks over rows, W blocks over columns
            out += comms(OpKind.BROADCAST, TP_ROW, q * logits * d, q)
            out += comms(OpKind.BROADCAST, TP_COL, q * w * d, q)
        if weight_grad:  # dW = dY^T X: dY blocks over rows, dW reduced over columns
            out += comms(OpKind.BROADCAST, TP_ROW, q * logits * d, q)
            out += comms(OpKind.REDUCE, TP_COL, q * w * d, q)
    return out


def tp_2d_notes(parallel) -> list[str]:
    """What a 2D run assumes (module docstring)."""
    if parallel.tp_mode != "2d":
        return []
    return ["tp_mode='2d': SUMMA's broadcasts and reduces of steps 2..q run beside the "
            "GEMMs without slowing them (the SMs NCCL takes are not charged), and its "
            "double-buffered receive blocks are not counted in memory"]


def summa_placements(comms_of_op: list[Comm], q: int) -> list[tuple[Comm, bool]]:
    """Each 2D collective with whether it runs beside its compute op: of the SUMMA
    broadcasts and reduces (the grid groups' BROADCAST and REDUCE), all but the first step
    of every q (Colossal-AI's double buffering); the rest after it, blocking."""
    out = []
    for c in comms_of_op:
        if c.kind in (OpKind.BROADCAST, OpKind.REDUCE) and c.count >= q:
            exposed = c.count // q
            first = round(c.nbytes * exposed / c.count)
            out += [(Comm(c.kind, c.group, c.nbytes - first, c.count - exposed), True),
                    (Comm(c.kind, c.group, first, exposed), False)]
        else:
            out.append((c, False))
    return out
