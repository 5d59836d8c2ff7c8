"""The intra-layer communication pass: TP, SP, CP and EP collectives as ops (issue 6).

`add_intra_layer(schedule, plan)` takes a lowered, costed schedule (schedules.annotate;
layer groups allowed) and, for every compute op, adds the
collectives of the layers it covers (schedules.comm_spec.Covered), aggregated per op and
kind (`Op.count` back-to-back collectives, `nbytes` their total; stage, microbatch and
chunk those of the compute op):
- tensor / sequence parallelism: schedules.tp_comms ('tp'); under a 2D or 2.5D grid
  schedules.tp_2d, under 3D schedules.tp_3d (the grid's groups: schedules.tp_grid);
- context parallelism: schedules.cp_comms ('cp', ring attention or Ulysses);
- expert parallelism: schedules.ep_comms ('ep' dispatch/combine all-to-alls, and
  with expert tensor parallelism the 'etp' all-gather / reduce-scatter of the dispatched
  tokens), and the busiest expert's extra FLOPs added to the compute op under
  `moe_imbalance`.
- scatter/gather of pipeline transfers (SC21 section 4.1; Megatron-LM's default
  `scatter_gather_tensors_in_pipeline` when tp > 1 without sequence parallelism), with
  `scatter_gather`: each TP rank sends 1/t of the stage boundary over its own NIC (SEND /
  RECV nbytes / t) and the receivers all-gather the pieces over 'tp' (one ALL_GATHER of
  the whole boundary, right after each RECV). Off by default.
The options are ParallelConfig fields (tp_comm_overlap, cp_comm, moe_imbalance,
scatter_gather; Megatron aliases in schedules.parallel_aliases).
Placement (the contract's rule, schedules.contract): collectives of a blocking group go
right after their compute op, those of an overlapped group
(ParallelConfig.overlapped_groups: 'cp' with ring attention, 'tp' with tp_comm_overlap)
right before it, after its RECVs, marked `Op.alongside`; so are the SUMMA broadcasts and
reduces of steps 2..q of a 2D or 2.5D linear (schedules.tp_2d).

TP overlap (--tp-comm-overlap: Transformer Engine's userbuffers, as Megatron-LM
configures them by default; TE's initialize_ub, transformer_engine/pytorch/module/base.py):
- the all-gathers feeding a GEMM (forward QKV and FC1 inputs, backward output gradients
  of the projection and FC2) run as a ring exchange in tp chunks, each hidden behind the
  GEMM of the chunk before it, on copy engines (1 SM): alongside;
- the backward's reduce-scatters (dgrad of QKV and FC1) are 'bulk' overlaps beside the
  weight-gradient GEMM: alongside;
- the forward's reduce-scatters after the projection and FC2 GEMMs are 'pipeline'
  overlaps in TP_OVERLAP_RS_SPLITS = 4 chunks: each chunk's reduce-scatter runs beside the
  next chunk's GEMM, and the last chunk's has nothing to hide behind: 3/4 of the bytes
  alongside, 1/4 (one collective per GEMM) blocking after the op;
- the pipeline and bulk methods take TP_OVERLAP_COMM_SMS = 16 SMs from the GEMMs they
  overlap (num_sm 16, set_sm_margin): sim.cost slows those GEMMs accordingly.

An overlapped pair (Op.overlapped: DualPipe's forward-backward chunk) of an MoE model with
ep or etp > 1 hides its expert collectives (DeepSeek-V3 report, section 3.2.1: "both
all-to-all and PP communication can be fully hidden"). The EP and ETP collectives of both
its ops are posted alongside before its F and run beside the whole pair, one after
another on their group (schedules.contract); the pair then takes max(F + B, the
all-to-alls), DeepSeek's ideal. How DeepSeek interleaves the components of the two
chunks is not modelled. The pair's compute runs on the SMs that ep_comms.PAIR_COMM_SMS
leave (sim.cost).

Aggregation keeps time exact on the critical path when the collectives run uncontended:
k sequential collectives of S bytes cost k*(steps*alpha) + k*S/bandwidth, which is what
the replay charges one op of count k and k*S bytes (sim.collectives). What it gives up:
the interleaving of each collective between the GEMMs of one op (only the sums matter on
one compute stream), and, for overlapped groups, the per-layer pairing of communication
with the compute it hides behind (the op's communication hides behind its whole compute).
"""
from __future__ import annotations

from .comm_spec import Comm, Covered
from .cp_comms import cp_comms
from .ep_comms import ep_comms, etp_comms, imbalance_flops, pair_hides_experts
from .model import ModelSpec
from .names import EP, ETP, INTRA_LAYER_GROUPS, TP
from .ops import WORK_KINDS, Op, OpKind, overlapped_pairs
from .parallel import ParallelConfig
from .plan import Plan
from .recompute import KEPT, layer_role
from .schedule import Schedule
from .tp_2d import summa_placements, tp_2d_comms
from .tp_3d import tp_3d_comms
from .tp_grid import tp_grid
from .tp_comms import tp_comms


EXPERT_GROUPS = frozenset({EP, ETP})
TP_OVERLAP_RS_SPLITS = 4  # TE initialize_ub default: 'pipeline' reduce-scatter, num_splits 4
TP_OVERLAP_COMM_SMS = 16  # TE initialize_ub default: num_sm of the pipeline and bulk methods


def sm_margin_gemms(parallel: ParallelConfig, model: ModelSpec, kind: OpKind
                    ) -> frozenset[str]:
    """The GEMM kernels (schedules.layer_kernels names) of a `kind` op that run beside
    communication kernels holding TP_OVERLAP_COMM_SMS SMs under TP overlap (module
    docstring): in F the projection and FC2 (pipelined reduce-scatter), in B, I and W the
    QKV and FC1 GEMMs (bulk overlaps of their dgrad and wgrad). An MoE layer's experts are
    not overlapped this way (their FC GEMMs are left out for MoE models); the forward that
    a full recompute reruns in B is left at full speed."""
    if TP not in parallel.overlapped_groups or kind not in WORK_KINDS:
        return frozenset()
    attention, mlp = ("proj_gemm", "fc2_gemm") if kind is OpKind.F else ("qkv_gemm", "fc1_gemm")
    return frozenset({attention} if model.is_moe else {attention, mlp})

def covered(op: Op, plan: Plan, groups: int) -> Covered:
    """The layers, embedding and head compute op `op` runs, its stage split into `groups`
    layer groups (Plan.chunk_parts)."""
    parts, model = plan.chunk_parts(op.stage, op.chunk, groups), plan.model
    rerun = [layer_role(plan.parallel, p) != KEPT for p in parts.positions]
    moe = [model.is_moe_layer(layer) for layer in parts.layers] if model.is_moe \
        else [False] * len(parts.layers)
    return Covered(op.kind, len(parts.layers), sum(moe), embedding=parts.embedding,
                   head=parts.head, rerun_layers=sum(rerun),
                   rerun_moe_layers=sum(m and r for m, r in zip(moe, rerun)))


def op_comms(plan: Plan, cov: Covered) -> list[Comm]:
    """All intra-layer collectives of one compute op: TP, then CP, then EP and ETP."""
    model, parallel = plan.model, plan.parallel
    if parallel.tp_mode == "3d":  # no cp or ep beside a grid (schedules.tp_grid)
        return tp_3d_comms(model, parallel, cov)
    if parallel.tp_mode != "1d":
        return tp_2d_comms(model, parallel, cov)
    return (tp_comms(model, parallel, cov) + cp_comms(model, parallel, cov, parallel.cp_comm)
            + ep_comms(model, parallel, cov) + etp_comms(model, parallel, cov))


def needs_intra_layer(parallel: ParallelConfig) -> bool:
    return (max(parallel.tp, parallel.cp, parallel.ep, parallel.etp) > 1
            or parallel.moe_imbalance != 1)


def scatters_p2p(parallel: ParallelConfig) -> bool:
    """Whether pipeline transfers are scattered over the TP ranks (module docstring)."""
    return parallel.scatter_gather and parallel.tp > 1 and not parallel.sequence_parallel


def has_intra_layer(schedule: Schedule) -> bool:
    """Whether `schedule` already carries intra-layer collectives."""
    return any(op.group in INTRA_LAYER_GROUPS and op.kind.is_collective for op in schedule.ops())


def _scattered(op: Op, tp: int) -> list[Op]:
    """A P2P op carrying 1/tp of the boundary, and after a RECV the all-gather."""
    piece = op.with_costs(nbytes=-(-op.nbytes // tp))
    if op.kind in (OpKind.RECV_F, OpKind.RECV_B):
        return [piece, Op(OpKind.ALL_GATHER, op.stage, op.microbatch, TP, op.nbytes)]
    return [piece]


def _placements(comms: list[Comm], overlapped: frozenset[str], pipelined_rs: bool
                ) -> list[tuple[Comm, bool]]:
    """Each collective of a compute op with whether it runs alongside the op: those of an
    overlapped group do, but on 'tp' only Transformer Engine's layers' gathers and scatters
    (Comm.in_linear: not the embedding's, the output layer's or the cross-entropy's), and,
    with `pipelined_rs` (a forward under TP overlap), not the last of TP_OVERLAP_RS_SPLITS
    chunks of their reduce-scatters (module docstring)."""
    out = []
    for c in comms:
        if c.group == TP and not c.in_linear:
            out.append((c, False))
        elif pipelined_rs and c.in_linear and c.kind is OpKind.REDUCE_SCATTER:
            splits = TP_OVERLAP_RS_SPLITS
            hidden = c.nbytes * (splits - 1) // splits
            out += [(Comm(c.kind, c.group, hidden, c.count * (splits - 1), True), True),
                    (Comm(c.kind, c.group, c.nbytes - hidden, c.count, True), False)]
        else:
            out.append((c, c.group in overlapped))
    return out


def add_intra_layer(schedule: Schedule, plan: Plan) -> Schedule:
    """`schedule` with the intra-layer collectives of every compute op (module docstring);
    `schedule` itself when tp = cp = ep = etp = 1 and experts are balanced. Run it once
    (schedules.lowering skips it for a schedule that already has such collectives)."""
    parallel = plan.parallel
    if not needs_intra_layer(parallel):
        return schedule
    overlapped = parallel.overlapped_groups
    scatter = scatters_p2p(parallel)
    tp_overlap = TP in overlapped
    pair_experts = pair_hides_experts(plan.model, parallel)
    grid = tp_grid(parallel)
    groups = schedule.layer_groups
    memo: dict[tuple, tuple[list[Op], list[Op], float]] = {}

    def placed(op: Op) -> tuple[list[Op], list[Op], float]:
        """The op's collectives before it (alongside) and after it, and its extra FLOPs;
        ops of one shape differ only by microbatch."""
        shape = (op.kind, op.stage, op.chunk, op.overlapped)
        if shape not in memo:
            cov = covered(op, plan, groups)
            hidden = overlapped | (EXPERT_GROUPS if op.overlapped and pair_experts
                                   else frozenset())
            comms = op_comms(plan, cov)
            placements = (summa_placements(comms, grid.q) if grid else
                          _placements(comms, hidden, tp_overlap and op.kind is OpKind.F))
            proto = [Op(c.kind, op.stage, None, c.group, c.nbytes, chunk=op.chunk,
                        count=c.count, alongside=alongside) for c, alongside in placements]
            memo[shape] = ([p for p in proto if p.alongside],
                           [p for p in proto if not p.alongside],
                           imbalance_flops(plan.model, parallel, cov, parallel.moe_imbalance))
        return memo[shape]

    def posted(protos: list[Op], m: int | None, alongside: bool) -> list[Op]:
        return [Op(p.kind, p.stage, m, p.group, p.nbytes, chunk=p.chunk, count=p.count,
                   alongside=alongside) for p in protos]

    programs = []
    for program in schedule.programs:
        out: list[Op] = []
        partner = dict(overlapped_pairs(program)) if pair_experts else {}
        for index, op in enumerate(program):
            if op.kind not in WORK_KINDS:
                out += _scattered(op, parallel.tp) if scatter and op.kind.is_p2p else [op]
                continue
            before, after, extra = placed(op)
            before = posted(before, op.microbatch, True)
            if op.overlapped and pair_experts:  # both ops' expert collectives before the F
                if op.kind is OpKind.F:
                    b = program[partner[index]]
                    before += posted([p for p in placed(b)[0] if p.group in EXPERT_GROUPS],
                                     b.microbatch, True)
                else:
                    before = [p for p in before if p.group not in EXPERT_GROUPS]
            out += before
            out.append(op.with_costs(flops=op.flops + extra) if extra else op)
            out += posted(after, op.microbatch, False)
        programs.append(out)
    return schedule.with_programs(programs)
