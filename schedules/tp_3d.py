"""3D tensor parallelism (Bian et al., "Maximizing Parallelism in Distributed Training for
Huge Neural Networks", 2021), as Colossal-AI's legacy 3D layers run it
(`ParallelConfig.tp_mode` '3d', tp = q^3; grid and groups: schedules.tp_grid). Sources and
line numbers: docs/research/tensor_parallel_nd.md, sections 1.3 and 6.3.

A linear layer Y = XW (X: T x h_in, T = b s tokens) keeps a 1/q^3 block of X and of W on
each GPU and runs one local (T/q x h_in/q) @ (h_in/q x h_out/q) GEMM between (sizes in
elements of the whole tensor each collective handles, nccl-tests' convention):
- forward: all-gather X over its input group (T h_in / q^2 out), all-gather W over
  'tp_weight' (h_in h_out / q^2 out), reduce-scatter Y over its output group
  (T h_out / q^2 in);
- input gradient: all-gather dY over the output group (T h_out / q^2), reduce-scatter dX
  over the input group (T h_in / q^2); the gathered dY stays for the weight gradient;
- weight gradient: reduce-scatter dW over 'tp_weight' (h_in h_out / q^2); a bias's
  gradient (h_out / q, replicated on the output group's plane with 'tp_weight') is
  all-reduced over that plane.
Colossal-AI swaps the input and output roles after building each linear, so QKV and fc1
gather over 'tp_input' and scatter over 'tp_output', the projection and fc2 the other way
round, and the output layer (one more such linear with h_out = V) as QKV. A ring moves
(q-1)/q of each, so a layer's forward moves (q-1)/q^3 (16 T h + 12 h^2) elements per rank
(GPT: sum h_in = 7h, sum h_out = 9h, sum h_in h_out = 12 h^2), its backward the same.
A LayerNorm all-reduces its per-token statistics (2 T/q^2 fp32 values, RMSNorm T/q^2) over
'tp_output' in forward and in backward, and its weights' gradients (h/q each) over
'tp_input_weight'. The vocabulary-parallel embedding (V/q^2 x h/q per GPU) all-gathers its
table over 'tp_weight' (V h/q^2) and reduce-scatters its output over 'tp_input'
(T h/q^2) in forward; its backward all-gathers the output gradient over 'tp_input' and
reduce-scatters the table's gradient over 'tp_weight'. A learned position table (h/q per
GPU) all-reduces its gradient over 'tp_input_weight'. The vocabulary-parallel
cross-entropy all-reduces 3 T/q^2 fp32 values over 'tp_input' (where the vocabulary
blocks lie) and 2 scalars. Every collective runs blocking after its compute op
(Colossal-AI overlaps the backward's reduce-scatters with the next GEMM: not credited;
tp_grid.tp_grid_notes says so).

Memory: each linear saves its gathered X (T h_in / q^2) and gathered W (h_in h_out / q^2)
for its backward (Colossal-AI's _Linear3D; `saved_gathered_bytes`), q times the shards.
"""
from __future__ import annotations

from .comm_spec import Comm, Covered, comms, merged
from .names import TP_INPUT, TP_INPUT_WEIGHT, TP_OUTPUT, TP_OUTPUT_WEIGHT, TP_WEIGHT
from .ops import OpKind
from .tp_grid import STAT_BYTES, layer_linears, norm_passes, tp_grid

_ROLES = ((TP_INPUT, TP_OUTPUT), (TP_OUTPUT, TP_INPUT))  # QKV, fc1; projection, fc2
_PLANE = {TP_OUTPUT: TP_OUTPUT_WEIGHT, TP_INPUT: TP_INPUT_WEIGHT}  # a bias's replicas


def tp_3d_comms(model, parallel, cov: Covered) -> list[Comm]:
    """The 3D tensor-parallel collectives of the compute op `cov` describes (module
    docstring): the linears', the norms', then the embedding's and the head's."""
    q, d = tp_grid(parallel).q, model.dtype_bytes
    tokens = model.micro_batch_size * model.seq_length
    forward = cov.forward_layers  # recomputed forwards included
    input_grad = cov.layers if cov.backward else 0
    weight_grad = cov.layers if cov.kind in (OpKind.B, OpKind.W) else 0
    out: list[Comm] = []
    for index, (h_in, h_out) in enumerate(layer_linears(model)):
        out += linear_3d_comms(q, tokens, h_in, h_out, d, _ROLES[index % 2], forward,
                               input_grad, weight_grad)
        if model.add_bias_linear:
            plane = _PLANE[_ROLES[index % 2][1]]
            out += comms(OpKind.ALL_REDUCE, plane, weight_grad * h_out / q * d, weight_grad)
    out += _norms(model, q, tokens, *norm_passes(cov))
    return merged(out + _embedding_and_head(model, cov, q, tokens, d))


def linear_3d_comms(q: int, tokens: float, h_in: float, h_out: float, d: int,
                    roles: tuple[str, str], forward: int, input_grad: int,
                    weight_grad: int) -> list[Comm]:
    """The collectives of `forward`, `input_grad` and `weight_grad` passes of one 3D
    linear (module docstring) whose input and output groups are `roles`."""
    gather, scatter = roles
    x, y, w = tokens * h_in / q ** 2 * d, tokens * h_out / q ** 2 * d, h_in * h_out / q ** 2 * d
    return [*comms(OpKind.ALL_GATHER, gather, forward * x, forward),
            *comms(OpKind.ALL_GATHER, TP_WEIGHT, forward * w, forward),
            *comms(OpKind.REDUCE_SCATTER, scatter, forward * y, forward),
            *comms(OpKind.ALL_GATHER, scatter, input_grad * y, input_grad),
            *comms(OpKind.REDUCE_SCATTER, gather, input_grad * x, input_grad),
            *comms(OpKind.REDUCE_SCATTER, TP_WEIGHT, weight_grad * w, weight_grad)]


def _norms(model, q: int, tokens: float, forward: int, backward: int,
           weight_grads: int) -> list[Comm]:
    """LayerNorm3D's collectives over `forward`, `backward` and `weight_grads` norm
    passes (module docstring)."""
    stats = 2 if model.normalization == "LayerNorm" else 1  # statistics, weights per norm
    row = stats * tokens / q ** 2 * STAT_BYTES
    return [*comms(OpKind.ALL_REDUCE, TP_OUTPUT, (forward + backward) * row, forward + backward),
            *comms(OpKind.ALL_REDUCE, TP_INPUT_WEIGHT,
                   weight_grads * stats * model.hidden_size / q * model.dtype_bytes,
                   weight_grads * stats)]


def _embedding_and_head(model, cov: Covered, q: int, tokens: float, d: int) -> list[Comm]:
    """The vocabulary-parallel embedding, learned position table, output layer and
    cross-entropy (module docstring)."""
    out: list[Comm] = []
    f = cov.kind is OpKind.F
    weight_grad = cov.kind in (OpKind.B, OpKind.W)
    v, h = model.vocab_size, model.hidden_size
    if cov.embedding:
        table, x = v * h / q ** 2 * d, tokens * h / q ** 2 * d
        if f:
            out += comms(OpKind.ALL_GATHER, TP_WEIGHT, table, 1)
            out += comms(OpKind.REDUCE_SCATTER, TP_INPUT, x, 1)
        if weight_grad:
            out += comms(OpKind.ALL_GATHER, TP_INPUT, x, 1)
            out += comms(OpKind.REDUCE_SCATTER, TP_WEIGHT, table, 1)
            position = model.embedding_param_count() - v * h
            out += comms(OpKind.ALL_REDUCE, TP_INPUT_WEIGHT, position / q * d, 1)
    if cov.head:
        out += linear_3d_comms(q, tokens, h, v, d, _ROLES[0], int(f), int(cov.backward),
                               int(weight_grad))
        if f:
            out += comms(OpKind.ALL_REDUCE, TP_INPUT, 3 * tokens / q ** 2 * STAT_BYTES, 3)
            out += comms(OpKind.ALL_REDUCE, TP_OUTPUT, STAT_BYTES, 1)
            out += comms(OpKind.ALL_REDUCE, TP_WEIGHT, STAT_BYTES, 1)
    return out


def saved_gathered_bytes(model, parallel) -> float:
    """Bytes one layer keeps for its backward beyond its 1/q^3 shards, per micro-batch:
    each linear's gathered X and W (module docstring) less the shard of X that the
    activation count (ModelSpec.layer_activation_bytes / tp) already holds."""
    q, d = tp_grid(parallel).q, model.dtype_bytes
    tokens = model.micro_batch_size * model.seq_length
    return sum((q - 1) * tokens * h_in / q ** 3 * d + h_in * h_out / q ** 2 * d
               for h_in, h_out in layer_linears(model))


def saved_head_bytes(model, parallel) -> float:
    """The output layer's gathered input and weight, beyond its input's shard (as
    saved_gathered_bytes)."""
    q, d = tp_grid(parallel).q, model.dtype_bytes
    tokens, h = model.micro_batch_size * model.seq_length, model.hidden_size
    return (q - 1) * tokens * h / q ** 3 * d + model.vocab_size * h / q ** 2 * d
