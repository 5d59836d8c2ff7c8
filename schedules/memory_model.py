"""Per-rank device (and host) memory of one training iteration, without simulating time.

Units: bytes. One RankMemory per pipeline rank; ranks that differ only by their TP, CP or
DP coordinate hold the same bytes (TP shards are equal, DP/ZeRO shards are equal).

Model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20, sections 3.1 and 5.1; Psi = parameters of this rank, N = ranks
the state is sharded over, K = optimizer bytes per parameter):
    stage 0  (2 + 2 + K) Psi            stage 2  2 Psi + (2 + K) Psi / N
    stage 1  2 Psi + 2 Psi + K Psi / N  stage 3  (2 + 2 + K) Psi / N
Mixed-precision Adam: 16-bit weights and gradients (2 + 2 bytes) and K = 12 (fp32 master
weights, momentum, variance). An fp32 model keeps 4-byte weights and gradients and K = 8
(no master copy). Under fp16 the optimizer also holds an fp32 copy of each gradient for
its step (`optimizer_memory_bytes`: K + 4 on the device; checkpoints and swaps hold K):
Megatron-LM's fp16 optimizer copies its main grads to fp32 beside its fp32 main params,
20 B/param, 4 + 16/d under the distributed optimizer (Megatron-LM docs,
distrib_optimizer.md, "fp16 param, fp16 grads"), as DeepSpeed's fp16 optimizers keep
fp32 gradients (partitions under ZeRO). bf16 keeps the ZeRO paper's 2 + 2 + 12:
Megatron-LM's bf16 training accumulates and reduces its gradients in fp32 instead (18
B/param, the same table), which the model does not follow (sim.cli.megatron_args
refuses --accumulate-allreduce-grads-in-fp32; schedules.data_parallel says so in a
run's warnings). Psi of a rank = its pipeline stages' parameters on one TP shard
(schedules.costs: layers / tp, routed experts E/ep per rank split over etp ranks, the
embedding on the first stage, the output layer or the tied embedding copy on the last).
N = dp * cp, or the hybrid shard group (schedules.sharding.state_shard_degree, from the
plan's shard group). The routed experts' state shards over Megatron-Core's expert
data-parallel group instead (N_e = edp = tp*cp*dp / (etp*ep) ranks) where that group
differs (Plan.expert_grad_group, as the data-parallel passes reduce their gradients):
each sharded term is then Psi_dense / N + Psi_experts / N_e. A bare parameter count
splits evenly over pp * tp ranks.

Extras:
- ZeRO++ hpZ keeps a secondary 16-bit parameter shard inside the node: 2 Psi / n_node
  (Wang et al., "ZeRO++", 2023, section 3.2), counted as model state.
- ZeRO-Offload (Ren et al., ATC21): the optimizer partition (K Psi / N, fp32 master
  weights included) lives on the host: `host`, not on the device. With ZeRO-Infinity's
  NVMe tier (offload_device 'nvme'; Rajbhandari et al. SC21) it lives on the node's NVMe
  (`nvme`), and host memory keeps DeepSpeed's pinned swap buffers only
  (runtime/swap_tensor/optimizer_utils.py: SwapBufferManager of `buffer_count` fp32 buffers
  of the largest optimizer sub-group's partition, stage3.py `largest_numel`):
  NVME_SWAP_BUFFERS x 4 B x min(Psi / N, NVME_SUB_GROUP) at DeepSpeed's defaults
  (offload_optimizer.buffer_count 4, zero_optimization.sub_group_size 1e9 elements;
  a sub-group may overrun 1e9 by one tensor's partition, not counted). DeepSpeed's fp32
  gradient partitions (swapped out in the backward, in at the step) are not counted, as
  ZeRO-Offload's host gradients are not.
- FP8 weight copies (dtype 'fp8'): Transformer Engine keeps an FP8 row-wise and
  column-wise copy of each FP8-GEMM weight beside the 16-bit weights (Psi_8 =
  ModelSpec.layer_fp8_weight_count per layer; cached across microbatches, TE
  module/linear.py quantize_weight): `fp8_weights` = 2 (1 + scale bytes) Psi_8
  (Fp8Recipe.cached_weight_bytes; 2 Psi_8 per-tensor: a weight and its transpose, as
  Hopper's FP8 GEMMs need), counted as model state as hpZ's copy is. With ZeRO-3 on
  one stage only the gathered units have copies (TE casts FSDP2's gathered weights).
  FP8 parameters (ModelSpec.fp8_param_gather, Megatron's --fp8-param-gather): the
  parameter IS the row-wise FP8 copy and its column-wise copy (a transpose on Hopper,
  TE tensor/utils.py post_all_gather_processing) stays with it, so `fp8_weights` is
  unchanged and the 16-bit copy of those weights, w Psi_8, leaves the unsharded
  weights: `parameters` under ZeRO 1/2, `gathered_parameters` under ZeRO-3 (whose
  16-bit shard stays, as torchao's FSDP2 float8 all-gather keeps it; Megatron-FSDP's
  FP8 shard, w Psi_8 / N less, is not modelled). fp32 master weights stay in K.
- Stashed weight versions (PipeDream, PipeDream-2BW; schedules.weight_stashing): a rank
  holding v versions keeps v - 1 copies of its weights beside the live ones,
  `stashed_weights` = (v - 1) w Psi (w: the model dtype's weight bytes; v = pp - rank for
  PipeDream, 2 for 2BW: Narayanan et al. 2021, section 3.1), counted as model state.
- LoRA / QLoRA (ModelSpec.lora, schedules.lora): Psi is the adapters' parameters, which
  alone have gradients and (K = 12, mixed-precision Adam) optimizer states and shard
  under ZeRO-1/2; the frozen base adds its stored bytes to `parameters`, unsharded (16-bit,
  or QLoRA's 4-bit + block scales: schedules.costs frozen_weight_bytes).
- Activations: the stage's bytes per microbatch (ModelSpec.layer_activation_bytes,
  Korthikanti et al. 2022 Table 2; TE's GEMM inputs in FP8 under 'fp8'; via
  schedules.costs) times the microbatches the rank holds at its peak, found by walking
  the schedule's programs (GPipe M; 1F1B min(P - rank, M); interleaved per Megatron)
  with schedules.timeline.peak_in_flight. ZeRO-R's partitioned checkpoints (Pa, Pa+cpu)
  keep 1/tp of each checkpoint there, or none there and 1/tp in `host`
  (schedules.activation_partition).
- Recompute working set (full recompute): the backward of one checkpointed region
  regenerates that region's activations, all of them, before freeing them: N layers'
  under uniform, one layer's under block (schedules.recompute.working_layers), of the
  rank's largest virtual stage, at no-recompute bytes per layer (K22 Table 2). K22's
  2sbhL of section 5 leaves this transient out.
- Communication buffers: two gradient buckets in flight when dp > 1 (bucket_bytes,
  torch DDP's 25 MiB by default).
- Gathered parameters (ZeRO-3/FSDP): the unsharded 16-bit parameters of the current and
  the prefetched unit (one transformer layer), or of every layer when
  reshard_after_forward is off, since they then stay gathered until the backward.
- FSDP with a pipeline (zero_stage 3, pp > 1; FSDP2 under torch.distributed.pipelining,
  schedules.zero3): no unit is resharded after a backward and gradient sync is off until
  the stage's last backward, so during the step a rank holds its stages' whole unsharded
  parameters, `gathered_parameters` = w Psi (with reshard_after_forward on too: after a
  backward every unit stays gathered, and a forward reshards only the unit it ran), and
  their unsharded accumulated gradients, `unsharded_gradients` = w Psi (w: bytes per
  16-bit weight; torch accumulates them in the reduce dtype, which torchtitan's
  mixed_precision_reduce='float32' default would make 4 bytes: we count the model dtype).
  The ZeRO-3 terms stay (2 + 2 + K) Psi / N: the shards persist between steps. ZeRO-2
  with a pipeline (Megatron-FSDP optim_grads) reduce-scatters every microbatch and keeps
  ZeRO-2's (2 + (2 + K) / N) Psi plus its buckets.
A bare parameter count has neither activations nor buffers: model states only.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .activation_partition import stage_activation_bytes
from .costs import layer_stored_bytes
from .errors import ConfigError
from .names import COMPUTE_LANE
from .parallel import ParallelConfig
from .plan import Plan
from .recompute import working_layers
from .registry import schedule_entry
from .schedule import Schedule
from .sharding import hpz_degree, shard_group_size, state_shard_degree
from .timeline import Span, peak_in_flight
from .tp_grid import tp_grid

MIXED_PRECISION_K = 12  # fp32 master weights + Adam momentum + variance, bytes/parameter
FP16_GRADIENT_COPY = 4  # fp16: the optimizer's fp32 copy of each gradient, bytes/parameter
FP32_K = 8  # Adam momentum + variance; the fp32 weights are the master copy
PREFETCHED_UNITS = 2  # ZeRO-3: the unit computing now and the one being gathered
BUCKETS_IN_FLIGHT = 2  # one bucket reducing while the next one fills
NVME_SWAP_BUFFERS = 4  # DeepSpeed offload_optimizer.buffer_count default (offload_config.py)
NVME_SUB_GROUP = 10**9  # DeepSpeed zero_optimization.sub_group_size default, elements
FP32_BYTES = 4  # DeepSpeed's optimizer swap buffers hold fp32 elements


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank of pipeline rank `pp_rank` holds at its peak (see module docstring).
    `params` is Psi (a count, before ZeRO sharding); `in_flight` the microbatches whose
    activations it holds at the peak; `host` the bytes offloaded to host memory (optimizer
    state or its NVMe swap buffers, Pa+cpu checkpoints); `nvme` the optimizer state on the
    node's NVMe (ZeRO-Infinity). Under LoRA `params` counts the adapters (what trains) and
    `frozen_params` the frozen base, whose stored bytes `parameters` includes."""

    pp_rank: int
    params: float
    parameters: float
    gradients: float
    optimizer_states: float
    hpz_secondary: float = 0.0
    fp8_weights: float = 0.0
    activations: float = 0.0
    communication_buffers: float = 0.0
    gathered_parameters: float = 0.0
    unsharded_gradients: float = 0.0
    recompute_working: float = 0.0
    host: float = 0.0
    nvme: float = 0.0
    in_flight: int = 0
    frozen_params: float = 0.0
    stashed_weights: float = 0.0

    @property
    def model_states_bytes(self) -> float:
        """Parameters + gradients + optimizer states on the device (ZeRO's Table 1), and
        the weights' extra copies (hpZ's secondary shard, TE's FP8 copies, stashed
        versions)."""
        return (self.parameters + self.gradients + self.optimizer_states + self.hpz_secondary
                + self.fp8_weights + self.stashed_weights)

    @property
    def total_bytes(self) -> float:
        """Device bytes at the peak: model states, activations, the recompute working set,
        buffers, gathered parameters and (FSDP with a pipeline) unsharded gradients."""
        return (self.model_states_bytes + self.activations + self.recompute_working
                + self.communication_buffers + self.gathered_parameters
                + self.unsharded_gradients)

    def to_dict(self) -> dict:
        return {**asdict(self), "model_states_bytes": self.model_states_bytes,
                "total_bytes": self.total_bytes}


def precision_bytes(dtype: str = "bf16") -> tuple[int, int]:
    """(bytes per weight or gradient, optimizer state bytes per parameter K: what a
    checkpoint holds and an offloaded optimizer swaps) for a model dtype: 16-bit (and fp8,
    whose master weights are kept in 16 bit) -> (2, 12); fp32 -> (4, 8)."""
    return (4, FP32_K) if dtype == "fp32" else (2, MIXED_PRECISION_K)


def optimizer_memory_bytes(dtype: str = "bf16") -> int:
    """Bytes per parameter the optimizer holds in memory: K, plus the fp32 gradient copy
    under fp16 (module docstring): 12, 16 for fp16, 8 for fp32."""
    return precision_bytes(dtype)[1] + (FP16_GRADIENT_COPY if dtype == "fp16" else 0)


def model_states(params: float, parallel: ParallelConfig, dtype: str = "bf16",
                 shard_group: int | None = None, experts_apart: float = 0.0
                 ) -> dict[str, float]:
    """Parameters, gradients, optimizer states, hpZ secondary shard, host and (with
    offload_device 'nvme' only) NVMe bytes of a rank holding `params` parameters, per ZeRO
    stage (module docstring); `shard_group`: the hybrid or hpZ shard group
    (Plan.dp_shard_size), from which N follows
    (schedules.sharding.state_shard_degree); `experts_apart`: the routed experts' part of
    `params` when it shards over edp ranks instead (Plan.expert_grad_group)."""
    weight, k = precision_bytes(dtype)[0], optimizer_memory_bytes(dtype)
    stage = parallel.zero_stage
    n = state_shard_degree(parallel, shard_group)

    def per_rank(from_stage: int) -> float:
        """Parameters whose state a rank keeps, when that state is sharded from ZeRO
        stage `from_stage` on."""
        if stage < from_stage:
            return params
        return (params - experts_apart) / n + experts_apart / parallel.edp

    optimizer = k * per_rank(1)
    states = {
        "parameters": weight * per_rank(3),
        "gradients": weight * per_rank(2),
        "optimizer_states": 0.0 if parallel.offload else optimizer,
        "host": optimizer if parallel.offload else 0.0,
        "hpz_secondary": 0.0,
    }
    if parallel.nvme_offload:
        states.update(nvme=optimizer, host=nvme_swap_buffer_bytes(per_rank(1)))
    if parallel.hpz:
        states["hpz_secondary"] = weight * params / hpz_degree(parallel, shard_group)
    return states


def nvme_swap_buffer_bytes(shard_params: float) -> float:
    """Pinned host bytes of DeepSpeed's NVMe optimizer swap buffers for a rank stepping
    `shard_params` parameters (module docstring)."""
    return NVME_SWAP_BUFFERS * FP32_BYTES * min(shard_params, NVME_SUB_GROUP)


def activation_peaks(schedule: Schedule, stage_bytes: Sequence[float]
                     ) -> tuple[dict[int, float], dict[int, int]]:
    """Per pipeline rank: the peak activation bytes held (stage s weighs stage_bytes[s]),
    and the peak number of microbatch-stages held. A rank's activations change only with
    its own compute ops, so unit-time steps in program order give the exact peaks."""
    spans = [Span(rank, COMPUTE_LANE, op, step, step + 1)
             for rank, program in enumerate(schedule.programs)
             for step, op in enumerate(o for o in program if o.kind.is_compute)]
    return (peak_in_flight(spans, lambda op: stage_bytes[op.stage]), peak_in_flight(spans))


def _buffers(plan: Plan, rank_params: float, layers_here: int) -> dict[str, float]:
    """Gradient buckets, ZeRO-3 gathered parameters and (FSDP with a pipeline) unsharded
    gradients of a rank (module docstring)."""
    model, parallel = plan.model, plan.parallel
    weight, _ = precision_bytes(model.dtype)
    buckets = gathered = unsharded = 0.0
    if parallel.grad_replicas > 1:
        buckets = min(BUCKETS_IN_FLIGHT * parallel.grad_bucket_bytes, weight * rank_params)
    if parallel.zero_stage == 3 and parallel.pp > 1:
        gathered = unsharded = pipelined_fsdp_buffers(rank_params, model.dtype)
    elif parallel.zero_stage == 3:
        unit = weight * model.layer_param_count(parallel.tp, parallel.ep, etp=parallel.etp)
        gathered = unit * _unsharded_layers(parallel, layers_here)
    return {"communication_buffers": buckets, "gathered_parameters": gathered,
            "unsharded_gradients": unsharded}


def _unsharded_layers(parallel: ParallelConfig, layers_here: int) -> int:
    """Layers of a rank whose parameters are unsharded at its peak: all of them, but with
    ZeRO-3 on one stage the current and the prefetched unit (all of them without
    reshard_after_forward)."""
    if parallel.zero_stage < 3 or parallel.pp > 1:
        return layers_here
    units = PREFETCHED_UNITS if parallel.reshard_after_forward else layers_here
    return min(units, layers_here)


def _fp8_weight_bytes(plan: Plan, layers_here: int) -> float:
    """TE's FP8 copies of the FP8-GEMM weights of a rank's `layers_here` layers (module
    docstring); 0 without FP8."""
    model, parallel = plan.model, plan.parallel
    if model.fp8 is None:
        return 0.0
    per_layer = model.layer_fp8_weight_count(parallel.tp, parallel.ep, etp=parallel.etp)
    return model.fp8.cached_weight_bytes * per_layer * _unsharded_layers(parallel, layers_here)


def _fp8_param_saving(plan: Plan, layers_here: int) -> float:
    """The 16-bit copy of the TE linear weights of a rank's unsharded layers that FP8
    parameters do without (module docstring); 0 without fp8_param_gather."""
    model, parallel = plan.model, plan.parallel
    if not model.fp8_param_gather:
        return 0.0
    per_layer = model.layer_fp8_weight_count(parallel.tp, parallel.ep, etp=parallel.etp)
    return model.dtype_bytes * per_layer * _unsharded_layers(parallel, layers_here)


def pipelined_fsdp_buffers(params: float, dtype: str = "bf16") -> float:
    """Bytes of each of the two whole-stage unsharded buffers FSDP keeps through a
    pipelined step (module docstring): parameters, and accumulated gradients, w Psi."""
    weight, _ = precision_bytes(dtype)
    return weight * params


def _layer_bytes_without_recompute(plan: Plan) -> float:
    """Activation bytes one layer keeps without recompute, per microbatch (K22 Table 2;
    schedules.costs.layer_stored_bytes)."""
    return layer_stored_bytes(plan.model, plan.parallel)


def rank_memory(plan: Plan, *, in_flight: Sequence[int] | None = None,
                schedule: Schedule | None = None) -> list[RankMemory]:
    """Memory of each pipeline rank of `plan`. Activations are held for `in_flight[s]`
    microbatches of virtual stage s when given, else as `schedule` (default: the plan's
    registered schedule, Plan.build_schedule) holds them."""
    num_stages, costs = plan.num_stages, plan.stage_costs
    if schedule is not None and (schedule.num_ranks, schedule.stage_ranks) != (
            plan.pp, plan.stage_ranks):
        raise ConfigError(f"schedule {schedule.name!r} has {schedule.num_ranks} ranks (stages on "
                          f"ranks {list(schedule.stage_ranks)}), its plan pp={plan.pp} (stages "
                          f"on ranks {list(plan.stage_ranks)})")
    if in_flight is None:
        schedule = schedule or plan.build_schedule()
    elif len(in_flight) != num_stages:
        raise ConfigError(f"in_flight has {len(in_flight)} entries, one per virtual stage "
                          f"is needed ({num_stages})")
    act, host_act = stage_activation_bytes(plan)
    peaks, counts = _held(plan, act, in_flight, schedule)
    host_peaks = _held(plan, host_act, in_flight, schedule)[0] if any(host_act) else {}
    stashing = schedule_entry(plan.schedule).stashing if plan.registered else None
    weight_bytes = precision_bytes(plan.model.dtype)[0]
    layer_bytes = _layer_bytes_without_recompute(plan)
    result = []
    for r in range(plan.pp):
        mine = plan.stages_of(r)
        params = sum(costs[s].param_count + costs[s].tied_param_count for s in mine)
        experts = (sum(costs[s].expert_param_count for s in mine)
                   if plan.expert_grad_group else 0.0)
        layers = sum(costs[s].layers for s in mine)
        working = max(working_layers(plan.parallel, costs[s].layers) for s in mine)
        states = model_states(params, plan.parallel, plan.model.dtype, plan.dp_shard_size,
                              experts)
        states["host"] += host_peaks.get(r, 0)
        states["parameters"] += sum(costs[s].frozen_weight_bytes for s in mine)
        buffers = _buffers(plan, params, layers)
        if plan.parallel.zero_stage == 3:
            buffers["gathered_parameters"] -= _fp8_param_saving(plan, layers)
        else:
            states["parameters"] -= _fp8_param_saving(plan, layers)
        result.append(RankMemory(
            pp_rank=r, params=params, activations=peaks.get(r, 0),
            frozen_params=sum(costs[s].frozen_param_count for s in mine),
            recompute_working=working * layer_bytes,
            fp8_weights=_fp8_weight_bytes(plan, layers),
            stashed_weights=(stashing.versions_held(plan.pp, r) - 1) * weight_bytes * params
            if stashing else 0.0,
            in_flight=counts.get(r, 0), **buffers, **states))
    return result


def _held(plan: Plan, stage_bytes: Sequence[float], in_flight: Sequence[int] | None,
          schedule: Schedule | None) -> tuple[dict[int, float], dict[int, int]]:
    """Per pipeline rank, the peak bytes (stage s weighing stage_bytes[s]) and microbatch-
    stages it holds: `in_flight[s]` of each stage when given, else as `schedule` holds."""
    if in_flight is None:
        return activation_peaks(schedule, stage_bytes)
    peaks: dict[int, float] = {}
    counts: dict[int, int] = {}
    for s, n in enumerate(in_flight):
        rank = plan.stage_ranks[s]
        peaks[rank] = peaks.get(rank, 0) + n * stage_bytes[s]
        counts[rank] = counts.get(rank, 0) + n
    return peaks, counts


def bare_rank_memory(params: float, parallel: ParallelConfig,
                     shard_group: int | None = None) -> list[RankMemory]:
    """Model states of each pipeline rank for a bare parameter count split evenly over
    pp * tp ranks (pp * q^2 under 2.5D tensor parallelism; 16-bit weights, Adam). `shard_group`: the hybrid / hpZ shard group
    (schedules.sharding.shard_group_size with a cluster; default: as the config gives it)."""
    if isinstance(params, bool) or not isinstance(params, (int, float)) or params <= 0:
        raise ConfigError(f"params must be a parameter count > 0, got {params!r}")
    if shard_group is None:
        shard_group = shard_group_size(parallel)
    grid = tp_grid(parallel)  # 2.5D: each depth slice holds a whole copy (q^2 shards)
    per_rank = params / (parallel.pp * (grid.matrix_shards if grid else parallel.tp))
    return [RankMemory(pp_rank=r, params=per_rank,
                       **model_states(per_rank, parallel, "bf16", shard_group))
            for r in range(parallel.pp)]
