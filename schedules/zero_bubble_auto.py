"""A zero-bubble schedule built for given stage costs under a memory cap.

The problem (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 3): P
stages, one per pipeline rank (loop placement, rank s holds stage s), M microbatches;
stage s takes F_s, I_s and W_s seconds for a microbatch's forward, input-gradient and
weight-gradient passes; a P2P transfer between neighbouring stages takes `p2p` seconds;
rank s may hold at most L_s microbatches' activations (from the start of F(s, m) to the
end of W(s, m)). Find each rank's order of F, I and W ops that minimises the iteration.

The method is the paper's heuristic (section 3.1, "Heuristic algorithm"), a list schedule
simulated in time:
- a rank runs an I as soon as it can (it lies on the critical path);
- otherwise an F, within its memory limit: as many warm-up forwards as the limit allows;
- otherwise, while it waits, a pending W fills the gap, always when the memory limit is
  reached (a W frees a microbatch) and, under the `fill` policy, only when the known gap
  until its next F or I can start is at least W_s ('gap'), or whenever it is idle
  ('greedy');
- every remaining W runs at the end.
F and I run in microbatch order on every rank, as in every schedule of the paper. Both fill
policies and every memory limit from 1F1B's (P - s on rank s) up to the cap are simulated,
and the shortest iteration wins (ties: less memory, then 'gap'). The paper refines its
heuristic with an ILP; here, where the problem is small (at most EXACT_LIMIT joint orders),
an exact search times every order of every rank that runs F, I and W each in microbatch
order within the memory cap (`exact_search`), so the result is the optimum over that
family. With uniform costs F = I = W, free P2P and
M >= P this finds ZB-H1's iteration under 1F1B's memory and ZB-H2's (no bubble) under
twice it (tests/test_zero_bubble_auto.py); with uneven stages it can beat both.

Units: seconds. Pure Python; the simulator supplies the costs (sim.simulate).
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .ops import Op, OpKind

FILL_POLICIES = ("gap", "greedy")
GRID_EVALUATIONS = 300  # template orders tried on the joint grid (spread over it)
EXACT_LIMIT = 20_000  # joint orders the exact search times: all of them, or it is skipped
SEARCH_EVALUATIONS = 250  # single-rank changes tried by the coordinate search


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one microbatch's forward, input-gradient and weight-gradient pass on a
    stage."""

    forward: float
    input_grad: float
    weight_grad: float


@dataclass(frozen=True)
class AutoSchedule:
    """The chosen programs, their iteration time (iteration_time), the microbatches each
    rank holds at its peak, and which searched order won."""

    programs: list[list[Op]]
    makespan: float
    peak_in_flight: tuple[int, ...]  # microbatches each rank holds at its peak
    origin: str  # which searched order won


def check_inputs(times: Sequence[StageTimes], microbatches: int, p2p: float,
                 max_in_flight: Sequence[int]) -> None:
    """ConfigError naming the field and the rule for inputs the search cannot use."""
    if not times:
        raise ConfigError("stage times: need at least one stage")
    if microbatches < 1:
        raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
    if not p2p >= 0:
        raise ConfigError(f"p2p seconds must be >= 0, got {p2p}")
    for s, t in enumerate(times):
        for name in ("forward", "input_grad", "weight_grad"):
            if not getattr(t, name) >= 0:
                raise ConfigError(f"stage {s} {name} seconds must be >= 0, got "
                                  f"{getattr(t, name)}")
    if len(max_in_flight) != len(times):
        raise ConfigError(f"memory limits: one per stage ({len(times)}), got "
                          f"{len(max_in_flight)}")
    low = [s for s, limit in enumerate(max_in_flight) if limit < 1]
    if low:
        raise ConfigError(f"memory limit of stage {low[0]} is {max_in_flight[low[0]]} "
                          f"microbatches: a rank must hold at least one")


def auto_zero_bubble(times: Sequence[StageTimes], microbatches: int, p2p: float,
                     max_in_flight: Sequence[int],
                     candidates: Sequence[tuple[str, list[list[Op]]]] = ()) -> AutoSchedule:
    """The shortest of the searched orders (module docstring) that keep every rank within
    `max_in_flight[s]` microbatches, with the iteration each takes under these costs.
    `candidates`: more (name, programs) to weigh, e.g. the handcrafted ZB-H1 and ZB-H2."""
    check_inputs(times, microbatches, p2p, max_in_flight)
    found: list[tuple[float, int, str, list[list[Op]]]] = []

    def weigh(origin: str, programs: list[list[Op]]) -> None:
        peaks = [peak_held(p) for p in programs]
        if any(peak > cap for peak, cap in zip(peaks, max_in_flight)):
            return
        try:
            seconds = iteration_time(programs, times, p2p)
        except ConfigError:
            return
        found.append((seconds, max(peaks), origin, programs))

    pp = len(times)
    extras, shifts = list(range(pp + 1)), list(range(-pp, pp + 1))
    stride = max(1, round((len(extras) * len(shifts) / GRID_EVALUATIONS) ** 0.5))
    for extra in sorted({0, *extras[::stride]}):
        for shift in sorted({0, *shifts[::stride]}):
            weigh(f"template (warm-up P-s+{extra}, W delay s{shift:+d})", [
                template_program(s, microbatches, min(microbatches, pp - s + extra),
                                 max(0, s + shift)) for s in range(pp)])
    for limits in _limit_sweep(pp, microbatches, max_in_flight):
        for fill in FILL_POLICIES:
            weigh(f"list schedule ({fill} W fill, limits {limits})",
                  list_schedule(times, microbatches, p2p, limits, fill)[0])
    for origin, programs in candidates:
        weigh(origin, programs)
    exact = exact_search(times, microbatches, p2p, max_in_flight)
    if exact is not None:
        weigh(f"exact search (every in-order F/I/W order of every rank: {exact[1]} joint "
              f"orders)", exact[0])
    if not found:
        raise ConfigError(f"no searched schedule fits the memory limits {tuple(max_in_flight)} "
                          f"(microbatches per rank); 1F1B needs P - s on rank s")
    seconds, _, origin, programs = min(found, key=lambda f: f[:2])
    refined, refined_seconds = coordinate_search(times, microbatches, p2p, max_in_flight,
                                                 start=programs)
    if refined_seconds < seconds - 1e-12:
        seconds, programs, origin = refined_seconds, refined, origin + ", then coordinate search"
    return AutoSchedule(programs, seconds, tuple(peak_held(p) for p in programs), origin)


def rank_orders(stage: int, microbatches: int, cap: int) -> list[list[Op]]:
    """Every order of one rank's F, I and W ops that runs each kind in microbatch order,
    I(m) after F(m) and W(m) after I(m), holding at most `cap` microbatches (F to W)."""
    orders: list[list[Op]] = []
    ops: list[Op] = []

    def walk(f: int, i: int, w: int) -> None:
        if w == microbatches:
            orders.append(list(ops))
            return
        for kind, m, ok in ((OpKind.F, f, f < microbatches and f - w < cap),
                            (OpKind.I, i, i < f), (OpKind.W, w, w < i)):
            if ok:
                ops.append(Op(kind, stage, m))
                walk(f + (kind is OpKind.F), i + (kind is OpKind.I), w + (kind is OpKind.W))
                ops.pop()

    walk(0, 0, 0)
    return orders


def count_orders(microbatches: int, cap: int) -> int:
    """len(rank_orders(s, microbatches, cap)), by dynamic programming over how many F, I
    and W ops have run."""
    @functools.lru_cache(maxsize=None)
    def ways(f: int, i: int, w: int) -> int:
        if w == microbatches:
            return 1
        return ((ways(f + 1, i, w) if f < microbatches and f - w < cap else 0)
                + (ways(f, i + 1, w) if i < f else 0) + (ways(f, i, w + 1) if w < i else 0))

    return ways(0, 0, 0)


def exact_search(times: Sequence[StageTimes], microbatches: int, p2p: float,
                 max_in_flight: Sequence[int], limit: int = EXACT_LIMIT
                 ) -> tuple[list[list[Op]], int] | None:
    """The shortest of all joint orders (rank_orders of every rank, within its memory
    cap) and how many there are; None when there are more than `limit` (counted first,
    without listing them)."""
    count = math.prod(count_orders(microbatches, cap) for cap in max_in_flight)
    if count > limit or not count:
        return None
    per_rank = [rank_orders(s, microbatches, cap) for s, cap in enumerate(max_in_flight)]
    best: tuple[float, tuple] | None = None
    for joint in itertools.product(*per_rank):
        try:
            seconds = iteration_time(joint, times, p2p)
        except ConfigError:
            continue  # deadlocks
        if best is None or seconds < best[0] - 1e-12:
            best = (seconds, joint)
    return None if best is None else ([list(p) for p in best[1]], count)


def _limit_sweep(pp: int, microbatches: int, max_in_flight: Sequence[int]):
    """Memory limits from 1F1B's (P - s) up to the caps, one more microbatch each step."""
    for extra in range(max(max_in_flight) + 1):
        limits = tuple(min(cap, max(1, min(pp - s, microbatches) + extra))
                       for s, cap in enumerate(max_in_flight))
        yield limits
        if all(limit >= min(cap, microbatches) for limit, cap in zip(limits, max_in_flight)):
            return


def template_program(stage: int, microbatches: int, warmup: int, delay: int) -> list[Op]:
    """One rank's order in the family the search walks: `warmup` forwards, then for each
    microbatch its I, the W's that keep at most `delay` of them pending, and the next F;
    the pending W's at the end. (warmup P-s, delay 0) is 1F1B with a split backward; ZB-H1
    and ZB-H2 delay W's and, for ZB-H2, run more warm-up forwards (Qi et al. 2024,
    section 3.2)."""
    ops = [Op(OpKind.F, stage, m) for m in range(min(warmup, microbatches))]
    pending: deque[int] = deque()
    forwarded = len(ops)
    for m in range(microbatches):
        ops.append(Op(OpKind.I, stage, m))
        pending.append(m)
        while len(pending) > delay:
            ops.append(Op(OpKind.W, stage, pending.popleft()))
        if forwarded < microbatches:
            ops.append(Op(OpKind.F, stage, forwarded))
            forwarded += 1
    return ops + [Op(OpKind.W, stage, m) for m in pending]


def coordinate_search(times: Sequence[StageTimes], microbatches: int, p2p: float,
                      max_in_flight: Sequence[int], start: list[list[Op]], rounds: int = 3,
                      evaluations: int = SEARCH_EVALUATIONS) -> tuple[list[list[Op]], float]:
    """Coordinate descent over per-rank orders: starting from `start`, each rank in turn
    takes the template order (template_program, any warm-up and W delay within its memory
    limit) that shortens the iteration most with the other ranks fixed, for up to `rounds`
    sweeps or `evaluations` tried orders."""
    pp = len(times)
    programs = [list(p) for p in start]
    best = iteration_time(programs, times, p2p)
    for _ in range(rounds):
        improved = False
        for s in range(pp):
            for warmup in range(1, min(microbatches, max_in_flight[s]) + 1):
                for delay in range(max_in_flight[s]):
                    program = template_program(s, microbatches, warmup, delay)
                    if peak_held(program) > max_in_flight[s]:
                        continue
                    evaluations -= 1
                    if evaluations < 0:
                        return programs, best
                    trial = programs[:s] + [program] + programs[s + 1:]
                    try:
                        seconds = iteration_time(trial, times, p2p)
                    except ConfigError:
                        continue  # this order deadlocks against the others
                    if seconds < best - 1e-12:
                        best, programs, improved = seconds, trial, True
        if not improved:
            break
    return programs, best


def iteration_time(programs: Sequence[Sequence[Op]], times: Sequence[StageTimes],
                   p2p: float) -> float:
    """Iteration seconds of per-rank F/I/W (or F/B) orders on one stage per rank under
    this module's cost model: a rank runs its ops in order, one at a time; F(s, m) starts
    `p2p` after F(s-1, m) ends, I or B(s, m) `p2p` after I or B(s+1, m) ends and after
    F(s, m), W(s, m) after I(s, m) (schedules.contract). ConfigError on a deadlock."""
    pp = len(programs)
    cost = {OpKind.F: "forward", OpKind.I: "input_grad", OpKind.W: "weight_grad"}
    end: dict[tuple, float] = {}
    free = [0.0] * pp
    position = [0] * pp
    remaining = sum(len(p) for p in programs)
    while remaining:
        placed = 0
        for r, program in enumerate(programs):
            while position[r] < len(program):
                op = program[position[r]]
                ready = _ready(op, end, pp, p2p)
                if ready is None:
                    break
                seconds = (getattr(times[op.stage], cost[op.kind]) if op.kind in cost else
                           times[op.stage].input_grad + times[op.stage].weight_grad)
                start = max(free[r], ready)
                free[r] = end[(op.kind, op.stage, op.microbatch)] = start + seconds
                position[r] += 1
                placed += 1
        if not placed:
            stuck = [str(p[i]) for p, i in zip(programs, position) if i < len(p)]
            raise ConfigError(f"the schedule deadlocks: stuck ops {', '.join(stuck)}")
        remaining -= placed
    return max(free)


def _ready(op: Op, end: dict, pp: int, p2p: float) -> float | None:
    """When `op`'s inputs are there (None: a predecessor has not run yet)."""
    s, m = op.stage, op.microbatch
    if op.kind is OpKind.F:
        needs = [] if s == 0 else [((OpKind.F, s - 1, m), p2p)]
    elif op.kind is OpKind.W:
        needs = [((OpKind.I, s, m), 0.0)]
    else:
        needs = [((OpKind.F, s, m), 0.0)]
        if s < pp - 1:
            needs.append((((OpKind.I if (OpKind.I, s + 1, m) in end else OpKind.B), s + 1, m),
                          p2p))
    times = [end.get(key) for key, _ in needs]
    if any(t is None for t in times):
        return None
    return max([0.0] + [t + delay for t, (_, delay) in zip(times, needs)])


def peak_held(program: Sequence[Op]) -> int:
    """The most microbatches a rank's program holds at once (+1 at F, -1 at its W, or B)."""
    level = peak = 0
    for op in program:
        level += {OpKind.F: 1, OpKind.W: -1, OpKind.B: -1}.get(op.kind, 0)
        peak = max(peak, level)
    return peak


def list_schedule(times: Sequence[StageTimes], microbatches: int, p2p: float,
                  limits: Sequence[int], fill: str) -> tuple[list[list[Op]], float]:
    """One rank order per stage by the heuristic (module docstring) with memory `limits`
    and W `fill` policy, and its iteration time."""
    if fill not in FILL_POLICIES:
        raise ConfigError(f"fill={fill!r} must be one of {', '.join(FILL_POLICIES)}")
    return _ListScheduler(times, microbatches, p2p, limits, fill).run()


class _ListScheduler:
    """The simulation behind list_schedule: ranks decide at their free time, in global
    time order; an op whose predecessor on another rank is not yet placed cannot start
    before that rank's current time."""

    def __init__(self, times, microbatches, p2p, limits, fill):
        self.times, self.m, self.p2p, self.limits, self.fill = (
            times, microbatches, p2p, limits, fill)
        pp = len(times)
        self.pp = pp
        self.free = [0.0] * pp  # when each rank is next free
        self.next_f = [0] * pp
        self.next_i = [0] * pp
        self.pending_w: list[deque[int]] = [deque() for _ in range(pp)]
        self.held = [0] * pp
        self.end_f = [[None] * microbatches for _ in range(pp)]
        self.end_i = [[None] * microbatches for _ in range(pp)]
        self.programs: list[list[Op]] = [[] for _ in range(pp)]

    def run(self) -> tuple[list[list[Op]], float]:
        while True:
            active = [s for s in range(self.pp) if not self._done(s)]
            if not active:
                return self.programs, max(self.free)
            now = min(self.free[s] for s in active)
            acted = False
            for s in active:
                if self.free[s] <= now and self._step(s, now):
                    acted = True
            if acted:
                continue
            idle = [s for s in active if self.free[s] <= now]
            events = [t for s in idle for t in (self._ready_f(s), self._ready_i(s))
                      if t is not None and t > now]
            events += [self.free[s] for s in active if self.free[s] > now]
            if not events:
                raise ConfigError(f"automatic schedule is stuck at {now:g} s (memory limits "
                                  f"{tuple(self.limits)}): no rank can run an op")
            for s in idle:
                self.free[s] = min(events)

    def _done(self, s: int) -> bool:
        return self.next_f[s] == self.m and self.next_i[s] == self.m and not self.pending_w[s]

    def _ready_f(self, s: int) -> float | None:
        """When F(s, next) could start (None: its input is not placed yet, or no F left)."""
        m = self.next_f[s]
        if m >= self.m:
            return None
        if s == 0:
            return 0.0
        end = self.end_f[s - 1][m]
        return None if end is None else end + self.p2p

    def _ready_i(self, s: int) -> float | None:
        m = self.next_i[s]
        if m >= self.next_f[s]:
            return None
        own = self.end_f[s][m]
        if s == self.pp - 1:
            return own
        end = self.end_i[s + 1][m]
        return None if end is None else max(own, end + self.p2p)

    def _next_known(self, s: int, now: float) -> float | None:
        known = [t for t in (self._ready_f(s), self._ready_i(s)) if t is not None and t > now]
        return min(known, default=None)

    def _step(self, s: int, now: float) -> bool:
        """Place one op on rank s at `now` if the heuristic runs one; False to wait."""
        t = self.times[s]
        ready_i, ready_f = self._ready_i(s), self._ready_f(s)
        if ready_i is not None and ready_i <= now:
            m = self.next_i[s]
            self._place(s, Op(OpKind.I, s, m), now, t.input_grad)
            self.end_i[s][m] = self.free[s]
            self.next_i[s] += 1
            self.pending_w[s].append(m)
            return True
        room = self.held[s] < self.limits[s]
        if ready_f is not None and ready_f <= now and room:
            m = self.next_f[s]
            self._place(s, Op(OpKind.F, s, m), now, t.forward)
            self.end_f[s][m] = self.free[s]
            self.next_f[s] += 1
            self.held[s] += 1
            return True
        if not self.pending_w[s]:
            return False
        nothing_left = self.next_f[s] == self.m and self.next_i[s] == self.m
        memory_full = not room and self.next_f[s] < self.m
        gap = self._next_known(s, now)
        if (self.fill == "greedy" or nothing_left or memory_full
                or (gap is not None and gap - now >= t.weight_grad)):
            self._run_w(s, now)
            return True
        return False

    def _run_w(self, s: int, now: float) -> None:
        m = self.pending_w[s].popleft()
        self._place(s, Op(OpKind.W, s, m), now, self.times[s].weight_grad)
        self.held[s] -= 1

    def _place(self, s: int, op: Op, now: float, seconds: float) -> None:
        self.programs[s].append(op)
        self.free[s] = now + seconds
