"""The planner's tightest bound: the replay's own execution contract (schedules.contract)
walked with every op at a lower bound of its duration, without SimPy or the network.

The replay (sim.engine.Replay) walks each rank's lowered program in order: it waits for
an op's keyed prerequisites (schedules.contract.prerequisites) before taking it; a
compute op (and an OPT_STEP on the stream) then waits for its positional waits
(local_waits) and holds the stream for its duration; a P2P op is posted after its
positional waits and a transfer starts once both ends are posted; a collective or copy
is posted and runs on its lane (group axis, PCIe, host) after the lane's previous op and
its positional waits, the other members posting at the same moment by symmetry. Every
start is so the max of the ends it waits for (and the walker's time), every end a start
plus a duration, in a fixed order per rank and per lane: a max-plus system, monotone in
the durations. `contract_bound` solves the same system with each duration replaced by a
lower bound of it:
- compute: the cost model's compute time, the one the replay takes (the slowdown beside
  collectives only lengthens it);
- a collective: its count times the safe time of one (sim.planner.bound.CollectiveTimes,
  its module docstring: no faster on the flow network); 0 for a group of one GPU;
- a P2P transfer: the route latency bound plus its bytes over the slowest link all its
  routes share (CollectiveTimes.transfer), between the GPUs of the two pipeline ranks
  (Plan.devices, as the replay's); a host copy: 0; a host OPT_STEP: its compute time.
Each of its ends is then no later than the replay's, so its last end (iteration time)
is no later either. Unlike the stage bounds (sim.planner.bound) it sees the
data-parallel communication a schedule cannot hide: ZeRO-2's per-microbatch
reduce-scatters queued on the DP lane, ZeRO-3's gathers before each forward and
backward, the last gradient bucket before the optimizer step.

What the walk cannot see is the overlap slowdown (sim.engine): while a rank's slowing
collectives (data-parallel: sim.collective_model.slows_compute) run, its F/B/I/W ops
progress at 1 / (1 + f) (f: compute_slowdowns), so an op of t seconds overlapping them
for o seconds lasts t + o * c, c = f / (1 + f). `overlap_bound` charges it, per rank.
Its stream ops (F/B/I/W and an OPT_STEP on the stream) run one at a time in program
order from t_first (first one's start) to t_last (last one's end), so t_last - t_first
= W + c * y + Gap, where W = the sum of their compute times, y = the time the F/B/I/W
ops overlap S (the union of the times a slowing collective runs) and Gap = the idle time
between consecutive stream ops. S inside [t_first, t_last] lies in the F/B/I/W ops (y),
the stream's OPT_STEPs (at most W_o, their compute times: not slowed) or the gaps (at
most Gap), so y >= |S in [t_first, t_last]| - W_o - Gap. A lane's collectives run one at
a time, so |S| >= D, the largest sum of CollectiveTimes over one slowing lane of the
rank; S outside [t_first, t_last] measures at most h + a, h = t_first and a = T -
t_last (the replay's first span starts at 0; T: its last end). Hence
    T = h + (t_last - t_first) + a >= h + a + W + Gap + c * max(0, D - W_o - Gap - h - a),
nondecreasing in h, a and Gap (c < 1), so lower bounds of them may stand in:
- h: the contract walk's start of the first stream op (contract_bound passes it; 0);
- Gap >= G, the sum over consecutive stream ops k, k' of the longest chain of lane ops
  posted between them (they start no earlier than k's end: the program reaches them
  after k) through their positional waits and lane order, that k' waits for: k'
  starts after its positional waits (schedules.contract.local_waits): the blocking
  intra-layer collectives of k, the last gradient bucket's reduction before the step;
- a >= the longest such chain after the last stream op (ZeRO-1/2's parameter gathers
  after the step): every op posted after it starts after it, and ends by T.
`contract_bound` returns the larger of the walk and this bound. Units: seconds.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

import networkx as nx

from clustersim.schedules.contract import (local_waits, p2p_peer, prerequisites,
                                           program_products, runs_on_compute_stream)
from clustersim.schedules.ops import P2P_KINDS, WORK_KINDS, Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.schedules.schedule import Schedule

from ..collective_model import compute_slowdowns, slows_compute
from .bound import CollectiveTimes


_SENDS = (OpKind.SEND_F, OpKind.SEND_B)


class _Rank:
    """One program's walk: position, walker time, each op's end (None: not yet known),
    per lane the posted ops not yet ended (index, post time), in issue order."""

    def __init__(self, program: list[Op]):
        self.program, self.pc, self.t = program, 0, 0.0
        self.local = local_waits(program)
        self.products = program_products(program)
        self.ends: list[float | None] = [None] * len(program)
        self.lanes: dict[tuple, deque[tuple[int, float]]] = {}
        self.lane_end: dict[tuple, float] = {}
        self.first_start: float | None = None  # of its first op on the compute stream


def contract_bound(lowered: Schedule, plan: Plan, topology: nx.DiGraph,
                   compute_time: Callable[[Op], float],
                   collectives: CollectiveTimes | None = None) -> float:
    """The larger of the finish time of the lowered schedule under the contract with
    lower-bound durations (module docstring) and `overlap_bound` on the walk's starts;
    0.0 (no bound) if the walk cannot finish. `plan`: the full plan the schedule was
    lowered with; `compute_time`: the cost model's (CostModel.compute_time(plan,
    topology))."""
    collectives = collectives or CollectiveTimes(plan, topology)
    ranks = _walk(lowered, plan, compute_time, collectives)
    if ranks is None:
        return 0.0
    walked = max((max([s.t, *(e for e in s.ends if e is not None)]) for s in ranks),
                 default=0.0)
    heads = [s.first_start for s in ranks]
    return max(walked, overlap_bound(lowered, plan, topology, compute_time, collectives,
                                     heads, [s.local for s in ranks]))


def _walk(lowered: Schedule, plan: Plan, compute_time: Callable[[Op], float],
          collectives: CollectiveTimes) -> list[_Rank] | None:
    """The contract walk (module docstring): each rank's state at the end, None if the
    walk is stuck (no registered schedule is). Ranks run from a ready queue, each until it
    cannot move: one stuck on a key joins that key's waiting list and is queued again
    when the key is done, one whose transfer its peer starts is queued again. The ends
    do not depend on this order: each is a max of ends it waits for plus a duration, each
    key an op waits for (a compute or P2P op's: schedules.contract.prerequisites) is
    produced by one op, and each lane ends its ops in post order."""
    replayed = plan.replayed_ranks
    stage_ranks, chains = lowered.stage_ranks, lowered.stage_chains
    count = lowered.num_microbatches
    ranks = [_Rank(list(p)) for p in lowered.programs]
    devices = plan.devices if collectives.flows else [None] * len(ranks)
    done: dict[tuple, float] = {}
    p2p_posted: dict[tuple, tuple[int, int, float]] = {}
    waiting: dict[tuple, list[int]] = {}  # key -> the ranks whose op at pc waits for it
    queued, ready = [True] * len(ranks), deque(range(len(ranks)))

    def wake(r: int) -> None:
        if not queued[r]:
            queued[r] = True
            ready.append(r)

    def duration(r: int, op: Op) -> float:
        if op.kind.is_collective:
            return collectives.seconds(op, replayed[r])
        return 0.0 if op.kind.is_copy else compute_time(op)  # a host OPT_STEP: compute

    def finish(r: int, i: int, end: float) -> None:
        ranks[r].ends[i] = end
        for key in ranks[r].products[i]:
            if key not in done:
                done[key] = end
                for waiter in waiting.pop(key, ()):
                    wake(waiter)

    def settle(r: int, state: _Rank) -> bool:
        """End each lane's first posted ops whose waits have ended (the lane's previous
        op has: it was first)."""
        moved = False
        for lane, queue in state.lanes.items():
            while queue:
                i, posted = queue[0]
                needs = [state.ends[j] for j in state.local[i]]
                if None in needs:
                    break
                queue.popleft()
                end = max([posted, state.lane_end.get(lane, 0.0), *needs]) + duration(
                    r, state.program[i])
                state.lane_end[lane] = end
                finish(r, i, end)
                moved = True
        return moved

    def advance(r: int, state: _Rank) -> bool:
        """Walk the program as far as the known ends allow; a keyed wait left unmet
        puts the rank on that key's waiting list."""
        moved = False
        while state.pc < len(state.program):
            i, op = state.pc, state.program[state.pc]
            keys = prerequisites(op, stage_ranks, count, chains)
            keyed = [done.get(k) for k in keys]
            if None in keyed:
                waiting.setdefault(keys[keyed.index(None)], []).append(r)
                break
            local = [state.ends[j] for j in state.local[i]]
            blocking = op.kind in P2P_KINDS or runs_on_compute_stream(op)
            if blocking and None in local:
                break  # its own lane ops (settle) or a transfer (the peer wakes it)
            t = max([state.t, *keyed])
            if op.kind in P2P_KINDS:
                state.t = max([t, *local])
                peer = p2p_posted.pop(p2p_peer(op), None)
                if peer is None:
                    p2p_posted[op.key] = (r, i, state.t)
                else:  # both ends posted: the transfer starts now
                    other, j, at = peer
                    src, dst = (r, other) if op.kind in _SENDS else (other, r)
                    end = max(at, state.t) + collectives.transfer(
                        devices[src], devices[dst], p2p_bytes(op, ranks[other].program[j]))
                    finish(r, i, end)
                    finish(other, j, end)
                    wake(other)
            elif blocking:
                start = max([t, *local])
                if state.first_start is None:
                    state.first_start = start
                state.t = start + compute_time(op)
                finish(r, i, state.t)
            else:
                state.t = t
                lane = (op.kind.is_collective, op.kind.is_copy, op.group)
                state.lanes.setdefault(lane, deque()).append((i, t))
            state.pc += 1
            moved = True
        return moved

    while ready:  # a rank runs until it cannot move; what it ends wakes its waiters
        r = ready.popleft()
        queued[r] = False
        state = ranks[r]
        while settle(r, state) | advance(r, state) | settle(r, state):
            pass
    if any(s.pc < len(s.program) or any(s.lanes.values()) for s in ranks):
        return None  # the walk is stuck (no registered schedule does this): no bound
    return ranks


def overlap_bound(lowered: Schedule, plan: Plan, topology: nx.DiGraph,
                  compute_time: Callable[[Op], float],
                  collectives: CollectiveTimes | None = None,
                  heads: list[float | None] | None = None,
                  waits: list[list[tuple[int, ...]]] | None = None) -> float:
    """The overlap bound of the module docstring: the largest over the replayed ranks of
    h + a + W + G + c * max(0, D - G - W_o - h - a); 0.0 for an asynchronous schedule
    (its replay reports a steady-state window). `heads[r]`: a lower bound of when rank
    r's first op on the compute stream starts (the contract walk's; default 0);
    `waits[r]`: local_waits of program r, where the caller has it already."""
    if lowered.asynchronous is not None:
        return 0.0
    collectives = collectives or CollectiveTimes(plan, topology)
    slowdowns = compute_slowdowns(plan, topology)
    best = 0.0
    for r, program in enumerate(lowered.programs):
        rank = plan.replayed_ranks[r]
        head = (heads[r] if heads is not None else None) or 0.0
        best = max(best, rank_overlap_bound(
            list(program), slowdowns[r], head, compute_time,
            lambda op, rank=rank: collectives.seconds(op, rank),
            None if waits is None else waits[r]))
    return best


def p2p_bytes(op: Op, peer: Op) -> float:
    """The bytes the replay transfers for a matched P2P pair: the SEND's (sim.engine)."""
    return op.nbytes if op.kind in _SENDS else peer.nbytes


def rank_overlap_bound(program: list[Op], slowdown: float, head: float,
                        compute_time: Callable[[Op], float],
                        seconds: Callable[[Op], float],
                        local: list[tuple[int, ...]] | None = None) -> float:
    """One rank's overlap bound (module docstring); `seconds(op)`: a collective's lower
    bound (CollectiveTimes); `local`: local_waits(program), if known."""
    stream = [i for i, op in enumerate(program) if runs_on_compute_stream(op)]
    if not stream:
        return 0.0
    work = sum(compute_time(program[i]) for i in stream)
    other = sum(compute_time(program[i]) for i in stream if program[i].kind not in WORK_KINDS)
    local = local_waits(program) if local is None else local

    def duration(op: Op) -> float:
        if op.kind.is_collective:
            return seconds(op)
        return 0.0 if op.kind.is_copy else compute_time(op)  # a host OPT_STEP

    gaps, tail = 0.0, 0.0
    marks = [*stream, len(program)]
    for begin, end in zip(marks, marks[1:]):
        since: dict[int, float] = {}  # lane op -> its least end after stream op `begin`
        last_on: dict[tuple, int] = {}
        for i in range(begin + 1, end):
            op = program[i]
            if op.kind in P2P_KINDS or runs_on_compute_stream(op):
                continue
            lane = (op.kind.is_collective, op.kind.is_copy, op.group)
            before = [since[j] for j in local[i] if j in since]
            if lane in last_on:
                before.append(since[last_on[lane]])
            since[i] = max([0.0, *before]) + duration(op)
            last_on[lane] = i
        if end < len(program):
            gaps += max([0.0, *(since[j] for j in local[end] if j in since)])
        else:
            tail = max([0.0, *since.values()])
    lanes: dict[str | None, float] = {}
    for op in program:
        if slows_compute(op):
            lanes[op.group] = lanes.get(op.group, 0.0) + seconds(op)
    slowing = max(lanes.values(), default=0.0) if slowdown > 0 else 0.0
    share = slowdown / (1 + slowdown)
    return head + tail + work + gaps + share * max(0.0, slowing - gaps - other - head - tail)
