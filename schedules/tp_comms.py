"""Tensor (and sequence) parallel communication of one compute op (Megatron-LM).

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM", section 3; SC21 section 2.3): attention
and MLP are each a column-parallel then a row-parallel linear, so a transformer layer
all-reduces its b*s*h activation twice in forward (after the attention and MLP
row-parallel linears: `g`) and twice in backward (the input gradients of the QKV and fc1
column-parallel linears: `f`). Per device per microbatch per layer, a ring moves
4 * 2(t-1)/t * b*s*h*dtype bytes = 8bsh(t-1)/t * dtype (Korthikanti et al. 2022, 4.2.2).
Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): every all-reduce becomes an
all-gather (before the column-parallel linear) and a reduce-scatter (after the
row-parallel one): forward 2 AG + 2 RS per layer, backward 2 RS + 2 AG; the ring volume
is the same (AG + RS = AR). Sizes are nccl-tests' S: b*s*h*dtype / cp (the all-gathered
output, the reduce-scattered input; context parallelism splits the sequence).
Outside the layers:
- vocabulary-parallel embedding: forward all-reduce of its b*s*h output (SP:
  reduce-scatter); backward nothing (SP: all-gather of the gradient);
- output layer (column parallel, vocabulary sharded): forward nothing (SP: all-gather of
  the final norm's output); backward all-reduce of its input gradient (SP: reduce-scatter);
- vocabulary-parallel cross-entropy (Megatron's `_VocabParallelCrossEntropy`): three
  all-reduces of b*s fp32 values in forward (max logit, target logit, sum of exps), none
  in backward. They are latency-bound: 3 alphas each microbatch.
FP8 (dtype 'fp8': Transformer Engine's recipe, schedules.model.DTYPE_BYTES): TE quantizes
a linear layer's GEMM input before the sequence-parallel all-gather that feeds it, in
forward (LayerNormLinear: the norm output is cast to FP8, then gathered) and backward
(TransformerEngineBaseModule.grad_output_preprocess: a row-parallel layer's output
gradient is cast to FP8, then gathered; transformer_engine/pytorch/module/). So a layer's
SP all-gathers move FP8 copies: the forward's one row-wise copy (ModelSpec.
gemm_input_bytes: 1 byte per element, plus block scales), the backward's the row-wise
copy, or both for a block-scaled recipe (ModelSpec.gathered_gradient_bytes). Current
scaling (--fp8-recipe tensorwise) all-reduces each such tensor's fp32 amax over tp before
casting it, so every rank casts with one scale (module/linear.py and layernorm_linear.py:
set_quantizer_amax_reduction_group with SP; csrc/quantizer.cpp quantize_impl): one
latency-bound all-reduce per layer all-gather. Every reduction (all-reduce,
reduce-scatter) sums 16-bit GEMM outputs and stays 16-bit, as do the embedding's and the
output layer's collectives (Megatron's own layers, not TE's) and, without SP, every TP
all-reduce: FP8 then saves no TP traffic at all.
Full recompute repeats the layers' forward communication in the backward. W (weight
gradient) needs no TP communication: dW = x^T dy on local shards. ZeRO-R's all-gathers of
partitioned checkpoints over tp are schedules.activation_partition's (posted before the
backward, which waits for them).
MoE layers (schedules.ep_comms): without sequence parallelism the experts are split
by t as the dense MLP is, so the layer posts the same two all-reduces. With it, Megatron-
Core's MoE layer takes the sequence-sharded tokens to the dispatcher, whose expert-TP
gather and scatter run on 'etp' (schedules.ep_comms); on 'tp' the layer then posts
the attention's all-gather and reduce-scatter only, plus the shared experts' pair (a
TP-split dense MLP, Megatron-Core's SharedExpertMLP) when the model has shared experts.
"""
from __future__ import annotations

from .comm_spec import Comm, Covered, comms
from .ep_comms import experts_split_by_tp
from .model import ModelSpec
from .names import TP
from .ops import OpKind
from .parallel import ParallelConfig

CROSS_ENTROPY_ALL_REDUCES = 3
CROSS_ENTROPY_BYTES = 4  # fp32 per token
AMAX_BYTES = 4  # one fp32 amax (current scaling)


def tp_comms(model: ModelSpec, parallel: ParallelConfig, cov: Covered) -> list[Comm]:
    """The TP collectives of the compute op `cov` describes (module docstring)."""
    t = parallel.tp
    if t == 1:
        return []
    tokens = model.micro_batch_size * model.seq_length / parallel.cp
    x = tokens * model.hidden_size * model.dtype_bytes
    dense_mlps = experts_split_by_tp(parallel) or model.moe_shared_expert_intermediate_size

    def blocks(layers: int, moe_layers: int) -> int:
        """Attention + MLP blocks, one AR (or AG + RS) each per pass; an MoE layer's MLP
        posts TP collectives only as the module docstring says."""
        return layers + (layers if dense_mlps else layers - moe_layers)

    inputs = blocks(cov.forward_layers, cov.forward_moe_layers)  # forward and recompute
    gradients = blocks(cov.layers, cov.moe_layers) if cov.backward else 0
    layer = inputs + gradients
    forward = cov.kind is OpKind.F
    out = []
    if parallel.sequence_parallel:
        gathers = (forward and cov.head) + (cov.backward and cov.embedding)
        scatters = (forward and cov.embedding) + (cov.backward and cov.head)
        te_gathered = tokens * model.hidden_size * (inputs * model.gemm_input_bytes
                                                    + gradients * model.gathered_gradient_bytes)
        if model.fp8 and model.fp8.current_amax:
            out += comms(OpKind.ALL_REDUCE, TP, layer * AMAX_BYTES, layer)
        if parallel.tp_comm_overlap:  # TE's layers' collectives apart: they overlap
            out += comms(OpKind.ALL_GATHER, TP, te_gathered, layer, in_linear=True)
            out += comms(OpKind.REDUCE_SCATTER, TP, layer * x, layer, in_linear=True)
            out += comms(OpKind.ALL_GATHER, TP, gathers * x, gathers)
            out += comms(OpKind.REDUCE_SCATTER, TP, scatters * x, scatters)
        else:
            out += comms(OpKind.ALL_GATHER, TP, te_gathered + gathers * x, layer + gathers)
            out += comms(OpKind.REDUCE_SCATTER, TP, (layer + scatters) * x, layer + scatters)
    else:
        reduces = layer + (forward and cov.embedding) + (cov.backward and cov.head)
        out += comms(OpKind.ALL_REDUCE, TP, reduces * x, reduces)
    if forward and cov.head:
        n = CROSS_ENTROPY_ALL_REDUCES
        out += comms(OpKind.ALL_REDUCE, TP, n * tokens * CROSS_ENTROPY_BYTES, n)
    return out
