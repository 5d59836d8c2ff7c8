"""Run-ahead: the ops of one rank whose times follow from that rank alone, timed without
events (issue 19: most of a replay's events are ones no other rank observes).

Before op `index`, sim.engine.Replay asks `_ahead(rank, index)`. From there, while an op
is a compute op (F/B/I/W) or a collective whose seconds the collective hook fixes in
advance (its `fixed(op, rank)`: an intra-node group's uncontended time,
sim.collective_model), and all it waits for is done or is an earlier op of the run, the
replay's rules (sim.engine) give its times directly, by the same floating-point
operations the events would have done:

- the program reaches the op at `t` and holds there until its keyed prerequisites are
  met (t = the latest of them);
- a compute op then starts at max(t, its positional waits), holds the stream for
  compute_time(op) x speed, and t becomes its end;
- a collective starts at max(t, its lane's previous op, its positional waits) and lasts
  its fixed seconds; t stays.

The run stops before the first op that needs another rank or the network (P2P, a network
collective, a full-replay meeting, a host copy or optimizer step), waits for something not
yet timed, or completes a key another rank's program waits for. It is tried only when
nothing else can change these times: no data-parallel collective of the rank posted and
unfinished (its overlap slowdown would slow the compute: sim.collective_model.
slows_compute) and no gathered-parameter memory (ZeRO-3's releases). The program then
sleeps once, to `t`, instead of once per op; ops that end after `t` (collectives beside
the last compute op) get one timer each at their end. Spans, memory samples and
completions are those the events would have produced; tests/test_engine_speed_unchanged.py
holds the answers to 1e-9 relative.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from clustersim.schedules.contract import Key, op_needs, op_products, prerequisites, produces
from clustersim.schedules.names import COMPUTE_LANE, PP_COPIES, collective_lane
from clustersim.schedules.ops import COLLECTIVE_KINDS, WORK_KINDS, Op
from clustersim.schedules.timeline import Span

from .lane_turn import LaneTurn


@dataclass(frozen=True)
class Timed:
    """One op of a run: where it ran and when (seconds)."""

    index: int
    op: Op
    lane: str
    start: float
    end: float
    info: dict | None


def at_time(env: simpy.Environment, when: float) -> simpy.Event:
    """A timeout that fires at exactly `when` (>= now): SimPy adds its delay to now, so
    the delay is nudged by ulps until now + delay == when."""
    now = env.now
    delay = when - now
    for _ in range(4):
        if now + delay == when:
            break
        delay = math.nextafter(delay, math.inf if now + delay < when else -math.inf)
    return env.timeout(max(delay, 0.0))


def foreign_keys(programs: list[list[Op]], contracts: list, stage_ranks, count,
                 chains) -> list[frozenset[Key]]:
    """Per program: the keys its ops complete that another program's ops wait for (a run
    stops before such an op: the waiter must wake at its exact time)."""
    awaited_by: dict[Key, set[int]] = {}
    for p, (program, contract) in enumerate(zip(programs, contracts)):
        for op in program:
            for key in prerequisites(op, stage_ranks, count, chains):
                awaited_by.setdefault(key, set()).add(p)
        for extra in contract.partner.values():
            for key in extra:
                awaited_by.setdefault(key, set()).add(p)
    foreign = []
    for p, (program, contract) in enumerate(zip(programs, contracts)):
        made = {k for op in program for k in produces(op)}
        made.update(k for extra in contract.completes.values() for k in extra)
        foreign.append(frozenset(k for k in made if awaited_by.get(k, {p}) - {p}))
    return foreign


class RunAhead:
    """sim.engine.Replay's run-ahead (module docstring). Expects the Replay's state:
    programs, contracts, done, local_done, replica, last_on_lane, memory, speed, pc.
    `run_ahead = False` replays event by event (tests/test_run_ahead.py compares)."""

    run_ahead = True

    def _init_run_ahead(self, contracts: list, program_of: list[int]) -> None:
        """`contracts[p]`: program p's contract; `program_of[r]`: replay rank r's program."""
        self.fixed = getattr(self.collective, "fixed", None)
        self.unfinished_slowing = [0] * len(self.programs)  # posted, not ended
        self.late: dict[tuple[int, int], float] = {}  # run ops still running -> end
        self._foreign_of = (contracts, program_of)  # what foreign_keys needs, on first use
        self.foreign: list[frozenset[Key]] | None = None
        self._timeable: list[bytes | None] = [None] * len(self.programs)

    def _timeable_mask(self, rank: int) -> bytes:
        """Per op of `rank`'s program, 1 where a run may hold it: a compute op, or a
        collective with a fixed time that meets no other replayed rank."""
        fixed, meet = self.fixed, self.meet

        def timeable(op: Op) -> bool:
            if op.kind in WORK_KINDS:
                return True
            return (op.kind in COLLECTIVE_KINDS and fixed is not None
                    and op.group != PP_COPIES and (meet is None or len(meet(rank, op)) == 1)
                    and fixed(op, rank) is not None)

        return bytes(map(timeable, self.programs[rank])) + b"\0"

    def _timeable_of(self, rank: int) -> bytes:
        """`_timeable_mask(rank)`, made once, or all 0 when `run_ahead` is off. The replay
        asks `_ahead` only where the mask has 1 at the op and the next: a run of one op
        saves no event (the engine's inline path)."""
        timeable = self._timeable[rank]
        if timeable is None:
            timeable = self._timeable[rank] = (self._timeable_mask(rank) if self.run_ahead
                                               else bytes(len(self.programs[rank]) + 1))
        return timeable

    def _ahead(self, rank: int, index: int) -> tuple[list[Timed], float] | None:
        """The run from op `index` (`_timeable_of` has 1 at it and the next) and when the
        program goes on (module docstring), or None when not even op `index` can be timed
        ahead."""
        timeable = self._timeable[rank]
        program = self.programs[rank]
        if self.unfinished_slowing[rank] or (self.releases is not None and self.releases[rank]):
            return None
        contract = self.contracts[rank]
        done, local_done = self.done[self.replica[rank]], self.local_done[rank]
        stage_ranks, count, chains = (self.schedule.stage_ranks,
                                      self.schedule.num_microbatches, self.chains)
        local, completes = contract.local, contract.completes
        fixed, foreign = self.fixed, None  # self.foreign[rank], read once a run needs it
        t = self.env.now
        ends: dict[int, float] = {}  # index -> end, ops of this run
        keys: dict[Key, float] = {}  # keys this run completes -> when
        lanes: dict[str, float] = {}  # lane -> end of this run's last op on it
        run: list[Timed] = []
        for j in range(index, len(program)):
            if not timeable[j]:
                break
            op = program[j]
            hit = None if op.kind in WORK_KINDS else fixed(op, rank)
            ready = t
            need = op_needs(op, j, contract, stage_ranks, count, chains)
            for key in need:
                if key not in done:
                    at = keys.get(key)
                    if at is None:
                        return self._ran(run, t)
                    ready = max(ready, at)
            made = op_products(op, j, completes)
            if foreign is None:
                foreign = self._foreign(rank)
            if foreign and any(k in foreign for k in made):
                break
            start = ready
            for w in local[j]:
                if w not in local_done:
                    at = ends.get(w)
                    if at is None:
                        at = self.late.get((rank, w))
                        if at is None:
                            return self._ran(run, t)
                    start = max(start, at)
            t = ready
            if hit is None:
                end = t = start + self._compute_seconds(rank, op)
                run.append(Timed(j, op, COMPUTE_LANE, start, end, None))
            else:
                lane = collective_lane(op.group)
                free = lanes.get(lane)
                if free is None:
                    free = self._lane_free(rank, lane)
                    if free is None:
                        break
                start = max(start, free)
                seconds, info = hit
                end = lanes[lane] = start + seconds
                run.append(Timed(j, op, lane, start, end, info))
            ends[j] = end
            for key in made:
                keys[key] = end
        return self._ran(run, t)

    def _foreign(self, rank: int) -> frozenset[Key]:
        """`foreign_keys` of the rank's program, computed for every program the first time
        a run gets as far as asking (a deep pipeline's runs stop earlier: each compute op
        waits for a transfer still running, so it never pays for this walk of every op)."""
        if self.foreign is None:
            contracts, program_of = self._foreign_of
            schedule = self.schedule
            foreign = foreign_keys(schedule.programs, contracts, schedule.stage_ranks,
                                   schedule.num_microbatches, self.chains)
            self.foreign = [foreign[p] for p in program_of]
        return self.foreign[rank]

    @staticmethod
    def _ran(run: list[Timed], t: float) -> tuple[list[Timed], float] | None:
        return (run, t) if len(run) > 1 else None

    def _lane_free(self, rank: int, lane: str) -> float | None:
        """When the rank's `lane` is free for a run's op: now if its last op has ended, that
        op's end if it is a run op still running, None if another op holds or queues."""
        last = self.last_on_lane.get((rank, lane))
        if last is None or last.over:
            return self.env.now
        return last.until

    def _run_ahead(self, rank: int, run: list[Timed], resume: float):
        """Record `run` (spans, memory, completions) and sleep the program until `resume`."""
        env, memory = self.env, self.memory
        if memory:
            starts, ends = self.activation_ends[rank]
            for timed in run:
                if timed.lane == COMPUTE_LANE:
                    if starts[timed.index]:
                        self._allocate(rank, memory.activations[timed.op.stage], timed.start)
                    if ends[timed.index]:
                        self._allocate(rank, -memory.activations[timed.op.stage], timed.end)
        early = sorted((x for x in run if x.end <= resume), key=_end)
        late = [x for x in run if x.end > resume]
        for timed in early:
            self.spans.append(Span(rank, timed.lane, timed.op, timed.start, timed.end,
                                   timed.info))
            if timed.lane != COMPUTE_LANE:
                self.last_on_lane.pop((rank, timed.lane), None)
        for timed in late:
            self._finish_late(rank, timed)
        yield at_time(env, resume)
        for timed in early:
            self._complete(rank, timed.index, timed.op)
        self.pc[rank] += len(run)

    def _finish_late(self, rank: int, timed: Timed) -> None:
        """A run op that ends after the program goes on: a timer at its end completes it."""
        key = (rank, timed.index)
        self.late[key] = timed.end
        timer = at_time(self.env, timed.end)
        turn = self.last_on_lane[(rank, timed.lane)] = LaneTurn(self.env, timed.end)

        def finish(_event: simpy.Event) -> None:
            self.spans.append(Span(rank, timed.lane, timed.op, timed.start, timed.end,
                                   timed.info))
            del self.late[key]
            self._complete(rank, timed.index, timed.op)
            turn.end()

        timer.callbacks.append(finish)


def _end(timed: Timed) -> float:
    return timed.end
