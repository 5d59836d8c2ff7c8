"""ZeRO-R partitioned activation checkpoints (Pa) and their CPU offload (Pa+cpu).

Rajbhandari et al., "ZeRO", SC20, section 6.1 (Pa): under tensor (model) parallelism every
TP rank keeps a replica of each activation checkpoint; Pa keeps 1/tp of it per rank and
all-gathers it over tp just before the checkpointed region is recomputed in the backward;
Pa+cpu keeps that partition in host memory. As DeepSpeed runs it
(deepspeed/runtime/activation_checkpointing/checkpointing.py: `partition_activations`
keeps the mp_rank-th 1/mp_size slice of each floating-point checkpointed input, `.cpu()`
under `cpu_checkpointing`; `gather_partitioned_activations` all-gathers the slices over
the model-parallel group in CheckpointFunction.backward) and as Megatron names it
(--distribute-saved-activations, Megatron-Core TransformerConfig).

DeepSpeed is read at commit 2ef4fd5 (microsoft/DeepSpeed).

Rules (ParallelConfig `partition_activations`, `cpu_checkpointing`; `check`):
- Pa needs recompute='full' (only a full recompute keeps checkpoints; Megatron-LM asserts
  recompute_granularity 'full') and tp > 1 (Megatron-LM: 'can distribute recomputed
  activations only across tensor model parallel groups');
- Pa is refused with sequence_parallel: the checkpointed input is then already split over
  tp (2sbh/t, Korthikanti et al. 2022 section 4.2.2), and Megatron-Core's
  TransformerConfig raises 'distribute_saved_activations ... must be false when sequence
  parallel is enabled';
- cpu_checkpointing needs Pa (DeepSpeed's configure(): checkpoint_in_cpu 'only works
  with partition_activation').

Memory, per microbatch per checkpoint on one TP rank: a checkpoint is its region's input,
C = b s h d / cp bytes (K22's 2sbh at d = 2; ModelSpec.layer_activation_bytes 'full').
Pa keeps C / tp on the device; Pa+cpu keeps none there and C / tp in host memory. The
checkpoints of a stage are schedules.recompute's CHECKPOINT layers (ceil(L/N) under
uniform, min(N, L) under block).
Operations (`add_checkpoint_ops`, run by the lowering's intra-layer pass), per compute op,
k = the CHECKPOINT layers it covers (schedules.recompute; one per checkpointed region, so
the groups of a chunked stage sum to the stage's checkpoints):
- Pa: right before each backward (B or I) with k > 0, one blocking all-gather over 'tp' of
  k checkpoints (count k, nccl-tests size S = C each: every rank receives C (tp - 1)/tp);
  the backward waits for it (the recompute needs the whole input), as DeepSpeed gathers
  in CheckpointFunction.backward before rerunning the region;
- Pa+cpu: right after each forward with k > 0, a COPY_D2H of k partitions (count k, C/tp
  bytes each), and right before the backward's all-gather a COPY_H2D of the same bytes,
  both on the GPU's PCIe link to its host (sim.offload) and both blocking the compute
  stream (schedules.contract's checkpoint-copy rule). DeepSpeed: partition_activations()
  copies the partition with `partition.cpu()` (or `copy_` into a CPU buffer) before the
  region's forward runs, a synchronous copy on the compute stream, not a copy on its
  `transport_stream`; gather_partitioned_activations() copies it back with `copy_` into
  a GPU tensor on the compute stream (its transport_stream use is commented out) and then
  all-gathers it. Copies between regions are summed after the forward: the same time on
  one stream.
A chunked backward recomputes a region in the group of its last layer; here its gather
and copy go with the group of its checkpoint layer (the totals are exact).
Units: bytes.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError
from .names import TP
from .ops import INPUT_GRAD_KINDS, Op, OpKind
from .recompute import CHECKPOINT, roles
from .schedule import Schedule

CHECKPOINT_COPIES = "pcie_checkpoints"
"""Group of a Pa+cpu copy: the GPU's PCIe link to its host, like ZeRO-Offload's copies
('pcie', schedules.names) but placed by the checkpoint-copy rule (schedules.contract)."""


def check(parallel: Any) -> None:
    """ConfigError where Pa or Pa+cpu cannot act (module docstring's rules)."""
    if parallel.cpu_checkpointing and not parallel.partition_activations:
        raise ConfigError("cpu_checkpointing=True moves the partitioned activation checkpoints "
                          "to the host: it needs partition_activations (DeepSpeed: 'only "
                          "works with partition_activation')")
    if not parallel.partition_activations:
        return
    if parallel.recompute != "full":
        raise ConfigError(f"partition_activations=True partitions the checkpoints of a full "
                          f"recompute: it needs recompute='full', got {parallel.recompute!r}")
    if parallel.tp == 1:
        raise ConfigError("partition_activations=True splits each checkpoint over the tensor-"
                          "parallel ranks: it needs tp > 1, got tp=1")
    if parallel.sequence_parallel:
        raise ConfigError("partition_activations=True with sequence_parallel: the checkpoints "
                          "are already split over tp by sequence parallelism (Megatron-Core "
                          "refuses distribute_saved_activations with sequence_parallel)")


def checkpoint_bytes(model: Any, parallel: Any) -> float:
    """C: bytes of one layer input a checkpoint holds, per microbatch, before Pa."""
    return model.layer_activation_bytes(parallel.tp, parallel.sequence_parallel,
                                        "full") / parallel.cp


def stage_checkpoints(parallel: Any, layers: int) -> int:
    """Checkpoints a (virtual) stage of `layers` layers keeps per microbatch."""
    return roles(parallel, range(layers))[CHECKPOINT]


def device_fraction(parallel: Any) -> float:
    """Share of a checkpoint one rank keeps on its GPU: 1, 1/tp (Pa) or 0 (Pa+cpu)."""
    if not parallel.partition_activations:
        return 1.0
    return 0.0 if parallel.cpu_checkpointing else 1 / parallel.tp


def stage_activation_bytes(plan: Any) -> tuple[list[int], list[int]]:
    """Per virtual stage, the activation bytes one microbatch keeps (device, host): the
    stage costs' activations, with Pa's partitions on the device or the host."""
    parallel = plan.parallel
    device = [c.activation_bytes for c in plan.stage_costs]
    host = [0] * len(device)
    if not parallel.partition_activations:
        return device, host
    c = checkpoint_bytes(plan.model, parallel)
    for s, cost in enumerate(plan.stage_costs):
        kept = stage_checkpoints(parallel, cost.layers) * c
        device[s] = math.ceil(device[s] - kept * (1 - device_fraction(parallel)))
        if parallel.cpu_checkpointing:
            host[s] = math.ceil(kept / parallel.tp)
    return device, host


_CHECKPOINTING_KINDS = frozenset({OpKind.F, *INPUT_GRAD_KINDS})


def is_checkpoint_copy(op: Op) -> bool:
    """A Pa+cpu host copy of checkpoint partitions (not an offload copy)."""
    return op.kind.is_copy and op.group == CHECKPOINT_COPIES


def checkpoint_ops(plan: Any, op: Op, k: int) -> tuple[list[Op], list[Op]]:
    """(ops posted right before `op`, right after it) under Pa: the all-gather and Pa+cpu's
    copies of forward or backward `op`, which covers `k` checkpoints (module docstring)."""
    if not k:
        return [], []
    parallel = plan.parallel
    c = checkpoint_bytes(plan.model, parallel)

    def make(kind: OpKind, group: str, nbytes: float) -> Op:
        return Op(kind, op.stage, op.microbatch, group, max(1, round(nbytes)), chunk=op.chunk,
                  count=k)

    part = k * c / parallel.tp
    cpu = parallel.cpu_checkpointing
    if op.kind is OpKind.F:
        return [], [make(OpKind.COPY_D2H, CHECKPOINT_COPIES, part)] if cpu else []
    upload = [make(OpKind.COPY_H2D, CHECKPOINT_COPIES, part)] if cpu else []
    return upload + [make(OpKind.ALL_GATHER, TP, k * c)], []


def add_checkpoint_ops(schedule: Schedule, plan: Any) -> Schedule:
    """`schedule` with every compute op's checkpoint_ops; itself without Pa."""
    if not plan.parallel.partition_activations:
        return schedule
    groups, counts = schedule.layer_groups, {}  # (stage, chunk) -> its checkpoints
    programs = []
    for program in schedule.programs:
        out: list[Op] = []
        for op in program:
            if op.kind not in _CHECKPOINTING_KINDS:
                out.append(op)
                continue
            where = (op.stage, op.chunk)
            if where not in counts:
                positions = plan.chunk_parts(op.stage, op.chunk, groups).positions
                counts[where] = roles(plan.parallel, positions)[CHECKPOINT]
            before, after = checkpoint_ops(plan, op, counts[where])
            out += [*before, op, *after]
        programs.append(out)
    return schedule.with_programs(programs)
