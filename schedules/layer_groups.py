"""Layer groups (`Op.chunk`): which layers of a stage a chunk covers, and what it costs.

A stage of L layers splits into G = `Schedule.layer_groups` groups of L/G consecutive
layers (G must divide L: data-parallel passes pick G that way); group g covers layers
g*L/G .. (g+1)*L/G - 1 of the stage, chunk None the whole stage. A group costs the layers
it covers, plus the embedding if it is group 0 of stage 0 and the head (final norm,
output layer, logits) if it is the last group of the last stage: exactly the costs of
stage s*G+g of the same model split into S*G stages of 1/G of each stage's layers
(schedules.costs.costs_for_layers), except that the
tied output-embedding copy that schedules.costs gives a last stage of a multi-stage split
belongs to a group only when the real split has more than one stage.

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
    """Raise ConfigError unless `groups` layer groups split `layers` layers evenly."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"layer_groups must be a positive integer, got {groups!r}")
    if layers % groups:
        raise ConfigError(f"layer_groups={groups} must divide the {layers} layers of a stage")


def chunk_layers(layers: int, groups: int, chunk: int | None) -> range:
    """Indices (within the stage) of the layers that layer group `chunk` of a stage of
    `layers` layers covers, the stage split into `groups` groups; None = all of them."""
    if chunk is None:
        return range(layers)
    check_groups(layers, groups)
    if not 0 <= chunk < groups:
        raise ConfigError(f"chunk {chunk} out of range 0..{groups - 1}")
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
    local = chunk_layers(counts[stage], groups, chunk)
    return ChunkParts(range(first + local.start, first + local.stop), local,
                      embedding=stage == 0 and chunk in (None, 0),
                      head=stage == len(counts) - 1 and chunk in (None, groups - 1))


def group_costs(model: ModelSpec, parallel: ParallelConfig, counts: Sequence[int],
                groups: int) -> list[list[StageCost]]:
    """`costs[s][g]`: the cost of layer group g of stage s, the stages holding `counts`
    layers each (module docstring)."""
    if groups == 1:
        return [[c] for c in costs_for_layers(model, parallel, counts)]
    for layers in counts:
        check_groups(layers, groups)
    fine = costs_for_layers(model, parallel, [c // groups for c in counts for _ in range(groups)],
                            [chunk_layers(c, groups, g) for c in counts for g in range(groups)])
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
    unit per layer), so G = layers per stage; otherwise gradients reduce in buckets, and G
    is the most groups (dividing every stage's layers) whose layers still fill at least one
    bucket each."""
    if parallel.zero_stage == 3 and moves_gradients(parallel):
        return model.num_layers // len(counts)
    layers = math.gcd(*counts)
    per_layer = (model.layer_param_count(parallel.tp, parallel.ep, etp=parallel.etp)
                 * model.dtype_bytes)
    for size in range(1, layers + 1):
        if layers % size == 0 and size * per_layer >= parallel.grad_bucket_bytes:
            return layers // size
    return 1
