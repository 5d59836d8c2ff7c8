"""`--schedule zb-auto`: the automatic zero-bubble schedule (schedules.zero_bubble_auto)
built for one run from that run's own simulated costs.

1. Simulate the run once with a stand-in order of the same shape: 1F1B with a split
   backward (one chunk per rank, the loop placement), with the run's cost model, network
   and collectives.
2. Read off that timeline each stage's F, I and W seconds: the median over microbatches
   of the time each holds its rank, every layer group and the blocking TP, CP and EP
   collectives the next op waits for included (held_seconds); and the P2P seconds (median
   of SEND_F and SEND_B spans): contention and each stage's device included.
3. Cap each rank at the microbatches whose activations fit in its limit:
   floor(limit / stage activation bytes per microbatch). The limit is
   ParallelConfig.activation_memory_limit when given. Otherwise it is the device memory
   left after the rank's model states and buffers (schedules.memory_model).
4. Search the order (schedules.zero_bubble_auto.auto_zero_bubble; the handcrafted ZB-H1
   and ZB-H2 are weighed too where they fit the caps) and hand it to the simulator as a
   schedule given as data.
The run's note says what it was built from. Data-parallel collectives and the optimizer
step are not part of the search's cost model: they come after it in the replay.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence

from clustersim.schedules.activation_partition import stage_activation_bytes
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.contract import runs_on_compute_stream
from clustersim.schedules.names import COMPUTE_LANE, INTRA_LAYER_GROUPS, collective_lane
from clustersim.schedules.ops import WORK_KINDS, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.zero_bubble_auto import (StageTimes, auto_zero_bubble,
                                                   iteration_time, template_program)


STAND_IN = "zb-auto stand-in (1F1B, split backward)"
HANDCRAFTED = ("zb-h1", "zb-h2")  # weighed too, where they fit (Qi et al. 2024, Figure 3)


def stand_in(parallel: ParallelConfig) -> Schedule:
    """1F1B with its backward split into I and W: the order zb-auto's costs are read from."""
    pp, m = parallel.pp, parallel.num_microbatches
    return Schedule(STAND_IN, m, [template_program(s, m, min(pp - s, m), 0)
                                  for s in range(pp)], pp)


def held_seconds(timeline: Timeline, lowered: Schedule,
                 programs: Sequence[int] | None = None) -> dict[tuple, float]:
    """Seconds each F, I and W (key (kind, stage, microbatch)) holds its rank's compute
    stream: its spans (every layer group) and those of the blocking intra-layer collectives
    posted after it, which the next compute op waits for (schedules.contract). A lane runs
    its ops in program order, so the k-th op a program posts on a lane is the k-th span of
    that lane (the engine's rules: contract.runs_on_compute_stream, names.collective_lane).
    `programs[r]`: the pipeline rank whose program Timeline rank r ran (sim.world; default
    r itself); where several ranks ran one program (the full replay), the slowest's."""
    lanes: dict[tuple[int, str], list] = defaultdict(list)
    for span in timeline.spans:
        lanes[(span.rank, span.lane)].append(span)
    for spans in lanes.values():
        spans.sort(key=lambda s: s.start)
    if programs is None:
        programs = range(len(lowered.programs))
    held: dict[tuple, float] = defaultdict(float)
    for rank, program in enumerate(programs):
        mine: dict[tuple, float] = defaultdict(float)
        posted: dict[str, int] = defaultdict(int)
        owner = None
        for op in lowered.programs[program]:
            lane = (COMPUTE_LANE if runs_on_compute_stream(op) else
                    collective_lane(op.group) if op.kind.is_collective else None)
            if lane is None:
                continue
            span = lanes[(rank, lane)][posted[lane]]
            posted[lane] += 1
            if op.kind in WORK_KINDS:
                owner = (op.kind, op.stage, op.microbatch)
            elif not (op.group in INTRA_LAYER_GROUPS and not op.alongside and owner):
                continue
            mine[owner] += span.end - span.start
        for key, seconds in mine.items():
            held[key] = max(held[key], seconds)
    return held


def stage_times(timeline: Timeline, lowered: Schedule,
                programs: Sequence[int] | None = None) -> tuple[list[StageTimes], float]:
    """Per stage, the median over microbatches of the seconds its F, I and W hold the
    rank (held_seconds), and the median P2P seconds (0 when nothing crosses stages)."""
    held = held_seconds(timeline, lowered, programs)
    per: dict[tuple[OpKind, int], list[float]] = defaultdict(list)
    for (kind, stage, _), seconds in held.items():
        per[(kind, stage)].append(seconds)
    times = [StageTimes(*(statistics.median(per[(kind, s)])
                          for kind in (OpKind.F, OpKind.I, OpKind.W)))
             for s in range(lowered.num_stages)]
    p2p = [s.end - s.start for s in timeline.spans
           if s.op.kind in (OpKind.SEND_F, OpKind.SEND_B)]
    return times, statistics.median(p2p) if p2p else 0.0


def memory_caps(plan: Plan, limit: float | None) -> list[int]:
    """Microbatches each stage's rank may hold (module docstring, step 3)."""
    activation = stage_activation_bytes(plan)[0]
    base = rank_memory(plan, in_flight=[0] * plan.num_stages)
    caps = []
    for s in range(plan.num_stages):
        room = (limit if limit is not None else
                plan.cluster.memory_bytes - base[plan.stage_ranks[s]].total_bytes)
        if activation[s] <= 0:
            caps.append(plan.parallel.num_microbatches)
            continue
        cap = math.floor(room / activation[s])
        if cap < 1:
            where = ("--activation-memory-limit" if limit is not None else
                     "the device memory left after model states and buffers")
            raise ConfigError(f"zb-auto: {where} ({room / 1e9:.2f} GB) holds no microbatch of "
                              f"stage {s} ({activation[s] / 1e9:.2f} GB each): nothing to "
                              f"schedule")
        caps.append(min(cap, plan.parallel.num_microbatches))
    return caps


def build_auto_schedule(parallel: ParallelConfig,
                        simulate_with: Callable[[Schedule],
                                                tuple[Plan, Timeline, Sequence[int]]]
                        ) -> tuple[Schedule, str]:
    """The zb-auto Schedule of this run and the note that says what it was built from.
    `simulate_with(schedule)` simulates the run with a schedule given as data and returns
    its plan, timeline and the program each Timeline rank ran (sim.simulate passes its own
    replay). One chunk per rank: the registry entry's vpp rule has refused any other vpp
    already."""
    standin = stand_in(parallel)
    plan, timeline, programs = simulate_with(standin)
    times, p2p = stage_times(timeline, lower(standin, plan), programs)
    caps = memory_caps(plan, parallel.activation_memory_limit)
    handcrafted = [(name, build_schedule(name, parallel.pp, parallel.num_microbatches).programs)
                   for name in HANDCRAFTED]
    auto = auto_zero_bubble(times, parallel.num_microbatches, p2p, caps, handcrafted)
    schedule = Schedule("zb-auto", parallel.num_microbatches, auto.programs, parallel.pp)
    ms = ", ".join(f"{t.forward * 1e3:.3g}/{t.input_grad * 1e3:.3g}/{t.weight_grad * 1e3:.3g}"
                   for t in times)
    baseline = iteration_time(standin.programs, times, p2p)
    note = (f"zb-auto built from the simulated F/I/W ms per stage ({ms}) and P2P "
            f"{p2p * 1e3:.3g} ms under caps of {caps} microbatches per rank: "
            f"{auto.origin}; its pipeline alone takes {auto.makespan:.4g} s against "
            f"{baseline:.4g} s for 1F1B with a split backward under the same costs")
    return schedule, note
