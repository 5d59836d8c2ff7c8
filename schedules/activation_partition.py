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
Communication: per checkpoint, per microbatch, in the backward (B or I) that recomputes it,
one all-gather over 'tp' of nccl-tests size S = C (each rank receives C (tp - 1)/tp),
blocking (the recompute needs it), with the op's other TP collectives (schedules.tp_comms).
Under uniform recompute with N > 1, a layer group (Op.chunk) of k recomputed layers counts
ceil(k/N) checkpoints: exact for a whole stage; a group that cuts a region counts it twice.
Pa+cpu's PCIe copies (a synchronous device-to-host copy in the forward, host-to-device
in the backward, in DeepSpeed) are not replayed: the execution contract has no rule that
makes a compute op wait for a host copy, so the simulator refuses it at lowering; its
memory is modelled (schedules.memory_model, `clustersim memory`).
Units: bytes.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError
from .recompute import CHECKPOINT, roles


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


def checkpoint_gathers(model: Any, parallel: Any, rerun_layers: int, backward: bool
                       ) -> tuple[int, float]:
    """(all-gathers, their total bytes) over 'tp' of a compute op whose backward (B or I:
    `backward`) reruns `rerun_layers` layers (module docstring); (0, 0) without Pa."""
    if not (parallel.partition_activations and backward and rerun_layers):
        return 0, 0.0
    if parallel.cpu_checkpointing:
        raise ConfigError("cpu_checkpointing: the PCIe copies of the partitioned checkpoints "
                          "are not simulated (the replay cannot make a recompute wait for a "
                          "host copy); `clustersim memory` models its memory")
    per_checkpoint = parallel.recompute_num_layers if parallel.recompute_method == "uniform" \
        else 1
    gathers = math.ceil(rerun_layers / per_checkpoint)
    return gathers, gathers * checkpoint_bytes(model, parallel)
