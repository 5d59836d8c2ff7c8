"""ZeRO-3 / FSDP full shard, HSDP and ZeRO++ as ops: parameters sharded per layer group.

Every F/B/I/W op is split into layer groups (FSDP units; one transformer layer per unit,
torch's usual transformer auto-wrap policy; the embedding rides with group 0 and the head
with the last group, schedules.layer_groups; a group without parameters, on a stage short
of layers, is no unit: it is neither gathered nor reduced, and prefetch passes over it).
Before a group computes, its parameters must be gathered (with tied embeddings on one
stage, the last group gathers the word embedding again for the output layer:
DPSizes.gathered):
- a parameter ALL_GATHER of (s, g) is posted before each F group and again before each B
  (or I) group; with reshard_after_forward=False the parameters gathered for F stay until
  the group's backward, which then needs no gather (torch SHARD_GRAD_OP). W needs no
  parameters (dW = x^T dy);
- prefetch: the gather of the next group is posted before the current group runs (one
  group ahead, FSDP's forward/backward prefetch), unless both are the same group;
- after each B or W group, its gradients are REDUCE_SCATTERed (every microbatch: the
  gradients are sharded, so accumulation happens on the shards, as DeepSpeed stage 3 and
  FSDP without no_sync do). Per microbatch a rank moves 2 Psi of gathers and Psi of
  reduce-scatter, the ZeRO paper's 3 Psi (section 7.2.2, with the ring factor (n-1)/n);
- then one OPT_STEP per stage on the rank's 1/N shard (on the host with offload, after a
  COPY_D2H of each reduced shard; a COPY_H2D of the updated shard follows it).
With pipeline parallelism (pp > 1) the ops follow FSDP2 under torch.distributed.pipelining,
as torchtitan runs it (torchtitan/distributed/fsdp.py, get_fsdp_reshard_after_forward_policy;
torch/distributed/pipelining/stage.py, _PipelineStageBase):
- backward_maybe_with_nosync calls set_requires_gradient_sync(False) and
  set_reshard_after_backward(False) before every microbatch's backward: gradients
  accumulate unsharded and parameters stay gathered after each backward;
- _post_backward (the REDUCE_GRAD action, perform_reduce_grad, once per step after the
  stage's last backward) turns both back on and runs every FSDP unit's post_backward: one
  REDUCE_SCATTER per layer group per step, posted right after the stage's last
  weight-gradient op, in layer order (HSDP: then the replica all-reduce of the shard);
- reshard_after_forward=False (torchtitan's default with PP: "do not reshard after forward
  to avoid per-microbatch all-gathers") therefore gathers each unit ONCE per step, before
  its first forward, and keeps it until the step ends; reshard_after_forward=True
  (torchtitan's "always") reshards after each forward, and the next backward gathers
  again; a unit gathered for a backward stays gathered for the next forward.
Per step and stage this moves one all-gather of the stage's parameters (with
reshard_after_forward=False) and one reduce-scatter of its gradients, whatever the number
of microbatches. APPROXIMATION: torch's _root_post_backward_final_callback makes the
compute stream wait for the stage's reduce-scatters; here they overlap whatever compute
the rank runs next (another virtual stage's backward under interleaving).
HSDP (fsdp='hybrid', torch HYBRID_SHARD): gathers and reduce-scatters over 'dp_shard'
(the node), then the shard's gradients are ALL_REDUCEd over 'dp_replicate'.
ZeRO++ (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model
Training", 2023):
- qwZ (quantized_weights): gathers over 'dp' move int8 weights, 1 byte per parameter
  (half of bf16); the quantization scales (one per block of 2048) are ignored;
- hpZ (hpz): the forward gather (over 'dp') also leaves a secondary shard inside the node,
  so backward gathers run over 'dp_shard' in 16 bit;
- qgZ (quantized_gradients): the reduce-scatter moves int4 gradients, half a byte per
  parameter. The paper's scheme is a hierarchical all-to-all (intra-node, then across
  nodes) with dequantize-reduce between; we model its volume, as one int4 reduce-scatter.
FP8 parameters (ModelSpec.fp8_param_gather; torchao's enable_fsdp_float8_all_gather, TE's
quantized params under Megatron-FSDP): every gather moves the TE linear weights at their
FP8 copy bytes, the rest in 16 bit (DPSizes.param_bytes); reduce-scatters stay 16-bit.
With context parallelism every 'dp' collective here runs over 'dp_cp' (DPSizes.grad_group).
Units: bytes (nccl-tests sizes: an all-gather carries the gathered group, a reduce-scatter
the group's full gradients).
"""
from __future__ import annotations

import math

from .dp_sizes import ADAM_BYTES_PER_PARAM, DPSizes, split_op
from .names import DP_REPLICATE, DP_SHARD, HOST, PCIE
from .ops import WEIGHT_GRAD_KINDS, WORK_KINDS, Op, OpKind
from .parallel import ParallelConfig
from .schedule import Schedule


def _is_unit(sizes: DPSizes, stage: int, chunk: int | None) -> bool:
    """Whether layer group `chunk` of `stage` holds parameters, i.e. is an FSDP unit."""
    return sizes.params[stage][chunk or 0] > 0


def _gather(sizes: DPSizes, parallel: ParallelConfig, op: Op) -> Op:
    forward = op.kind is OpKind.F
    local = parallel.fsdp == "hybrid" or (parallel.hpz and not forward)
    group = DP_SHARD if local else sizes.grad_group
    g = op.chunk or 0  # a stage of one layer group: its compute ops are unchunked
    params = sizes.gathered[op.stage][g]
    nbytes = (params if parallel.quantized_weights and not local
              else sizes.param_bytes(params, sizes.fp8_params[op.stage][g]))
    return Op(OpKind.ALL_GATHER, op.stage, op.microbatch, group, nbytes, chunk=g)


def _reduce(sizes: DPSizes, parallel: ParallelConfig, op: Op) -> list[Op]:
    s, m, g = op.stage, op.microbatch, op.chunk or 0
    if not _is_unit(sizes, s, g):
        return []
    hybrid = parallel.fsdp == "hybrid"
    params = sizes.params[s][g]
    nbytes = math.ceil(params / 2) if parallel.quantized_gradients else sizes.grads[s][g]
    ops = [Op(OpKind.REDUCE_SCATTER, s, m, DP_SHARD if hybrid else sizes.grad_group, nbytes,
              chunk=g)]
    if hybrid:
        ops.append(Op(OpKind.ALL_REDUCE, s, m, DP_REPLICATE, sizes.grads[s][g] // sizes.shard,
                      chunk=g))
    if parallel.offload:
        ops.append(Op(OpKind.COPY_D2H, s, m, PCIE, sizes.grads[s][g] // sizes.shard, chunk=g))
    return ops


def pipelined(parallel: ParallelConfig) -> bool:
    """Whether the FSDP2 + torch.distributed.pipelining rules apply (pp > 1)."""
    return parallel.pp > 1


def _needs_gather(parts: list[Op], parallel: ParallelConfig) -> set[int]:
    """Indices of the compute groups whose parameters are not gathered when they run.
    Parameters are resharded after F when reshard_after_forward, and after a backward
    unless a pipeline keeps them until the step ends (module docstring)."""
    after_backward = not pipelined(parallel)
    gathered: set[tuple[int, int]] = set()
    needs = set()
    for index, op in enumerate(parts):
        if op.kind not in WORK_KINDS or op.kind is OpKind.W:
            continue
        unit = (op.stage, op.chunk)
        if unit not in gathered:
            needs.add(index)
            gathered.add(unit)
        if parallel.reshard_after_forward if op.kind is OpKind.F else after_backward:
            gathered.discard(unit)
    return needs


def _last_weight_grads(parts: list[Op]) -> dict[int, int]:
    """stage -> index in `parts` of its last weight-gradient group (B or W)."""
    return {op.stage: index for index, op in enumerate(parts) if op.kind in WEIGHT_GRAD_KINDS}


def _program(program: list[Op], sizes: DPSizes, parallel: ParallelConfig) -> list[Op]:
    parts: list[Op] = []
    for op in program:
        parts += split_op(op, sizes.groups) if op.kind in WORK_KINDS else [op]
    needs = _needs_gather(parts, parallel)
    before: dict[int, list[Op]] = {}
    previous = None  # index of the previous compute group of a unit
    for index, op in enumerate(parts):
        if op.kind not in WORK_KINDS or not _is_unit(sizes, op.stage, op.chunk):
            continue
        if index in needs:
            same = previous is not None and (parts[previous].stage, parts[previous].chunk) \
                == (op.stage, op.chunk)
            at = index if previous is None or same else previous
            before.setdefault(at, []).append(_gather(sizes, parallel, op))
        previous = index
    out: list[Op] = []
    stages: list[int] = []
    once = pipelined(parallel)
    last = _last_weight_grads(parts) if once else {}
    for index, op in enumerate(parts):
        out += before.get(index, [])
        out.append(op)
        if op.kind in WEIGHT_GRAD_KINDS:
            if not once:
                out += _reduce(sizes, parallel, op)
            elif last[op.stage] == index:  # the stage's REDUCE_GRAD (module docstring)
                for g in range(sizes.groups):
                    out += _reduce(sizes, parallel, Op(op.kind, op.stage, op.microbatch,
                                                       chunk=g))
            if op.stage in stages:
                stages.remove(op.stage)
            stages.append(op.stage)
    for s in stages:
        shard = math.ceil(sizes.stage_params(s) / sizes.shard)
        out.append(Op(OpKind.OPT_STEP, s, None, HOST if parallel.offload else None,
                      ADAM_BYTES_PER_PARAM * shard))
        if parallel.offload:
            out.append(Op(OpKind.COPY_H2D, s, None, PCIE, shard * sizes.dtype_bytes))
    return out


def add_zero3(schedule: Schedule, sizes: DPSizes, parallel: ParallelConfig) -> Schedule:
    """`schedule` with ZeRO-3 / FSDP / HSDP / ZeRO++ communication (module docstring)."""
    programs = [_program(program, sizes, parallel) for program in schedule.programs]
    return schedule.with_programs(programs, layer_groups=sizes.groups)
