"""Per-stage costs of a pipeline split: FLOPs, bytes and parameters of one rank's stage.

Units: FLOPs, bytes and parameter counts for ONE micro-batch on ONE rank (a TP/CP shard of
the stage). Layers split as schedules.pipeline_split says (evenly by default; the Plan holds
the split and these costs, schedules.plan); stage 0 also holds
the embedding, the last stage the final norm, the output layer and the logits.
FLOP and activation formulas come from `ModelSpec` (SC21, Korthikanti et al. 2022).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .layer_kernels import (Kernel, embedding_forward, head_backward, head_forward,
                            layer_backward, layer_forward, merge, recompute_forward)
from .model import ModelSpec
from .parallel import RECOMPUTE, ParallelConfig
from .recompute import CHECKPOINT, INSIDE, KEPT, roles
from .tp_3d import saved_gathered_bytes, saved_head_bytes
from .tp_grid import grid_layer_params, tp_grid

LOGITS_BYTES = 4  # cross-entropy keeps fp32 logits (Korthikanti et al. 2022, section 4.3)


@dataclass(frozen=True)
class StageCost:
    """Costs of one virtual pipeline stage on one rank, per micro-batch.

    - forward_flops / backward_flops: FLOPs of F and B (B = 2F, under LoRA less the frozen
      weights' gradients, ModelSpec.layer_backward_flops; full recompute adds the
      forward of each recomputed layer, selective the core attention 4bs^2h per layer).
    - activation_bytes: kept from F until B of the same micro-batch.
    - param_count: parameters this rank holds for the stage (unique: the stages of a
      model sum to ModelSpec.param_count() at tp = ep = etp = 1); routed experts are
      E/ep per rank, each split over etp ranks (ModelSpec.layer_param_count).
    - tied_param_count: the copy of the word embedding the last stage keeps for the output
      layer when embeddings are tied and there is more than one stage (Megatron-LM keeps
      it and all-reduces its gradient with stage 0); count it for memory, not for totals.
    - expert_param_count: the routed experts' part of param_count
      (ModelSpec.layer_expert_param_count), whose gradients Megatron-Core reduces over the
      expert data-parallel group (schedules.data_parallel).
    - grad_bytes: the stage's gradients in the model dtype, (param_count + tied) *
      dtype_bytes: what a DP gradient all-reduce of the stage moves (PyTorch DDP reduces
      in the parameter dtype).
    - boundary_bytes: the activation sent to the next stage, b*s*h*dtype_bytes / cp
      (/ tp with sequence parallelism); 0 on the last stage.
    - frozen_param_count / frozen_weight_bytes: under LoRA, the frozen parameters this rank
      holds (the base, the tied copy included) and their bytes as stored (QLoRA's
      quantized linear weights, ModelSpec.layer_frozen_weight_bytes); param_count,
      tied_param_count, grad_bytes and expert_param_count then count the adapters only
      (what trains, reduces and shards: the embedding and output layer train no more).
      0 without LoRA.
    - forward_kernels / backward_kernels: the kernels F and B run (schedules.layer_kernels,
      merged by name over the stage's layers; B includes recomputation), whose FLOPs sum
      to forward_flops / backward_flops; forward_bytes / backward_bytes are their HBM
      bytes, summed.
    """

    layers: int
    forward_flops: float
    backward_flops: float
    activation_bytes: int
    param_count: int
    boundary_bytes: int
    forward_bytes: int
    backward_bytes: int
    tied_param_count: int = 0
    grad_bytes: int = 0
    expert_param_count: int = 0
    frozen_param_count: int = 0
    frozen_weight_bytes: int = 0
    forward_kernels: tuple[Kernel, ...] = ()
    backward_kernels: tuple[Kernel, ...] = ()


def embedding_activation_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Embedding dropout mask, sbh bytes (/t with SP) — Korthikanti et al. 2022, 4.3; none
    under LoRA (nothing before the first layer trains, so autograd keeps no mask)."""
    if model.lora:
        return 0.0
    sp = parallel.tp if parallel.activations_split else 1
    return model.seq_length * model.micro_batch_size * model.hidden_size / (sp * parallel.cp)


def layer_stored_bytes(model: ModelSpec, parallel: ParallelConfig,
                       recompute: str = "none") -> float:
    """Bytes one layer keeps for its backward per micro-batch on one rank, under
    `recompute`: ModelSpec.layer_activation_bytes / cp, plus under 3D tensor parallelism
    the gathered linear inputs and weights it saves (schedules.tp_3d; a full recompute
    gathers them again in the backward)."""
    stored = model.layer_activation_bytes(parallel.tp, parallel.activations_split,
                                          recompute) / parallel.cp
    if parallel.tp_mode == "3d" and recompute != "full":
        stored += saved_gathered_bytes(model, parallel)
    return stored


def output_activation_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Final-norm input and output-projection input, 2sbh each in 16 bit (/t with SP), and
    fp32 logits 4sbV/t: with SP Korthikanti et al. 2022's 4sbh/t (1 + V/h), section 4.3.
    Under LoRA the frozen output layer's dX needs its weight alone: not its input."""
    sb, t = model.seq_length * model.micro_batch_size, parallel.tp
    sp = t if parallel.activations_split else 1
    inputs = (1 if model.lora else 2) * sb * model.hidden_size * model.dtype_bytes / sp
    gathered = saved_head_bytes(model, parallel) if parallel.tp_mode == "3d" else 0.0
    return (inputs + LOGITS_BYTES * sb * model.vocab_size / t) / parallel.cp + gathered


def costs_for_layers(model: ModelSpec, parallel: ParallelConfig, counts: Sequence[int],
                     positions: Sequence[range] | None = None) -> list[StageCost]:
    """Costs of consecutive stages holding `counts[i]` layers each (summing to the model's
    layers): the first also holds the embedding, the last the head. `positions[i]`: where
    stage i's layers sit in their (virtual) pipeline stage (default: the whole stage,
    range(counts[i])); a full recompute's method picks by position which layers keep what
    and rerun their forward (schedules.recompute).

    Per-layer FLOPs divide by tp * cp (TP shards every GEMM; CP splits the sequence, and
    each CP rank's queries attend to the whole sequence, so the s^2 term divides by cp too).
    Logits FLOPs divide likewise (vocab-parallel output layer). Activations divide by cp.
    """
    if sum(counts) != model.num_layers:
        raise ConfigError(f"stage layer counts {list(counts)} must sum to num_layers="
                          f"{model.num_layers}")
    num_stages = len(counts)
    tp, cp, d = parallel.tp, parallel.cp, model.dtype_bytes
    shard = tp * cp
    layer_fwd = model.layer_forward_flops() / shard
    layer_skipped = model.skipped_weight_gradient_flops() / shard
    if positions is None:
        positions = [range(c) for c in counts]
    if [len(p) for p in positions] != list(counts):
        raise ConfigError(f"positions {list(positions)} must hold counts {list(counts)} layers")
    recompute_flops = {"none": 0.0, "full": layer_fwd,
                       "selective": model.attention_core_flops() / shard}[parallel.recompute]
    stored = {how: layer_stored_bytes(model, parallel, how) for how in RECOMPUTE}
    grid = tp_grid(parallel)
    layer_params = (model.layer_param_count(tp, parallel.ep, etp=parallel.etp)
                    if grid is None else grid_layer_params(model, grid))
    layer_experts = model.layer_expert_param_count(tp, parallel.ep, etp=parallel.etp)
    layer_adapters = model.layer_adapter_param_count(tp)
    layer_frozen = model.layer_frozen_weight_bytes(tp) if model.lora else 0.0
    layer_kernels_f = layer_forward(model, parallel)
    layer_kernels_b = layer_backward(model, parallel)
    layer_kernels_redo = recompute_forward(model, parallel)
    word = (model.vocab_size * model.hidden_size  # vocab-parallel embedding / output
            / (grid.matrix_shards if grid else tp))
    position = ((model.embedding_param_count() - model.vocab_size * model.hidden_size)
                / (grid.position_shards if grid else 1))
    boundary = model.micro_batch_size * model.seq_length * model.hidden_size * d / cp
    if parallel.activations_split:
        boundary /= tp

    costs = []
    for stage, layers in enumerate(counts):
        first, last = stage == 0, stage == num_stages - 1
        fwd = layers * layer_fwd
        role = roles(parallel, positions[stage])
        if parallel.recompute == "full":
            redone = role[CHECKPOINT] + role[INSIDE]
            act = role[CHECKPOINT] * stored["full"] + role[KEPT] * stored["none"]
        else:
            redone, act = layers, layers * stored[parallel.recompute]
        bwd = 2 * fwd - layers * layer_skipped + redone * recompute_flops
        params = layers * layer_params
        tied = 0.0
        kernels_f = [k.scaled(layers) for k in layer_kernels_f]
        kernels_b = ([k.scaled(layers) for k in layer_kernels_b]
                     + [k.scaled(redone) for k in layer_kernels_redo])
        if first:
            act += embedding_activation_bytes(model, parallel)
            params += word + position
            kernels_f += embedding_forward(model, parallel)
            if not model.lora:  # dropout and scatter-add grads; frozen: none
                kernels_b += embedding_forward(model, parallel)
        if last:
            kernels_f += head_forward(model, parallel)
            kernels_b += head_backward(model, parallel)
            logits = model.logits_forward_flops() / shard
            fwd, bwd = fwd + logits, bwd + model.logits_backward_passes * logits
            act += output_activation_bytes(model, parallel)
            params += model.final_norm_param_count() / (grid.vector_shards if grid else 1)
            if model.untie_embeddings_and_output_weights:
                params += word
            elif not first:
                tied = word
        frozen = frozen_bytes = 0.0
        if model.lora:  # the model's parameters are frozen; its adapters train
            frozen = params + tied
            frozen_bytes = d * (frozen - layers * layer_params) + layers * layer_frozen
            params, tied = layers * layer_adapters, 0.0
        weight_bytes = (params + tied) * d
        kernels_f, kernels_b = merge(kernels_f), merge(kernels_b)
        costs.append(StageCost(
            layers=layers, forward_flops=fwd, backward_flops=bwd,
            activation_bytes=math.ceil(act), param_count=math.ceil(params),
            boundary_bytes=0 if last else math.ceil(boundary),
            forward_bytes=math.ceil(sum(k.nbytes for k in kernels_f)),
            backward_bytes=math.ceil(sum(k.nbytes for k in kernels_b)),
            tied_param_count=math.ceil(tied), grad_bytes=math.ceil(weight_bytes),
            expert_param_count=math.ceil(layers * layer_experts),
            frozen_param_count=math.ceil(frozen), frozen_weight_bytes=math.ceil(frozen_bytes),
            forward_kernels=kernels_f, backward_kernels=kernels_b))
    return costs
