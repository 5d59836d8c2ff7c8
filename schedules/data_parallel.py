"""Data-parallel communication as ops: passes over the pipeline programs (issue 5).

`add_data_parallel(schedule, plan)` picks the pass from the plan's ParallelConfig (its
sharding fields are canonical, schedules.sharding) and sizes it from the plan
(schedules.dp_sizes: the layer groups, their costs, the shard group):
- zero_stage 0, DDP (Li et al., VLDB 2020, "PyTorch Distributed"): gradients in buckets of
  `bucket_bytes` (None = torch DDP's 25 MiB, schedules.sharding.DEFAULT_BUCKET_BYTES;
  Megatron-LM's default is max(40M, 1M * dp) parameters per bucket). Earlier microbatches
  accumulate without communication (`no_sync`); the LAST weight-gradient op of each stage
  (B, or W when split) is split into layer groups in reverse layer order and, after each
  group, the ALL_REDUCEs of its buckets are posted, so they overlap the rest of the
  backward. overlap_grad_reduce=False posts them after the whole backward instead.
  Then one OPT_STEP per stage.
- zero_stage 1 (optimizer-state sharding; Megatron's distributed optimizer): the
  gradients are REDUCE_SCATTERed once per iteration, each rank steps its 1/N shard, and
  the updated parameters are ALL_GATHERed after the step (Rajbhandari et al. SC20,
  section 5: Psi reduce-scatter + Psi all-gather = 2 Psi per rank, as DDP). With
  overlap_grad_reduce (Megatron's --overlap-grad-reduce; on by default here, as DDP's)
  the bucket reduce-scatters are posted during the last microbatch's backward, as DDP's
  all-reduces are; without it, after the backward. overlap_param_gather (Megatron's
  --overlap-param-gather) posts the all-gathers instead at the start of the program, one
  set per layer group, and splits each stage's first forward into its layer groups, each
  waiting for its own gathers: in the steady state the previous step's gathers run
  during this forward (the replay's one iteration stands for every iteration).
- zero_stage 2: as 1 (gradients sharded too: a memory difference). We reduce ONCE per
  iteration (Megatron's distributed optimizer; torch FSDP SHARD_GRAD_OP under no_sync);
  DeepSpeed's stage 2 reduces at every micro-step (M times the volume): not modelled.
  fsdp='hybrid' (torch _HYBRID_SHARD_ZERO2) reduce-scatters over 'dp_shard', all-reduces
  the shard over 'dp_replicate' and gathers over 'dp_shard'.
  With pp > 1, ZeRO-2 is Megatron-FSDP's "optim_grads" (schedules.sharding): its gradient
  hook reduce-scatters on every backward (megatron_fsdp.py: `grad_reduce_every_bprop` for
  optim_grads / optim_grads_params), so EVERY microbatch's weight-gradient op is split
  into layer groups and each group's buckets are REDUCE_SCATTERed after it (M times the
  pp = 1 volume: the gradients live only as shards, the ZeRO-2 memory of
  schedules.memory_model); the HSDP outer reduction ('dp_replicate' all-reduce of the
  shard) runs only after the last microbatch's (`outer_fsdp_group_grad_reduce` is
  `is_last_microbatch or model_auto_sync`). The parameters are not sharded: no gather
  before compute; the updated ones are ALL_GATHERed after the step, as ZeRO-1's.
- an asynchronous pipeline (PipeDream, PipeDream-2BW; schedules.weight_stashing), ZeRO-0
  only: DDP's reduction and a step after the backward that ends each weight update
  (`add_per_update_steps`), not once per iteration.
- dp_impl 'dataparallel' (torch.nn.DataParallel, one process): a parameter BROADCAST
  before every forward and a gradient REDUCE to GPU 0 after every backward, then GPU 0's
  step (schedules.single_process_dp).
- zero_stage 3 / FSDP / HSDP / ZeRO++: schedules.zero3 (with pp > 1: FSDP2 under
  torch.distributed.pipelining, as torchtitan runs it).
- offload (ZeRO-Offload, Ren et al. ATC 2021; zero_stage >= 1): each reduced gradient
  bucket's shard goes to the host (COPY_D2H on lane 'pcie'), the step runs on the host CPU
  (OPT_STEP with group 'host', costed by sim.optimizer_cost), the updated 16-bit shard comes
  back (COPY_H2D) before the parameter all-gather (ZeRO-3: per layer group, and the next
  iteration's gathers fetch it). With dp = 1 there is nothing to reduce: copies only, and
  without offload only the OPT_STEPs (every iteration steps its optimizer).

FP8 parameters (ModelSpec.fp8_param_gather, Megatron-LM's --fp8-param-gather with the
distributed optimizer): the ZeRO-1/2 parameter all-gathers move TE's linear weights at
their FP8 copy bytes, the rest in 16 bit (DPSizes.param_bytes); gradients stay 16-bit.
Sizes (bytes) follow nccl-tests (sim.collective_algorithms): ALL_REDUCE and
REDUCE_SCATTER carry the full gradient bucket, ALL_GATHER the full gathered parameters.
OPT_STEP.nbytes is the Adam update's memory traffic on the rank's shard,
ADAM_BYTES_PER_PARAM per parameter. Groups name axes: 'dp', 'dp_shard', 'dp_replicate'
(schedules.names.DP_GROUPS; Plan.group maps them to ranks). As in Megatron-Core
(parallel_state: the data-parallel group "with context parallel", and the expert
data-parallel group):
- dense gradients reduce, and ZeRO shards, over the dp x cp ranks of a tp and pp
  coordinate ('dp' when cp = 1, else 'dp_cp'; Plan.grad_group): the CP ranks hold the
  same weights and compute gradients of different sequence chunks;
- the routed experts' gradients reduce, and their optimizer state shards, over the
  expert data-parallel group 'edp' (tp*cp*dp / (etp*ep) ranks) when it differs from
  that group (ep > 1 or etp != tp; Plan.expert_grad_group), in buckets of their own
  (DPSizes.parts); with edp = 1 they do not move. ZeRO-3 and HSDP of such experts are
  refused (ParallelConfig.check_model).
"""
from __future__ import annotations

import math

from .dp_sizes import ADAM_BYTES_PER_PARAM, DPSizes, GradPart, dp_sizes, split_op
from .errors import ConfigError
from .names import DP, DP_GROUPS, DP_REPLICATE, DP_SHARD, HOST, PCIE, PP_COPIES
from .ops import BACKWARD_KINDS, WEIGHT_GRAD_KINDS, Op, OpKind
from .parallel import ParallelConfig
from .plan import Plan
from .schedule import Schedule
from .sharding import moves_gradients
from .single_process_dp import add_single_process
from .zero3 import add_zero3

__all__ = ["ADAM_BYTES_PER_PARAM", "add_data_parallel", "add_dp_allreduce",
           "add_per_update_steps", "add_sharded_optimizer", "gradient_dtype_notes",
           "has_data_parallel"]


def add_dp_allreduce(schedule: Schedule) -> Schedule:
    """The plain DDP baseline: one unbucketed `ALL_REDUCE(stage, group='dp')` per stage,
    after the stage's last backward op, in the order those backwards end (reduced once
    per iteration, after accumulation); no optimizer step. Idempotent. `nbytes` (the
    stage's gradient bytes) is filled in by schedules.annotate."""
    if any(op.kind is OpKind.ALL_REDUCE for op in schedule.ops()):
        return schedule
    programs = []
    for program in schedule.programs:
        stages = _stages_by_last_backward(program)
        programs.append(list(program) + [Op(OpKind.ALL_REDUCE, s, None, group=DP)
                                          for s in stages])
    return schedule.with_programs(programs)


def _stages_by_last_backward(program: list[Op]) -> list[int]:
    last: dict[int, int] = {}
    for index, op in enumerate(program):
        if op.kind in BACKWARD_KINDS:
            last[op.stage] = index
    return sorted(last, key=last.__getitem__)


def _last_weight_grads(program: list[Op]) -> dict[int, int]:
    """stage -> index of its last weight-gradient op (B or W) in `program`."""
    last: dict[int, int] = {}
    for index, op in enumerate(program):
        if op.kind in WEIGHT_GRAD_KINDS:
            last[op.stage] = index
    return last


def gradient_ops(sizes: DPSizes, parallel: ParallelConfig, stage: int, chunk: int | None,
                 microbatch: int | None, replicate: bool = True) -> list[Op]:
    """The bucketed reduction of the gradients of (stage, chunk) for ZeRO 0-2, each part
    over its group (DPSizes.parts), with the offload copies of the reduced shards;
    `replicate=False` leaves out HSDP's 'dp_replicate' all-reduce (a microbatch before
    the last under Megatron-FSDP, module docstring)."""
    layers = sizes.layers[stage] * (sizes.groups if chunk is None else 1)
    ops = []
    for part in sizes.parts(stage, chunk):
        for bucket in sizes.buckets(part.nbytes, layers) if part.nbytes else ():
            ops += _bucket_ops(part, bucket, parallel, Op(OpKind.COPY_D2H, stage, microbatch,
                                                          chunk=chunk), replicate)
    return ops


def _bucket_ops(part: GradPart, bucket: int, parallel: ParallelConfig, at: Op,
                replicate: bool = True) -> list[Op]:
    """One gradient bucket of `part`: all-reduced (ZeRO-0) or reduce-scattered (ZeRO 1-2;
    HSDP then all-reduces the shard over 'dp_replicate' when `replicate`), and its shard
    copied to the host under offload. Nothing moves over a group of one rank but the
    offload copy. `at` gives the stage, microbatch and layer group."""
    def op(kind: OpKind, group: str, nbytes: int) -> Op:
        return Op(kind, at.stage, at.microbatch, group, nbytes, chunk=at.chunk)

    ops = []
    if part.ranks > 1:
        if parallel.zero_stage == 0:
            return [op(OpKind.ALL_REDUCE, part.group, bucket)]
        ops.append(op(OpKind.REDUCE_SCATTER, part.group, bucket))
        if part.replicate and replicate:
            ops.append(op(OpKind.ALL_REDUCE, DP_REPLICATE, bucket // part.shard))
    if parallel.offload:
        ops.append(op(OpKind.COPY_D2H, PCIE, bucket // part.shard))
    return ops


def copy_ops(sizes: DPSizes, parallel: ParallelConfig, stage: int) -> list[Op]:
    """DualPipe (schedules.chains): the ALL_REDUCE of `stage`'s reduced gradients (this
    rank's shard under ZeRO 1-2) with the other copy of its model stage, on pipeline rank
    P-1-r (group 'pp_copies'), so that both copies step alike. DeepSeek's example sums
    the copies' gradients after its step() (deepseek-ai/DualPipe,
    examples/example_dualpipe.py); an all-reduce of two ranks moves the same bytes."""
    nbytes = sum(part.nbytes // (part.shard if parallel.zero_stage else 1)
                 for part in sizes.parts(stage, None))
    return [Op(OpKind.ALL_REDUCE, stage, None, PP_COPIES, nbytes)] if nbytes else []


def step_ops(sizes: DPSizes, parallel: ParallelConfig, stage: int,
             microbatch: int | None = None) -> list[Op]:
    """OPT_STEP of the rank's part of `stage` (on the host when offloaded); `microbatch`:
    the last one whose gradients it applies, when a program steps more than once."""
    shard = sizes.stage_params(stage) if parallel.zero_stage == 0 else sizes.shard_params(stage)
    return [Op(OpKind.OPT_STEP, stage, microbatch, HOST if parallel.offload else None,
               ADAM_BYTES_PER_PARAM * shard)]


def upload_ops(sizes: DPSizes, parallel: ParallelConfig, stage: int) -> list[Op]:
    """ZeRO-Offload after the step: the updated 16-bit shard back to the device."""
    if not parallel.offload:
        return []
    parts = sizes.parts(stage, None, gradients=False)
    return [Op(OpKind.COPY_H2D, stage, None, PCIE,
               sum(math.ceil(part.nbytes / part.shard) for part in parts))]


def gather_ops(sizes: DPSizes, parallel: ParallelConfig, stage: int,
               chunk: int | None = None) -> list[Op]:
    """ZeRO-1/2: gather the updated parameters of (stage, layer group `chunk`; None: the
    whole stage) in buckets, each part over the group it is sharded over."""
    if parallel.zero_stage == 0:
        return []
    layers = sizes.layers[stage] * (sizes.groups if chunk is None else 1)
    ops = []
    for part in sizes.parts(stage, chunk, gradients=False):
        if part.shard > 1 and part.nbytes:
            group = DP_SHARD if part.replicate else part.group
            ops += [Op(OpKind.ALL_GATHER, stage, None, group, b, chunk=chunk)
                    for b in sizes.buckets(part.nbytes, layers)]
    return ops


def add_sharded_optimizer(schedule: Schedule, sizes: DPSizes, parallel: ParallelConfig
                          ) -> Schedule:
    """DDP and ZeRO-1/2 (module docstring)."""
    overlap = parallel.overlap_grad_reduce and moves_gradients(parallel)
    groups = sizes.groups if overlap else 1
    every = overlap and reduces_every_microbatch(parallel)
    programs = []
    for program in schedule.programs:
        last = _last_weight_grads(program)
        stages = sorted(last, key=last.__getitem__)
        out: list[Op] = []
        if parallel.overlap_param_gather:  # the previous step's gathers, met by the forward
            first_forwards = _first_forwards(program)
            for s in sorted(first_forwards, key=first_forwards.__getitem__):
                for g in range(groups):
                    out += gather_ops(sizes, parallel, s, g)
        else:
            first_forwards = {}
        for index, op in enumerate(program):
            if overlap and (last.get(op.stage) == index
                            or (every and op.kind in WEIGHT_GRAD_KINDS)):
                final = last.get(op.stage) == index
                for part in split_op(op, groups):
                    out.append(part)
                    out += gradient_ops(sizes, parallel, op.stage, part.chunk, op.microbatch,
                                        replicate=final)
            elif first_forwards.get(op.stage) == index:
                out += split_op(op, groups)
            else:
                out.append(op)
        if not overlap:
            for s in stages:
                out += gradient_ops(sizes, parallel, s, None, None)
        if schedule.chains > 1:  # in one order on both ranks of a copy pair
            for s in sorted(stages, key=schedule.stage_chains.model_stage):
                out += copy_ops(sizes, parallel, s)
        for s in stages:
            out += step_ops(sizes, parallel, s)
        for s in stages:
            out += upload_ops(sizes, parallel, s)
            if not parallel.overlap_param_gather:
                out += gather_ops(sizes, parallel, s)
        programs.append(out)
    return schedule.with_programs(programs, layer_groups=groups)


def add_per_update_steps(schedule: Schedule, sizes: DPSizes, parallel: ParallelConfig
                         ) -> Schedule:
    """An asynchronous pipeline (schedules.weight_stashing: PipeDream, 2BW): each stage's
    gradients are reduced, as DDP's are (bucketed after the layer groups of the backward
    with overlap_grad_reduce, else after it), and its weights stepped after the backward
    that ends each update, every `update_every` microbatches; the pipeline never drains.
    ZeRO-0 only (ParallelConfig refuses the sharded optimizers under stashing)."""
    every = schedule.asynchronous.update_every
    overlap = parallel.overlap_grad_reduce and moves_gradients(parallel)
    groups = sizes.groups if overlap else 1
    programs = []
    for program in schedule.programs:
        out: list[Op] = []
        for op in program:
            if op.kind not in WEIGHT_GRAD_KINDS or (op.microbatch + 1) % every:
                out.append(op)
                continue
            for part in split_op(op, groups) if overlap else [op]:
                out.append(part)
                if overlap:
                    out += gradient_ops(sizes, parallel, op.stage, part.chunk, op.microbatch)
            if not overlap:
                out += gradient_ops(sizes, parallel, op.stage, None, op.microbatch)
            out += step_ops(sizes, parallel, op.stage, op.microbatch)
        programs.append(out)
    return schedule.with_programs(programs, layer_groups=groups)


def reduces_every_microbatch(parallel: ParallelConfig) -> bool:
    """Whether gradients are reduce-scattered after every microbatch's backward instead
    of once per step: ZeRO-2 with pp > 1, as Megatron-FSDP's optim_grads runs it (module
    docstring)."""
    return parallel.zero_stage == 2 and parallel.pp > 1 and moves_gradients(parallel)


def _first_forwards(program: list[Op]) -> dict[int, int]:
    """stage -> index of its first F in `program`."""
    first: dict[int, int] = {}
    for index, op in enumerate(program):
        if op.kind is OpKind.F:
            first.setdefault(op.stage, index)
    return first


def has_data_parallel(schedule: Schedule) -> bool:
    """Whether `schedule` already carries data-parallel ops (an optimizer step, a host
    copy, or a collective on a DP group): the pass then leaves it as it is."""
    return any(op.kind is OpKind.OPT_STEP or op.kind.is_copy or
               (op.kind.is_collective and op.group in DP_GROUPS) for op in schedule.ops())


def gradient_dtype_notes(plan: Plan) -> list[str]:
    """What a bf16 (or fp8) run's gradient reductions assume, when it has any: 16-bit
    gradients (2 bytes per parameter, the model dtype's), where Megatron-LM by default
    accumulates and reduces bf16 gradients in fp32 (megatron/training/arguments.py sets
    accumulate_allreduce_grads_in_fp32 for bf16; --grad-reduce-in-bf16 opts out)."""
    parallel = plan.parallel
    if plan.model.dtype not in ("bf16", "fp8") or (parallel.grad_replicas == 1
                                                   and parallel.edp == 1):
        return []
    return ["gradients reduced over data parallelism in bf16 (2 B per parameter) as "
            "Megatron-LM's --grad-reduce-in-bf16 does; its bf16 default accumulates and "
            "reduces them in fp32 (twice these collectives' bytes, and 2 B per parameter "
            "more memory), which this model does not follow"]


def add_data_parallel(schedule: Schedule, plan: Plan) -> Schedule:
    """`schedule` with the data-parallel communication `plan` asks for (module
    docstring). With dp = 1 (and no offload) only the optimizer steps are added.
    fsdp='hybrid' and hpz need the shard group (Plan.dp_shard_size: shard_size or
    hpz_partition_size, or the dp ranks per node of the plan's cluster). The pass runs
    once: a schedule that already has data-parallel ops is refused (schedules.lowering
    skips the pass for it instead)."""
    if has_data_parallel(schedule):
        raise ConfigError(f"schedule {schedule.name!r} already has data-parallel ops: the "
                          "data-parallel pass runs once, on a pipeline schedule")
    if schedule.layer_groups != 1:
        raise ConfigError("the data-parallel pass needs a schedule without layer groups")
    parallel = plan.parallel
    if (parallel.fsdp == "hybrid" or parallel.hpz) and plan.dp_shard_size is None:
        raise ConfigError(f"fsdp={parallel.fsdp!r} hpz={parallel.hpz}: give shard_size (the "
                          "ranks of one node's shard group), or a topology to take it from")
    sizes = dp_sizes(plan)
    if parallel.dp_impl == "dataparallel":
        params, grads = (sum(part.nbytes for part in sizes.parts(0, None, gradients=g))
                         for g in (False, True))
        return add_single_process(schedule, params, grads, step_ops(sizes, parallel, 0))
    if schedule.asynchronous is not None:
        return add_per_update_steps(schedule, sizes, parallel)
    if parallel.zero_stage == 3 and moves_gradients(parallel):
        return add_zero3(schedule, sizes, parallel)
    return add_sharded_optimizer(schedule, sizes, parallel)
