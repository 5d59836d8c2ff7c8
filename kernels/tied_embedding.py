"""Megatron's embedding-gradient all-reduce for tied embeddings, run before OPT_STEP.

With tied embeddings (ModelSpec.untie_embeddings_and_output_weights False) the word
embedding of the first stage and the output layer of the last stage are one weight, held
as two copies named `word_embeddings.weight` (kernels.stage). Before the optimizer step
Megatron-LM sums the two copies' gradients over its embedding group, the two ranks at the
pipeline coordinates of the first and the last stage with the same other (dp, tp, ...)
coordinates (megatron/core/distributed/finalize_model_grads.py,
`_allreduce_word_embedding_grads`): both copies then take the same Adam step and stay equal.

The IR has no op for it. The kernels run it in the OPT_STEP of the first and of the last
stage (kernels.dp_ops), after that stage's DP gradient reduction, whose mean is linear (a
sum of DP means is the DP mean of the sums), and before the span of the step: its time is
in no span. It needs each copy's gradient whole on its rank (DDP, zero_stage 0): ZeRO's
sharded flat buffers would need a shard-aligned variant: `check_tied_embeddings`
(run by kernels.launch) refuses it.
Units: elements of the model dtype.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.contract import is_gradient_collective, is_parameter_gather
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import PP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.schedule import Schedule

from .errors import KernelsError
from .stage import StageModule

AXIS = "embedding"  # the process-group name (kernels.worker)
WORD_EMBEDDING = "word_embeddings.weight"


def tied_pipeline_ranks(schedule: Schedule, model: ModelSpec) -> tuple[int, int] | None:
    """(pipeline rank of the first stage, of the last stage) when the model's embeddings
    are tied and those stages are on two different pipeline ranks; else None."""
    if model.untie_embeddings_and_output_weights:
        return
    if schedule.num_stages == 1:
        if any(is_parameter_gather(op) and op.chunk not in (None, 0) for op in schedule.ops()):
            raise KernelsError(
                "tied embeddings with ZeRO-3/FSDP on one pipeline stage: the IR gathers the "
                "word embedding again for the output layer (the last layer group), which "
                "the kernels' parameter units do not (a shared parameter belongs to the "
                "first group, kernels.param_units); set untie_embeddings_and_output_weights "
                "or use zero_stage <= 2")
        return None
    first, last = schedule.rank_of_stage(0), schedule.rank_of_stage(schedule.num_stages - 1)
    return None if first == last else (first, last)


def summing_ranks(schedule: Schedule, model: ModelSpec) -> tuple[int, int] | None:
    """tied_pipeline_ranks when the schedule has an optimizer step (whose OPT_STEPs then
    sum the tied gradient: the embedding group is needed), else None."""
    pair = tied_pipeline_ranks(schedule, model)
    return pair if pair and any(op.kind is OpKind.OPT_STEP for op in schedule.ops()) else None


def embedding_group(parallel: ParallelConfig, rank: int, pair: tuple[int, int]) -> list[int]:
    """Global ranks of `rank`'s embedding group: the ranks at pipeline coordinates `pair`
    whose other coordinates are `rank`'s."""
    along_pp = parallel.group(PP, rank)
    return [along_pp[pair[0]], along_pp[pair[1]]]


def check_tied_embeddings(schedule: Schedule, model: ModelSpec, parallel: ParallelConfig
                          ) -> None:
    """Raise KernelsError for what the sum cannot serve (kernels.launch runs this): the
    first and last stage on one rank (its one shared weight would be stepped or sharded
    once per stage), an OPT_STEP of only one of them, or ZeRO sharding of them."""
    if model.untie_embeddings_and_output_weights or schedule.num_stages == 1:
        return
    ends = (0, schedule.num_stages - 1)
    steps_or_shards = [op for op in schedule.ops() if op.kind is OpKind.OPT_STEP
                       or is_gradient_collective(op) and op.kind is OpKind.REDUCE_SCATTER
                       or is_parameter_gather(op)]
    if tied_pipeline_ranks(schedule, model) is None:
        if steps_or_shards:
            raise KernelsError("tied embeddings with the first and last stage on one rank: "
                               "the IR counts a word-embedding copy per stage, the rank holds "
                               "one shared weight, which two stages' steps or shards would "
                               "update twice; set untie_embeddings_and_output_weights")
        return
    stepped = {op.stage for op in schedule.ops() if op.kind is OpKind.OPT_STEP} & set(ends)
    if stepped and stepped != set(ends):
        raise KernelsError(f"tied embeddings: the schedule steps stage {min(stepped)} but not "
                           f"stage {max(set(ends) - stepped)}; the word-embedding gradient sum "
                           f"before the step (Megatron's embedding all-reduce) needs an "
                           f"OPT_STEP of both the first and the last stage")
    sharded = [op for op in steps_or_shards if op.stage in ends
               and op.kind is not OpKind.OPT_STEP]  # DP reduce-scatters and gathers only
    if stepped and sharded:
        raise KernelsError(
            f"zero_stage={parallel.zero_stage} with tied embeddings on different pipeline "
            f"ranks: the kernels sum the word-embedding gradients of the first and last stage "
            f"before the step (Megatron's embedding all-reduce) only where each copy's "
            f"gradient is whole (DDP, zero_stage=0, or dp=1); op {sharded[0]} shards them "
            f"(sharded flat buffers would need a shard-aligned sum, not implemented); set "
            f"zero_stage=0 or untie_embeddings_and_output_weights", op=str(sharded[0]))


@torch.no_grad()
def sum_tied_grad(module: StageModule, group: Any) -> None:
    """Sum the gradient of `module`'s word-embedding copy over `group`, in place."""
    weight = module.word_embeddings.weight
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    dist.all_reduce(weight.grad, group=group)
