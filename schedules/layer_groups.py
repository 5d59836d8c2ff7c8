"""Layer groups (`Op.chunk`): which layers of a stage a chunk covers, and what it costs.

A stage of L layers splits into G = `Schedule.layer_groups` groups of consecutive layers,
chunk None being the whole stage:
- G divides L (the bucketed pass's G always, ZeRO-3's on an even split): group g covers
  layers g*L/G .. (g+1)*L/G - 1 of the stage;
- G > L: one layer or none per group. ZeRO-3 / FSDP runs one unit per layer and takes G =
  the most layers any stage holds (data_parallel_groups), so a stage of an uneven split
  (the embedding and the loss taking a layer slot: [3, 4, ..., 4, 3]) is G - L groups
  short. On the first stage the empty groups lead, so its group 0 holds the embedding
  alone; on every other stage they trail, so the last stage's last group holds the head
  alone. That is torchtitan's FSDP2 wrapping (models/llama3/infra/parallelize.py,
  apply_fsdp: one fully_shard of tok_embeddings, one per transformer block, one of
  [norm, output]), where each stage of such a split runs exactly G units; on an even
  split the embedding and the head ride with their stage's first and last layer instead.
  Any other group without a layer (a middle stage short of layers, an end stage short of
  more than one) has no parameters or compute (schedules.zero3 gathers and reduces no
  such group);
- otherwise the split is refused (check_groups).
A group costs the layers it covers, plus the embedding if it is group 0 of stage 0 and the
head (final norm, output layer, logits) if it is the last group of the last stage:
exactly the costs of the S*G stages of the same model each holding one group's layers
(schedules.costs.costs_for_layers), except that the tied output-embedding copy that
schedules.costs gives a last stage of a multi-stage split belongs to a group only when the
real split has more than one stage.

Units: as schedules.costs (FLOPs, bytes, parameter counts per micro-batch per rank).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .costs import StageCost, costs_for_layers
from .errors import ConfigError
from .model import ModelSpec
from .parallel import ParallelConfig
from .sharding import moves_gradients


def check_groups(layers: int, groups: int) -> None:
    """Raise ConfigError unless `groups` layer groups split a stage of `layers` layers:
    evenly, or at most one layer per group (module docstring)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"layer_groups must be a positive integer, got {groups!r}")
    if layers % groups and groups < layers:
        raise ConfigError(f"layer_groups={groups} must divide the {layers} layers of a stage "
                          f"or be at least that many (one layer or none per group)")


def chunk_layers(layers: int, groups: int, chunk: int | None, first: bool = False) -> range:
    """Indices (within the stage) of the layers that layer group `chunk` of a stage of
    `layers` layers covers, the stage split into `groups` groups; None = all of them.
    `first`: the stage is the pipeline's first, whose groups without layers lead."""
    if chunk is None:
        return range(layers)
    check_groups(layers, groups)
    if not 0 <= chunk < groups:
        raise ConfigError(f"chunk {chunk} out of range 0..{groups - 1}")
    if groups > layers:  # one layer or none per group (module docstring)
        index = chunk - (groups - layers if first else 0)
        return range(min(max(index, 0), layers), min(max(index + 1, 0), layers))
    size = layers // groups
    return range(chunk * size, (chunk + 1) * size)


@dataclass(frozen=True)
class ChunkParts:
    """What a compute op of one (stage, layer group) runs: its transformer layers (global
    indices, model order; `positions`: the same layers' places in their stage), whether
    it holds the embedding (group 0 of stage 0) and the head (final norm, output layer,
    loss: the last group of the last stage)."""

    layers: range
    positions: range
    embedding: bool
    head: bool


def chunk_parts(counts: Sequence[int], stage: int, chunk: int | None,
                groups: int) -> ChunkParts:
    """The parts layer group `chunk` (None: the whole stage) of `stage` runs, the stages
    holding `counts` layers each and split into `groups` groups (module docstring)."""
    first = sum(counts[:stage])
    local = chunk_layers(counts[stage], groups, chunk, first=stage == 0)
    return ChunkParts(range(first + local.start, first + local.stop), local,
                      embedding=stage == 0 and chunk in (None, 0),
                      head=stage == len(counts) - 1 and chunk in (None, groups - 1))


def group_costs(model: ModelSpec, parallel: ParallelConfig, counts: Sequence[int],
                groups: int) -> list[list[StageCost]]:
    """`costs[s][g]`: the cost of layer group g of stage s, the stages holding `counts`
    layers each (module docstring)."""
    if groups == 1:
        return [[c] for c in costs_for_layers(model, parallel, counts)]
    spans = [chunk_layers(c, groups, g, first=s == 0)
             for s, c in enumerate(counts) for g in range(groups)]
    fine = costs_for_layers(model, parallel, [len(r) for r in spans], spans)
    num_stages = len(counts)
    if num_stages == 1 and fine[-1].tied_param_count:
        last = fine[-1]
        dtype = model.dtype_bytes
        fine[-1] = dataclasses.replace(last, tied_param_count=0,
                                       grad_bytes=last.grad_bytes - last.tied_param_count * dtype)
    return [fine[s * groups:(s + 1) * groups] for s in range(num_stages)]


def data_parallel_groups(model: ModelSpec, parallel: ParallelConfig,
                         counts: Sequence[int]) -> int:
    """G, the layer groups per stage of the data-parallel pass (schedules.data_parallel):
    ZeRO-3 / FSDP gathers one layer at a time (torch's transformer auto-wrap: one FSDP
    unit per layer), so G = the most layers a stage holds (a stage holding fewer has
    groups without layers, module docstring); otherwise gradients reduce in buckets, and
    G is the most groups (dividing every stage's layers) whose layers' trained gradients
    (under LoRA the adapters') still fill at least one bucket each."""
    if parallel.zero_stage == 3 and moves_gradients(parallel):
        return max(counts)
    layers = math.gcd(*counts)
    trained = (model.layer_adapter_param_count(parallel.tp) if model.lora
               else model.layer_param_count(parallel.tp, parallel.ep, etp=parallel.etp))
    per_layer = trained * model.dtype_bytes
    for size in range(1, layers + 1):
        if layers % size == 0 and size * per_layer >= parallel.grad_bucket_bytes:
            return layers // size
    return 1
