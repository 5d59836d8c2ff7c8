"""The execution contract: what each op waits for. Both backends obey exactly this.

Rules (docs/architecture.md, "The execution contract"):
- a rank's ops are taken in program order; compute ops run one at a time on one stream;
- `F(s,m)` waits for `RECV_F(s,m)` unless `s` is the first stage;
- `B(s,m)` and `I(s,m)` wait for `F(s,m)` and, unless `s` is the last stage, `RECV_B(s,m)`;
- `W(s,m)` waits for `I(s,m)`;
- the F of an overlapped pair (an F and the B after it, both marked `overlapped`:
  DualPipe) also waits for the B's inputs (`pair_waits`);
- `SEND_F(s,m)` waits for `F(s,m)`; `SEND_B(s,m)` for the input gradient of `(s,m)`;
- a whole-iteration DP gradient collective of stage s (chunk and microbatch None) waits
  for the weight gradients of every microbatch;
- communication ops are *posted* when the program reaches them and do not block the
  stream; a P2P transfer starts when both its SEND and its RECV are posted, and the RECV
  completes when the transfer does; a collective starts when every member has posted it
  and the member's previous collective on the same group has finished (NCCL runs a
  communicator's operations in issue order).

`B` is `I` and `W` fused, so a completed `B` also satisfies waits on `I` and `W`: the
contract speaks of data products, and `B` produces both.

Chunked ops (`Op.chunk`, a layer group; issue 5). The rules above name whole-stage
products: `(F, s, m)` is available when the *last* op of the program that computes a
part of it ends (`chunk_completions`), so `SEND_F(s,m)` waits for the last forward chunk
and `SEND_B(s,m)` for the last input-gradient chunk (chunk 0: backward runs in reverse
layer order).

Positional rules (`local_waits`), for the data-parallel ops, which may repeat one key
(a ZeRO-3 gather before F and again before B) and so are identified by their place in the
program. Each op waits for EARLIER ops of the same program (so these rules alone cannot
deadlock); "(s, g) covers (s, c)" when g == c or either is None:
- a compute op F/B/I/W of (s, g) waits for the latest parameter gather (ALL_GATHER on a
  DP group) of each chunk of stage s covering g posted before it;
- a gradient collective (ALL_REDUCE / REDUCE_SCATTER on a DP group) of (s, g) waits for
  the latest preceding weight-gradient op of stage s covering g (B or W: `I` makes no
  weight gradient) and for the latest preceding gradient collective of the same (s, g)
  on another group (HSDP: the replica all-reduce reduces the shard's reduce-scatter);
  DualPipe's all-reduce of a stage's two copies (group 'pp_copies', schedules.chains)
  waits for every gradient collective of s since its previous OPT_STEP;
- COPY_D2H (gradients to the host) of (s, g) waits for the latest preceding gradient
  collective of (s, g) covering it, else the latest weight-gradient op covering g;
- OPT_STEP(s) waits for every gradient collective and COPY_D2H of EVERY stage of the
  program since the previous OPT_STEP, and for the latest weight-gradient op of every
  stage: a rank steps one optimizer over all its model chunks, once all their gradients
  are reduced (Megatron-LM's finalize_model_grads syncs every chunk before the step, and
  the global gradient norm of clipping needs them all; torchtitan clips over all model
  parts before stepping), so a chunk's step does not overlap another chunk's reduction;
- COPY_H2D (parameters to the device) of (s, g) waits for the latest OPT_STEP(s);
- a parameter gather of (s, g) waits for the latest OPT_STEP(s) and COPY_H2D of (s, c)
  covering g (ZeRO-1/2: gather the updated shards); torch.nn.DataParallel's BROADCAST of
  the parameters also for the latest REDUCE of s (its `loss.backward()` returns after the
  gradients' reduce, and the next forward replicates again).
An op that is not compute (collectives, copies, an OPT_STEP with group 'host') is posted
in program order and starts once its waits are met and the previous op on its lane ends.

Intra-layer communication (issue 6): collectives on a group of INTRA_LAYER_GROUPS
('tp', 'cp', 'ep', 'etp': schedules.intra_layer) inside the layers a compute op covers, aggregated
per compute op (`Op.count`). Each belongs to ONE compute op, by position:
- a blocking op (`Op.alongside` False) is posted right AFTER its compute op; the
  next compute op of the program, and every P2P SEND and OPT_STEP before that, wait for
  it (the next layer needs the reduced activation; a SEND ships it; a step follows the
  whole backward). The blocking ops of one compute
  op run one after another (each waits for the previous one): inside a layer they
  alternate with its GEMMs, so their times add up on the critical path even on
  different groups. TP all-reduces (Megatron), SP all-gathers / reduce-scatters, Ulysses
  and MoE all-to-alls (and expert-TP gathers / scatters) are blocking;
- an overlapped op (`Op.alongside`: ring attention's KV passes, or TP with
  --tp-comm-overlap but for the exposed tail of its pipelined reduce-scatters, a blocking
  op) is posted right BEFORE its compute op and runs alongside it: it waits
  for the P2P RECVs posted since the previous compute op (its compute op's inputs), its
  compute op does NOT wait for it, and the compute op after it, and SENDs in between, do.
Every intra-layer op also waits for the RECVs posted since the previous compute op (an
all-gather that reassembles a scatter/gather P2P transfer, schedules.intra_layer).
So a compute op waits for the intra-layer collectives of the previous compute op. An `I`'s
collectives delay the `W` after it too (a simplification: W needs none of them). The
alongside collectives posted before an overlapped pair's F (DualPipe: both ops' expert
all-to-alls, schedules.intra_layer) run beside the whole pair: its B does not wait for
them, the compute op after the pair and the SENDs after its B do.
The flag travels with the op (schedules.intra_layer sets it), so both backends read the
same placement from the program alone.

ZeRO-R's checkpoint ops (schedules.activation_partition) follow the blocking rule by
where the lowering puts them: Pa's all-gather of a backward's checkpoints over 'tp' is
posted right BEFORE that backward (B / I), so the backward waits for it; a Pa+cpu
checkpoint copy (`is_checkpoint_copy`: COPY_D2H / COPY_H2D on group CHECKPOINT_COPIES)
counts as a blocking op too, since DeepSpeed copies on the compute stream, synchronously
(`.cpu()` in the forward, `copy_` to the GPU before the backward's gather): the COPY_D2H
right after its F, which the next compute op and SENDs before it wait for; the COPY_H2D
right before the backward's all-gather, which waits for it (the chain), as the backward
waits for both. The ZeRO-Offload rules above do not apply to checkpoint copies.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .activation_partition import is_checkpoint_copy
from .chains import StageChains
from .names import DP_GROUPS, EP, ETP, HOST, INTRA_LAYER_GROUPS, PP_COPIES
from .ops import (COLLECTIVE_KINDS, COPY_KINDS, INPUT_GRAD_KINDS, P2P_KINDS, WORK_KINDS, Op,
                  OpKind, overlapped_pairs)

Key = tuple  # (kind, stage, microbatch) or (kind, stage, microbatch, chunk): Op.key


_GRADIENT_KINDS = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.REDUCE)
_GATHER_KINDS = (OpKind.ALL_GATHER, OpKind.BROADCAST)
_POSITIONAL_KINDS = frozenset({OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER,
                               OpKind.ALL_TO_ALL, OpKind.OPT_STEP, OpKind.COPY_D2H,
                               OpKind.COPY_H2D, OpKind.BROADCAST, OpKind.REDUCE})


_PLACED_KINDS = frozenset((*COLLECTIVE_KINDS, *COPY_KINDS))  # intra-layer ops, copies


def is_intra_layer(op: Op) -> bool:
    return op.group in INTRA_LAYER_GROUPS and op.kind.is_collective


def is_gradient_collective(op: Op) -> bool:
    return op.kind in _GRADIENT_KINDS and op.group in DP_GROUPS


def is_parameter_gather(op: Op) -> bool:
    """A ZeRO / FSDP ALL_GATHER of parameters, or torch.nn.DataParallel's BROADCAST of
    them from its first GPU (schedules.data_parallel.add_single_process)."""
    return op.kind in _GATHER_KINDS and op.group in DP_GROUPS


def runs_on_compute_stream(op: Op) -> bool:
    """Compute ops hold the rank's one stream; a host optimizer step does not."""
    return op.kind.is_compute and op.group != HOST


def prerequisites(op: Op, stage_ranks: Sequence[int],
                  num_microbatches: int | None = None,
                  chains: StageChains | None = None) -> tuple[Key, ...]:
    """Keys of the ops that must have *completed* before `op` may start (or be posted).

    `stage_ranks[s]` is the rank holding stage `s`. Where two neighbouring stages sit on
    the same rank there is no transfer, and the consumer waits for the producer directly.
    A whole-iteration data-parallel gradient collective of stage s (`ALL_REDUCE` /
    `REDUCE_SCATTER` on a DP group, chunk and microbatch None) waits for the weight
    gradients of all `num_microbatches` microbatches (of its chain: `chains`, default one
    chain of all stages, schedules.chains). Chunked ops wait for the same whole-stage keys
    as their unchunked op (positional rules: `local_waits`).
    """
    s, m = op.stage, op.microbatch
    kind = op.kind
    chains = chains or StageChains(len(stage_ranks), 1, num_microbatches)
    if kind is OpKind.F:
        before = chains.previous(s)
        if before is None:
            return ()
        local = stage_ranks[before] == stage_ranks[s]
        return ((OpKind.F, before, m) if local else (OpKind.RECV_F, s, m),)
    if kind in INPUT_GRAD_KINDS:
        needs = [(OpKind.F, s, m)]
        after = chains.next(s)
        if after is not None:
            local = stage_ranks[after] == stage_ranks[s]
            needs.append((OpKind.I, after, m) if local else (OpKind.RECV_B, s, m))
        return tuple(needs)
    if kind is OpKind.W:
        return ((OpKind.I, s, m),)
    if kind is OpKind.SEND_F:
        return ((OpKind.F, s, m),)
    if kind is OpKind.SEND_B:
        return ((OpKind.I, s, m),)
    if (kind in _GRADIENT_KINDS and op.group in DP_GROUPS and num_microbatches
            and op.chunk is None and m is None):
        return tuple((OpKind.W, s, mb) for mb in chains.microbatches_of(s))
    return ()


def produces(op: Op) -> tuple[Key, ...]:
    """Keys that the completion of `op` satisfies (a full `B` also yields `I` and `W`)."""
    if op.kind is OpKind.B:
        if op.chunk is None:
            return (op.key, (OpKind.I, op.stage, op.microbatch),
                    (OpKind.W, op.stage, op.microbatch))
        return (op.key, (OpKind.I, op.stage, op.microbatch, op.chunk),
                (OpKind.W, op.stage, op.microbatch, op.chunk))
    return (op.key,)


def chunk_completions(program: Sequence[Op]) -> dict[int, tuple[Key, ...]]:
    """Index -> the whole-stage keys that op completes beyond produces(op): the last
    group of each chunked (kind, stage, microbatch) in `program` (empty when unchunked)."""
    last: dict[tuple, int] = {}
    for index, op in enumerate(program):
        if op.chunk is not None and op.kind in WORK_KINDS:
            last[(op.kind, op.stage, op.microbatch)] = index
    return {index: produces(Op(kind, stage, microbatch))
            for (kind, stage, microbatch), index in last.items()}


def op_products(op: Op, index: int, completes: dict[int, tuple[Key, ...]]
                ) -> tuple[Key, ...]:
    """Keys op `index` of a program satisfies: produces(op), then, where it is the last
    layer group of a chunked op, the whole op's (`completes`: chunk_completions)."""
    extra = completes.get(index) if completes else None
    return produces(op) + extra if extra else produces(op)


def program_products(program: Sequence[Op]) -> list[tuple[Key, ...]]:
    """Keys each op of `program` satisfies: produces() plus chunk_completions()."""
    extra = chunk_completions(program)
    return [op_products(op, i, extra) for i, op in enumerate(program)]


def _covering(latest: dict, stage: int, chunk: int | None) -> list[int]:
    """Indices in `latest` ((stage, chunk) -> index) whose chunk covers `chunk`."""
    if chunk is None:
        return [i for (s, _), i in latest.items() if s == stage]
    return [i for i in (latest.get((stage, chunk)), latest.get((stage, None))) if i is not None]


def _newest(indices: list[int]) -> tuple[int, ...]:
    return (max(indices),) if indices else ()


def local_waits(program: Sequence[Op]) -> list[tuple[int, ...]]:
    """For each op of `program`, the indices of the earlier ops of the same program it
    waits for under the positional rules (module docstring); () for most ops."""
    waits: list[tuple[int, ...]] = [()] * len(program)
    if not any(op.kind in _POSITIONAL_KINDS for op in program):
        return waits
    if any(op.kind in _PLACED_KINDS and (is_intra_layer(op) or is_checkpoint_copy(op))
           for op in program):
        _intra_layer_waits(program, waits)
    gathers: dict = {}    # (stage, chunk) -> latest parameter gather
    grads: dict = {}      # (stage, chunk) -> latest weight-gradient op
    reduced: dict = {}    # (stage, chunk) -> latest gradient collective
    reduced_on: dict = {}  # (stage, chunk) -> its group
    pending: dict = {}    # stage -> gradient collectives / D2H copies since its last step
    steps: dict = {}      # stage -> latest OPT_STEP
    uploads: dict = {}    # (stage, chunk) -> latest COPY_H2D
    reduces: dict = {}    # stage -> latest REDUCE (torch.nn.DataParallel)
    for index, op in enumerate(program):
        kind = op.kind
        if kind in P2P_KINDS:
            continue  # positional rules neither apply to them nor look at them
        s, g = op.stage, op.chunk
        if kind in COPY_KINDS and is_checkpoint_copy(op):
            continue  # placed as a blocking op (_intra_layer_waits)
        if kind in WORK_KINDS:
            waits[index] = waits[index] + tuple(_covering(gathers, s, g))
            if kind is not OpKind.I:
                grads[(s, g)] = index
        elif is_gradient_collective(op):
            need = _newest(_covering(grads, s, g))
            if (s, g) in reduced and reduced_on[(s, g)] != op.group:
                need += (reduced[(s, g)],)
            if op.group == PP_COPIES:  # DualPipe sums the copies' reduced gradients
                need += tuple(pending.get(s, ()))
            waits[index] = need
            reduced[(s, g)], reduced_on[(s, g)] = index, op.group
            pending.setdefault(s, []).append(index)
            if kind is OpKind.REDUCE:
                reduces[s] = index
        elif kind is OpKind.COPY_D2H:
            waits[index] = _newest(_covering(reduced, s, g) or _covering(grads, s, g))
            pending.setdefault(s, []).append(index)
        elif kind is OpKind.OPT_STEP:  # one optimizer per rank: every stage's gradients
            waits[index] = (waits[index] + tuple(sorted(i for ops in pending.values()
                                                        for i in ops))
                            + tuple(sorted(_newest(_covering(grads, t, None))[0]
                                           for t in {t for t, _ in grads})))
            pending.clear()
            steps[s] = index
        elif kind is OpKind.COPY_H2D:
            waits[index] = (steps[s],) if s in steps else ()
            uploads[(s, g)] = index
        elif is_parameter_gather(op):
            need = ([steps[s]] if s in steps else []) + _covering(uploads, s, g)
            if kind is OpKind.BROADCAST and s in reduces:
                need.append(reduces[s])
            waits[index] = tuple(need)
            gathers[(s, g)] = index
    return waits


def _intra_layer_waits(program: Sequence[Op], waits: list[tuple[int, ...]]) -> None:
    """Fill `waits` with the intra-layer rules, checkpoint copies included (module
    docstring)."""
    blocking: list[int] = []   # collectives the next compute op and SENDs wait for
    alongside: list[int] = []  # overlapped collectives of the coming compute op
    recvs: list[int] = []      # RECVs since the previous compute op
    chain: tuple[int, ...] = ()  # the latest blocking collective of this compute op
    pair: list[int] = []       # an overlapped pair's collectives, run beside both its ops
    for index, op in enumerate(program):
        kind = op.kind
        if kind in WORK_KINDS and op.overlapped and kind is OpKind.F:
            waits[index] = tuple(blocking)  # the pair's F; its B waits for none of the
            pair = [i for i in alongside if program[i].group in (EP, ETP)]  # expert ops
            blocking = [i for i in alongside if i not in pair]
            alongside, recvs, chain = [], [], ()
        elif kind in WORK_KINDS:
            waits[index] = tuple(blocking)
            blocking, alongside, recvs, chain = pair + alongside, [], [], ()
            pair = []
        elif kind in (OpKind.SEND_F, OpKind.SEND_B, OpKind.OPT_STEP):
            waits[index] = tuple(blocking)
        elif kind in (OpKind.RECV_F, OpKind.RECV_B):
            recvs.append(index)
        elif is_intra_layer(op) or is_checkpoint_copy(op):
            if op.alongside:
                waits[index] = tuple(recvs)
                alongside.append(index)
            else:
                waits[index] = chain + tuple(recvs)
                chain = (index,)
                blocking.append(index)


@dataclass(frozen=True)
class ProgramContract:
    """What a backend precomputes for one rank's program so it does not rescan:
    `local[i]`, the earlier indices op i waits for (local_waits), `completes`, the
    extra whole-stage keys of chunked ops (chunk_completions), and `partner`, the extra
    keyed waits of the F of an overlapped pair (pair_waits). Keyed waits and products
    stay per op: prerequisites(op, ...) and produces(op)."""

    local: list[tuple[int, ...]]
    completes: dict[int, tuple[Key, ...]]
    partner: dict[int, tuple[Key, ...]] = field(default_factory=dict)


def op_needs(op: Op, index: int, contract: ProgramContract, stage_ranks: Sequence[int],
             num_microbatches: int | None = None, chains: StageChains | None = None
             ) -> tuple[Key, ...]:
    """Keys op `index` of a program (whose contract is `contract`) waits for:
    prerequisites(op, ...), then, for the F of an overlapped pair, its partner's
    (pair_waits)."""
    keys = prerequisites(op, stage_ranks, num_microbatches, chains)
    extra = contract.partner.get(index) if contract.partner else None
    return keys + extra if extra else keys


def program_needs(program: Sequence[Op], contract: ProgramContract,
                  stage_ranks: Sequence[int], num_microbatches: int | None = None,
                  chains: StageChains | None = None) -> list[tuple[Key, ...]]:
    """`op_needs` of each op of `program`."""
    return [op_needs(op, i, contract, stage_ranks, num_microbatches, chains)
            for i, op in enumerate(program)]


def program_contract(program: Sequence[Op], stage_ranks: Sequence[int] = (),
                     chains: StageChains | None = None) -> ProgramContract:
    return ProgramContract(local_waits(program), chunk_completions(program),
                           pair_waits(program, stage_ranks, chains) if stage_ranks else {})


def pair_waits(program: Sequence[Op], stage_ranks: Sequence[int],
               chains: StageChains | None = None) -> dict[int, tuple[Key, ...]]:
    """An overlapped pair (an F and the B after it, both `overlapped`: DualPipe's F&B chunk)
    starts when the inputs of both are there, as torch lowers OVERLAP_F_B
    (`_add_send_recv`) and DeepSeek's `_forward_backward_chunk` receives both before
    computing: the F also waits for the B's keyed prerequisites but its own forward. The
    P2P pass posts the B's RECV before the F and the F's SEND after the B
    (schedules.p2p), so both outputs leave when the pair ends."""
    waits: dict[int, tuple[Key, ...]] = {}
    for forward, backward in overlapped_pairs(program):
        op = program[backward]
        own = (OpKind.F, op.stage, op.microbatch)
        waits[forward] = tuple(k for k in prerequisites(op, stage_ranks, chains=chains)
                               if k != own)
    return waits


_P2P_PEERS = {OpKind.SEND_F: (OpKind.RECV_F, 1), OpKind.RECV_F: (OpKind.SEND_F, -1),
              OpKind.SEND_B: (OpKind.RECV_B, -1), OpKind.RECV_B: (OpKind.SEND_B, 1)}
"""A P2P kind -> its other end's kind and stage offset (p2p_peer: a replay asks per post)."""


def p2p_peer(op: Op) -> Key:
    """The key of the other end of a P2P op: SEND_F(s,m) pairs with RECV_F(s+1,m), etc."""
    peer = _P2P_PEERS.get(op.kind)
    if peer is None:
        raise ValueError(f"{op} is not a P2P op")
    return (peer[0], op.stage + peer[1], op.microbatch)


def copy_peer(op: Op, chains: StageChains) -> Key:
    """The key of the other half of DualPipe's all-reduce of a stage's two copies (group
    'pp_copies'): the same op of the other copy's stage, on pipeline rank P-1-r."""
    return (op.kind, chains.copy_of(op.stage), op.microbatch)


def gather_releases(program: list[Op], contract: ProgramContract) -> dict[int, list[int]]:
    """compute index -> the parameter gathers whose last user it is: after it ends, the
    gathered parameters are freed (resharded). Both backends free gathered parameters by
    this rule."""
    last_user: dict[int, int] = {}
    for index, op in enumerate(program):
        if op.kind in WORK_KINDS:
            for j in contract.local[index]:
                if is_parameter_gather(program[j]):
                    last_user[j] = index
    out: dict[int, list[int]] = {}
    for gather, user in last_user.items():
        out.setdefault(user, []).append(gather)
    return out
