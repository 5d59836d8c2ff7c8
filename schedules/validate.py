"""Structural checks and a unit-time dry run that finds deadlocks.

The dry run executes the execution contract (schedules.contract) with every compute op
taking one step and communication taking none (a collective's other members are the
same program rank in other replicas, so they post it at the same step). It yields the rank x step grid that
`clustersim show` prints, and, when some ops can never run, a DeadlockError whose report
is that grid with each rank's stuck op marked `>op<`.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from .contract import (Key, copy_peer, is_gradient_collective, is_intra_layer,
                       is_parameter_gather, p2p_peer, prerequisites, produces,
                       program_contract, runs_on_compute_stream)
from .errors import ConfigError, DeadlockError
from .limits import MAX_GRID_CELLS
from .names import PP_COPIES
from .ops import COMPUTE_KINDS, Op, OpKind
from .p2p import add_p2p
from .schedule import Schedule


@dataclass
class DryRun:
    """Unit-time execution: `steps[r]` lists (op, start step) of rank r's compute ops."""

    steps: list[list[tuple[Op, int]]]
    makespan: int

    def cells(self) -> int:
        """Cells of the rank x step grid."""
        return len(self.steps) * (self.makespan + 1)

    def grid(self, stuck: dict[int, Op] | None = None) -> str:
        """Rank x step table; idle steps are `.`; an op of an overlapped pair (Op.overlapped:
        DualPipe's F&B) ends in `&`; stuck ops appear as `>op<` after the end.
        ConfigError above MAX_GRID_CELLS cells (a text of gigabytes)."""
        if self.cells() > MAX_GRID_CELLS:
            raise ConfigError(f"the rank x step grid would have {len(self.steps):,} ranks x "
                              f"{self.makespan:,} steps, above {MAX_GRID_CELLS:,} cells "
                              f"(schedules.limits.MAX_GRID_CELLS): use --format text or csv")
        stuck = stuck or {}
        cells = []
        for r, ops in enumerate(self.steps):
            row = ["."] * self.makespan
            for op, t in ops:
                row[t] = f"{op}&" if op.overlapped else str(op)
            if r in stuck:
                row.append(f">{stuck[r]}<")
            cells.append(row)
        width = max([len(c) for row in cells for c in row] + [3])
        ncols = max(len(row) for row in cells)
        header = "step   " + " ".join(f"{i:>{width}}" for i in range(ncols))
        lines = [header]
        for r, row in enumerate(cells):
            lines.append(f"rank {r:<2}" + " ".join(f"{c:>{width}}" for c in row))
        return "\n".join(lines)


def check_structure(schedule: Schedule) -> None:
    """Every (stage, microbatch) has exactly one F and one backward, on the right rank.

    A compute op may instead come as its layer groups (`Op.chunk`): all of 0..G-1 once
    each (G = schedule.layer_groups), forward groups in layer order and backward groups
    (B, I) in reverse. Data-parallel ops (schedules.contract's positional kinds) may repeat
    a key: they are placed by their position in the program, not by key."""
    m_count, s_count = schedule.num_microbatches, schedule.num_stages
    chains = schedule.stage_chains
    seen: Counter = Counter()
    runs_of: dict[int, range] = {}  # stage -> its microbatches, found once per stage
    for rank, program in enumerate(schedule.programs):
        _check_chunks(program, rank, schedule.layer_groups)
        for op in program:
            stage, microbatch, kind = op.stage, op.microbatch, op.kind
            if stage < 0 or stage >= s_count:
                raise ConfigError(f"rank {rank}: op {op} names stage {stage}, "
                                  f"schedule has stages 0..{s_count - 1}")
            if schedule.rank_of_stage(stage) != rank:
                raise ConfigError(f"rank {rank}: op {op} belongs to stage {stage}, which "
                                  f"lives on rank {schedule.rank_of_stage(stage)}")
            if microbatch is not None:
                if not 0 <= microbatch < m_count:
                    raise ConfigError(f"rank {rank}: op {op} names microbatch {microbatch}, "
                                      f"schedule has microbatches 0..{m_count - 1}")
                runs = runs_of.get(stage) if kind in COMPUTE_KINDS else None
                if runs is None and kind in COMPUTE_KINDS:
                    runs = runs_of[stage] = chains.microbatches_of(stage)
                if runs is not None and microbatch not in runs:
                    raise ConfigError(f"rank {rank}: op {op}: stage {stage} runs "
                                      f"microbatches {runs.start}..{runs.stop - 1} (its "
                                      f"direction, schedules.chains), not {microbatch}")
            if kind not in _MAYBE_POSITIONAL or not positional(op):
                seen[op.key] += 1
    for key, n in seen.items():
        if n > 1:
            text = str(Op(*key[:3], chunk=key[3] if len(key) > 3 else None))
            raise ConfigError(f"op {text} appears {n} times; each op must run once")
    for key in [k for k in seen if len(k) > 3]:
        seen[key[:3]] += 1 if key[3] == 0 else 0  # a complete group set counts once
    for s in range(s_count):
        for m in chains.microbatches_of(s):
            if not seen[(OpKind.F, s, m)]:
                raise ConfigError(f"missing forward {s}F{m}")
            full = seen[(OpKind.B, s, m)]
            split = seen[(OpKind.I, s, m)], seen[(OpKind.W, s, m)]
            if not (full == 1 and split == (0, 0) or full == 0 and split == (1, 1)):
                raise ConfigError(f"stage {s} microbatch {m} needs one backward: either "
                                  f"{s}B{m}, or both {s}I{m} and {s}W{m}")
    check_p2p_order(schedule)


def check_p2p_order(schedule: Schedule) -> None:
    """ConfigError when a rank's sends to another rank come in another order than that
    rank's receives from it. NCCL matches the point-to-point operations of a rank pair in
    issue order, not by tag (torch.distributed P2P over NCCL), so a swapped pair would
    deliver one microbatch's tensor as another's on real hardware, while a simulator
    that matches by key would run it. Only the P2P ops in the programs are compared (a
    missing one is the dry run's deadlock)."""
    sent: dict[tuple[int, int], list[Op]] = {}      # (src, dst) -> sends, issue order
    received: dict[tuple[int, int], list[Op]] = {}  # (src, dst) -> receives, issue order
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if not op.kind.is_p2p:
                continue
            peer = schedule.rank_of_stage(p2p_peer(op)[1])
            if peer == rank:
                continue
            if op.kind in (OpKind.SEND_F, OpKind.SEND_B):
                sent.setdefault((rank, peer), []).append(op)
            else:
                received.setdefault((peer, rank), []).append(op)
    for (src, dst), sends in sent.items():
        for send, recv in zip(sends, received.get((src, dst), [])):
            if p2p_peer(send) != recv.key:
                raise ConfigError(
                    f"rank {src} sends {send} to rank {dst} where rank {dst} receives {recv}: "
                    f"NCCL pairs a rank pair's sends and receives in issue order, so "
                    f"{recv} would get {send}'s tensor; order rank {dst}'s receives (or "
                    f"rank {src}'s sends) alike")


def _check_chunks(program: list[Op], rank: int, groups: int) -> None:
    if all(op.chunk is None for op in program):
        return
    order: dict[tuple, list[int]] = {}
    for op in program:
        if op.kind.is_compute and not positional(op):
            order.setdefault((op.kind, op.stage, op.microbatch), []).append(op.chunk)
    for (kind, s, m), chunks in order.items():
        if all(c is None for c in chunks):
            continue  # whole ops; duplicates are reported by check_structure
        what = f"rank {rank}: {s}{kind.value}{m}"
        if None in chunks:
            raise ConfigError(f"{what} appears both whole and as layer groups")
        bad = [c for c in chunks if not 0 <= c < groups]
        if bad:
            raise ConfigError(f"{what}.{bad[0]}: chunk out of range 0..{groups - 1} "
                              f"(schedule.layer_groups={groups})")
        want = list(range(groups)) if kind is OpKind.F else list(range(groups - 1, -1, -1))
        if kind is OpKind.W:
            chunks = sorted(chunks, reverse=True)
        if chunks != want:
            raise ConfigError(f"{what} must come as layer groups {want} in this order "
                              f"(forward in layer order, backward in reverse), got {chunks}")


def dry_run(schedule: Schedule) -> DryRun:
    """Run the contract with unit compute time; raise DeadlockError if it cannot finish."""
    lowered = add_p2p(schedule)
    programs, ranks = lowered.programs, lowered.stage_ranks
    chains = lowered.stage_chains
    contracts = [program_contract(p, ranks, chains) for p in programs]
    done: dict[Key, int] = {}      # key -> step at which its product is available
    posted: dict[Key, int] = {}    # p2p key -> step at which it was posted
    copies: dict[Key, tuple[int, int, int]] = {}  # DualPipe copy all-reduce -> rank, index, step
    finished = [[0] * len(p) for p in programs]  # step at which op i's product exists
    clock = [0] * len(programs)
    pc = [0] * len(programs)
    steps: list[list[tuple[Op, int]]] = [[] for _ in programs]

    waiting: dict[Key, list[int]] = {}  # missing key -> ranks blocked on it
    queue, queued = deque(range(len(programs))), set(range(len(programs)))

    def finish(keys, at: int) -> None:
        for key in keys:
            done[key] = at
            for blocked in waiting.pop(key, ()):
                if blocked not in queued:
                    queue.append(blocked)
                    queued.add(blocked)

    while queue:  # a worklist: a rank runs again only when a key it waits for appears
        r = queue.popleft()
        queued.discard(r)
        program, contract = programs[r], contracts[r]
        while pc[r] < len(program):
            i = pc[r]
            op = program[i]
            needs = (prerequisites(op, ranks, lowered.num_microbatches, chains)
                     + contract.partner.get(i, ()))
            missing = next((n for n in needs if n not in done), None)
            if missing is None:  # an earlier copy all-reduce not met by its peer yet
                missing = next((program[j].key for j in contract.local[i]
                                if finished[r][j] is None), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            ready = max([done[n] for n in needs] + [finished[r][j] for j in contract.local[i]],
                        default=0)
            if runs_on_compute_stream(op):
                start = max(clock[r], ready)
                steps[r].append((op, start))
                clock[r] = finished[r][i] = start + 1
                finish(produces(op) + contract.completes.get(i, ()), start + 1)
            elif op.kind.is_p2p:
                posted[op.key] = max(clock[r], ready)
                peer = p2p_peer(op)
                if peer in posted:
                    finish((op.key, peer), max(posted[op.key], posted[peer]))
            elif op.group == PP_COPIES:  # DualPipe's copies: both replayed ranks post it
                copies[op.key] = (r, i, max(clock[r], ready))
                peer = copies.get(copy_peer(op, chains))
                finished[r][i] = None  # until the peer posts it
                if peer is not None:
                    at = max(copies[op.key][2], peer[2])
                    finished[r][i] = finished[peer[0]][peer[1]] = at
                    finish((op.key, copy_peer(op, chains)), at)
            else:  # collectives (members are symmetric replicas: all post now), copies
                finished[r][i] = max(clock[r], ready)
                finish((op.key,), finished[r][i])
            pc[r] += 1

    result = DryRun(steps, max(clock))
    stuck = {r: programs[r][pc[r]] for r in range(len(programs)) if pc[r] < len(programs[r])}
    if stuck:
        lines = []
        for r, op in stuck.items():
            needs = (prerequisites(op, ranks, lowered.num_microbatches, chains)
                     + contracts[r].partner.get(pc[r], ()))
            missing = [n for n in needs if n not in done]
            waits = ", ".join([_describe_wait(n, posted) for n in missing] + [
                f"{_describe_wait(programs[r][j].key, posted)} on '{PP_COPIES}' (its other "
                f"copy's all-reduce {_describe_wait(copy_peer(programs[r][j], chains), posted)}"
                f" is never posted)"
                for j in contracts[r].local[pc[r]] if finished[r][j] is None])
            lines.append(f"rank {r} stuck at {op} waiting for {waits}")
        cells = result.cells()
        report = (result.grid(stuck) if cells <= MAX_GRID_CELLS else
                  f"(the rank x step grid, {cells:,} cells, is above {MAX_GRID_CELLS:,}: "
                  f"not drawn)")
        raise DeadlockError(
            f"deadlock: {len(stuck)} rank(s) can never finish; " + "; ".join(lines),
            stuck, report,
        )
    return result


def positional(op: Op) -> bool:
    """Ops the contract places by position (may repeat a key): DP collectives, copies,
    optimizer steps, intra-layer (TP/CP/EP) collectives."""
    if op.kind not in _MAYBE_POSITIONAL:
        return False
    return (op.kind is OpKind.OPT_STEP or op.kind.is_copy or is_gradient_collective(op)
            or is_parameter_gather(op) or is_intra_layer(op))


_MAYBE_POSITIONAL = frozenset({OpKind.OPT_STEP, OpKind.COPY_D2H, OpKind.COPY_H2D,
                               OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER,
                               OpKind.ALL_TO_ALL, OpKind.BROADCAST, OpKind.REDUCE})


def _describe_wait(key: Key, posted: dict[Key, int]) -> str:
    kind, stage, microbatch = key[:3]
    text = f"{stage}{kind.value}{'' if microbatch is None else microbatch}"
    if kind.is_p2p:
        p_kind, p_stage, p_mb = p2p_peer(Op(kind, stage, microbatch))
        if key in posted:
            return f"{text} (its peer {p_stage}{p_kind.value}{p_mb} is never posted)"
        return f"{text} (never posted)"
    return text


def validate(schedule: Schedule) -> DryRun:
    """Check structure, then dry-run; returns the dry run of a valid schedule."""
    check_structure(schedule)
    return dry_run(schedule)
