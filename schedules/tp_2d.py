"""2D and 2.5D tensor parallelism: Optimus (Xu et al., "An Efficient 2D Method for Training
Super-Large Deep Learning Models", 2021), SUMMA on a q x q grid, and Tesseract (Wang et al.,
"2.5-dimensional distributed model training", 2021), d such grids, as Colossal-AI runs them
(`ParallelConfig.tp_mode` '2d' or '2.5d'; grids and groups: schedules.tp_grid). Sources and
line numbers: docs/research/tensor_parallel_nd.md, sections 1.1, 1.2, 6.1 and 6.2.

Every weight W (h_in x h_out) is split in q x q blocks, every activation X (T x h_in,
T = b s tokens) too (the micro-batch over rows, the hidden dimension over columns); 2.5D
runs one such grid per depth slice on 1/d of the micro-batch's samples (T/d tokens), with
the weights' blocks replicated on the slices (their gradients summed over 'dp_dep' by the
data-parallel pass, schedules.tp_grid). Below T is one slice's tokens.

A linear layer Y = XW is q SUMMA steps. Per step (sizes in elements per broadcast / reduce):
- forward: broadcast an X block over 'tp_row' (T h_in / q^2) and a W block over 'tp_col'
  (h_in h_out / q^2), then a local (T/q x h_in/q) @ (h_in/q x h_out/q) GEMM;
- input gradient dX = dY W^T: broadcast a W block over 'tp_col', reduce a dX block over
  'tp_row' (T h_in / q^2);
- weight gradient dW = X^T dY: broadcast an X block over 'tp_row', reduce a dW block over
  'tp_col' (h_in h_out / q^2).
So a layer's forward moves (7 T h + 12 h^2) / q elements per rank (GPT: h_in sums to 7h and
h_in h_out to 12 h^2 over QKV, projection, fc1, fc2), Optimus' per-layer forward term before
its log(p) tree factor, and its backward twice that; 2.5D moves (7 T h / d + 12 h^2) / q,
Colossal-AI's bandwidth term 3 (q-1)(d+1)/(d q) per pass pair. Colossal-AI double-buffers
the steps: the broadcasts and reduces of steps 2..q run beside the GEMMs (`in_linear`),
the first step's are exposed.
Around them: a LayerNorm all-reduces its per-token statistics over 'tp_row' (T/q fp32 values
each: mean and variance, RMSNorm its one sum of squares) in forward and again in backward;
a bias or norm weight is all-gathered over 'tp_col' (h_out/q output) in forward and its
gradient reduce-scattered there in backward (2.5D: broadcast from row 0 over 'tp_col',
h_out/q, and reduced to it); the final norm does as a layer's. The vocabulary-parallel
embedding (V/q x h/q per GPU) reduce-scatters its T h / q output over 'tp_col' in forward
and all-gathers its output gradient in backward; a learned position table (h/q^2 per GPU)
is all-gathered over 'tp_col' in forward and its gradient reduce-scattered. The output
layer is one more SUMMA product with h_out = V (Colossal-AI's VocabParallelClassifier2D:
its forward broadcasts W blocks over 'tp_col' and reduces output blocks over 'tp_row'),
and the vocabulary-parallel cross-entropy all-reduces 3 T/q fp32 values over 'tp_row' and
a scalar over 'tp_col'.
Not modelled, and said in the run's notes (tp_grid.tp_grid_notes): the SMs the SUMMA
collectives beside the GEMMs take from them (no slowdown is charged), and the receive
buffers (transient, 2 (T h_in + h_in h_out) / q^2 elements).
"""
from __future__ import annotations

from .comm_spec import Comm, Covered, comms, merged
from .names import TP_COL, TP_ROW
from .ops import OpKind
from .tp_grid import STAT_BYTES, layer_biases, layer_linears, norm_passes, tp_grid


def tp_2d_comms(model, parallel, cov: Covered) -> list[Comm]:
    """The 2D or 2.5D tensor-parallel collectives of the compute op `cov` describes (module
    docstring): SUMMA's first, then the norms' and biases', then the embedding's and the
    head's."""
    grid = tp_grid(parallel)
    q, d = grid.q, model.dtype_bytes
    tokens = model.micro_batch_size * model.seq_length / grid.depth  # one depth slice's
    linears = layer_linears(model)
    forward = cov.forward_layers  # recomputed forwards included
    input_grad = cov.layers if cov.backward else 0
    weight_grad = cov.layers if cov.kind in (OpKind.B, OpKind.W) else 0
    out = []
    for h_in, h_out in linears:
        out += summa_comms(q, tokens * h_in * d, h_in * h_out * d, forward, input_grad,
                           weight_grad)
    stats = 2 if model.normalization == "LayerNorm" else 1  # statistics, weights per norm
    norm_f, norm_b, norm_w = norm_passes(cov)
    out += comms(OpKind.ALL_REDUCE, TP_ROW, (norm_f + norm_b) * stats * tokens / q * STAT_BYTES,
                 (norm_f + norm_b) * stats)
    spread, collect = ((OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER) if grid.depth == 1 else
                       (OpKind.BROADCAST, OpKind.REDUCE))  # 2.5D: from and to row 0
    biases = layer_biases(model)
    norm = stats * model.hidden_size  # one norm's weights
    out += comms(spread, TP_COL, (forward * sum(biases) + norm_f * norm) / q * d,
                 forward * len(biases) + norm_f * stats)
    out += comms(collect, TP_COL, (weight_grad * sum(biases) + norm_w * norm) / q * d,
                 weight_grad * len(biases) + norm_w * stats)
    return merged(out + _embedding_and_head(model, cov, q, tokens, d))


def summa_comms(q: int, x: float, w: float, forward: int, input_grad: int,
                weight_grad: int) -> list[Comm]:
    """The broadcasts and reduces of `forward`, `input_grad` and `weight_grad` passes of
    a SUMMA product with input X of `x` bytes and weight W of `w` bytes (whole, T h_in
    and h_in h_out; each step moves a 1/q^2 block of each: module docstring)."""
    x, w = x / q, w / q  # a pass's q steps
    return [*comms(OpKind.BROADCAST, TP_ROW, forward * x, forward * q, in_linear=True),
            *comms(OpKind.BROADCAST, TP_COL, forward * w, forward * q, in_linear=True),
            *comms(OpKind.BROADCAST, TP_COL, input_grad * w, input_grad * q, in_linear=True),
            *comms(OpKind.REDUCE, TP_ROW, input_grad * x, input_grad * q, in_linear=True),
            *comms(OpKind.BROADCAST, TP_ROW, weight_grad * x, weight_grad * q, in_linear=True),
            *comms(OpKind.REDUCE, TP_COL, weight_grad * w, weight_grad * q, in_linear=True)]


def _embedding_and_head(model, cov: Covered, q: int, tokens: float, d: int) -> list[Comm]:
    """The vocabulary-parallel embedding, output layer and cross-entropy (module
    docstring)."""
    out: list[Comm] = []
    f = cov.kind is OpKind.F
    weight_grad = cov.kind in (OpKind.B, OpKind.W)
    if cov.embedding:
        x = tokens * model.hidden_size / q * d
        if f:
            out += comms(OpKind.REDUCE_SCATTER, TP_COL, x, 1)
        if weight_grad:  # its weight gradient needs the gathered output gradient
            out += comms(OpKind.ALL_GATHER, TP_COL, x, 1)
        position = (model.embedding_param_count() - model.vocab_size * model.hidden_size) / q
        out += comms(OpKind.ALL_GATHER, TP_COL, position * d * f, 1)  # Embedding2D's table
        out += comms(OpKind.REDUCE_SCATTER, TP_COL, position * d * weight_grad, 1)
    if cov.head:
        v, h = model.vocab_size, model.hidden_size
        if f:
            out += comms(OpKind.ALL_REDUCE, TP_ROW, 3 * tokens / q * STAT_BYTES, 3)
            out += comms(OpKind.ALL_REDUCE, TP_COL, STAT_BYTES, 1)
        # Y = X W^T: its forward has a linear's input-gradient pattern (W blocks over
        # columns, logit blocks reduced over rows) and its dX = dY W a linear's forward
        out += summa_comms(q, tokens * v * d, v * h * d, int(cov.backward), int(f),
                           int(weight_grad))
    return out


def summa_placements(comms_of_op: list[Comm], q: int) -> list[tuple[Comm, bool]]:
    """Each 2D or 2.5D collective with whether it runs beside its compute op: of the
    SUMMA broadcasts and reduces (`in_linear`), all but the first step of every q
    (Colossal-AI's double buffering); the rest after it, blocking. Collectives of one
    kind, group and placement are one entry (2.5D's vector broadcasts and reduces with
    SUMMA's first steps), so a placed op stands for every collective of its key."""
    out: dict[tuple, Comm] = {}

    def add(c: Comm, alongside: bool) -> None:
        key = (c.kind, c.group, alongside)
        seen = out.get(key)
        out[key] = c if seen is None else Comm(c.kind, c.group, seen.nbytes + c.nbytes,
                                               seen.count + c.count)
    for c in comms_of_op:
        if c.in_linear:
            exposed = c.count // q
            first = round(c.nbytes * exposed / c.count)
            add(Comm(c.kind, c.group, c.nbytes - first, c.count - exposed), True)
            add(Comm(c.kind, c.group, first, exposed), False)
        else:
            add(c, False)
    return [(c, alongside) for (_, _, alongside), c in out.items()]
