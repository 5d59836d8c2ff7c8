"""Branch and bound over the planner's layouts: check, fit, bound, replay the few that can
win. Units: seconds, bytes.

1. enumerate (sim.planner.space); 2. drop what ParallelConfig, the plan
   (schedules.plan.resolve's checks) or the replay's symmetry refuses, counting each
   reason (the error's text with its numbers masked); 3. drop what does not fit in
   memory (schedules.memory_model through sim.planner.inflight); 4. bound every
   survivor with the closed form (sim.planner.bound.quick_bound) and push it on a heap;
   5. pop the lowest bound: the first time, replace its bound by the compute-only
   schedule's finish time (path_bound, tighter) and push it back; the second time, replay
   it (sim.simulate). Stop when `top` candidates are replayed and the lowest bound left is
   no lower than the top-th best time: nothing left can enter the top. The top `top` are
   then exact (for top = 1: the best layout of the space).
   Refinement tiers: 0 quick_bound; 1 path_bound; 2 the larger of lane_bound and
   contract_bound (sim.planner.walk: the lowered schedule under the replay's contract).
   With more than one worker (`n_jobs` on the execution `backend`, sim.backends: local
   cores through joblib, or a Ray or Dask cluster) the popped candidates that can still
   enter the top are replayed as one batch of up to the backend's workers. A batch may
   replay a candidate the serial search would have bounded out, never skips one it would
   replay, so the ranked top `top` (ties broken by layout) are the serial search's, on
   every backend.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from clustersim.schedules.errors import ClustersimError, ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.lowering import lower
from clustersim.schedules.plan import Plan, resolve
from clustersim.schedules.timeline import Timeline
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.backends import open_backend
from clustersim.sim.cost_model import CostModel, RooflineCostModel
from clustersim.sim.simulate import simulate
from clustersim.sim.symmetry import check_symmetric

from .bound import (CollectiveTimes, StageTimes, is_split, lane_bound, path_bound, quick_bound,
                    stage_times)
from .inflight import compute_schedule, fits
from .plans import PlanCache, cost_key
from .space import Layout, SearchSpace, enumerate_layouts
from .walk import contract_bound

log = logging.getLogger(__name__)

Simulator = Callable[[ModelSpec, object, nx.DiGraph], Timeline]


@dataclass
class Candidate:
    """A layout that fits, its bound (how far refined: `tier`) and, once
    replayed, its Timeline's figures (`result`)."""

    layout: Layout
    plan: Plan
    bound: float
    times: StageTimes
    split: bool
    tier: int = 0  # 0: quick_bound, 1: path_bound, 2: lane and contract bounds applied
    result: dict | None = None


@dataclass
class SearchResult:
    """The funnel counts and the replayed candidates, fastest first. enumerated = the
    rejections before the memory check + fit_in_memory; fit_in_memory = bounded_out +
    lowering_refused + simulated. `rejected` counts every refusal by reason, those after
    the memory check too ('lowering: ...', and the replay's own among `simulated`)."""

    enumerated: int = 0
    rejected: Counter = field(default_factory=Counter)
    fit_in_memory: int = 0
    bounded_out: int = 0  # fit, never replayed, not refused by the lowering
    simulated: int = 0  # replays run (those the replay refused among them)
    lowering_refused: int = 0  # fit, then refused by the full plan or the lowering
    path_bounds: int = 0
    lowered_bounds: int = 0
    candidates: list[Candidate] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    capacity_bytes: float = 0.0


def reason(error: Exception) -> str:
    """The rule an error states, its numbers masked so that layouts refused by one rule
    count together: 'num_layers=N is not divisible by num_stages=N (pp*vpp); ...'; an op
    ('3B1.5') reads '(an op)', digits inside a name ('ZeRO-3') stay."""
    text = re.sub(r"\b\d+[A-Z]+\d+(\.\d+)?\b", "(an op)", str(error).splitlines()[0])
    text = re.sub(r"(?<![\w.-])\d+(\.\d+)?(?![\w.])", "N", text)
    return text[:160]


def search(model: ModelSpec, gpus: int, topology: nx.DiGraph, global_batch_size: int,
           capacity_bytes: float | None = None, top: int = 5,
           space: SearchSpace = SearchSpace(), costs: CostModel = RooflineCostModel(),
           simulator: Simulator | None = None, n_jobs: int = -1,
           backend: str = "local") -> SearchResult:
    """The planner's search (module docstring). `capacity_bytes`: the memory limit per
    GPU (default: the topology's device memory); `simulator(model, parallel, topology)`
    replays one layout (default sim.simulate with `costs`); `n_jobs`: replays at once
    (-1: every local core or cluster CPU, 1 serial) on `backend` (sim.backends: local,
    ray or dask)."""
    facts = cluster_facts(topology)
    facts.check_fits(gpus)
    capacity = capacity_bytes if capacity_bytes is not None else facts.memory_bytes
    result = SearchResult(capacity_bytes=capacity)
    started = time.perf_counter()
    fitting = _screen(model, gpus, topology, global_batch_size, capacity, space, costs,
                      facts, result)
    if not result.enumerated:
        raise ConfigError(
            f"no layout to search: none of tp x pp x dp x cp = {gpus} GPUs with micro-batch "
            f"sizes {list(space.micro_batch_size)} and schedules {list(space.schedules)} "
            f"makes the global batch of {global_batch_size} a whole number of micro-batches "
            f"per data-parallel rank (global batch / (dp x micro-batch size)) and splits the "
            f"{model.num_layers} layers over the schedule's stages")
    result.seconds["screen"] = time.perf_counter() - started
    replay = simulator or functools.partial(_simulate, costs=costs)
    _branch_and_bound(fitting, top, replay, topology, costs, result, n_jobs, backend)
    result.seconds["total"] = time.perf_counter() - started
    result.bounded_out = result.fit_in_memory - result.simulated - result.lowering_refused
    result.candidates.sort(key=lambda c: (c.result["iteration_time"], c.layout))
    return result


def _simulate(model: ModelSpec, parallel, topology: nx.DiGraph, costs: CostModel
              ) -> Timeline:
    return simulate(model, parallel, topology, costs=costs)


def _replayed(replay: Simulator, model: ModelSpec, parallel, topology: nx.DiGraph
              ) -> dict | str:
    """One replay's figures, or the reason the replay refused it (in a worker)."""
    logging.getLogger("clustersim").setLevel(log.getEffectiveLevel())
    try:
        return figures(replay(model, parallel, topology))
    except ClustersimError as err:
        return "replay: " + reason(err)


def _screen(model: ModelSpec, gpus: int, topology: nx.DiGraph, global_batch_size: int,
            capacity: float, space: SearchSpace, costs: CostModel, facts,
            result: SearchResult) -> list[Candidate]:
    """Steps 1-4 of the module docstring: the candidates that fit, with their bounds."""
    caches: dict[int, PlanCache] = {}
    times_of: dict[tuple, StageTimes] = {}
    symmetric: bool | None = None
    memory_rule = (f"peak memory above {capacity / 1e9:.1f} GB per GPU "
                   f"(schedules.memory_model)")
    fitting = []
    for layout in enumerate_layouts(model, gpus, global_batch_size, space,
                                    facts.gpus_per_node):
        result.enumerated += 1
        mbs = layout.micro_batch_size
        if mbs not in caches:
            caches[mbs] = PlanCache(dataclasses.replace(model, micro_batch_size=mbs), facts)
        try:
            parallel = layout.parallel(global_batch_size)
            plan = caches[mbs].plan(layout, parallel)
            if symmetric is None:
                check_symmetric(plan, topology)  # one job's GPUs: the same for all layouts
                symmetric = True
        except ConfigError as err:
            result.rejected[reason(err)] += 1
            continue
        if not fits(plan, capacity):
            result.rejected[memory_rule] += 1
            continue
        result.fit_in_memory += 1
        shape = (plan.schedule, plan.pp, plan.stages_per_rank, plan.num_microbatches)
        split = is_split(compute_schedule(shape))
        key = (cost_key(layout), layout.dp, layout.rank_order, split)
        if key not in times_of:
            times_of[key] = stage_times(plan, topology, costs, split)
        times = times_of[key]
        fitting.append(Candidate(layout, plan, quick_bound(plan, times, split), times, split))
    return fitting


def _branch_and_bound(fitting: list[Candidate], top: int, replay: Simulator,
                      topology: nx.DiGraph, costs: CostModel, result: SearchResult,
                      n_jobs: int, backend: str) -> None:
    """Step 5 of the module docstring, replaying batches of up to the backend's workers."""
    heap = [(c.bound, i) for i, c in enumerate(fitting)]
    heapq.heapify(heap)
    best: list[float] = []  # replayed times, sorted
    started = time.perf_counter()
    with open_backend(backend, n_jobs) as pool:
        workers = pool.workers
        while True:
            batch = _next_batch(fitting, heap, best, top, workers, topology, costs, result)
            if not batch:
                break
            calls = [(replay, fitting[i].plan.model, fitting[i].plan.parallel, topology)
                     for i in batch]
            outcomes = pool.map(_replayed, calls)  # in call order (n_jobs=1: in this process)
            for i, outcome in zip(batch, outcomes):
                result.simulated += 1
                if isinstance(outcome, str):  # refused only by the replay: counted
                    result.rejected[outcome] += 1
                    continue
                candidate = fitting[i]
                candidate.result = outcome
                result.candidates.append(candidate)
                best = sorted([*best, outcome["iteration_time"]])
                log.info("simulated %s: %.4f s (bound %.4f s)", candidate.layout.describe(),
                         outcome["iteration_time"], candidate.bound)
    result.seconds["branch_and_bound"] = time.perf_counter() - started


def _next_batch(fitting: list[Candidate], heap: list, best: list[float], top: int,
                size: int, topology: nx.DiGraph, costs: CostModel,
                result: SearchResult) -> list[int]:
    """Pop up to `size` candidates, each refined to tier 2, whose bounds can still enter
    the top (`best`: the replayed times so far)."""
    batch: list[int] = []
    while heap and len(batch) < size:
        bound, i = heap[0]
        if len(best) >= top and bound >= best[top - 1]:
            break
        heapq.heappop(heap)
        candidate = fitting[i]
        if candidate.tier == 2:
            batch.append(i)
            continue
        try:
            candidate.bound = max(bound, _refined(candidate, topology, costs))
        except ClustersimError as err:  # refused by the full plan or the lowering
            result.rejected["lowering: " + reason(err)] += 1
            result.lowering_refused += 1
            continue
        result.path_bounds += candidate.tier == 0
        result.lowered_bounds += candidate.tier == 1
        candidate.tier += 1
        heapq.heappush(heap, (candidate.bound, i))
    return batch


def _refined(candidate: Candidate, topology: nx.DiGraph, costs: CostModel) -> float:
    """The next tier's bound: path_bound of the compute-only schedule, then the larger of
    lane_bound and contract_bound of the lowered one (sim.planner.bound, .walk)."""
    plan = candidate.plan
    shape = (plan.schedule, plan.pp, plan.stages_per_rank, plan.num_microbatches)
    if candidate.tier == 0:
        return path_bound(compute_schedule(shape), candidate.times)
    full = resolve(plan.model, plan.parallel, plan.cluster)
    lowered = lower(compute_schedule(shape), full)
    # other cost models may price communication otherwise (free, or from a profile):
    # then only compute bounds the replay (sim.planner.bound, `flows`)
    collectives = CollectiveTimes(full, topology, flows=isinstance(costs, RooflineCostModel))
    return max(lane_bound(lowered, full, topology, collectives),
               contract_bound(lowered, full, topology, costs.compute_time(full, topology),
                              collectives))


def figures(timeline: Timeline) -> dict:
    """What the planner reports of one replay: iteration time (s), peak memory (bytes,
    the replay's memory model), throughput (sim.throughput), bubble and exposed
    communication fractions (Timeline), recomputed FLOPs over model FLOPs."""
    throughput = timeline.meta["throughput"]
    model_tflops = throughput["model_tflops_per_gpu"]
    return {"iteration_time": timeline.iteration_time,
            "peak_memory": max(timeline.peak_memory().values(), default=0.0),
            "tokens_per_s": throughput["tokens_per_s"], "mfu": throughput["mfu"],
            "model_tflops_per_gpu": model_tflops,
            "bubble_fraction": timeline.bubble_fraction,
            "exposed_comm_fraction": timeline.exposed_comm_fraction,
            "recompute_overhead": (throughput["hardware_tflops_per_gpu"] / model_tflops - 1
                                   if model_tflops else 0.0),
            "oom_ranks": timeline.meta.get("oom_ranks", [])}
