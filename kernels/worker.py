"""The body of one rank process: join the process group, build this rank's stages, run
the program for warm-up + measured iterations, and report spans and gradients.

Messages to the parent (one per rank, on a multiprocessing queue):
- ('ok', rank, payload): payload = {'iterations': [{'t0', 'spans', 'memory'}, ...],
  memory = [(t, bytes) or, in replay, (t, bytes, pipeline rank)],
  'grads': bytes of torch.save({name: grad}) or None (a sharded gradient: the rank's
  shard, NaN elsewhere), 'params': the same for the parameters as the rank holds them
  after its last iteration (NaN where resharded) or None, 'shard_blocks': {name: the
  ((dim, index, parts), ...) of the full tensor its TP block is, () when whole:
  kernels.layers.parameter_blocks; None for a copy the forward never reads, 2.5D's
  vectors off row 0: kernels.layers_2d.layer_vector}, 'summed_grads': [names whose
  gradient already is the sum over a tied weight's copies (kernels.tied_embedding)],
  'device_name': str};
- ('error', rank, op text or phase, message, traceback).
`progress[2*rank : 2*rank+2]` = (iteration, op index) says where a rank is, so the parent
can name a stuck op: iteration -1 = starting up (index -1: process starting, 0: joining
the process group, 1: building its stages), N = at the final barrier; index -1 = at the
barrier before the program, i = op i started (ops 0..i-1 done, a comm op done when
posted), len(program) = completing comm after it. Every change is progress to the
parent's no-progress watchdog (kernels.watchdog).
Times are perf_counter seconds (CLOCK_MONOTONIC, shared by all processes of a host).

Lifetime and rendezvous: a rank first ties its life to the launcher's
(kernels.lifecycle.die_with_parent), then joins the launcher's loopback store
(kernels.rendezvous). Its own waits time out after `backstop_timeout(job.timeout)`,
later than the launcher's watchdog, which names every rank's op when a run stalls.

Replay (`Job.replay`): one process runs every pipeline rank's program in turn on one
device, in loopback (kernels.executor: RECVs yield random data, SENDs are dropped), so a
single GPU measures each rank's compute at the schedule's shapes. Each pipeline rank's
spans are shifted to start at its own t0 = 0 and carry that pipeline rank as `rank`.
"""
from __future__ import annotations

import datetime
import io
import os
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import (DP, DP_DEP, DP_REPLICATE, DP_SHARD, PP, PP_COPIES, TP,
                                        TP_COL, TP_ROW)
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan
from clustersim.schedules.recompute import Recompute
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.tp_grid import tp_grid

from .executor import RankExecutor, RankSetup
from .layers import parameter_blocks
from .lifecycle import die_with_parent
from .rendezvous import join_group
from .linear_nd import Grid3D, Grid25D
from .stage import StageModule, build_stages, named_parameters, token_batch
from .stage_2d import GridStageModule
from .stage_3d import CubeStageModule
from .summa import SummaGrid
from .tensor_parallel import TensorParallel
from .tied_embedding import AXIS as EMBEDDING
from .tied_embedding import embedding_group, summing_ranks
from .timing import make_clock

BEFORE_PROGRAM = -1
STARTUP = -1
JOINING, BUILDING = 0, 1  # op index while starting up
MAX_WAIT_S = 1e7  # what datetime.timedelta and gloo's millisecond timeouts can hold


def backstop_timeout(timeout: float) -> float:
    """Seconds a rank's own waits allow (gloo collectives, the store, a posted op's
    completion): 2 * timeout + 10, past the launcher's no-progress watchdog of `timeout`
    seconds (kernels.launch), so the launcher reports a stall first, naming every rank's
    op; this only ends a rank the launcher cannot."""
    return min(2 * timeout + 10, MAX_WAIT_S)


def describe_progress(program: list, iterations: int, iteration: int, index: int) -> str:
    """Where a rank is, in words, from its (iteration, op index) progress pair."""
    if iteration == STARTUP:
        return {JOINING: "starting up (joining the process group)",
                BUILDING: "starting up (building its stages)"}.get(
                    index, "starting up (its process starting)")
    if iteration >= iterations:
        return "at the final barrier (done with its program)"
    of = f"iteration {iteration + 1} of {iterations}"
    if index == BEFORE_PROGRAM:
        return f"at the barrier before {of}"
    if index >= len(program):
        return f"completing its comm ops after its program ({of})"
    return f"on op {program[index]} (step {index} of {len(program)}, {of})"


@dataclass(frozen=True)
class Job:
    """Everything a rank needs, picklable: the lowered schedule, the plan it was lowered
    for (schedules.plan) and the run's settings."""

    schedule: Schedule
    plan: Plan
    device: str  # 'cpu' or 'cuda'
    seed: int
    timeout: float  # seconds with no op finished on any rank before the run fails
    warmup_iterations: int
    iterations: int
    return_grads: bool
    master_port: int  # the launcher's loopback TCPStore (kernels.rendezvous); 0 until
    # kernels.launch._launch serves it
    replay: bool = False
    return_params: bool = False

    @property
    def model(self) -> ModelSpec:
        return self.plan.model

    @property
    def parallel(self) -> ParallelConfig:
        return self.plan.parallel

    @property
    def world_size(self) -> int:
        """Rank processes: one in replay, else every rank of the grid."""
        return 1 if self.replay else self.plan.world_size


def dp_axes(plan: Plan, rank: int) -> dict[str, list[int]]:
    """Global ranks of `rank`'s data-parallel groups (Plan.group): 'dp', with a hybrid
    shard group also 'dp_shard' and 'dp_replicate', under 2.5D tensor parallelism
    'dp_dep' (Plan.grad_group)."""
    hybrid = plan.parallel.fsdp == "hybrid" and plan.dp_shard_size
    copies = (PP_COPIES,) if plan.chains > 1 else ()  # DualPipe's two copies of a stage
    depth = (DP_DEP,) if plan.grad_group == DP_DEP else ()
    return {axis: plan.group(axis, rank)
            for axis in ((DP, DP_SHARD, DP_REPLICATE) if hybrid else (DP,)) + copies + depth}


def group_axes(plan: Plan, rank: int) -> dict[str, list[int]]:
    """Global ranks of `rank`'s collective groups: its DP axes (dp_axes) and, with
    tp > 1, its TP group ('tp': the ranks of one (pp, dp, cp) coordinate), or on a 2D
    grid its row and column ('tp_row', 'tp_col': Plan.grid_groups)."""
    axes = dp_axes(plan, rank)
    if plan.parallel.tp > 1:
        axes.update({axis: plan.group(axis, rank) for axis in plan.grid_groups or (TP,)})
    return axes


def _groups(job: Job, rank: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """Process groups: one per DP group and sub-group, per TP group and, with tied
    embeddings on two pipeline ranks and an optimizer step, per embedding group
    (kernels.tied_embedding) — every rank creates every group, in the same order, as
    torch.distributed requires — and one world group per P2P direction."""
    parallel = job.parallel
    pair = summing_ranks(job.schedule, job.model)

    def axes(r: int) -> dict[str, list[int]]:
        out = group_axes(job.plan, r)
        if pair:
            out[EMBEDDING] = embedding_group(parallel, r, pair)
        return out

    groups: dict[str, Any] = {}
    seen: list[tuple[int, ...]] = []
    mine = axes(rank)
    for r in range(parallel.world_size):
        for members in axes(r).values():
            if tuple(members) in seen:
                continue
            seen.append(tuple(members))
            group = dist.new_group(list(members), timeout=timeout)
            groups.update({name: group for name, ranks in mine.items()
                           if tuple(ranks) == tuple(members)})
    world = list(range(parallel.world_size))
    groups["p2p_f"] = dist.new_group(world, timeout=timeout) if parallel.pp > 1 else None
    groups["p2p_b"] = dist.new_group(world, timeout=timeout) if parallel.pp > 1 else None
    return groups


def _setup_device(job: Job, rank: int) -> torch.device:
    if job.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def run_rank(rank: int, job: Job, results: Any, progress: Any, link: Any = None) -> None:
    """Process entry point (top level, so the multiprocessing context can pickle it).
    `link`: the read end of kernels.lifecycle.parent_link (None: not tied)."""
    if link is not None:
        die_with_parent(link)
    where = "startup"
    try:
        torch.set_num_threads(1)
        progress[2 * rank], progress[2 * rank + 1] = STARTUP, JOINING
        device = _setup_device(job, rank)
        wait_s = backstop_timeout(job.timeout)
        where = "joining the process group"
        join_group("nccl" if job.device == "cuda" else "gloo", rank, job.world_size,
                   job.master_port, wait_s)
        groups = {} if job.replay else _groups(job, rank,
                                               datetime.timedelta(seconds=wait_s))
        progress[2 * rank + 1] = BUILDING
        where = "building its stages"
        payload = _replay(job, device, progress) if job.replay else _run(
            rank, job, device, groups, progress)
        where = "the final barrier"
        dist.barrier()
        dist.destroy_process_group()
        results.put(("ok", rank, payload))
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, then exit)
        op = getattr(exc, "_kernels_op", None) or where
        results.put(("error", rank, op, f"{type(exc).__name__}: {exc}",
                     traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)  # skip process-group teardown, which could block on dead peers


def _run(rank: int, job: Job, device: torch.device, groups: dict, progress: Any) -> dict:
    coords = job.parallel.coords(rank)
    setup = RankSetup(rank=rank, pipeline_rank=coords[PP], dp_rank=coords[DP],
                      pp_ranks=job.plan.group(PP, rank), groups=groups,
                      dp_size=job.parallel.dp, timeout=backstop_timeout(job.timeout),
                      group_ranks=dp_axes(job.plan, rank),
                      single_process=job.parallel.dp_impl == "dataparallel")
    iterations, results = _iterate(rank, job, device, setup, progress)
    return {"iterations": iterations, **results, "device_name": _device_name(device)}


def _replay(job: Job, device: torch.device, progress: Any) -> dict:
    """Every pipeline rank's program in loopback, one after another, each from t = 0."""
    per_rank = []
    for pipeline_rank in range(job.parallel.pp):
        setup = RankSetup(rank=pipeline_rank, pipeline_rank=pipeline_rank, dp_rank=0,
                          pp_ranks=list(range(job.parallel.pp)), groups={}, dp_size=1,
                          timeout=backstop_timeout(job.timeout), loopback=True)
        iterations, _ = _iterate(0, job, device, setup, progress)
        per_rank.append([_from_zero(it) for it in iterations])
    merged = [{"t0": 0.0, "spans": [s for its in per_rank for s in its[i]["spans"]],
               "memory": [(t, n, r) for r, its in enumerate(per_rank)
                          for t, n in its[i]["memory"]]}
              for i in range(job.iterations)]
    return {"iterations": merged, "grads": None, "params": None,
            "device_name": _device_name(device)}


def _from_zero(iteration: dict) -> dict:
    t0 = iteration["t0"]
    return {"t0": 0.0,
            "spans": [{**s, "start": s["start"] - t0, "end": s["end"] - t0}
                      for s in iteration["spans"]],
            "memory": [(t - t0, n) for t, n in iteration["memory"]]}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _iterate(rank: int, job: Job, device: torch.device, setup: RankSetup,
             progress: Any) -> tuple[list[dict], dict]:
    """Warm-up + timed iterations of `setup.pipeline_rank`'s program: the timed
    iterations' resolved spans and memory, and {'grads', 'params'} (serialised, or None
    where the job does not want them)."""
    schedule, plan = job.schedule, job.plan
    clock = make_clock(device)
    tp = _tensor_parallel(job.parallel, setup, clock)
    modules = build_stages(job.model, plan.stages_of(setup.pipeline_rank), plan.num_stages,
                           job.seed, device, tp, plan.stage_layers,
                           Recompute.of(job.parallel), plan.stage_chains, _stage_class(tp))
    tokens, labels = token_batch(job.model, job.parallel.global_batch_size, job.seed, device)

    def on_op(index: int) -> None:
        progress[2 * rank + 1] = index

    executor = RankExecutor(schedule, modules, setup, tokens, labels, clock, on_op, tp)
    params = named_parameters(modules)
    iterations = []
    total = job.warmup_iterations + job.iterations
    for i in range(total):
        for p in params.values():
            p.grad = None
        progress[2 * rank], progress[2 * rank + 1] = i, BEFORE_PROGRAM
        dist.barrier()
        t0 = clock.reset()
        try:
            executor.run_iteration()
        except BaseException as exc:
            exc._kernels_op = str(executor.current) if executor.current else "draining comm"
            raise
        if i >= job.warmup_iterations:
            spans, memory = executor.resolve()
            iterations.append({"t0": t0, "spans": spans, "memory": memory})
    progress[2 * rank] = total
    return iterations, {
        "grads": _serialise(executor.export_grads()) if job.return_grads else None,
        "params": _serialise(executor.export_params()) if job.return_params else None,
        "shard_blocks": {n: None if getattr(p, "unread_copy", False)
                         else parameter_blocks(p, tp.rank) for n, p in params.items()},
        "summed_grads": sorted(executor.summed_grads)}


def _tensor_parallel(parallel: ParallelConfig, setup: RankSetup, clock: Any
                     ) -> TensorParallel | SummaGrid | Grid3D:
    """This rank's TP shard and group (size 1 in replay, which kernels.launch allows at
    tp = 1 only), or its place on a grid: 2D (kernels.summa), 2.5D or 3D
    (kernels.linear_nd)."""
    if parallel.tp == 1 or setup.loopback:
        return TensorParallel(clock=clock)
    t = parallel.coords(setup.rank)[TP]
    grid = tp_grid(parallel)
    if grid is None:
        return TensorParallel(parallel.tp, t, setup.groups[TP], parallel.sequence_parallel,
                              clock)
    if grid.mode == "3d":
        return Grid3D.of_groups(grid.q, t, setup.groups, clock)
    if grid.mode == "2.5d":
        return Grid25D.of_groups(grid.q, grid.depth, t, setup.groups, clock)
    return SummaGrid.of_groups(grid.q, t, setup.groups[TP_ROW], setup.groups[TP_COL], clock)


def _stage_class(tp: TensorParallel | SummaGrid | Grid3D) -> type[StageModule]:
    """The stage module of a rank whose TP place is `tp`: kernels.stage_3d's on a cube,
    kernels.stage_2d's on a 2D or 2.5D grid (a SummaGrid), else kernels.stage's."""
    if isinstance(tp, Grid3D):
        return CubeStageModule
    return GridStageModule if isinstance(tp, SummaGrid) else StageModule


def _serialise(tensors: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()
