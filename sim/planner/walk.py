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
- a collective: its count times the uncontended alpha-beta time of one
  (sim.planner.bound._one_collective: every phase pays its most loaded link's bytes /
  bandwidth, which sharing a link only raises); 0 for a group of one GPU;
- a P2P transfer or a host copy: 0; a host OPT_STEP: its compute time.
Each of its ends is then no later than the replay's, so its last end (iteration time)
is no later either. Unlike the stage bounds (sim.planner.bound) it sees the
data-parallel communication a schedule cannot hide: ZeRO-2's per-microbatch
reduce-scatters queued on the DP lane, ZeRO-3's gathers before each forward and
backward, the last gradient bucket before the optimizer step. Units: seconds.
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

from .bound import CollectiveTimes


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


def contract_bound(lowered: Schedule, plan: Plan, topology: nx.DiGraph,
                   compute_time: Callable[[Op], float],
                   collectives: CollectiveTimes | None = None) -> float:
    """The finish time of the lowered schedule under the contract with lower-bound
    durations (module docstring); 0.0 (no bound) if the walk cannot finish.
    `plan`: the full plan the schedule was lowered with; `compute_time`: the cost model's
    (CostModel.compute_time(plan, topology))."""
    collectives = collectives or CollectiveTimes(plan, topology)
    replayed = plan.replayed_ranks
    stage_ranks, chains = lowered.stage_ranks, lowered.stage_chains
    count = lowered.num_microbatches
    ranks = [_Rank(list(p)) for p in lowered.programs]
    done: dict[tuple, float] = {}
    p2p_posted: dict[tuple, tuple[int, int, float]] = {}

    def duration(r: int, op: Op) -> float:
        if op.kind.is_collective:
            return collectives.seconds(op, replayed[r])
        return 0.0 if op.kind.is_copy else compute_time(op)  # a host OPT_STEP: compute

    def finish(state: _Rank, i: int, end: float) -> None:
        state.ends[i] = end
        for key in state.products[i]:
            done.setdefault(key, end)

    def settle(r: int, state: _Rank) -> bool:
        """End each lane's first posted ops whose waits have ended (the lane's previous
        op has: it was first)."""
        moved = False
        for lane, queue in state.lanes.items():
            while queue:
                i, posted = queue[0]
                needs = [state.ends[j] for j in state.local[i]]
                if any(e is None for e in needs):
                    break
                queue.popleft()
                end = max([posted, state.lane_end.get(lane, 0.0), *needs]) + duration(
                    r, state.program[i])
                state.lane_end[lane] = end
                finish(state, i, end)
                moved = True
        return moved

    def advance(r: int, state: _Rank) -> bool:
        """Walk the program as far as the known ends allow."""
        moved = False
        while state.pc < len(state.program):
            i, op = state.pc, state.program[state.pc]
            keyed = [done.get(k) for k in prerequisites(op, stage_ranks, count, chains)]
            local = [state.ends[j] for j in state.local[i]]
            blocking = op.kind in WORK_KINDS or op.kind in P2P_KINDS or (
                op.kind is OpKind.OPT_STEP and runs_on_compute_stream(op))
            if any(e is None for e in keyed) or (blocking and any(e is None for e in local)):
                break
            t = max([state.t, *keyed])
            if op.kind in P2P_KINDS:
                state.t = max([t, *local])
                peer = p2p_posted.pop(p2p_peer(op), None)
                if peer is None:
                    p2p_posted[op.key] = (r, i, state.t)
                else:  # both ends posted: the transfer (>= 0 s) starts now
                    other, j, at = peer
                    end = max(at, state.t)
                    finish(state, i, end)
                    finish(ranks[other], j, end)
            elif blocking:
                state.t = max([t, *local]) + compute_time(op)
                finish(state, i, state.t)
            else:
                state.t = t
                lane = (op.kind.is_collective, op.kind.is_copy, op.group)
                state.lanes.setdefault(lane, deque()).append((i, t))
            state.pc += 1
            moved = True
        return moved

    moved = True
    while moved:
        moved = False
        for r, state in enumerate(ranks):
            moved |= settle(r, state)
            moved |= advance(r, state)
            moved |= settle(r, state)
    if any(s.pc < len(s.program) or any(s.lanes.values()) for s in ranks):
        return 0.0  # the walk is stuck (no registered schedule does this): no bound
    return max((max([s.t, *(e for e in s.ends if e is not None)]) for s in ranks),
               default=0.0)
