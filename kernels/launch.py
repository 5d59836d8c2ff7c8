"""Run a schedule on real devices, one process per rank, and return the measured Timeline.

`run_schedule(schedule, plan)` lowers the schedule with the simulator's own pass list
(schedules.lowering: data parallel, P2P, costs, intra-layer collectives; a pass whose ops
the schedule already has leaves it), starts the plan's world size of processes (ranks in
ParallelConfig's rank order; a rank runs the program of its pipeline coordinate), gloo on
CPU or NCCL on CUDA, and watches them: a rank that raises or dies, or a run in which no
op finished on any rank for `timeout` seconds (a transfer or collective that never
completes: kernels.watchdog), ends with a KernelsError naming the rank and the op it was
on, and every rank process is killed — never a hang. A long run that keeps finishing ops
is never cut short.

Process lifetime (kernels.lifecycle): the ranks die with the launching process, even
when it is SIGKILLed, and SIGTERM/SIGHUP to it kill the ranks before it exits. The ranks
meet on a TCPStore this process serves on 127.0.0.1 only (kernels.rendezvous). At most
kernels.preflight.local_rank_limit() rank processes (64 unless
$CLUSTERSIM_MAX_LOCAL_RANKS says otherwise) are started.

Processes come from a forkserver that has imported torch once, so a run after the first
starts in well under a second instead of paying torch's import per rank.

Tied embeddings (Megatron's default) with optimizer steps: when the first and the last
stage are on two pipeline ranks, their OPT_STEPs first sum the two word-embedding copies'
gradients over those ranks (Megatron's embedding all-reduce, kernels.tied_embedding), with
DDP (zero_stage 0) or dp = 1; ZeRO sharding of those stages, and both stages on one rank,
are refused with a KernelsError naming the rule.

Activation recomputation: parallel.recompute ('selective' or 'full') runs as in Megatron
(kernels.stage), and the backward reruns the recomputed forward, TP collectives
included, as the simulator charges it; 'full' with a schedule of I/W ops is refused
(kernels.split_backward.check_recompute_split).

`run_reference` / `run_reference_steps` (kernels.reference) compute the same model's
gradients (and Adam steps) in one process: what every distributed run must reproduce;
`run_stale_reference` does so for an asynchronous schedule, on the same stale weights.
kernels.results merges the ranks' payloads into the Timeline, gradients and parameters.
Units: seconds (Timeline), gradients and parameters in the model dtype.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import time
from dataclasses import replace
from typing import Any

import torch

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import check_kernel_list_used
from clustersim.schedules.lowering import lower
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import DP_GROUPS, PP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan
from clustersim.schedules.registry import SCHEDULES, schedule_entry
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.tp_grid import tp_grid
from clustersim.schedules.validate import dry_run
from clustersim.user_files import is_finite_number

from .errors import KernelsError
from .lifecycle import rank_session
from .preflight import check_local_ranks
from .reference import run_reference, run_reference_steps, run_stale_reference
from .results import gather_grads, gather_state, merge_timeline
from .split_backward import check_recompute_split
from .stage_2d import check_grid_model
from .stashing import check_stashing
from .tied_embedding import check_tied_embeddings
from .tp_ops import TENSOR_GROUPS
from .watchdog import ProgressWatch, stall_report
from .worker import STARTUP, Job, backstop_timeout, describe_progress, run_rank

__all__ = ["gather_grads", "gather_state", "merge_timeline", "run_reference",
           "run_reference_steps", "run_schedule", "run_stale_reference"]

SUPPORTED_KINDS = frozenset({OpKind.F, OpKind.B, OpKind.I, OpKind.W, OpKind.SEND_F,
                             OpKind.RECV_F, OpKind.SEND_B, OpKind.RECV_B, OpKind.ALL_REDUCE,
                             OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.OPT_STEP,
                             OpKind.BROADCAST, OpKind.REDUCE})
UNSUPPORTED_SHARDING = ("quantized_weights", "hpz", "quantized_gradients", "offload")
_POLL_S = 0.05
_DEATH_GRACE_S = 0.5  # after a rank's error, how long to look for a peer that died first
_ERROR_GRACE_S = 2.0  # after a rank dies, how long to wait for its error message
_MAIN_GUARD_HINT = (" (rank processes start by importing the caller's main module: a script "
                    "that calls run_schedule needs an `if __name__ == '__main__':` guard)")


def _check_run(device: str, iterations: int, warmup_iterations: int, timeout: float) -> None:
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r} must be 'cpu' or 'cuda'")
    if iterations < 1 or warmup_iterations < 0:
        raise ConfigError(f"iterations must be >= 1 and warmup_iterations >= 0, got "
                          f"{iterations} and {warmup_iterations}")
    if not is_finite_number(timeout) or not timeout > 0:
        raise ConfigError(f"timeout must be a finite number of seconds > 0 (the run fails "
                          f"when no op finished on any rank for that long), got {timeout!r}")


def _check_layout(plan: Plan, device: str, replay: bool) -> None:
    """Refuse, before lowering, what the kernels cannot run for this plan's layout."""
    model, parallel = plan.model, plan.parallel
    for axis in ("cp", "ep"):
        if getattr(parallel, axis) != 1:
            raise KernelsError(f"{axis}={getattr(parallel, axis)}: the kernels backend runs "
                               f"pipeline, data and tensor parallelism only so far ({axis} "
                               f"must be 1)")
    if parallel.etp != parallel.tp:
        raise KernelsError(f"expert_tensor_parallel={parallel.etp} differs from tp="
                           f"{parallel.tp}: the kernels backend runs no MoE experts (leave it "
                           f"unset)")
    _check_tensor_parallel(model, parallel, replay)
    for name in UNSUPPORTED_SHARDING:
        if getattr(parallel, name):
            raise KernelsError(f"{name}=True: ZeRO++ quantization/hpZ and ZeRO-Offload are "
                               f"not implemented in the kernels backend (their op sizes are "
                               f"not the tensors it moves)")
    check_kernel_list_used(model, "the kernels backend, which runs PyTorch's own kernels,")
    if model.lora:
        raise KernelsError(f"lora_rank={model.lora_rank}: the kernels backend trains every "
                           f"weight; LoRA adapters and frozen (or quantized) base weights are "
                           f"not implemented")
    if parallel.partition_activations:
        raise KernelsError("partition_activations=True: ZeRO-R's partitioned activation "
                           "checkpoints are not implemented in the kernels backend (it keeps "
                           "whole checkpoints and would not run their all-gathers)")
    if parallel.tp_comm_overlap:
        raise KernelsError("tp_comm_overlap=True: the kernels backend runs TP collectives "
                           "inside the layers, blocking; Transformer Engine's userbuffers "
                           "overlap, which the simulator models, is not implemented here")
    if parallel.overlap_param_gather:
        raise KernelsError("overlap_param_gather=True: the kernels backend gathers the "
                           "updated parameters after the step, not at the start of the next "
                           "iteration (the simulator's steady-state placement)")
    if parallel.fsdp == "hybrid" and not parallel.shard_size:
        raise KernelsError("fsdp='hybrid' needs shard_size in the kernels backend (there is "
                           "no topology to take the GPUs per node from)")
    if replay and parallel.dp != 1:
        raise ConfigError(f"replay runs one pipeline replica's compute on one device: dp must "
                          f"be 1, got dp={parallel.dp}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise KernelsError("device='cuda' but torch sees no CUDA device "
                               f"(torch {torch.__version__})")
        count = torch.cuda.device_count()
        if not replay and parallel.world_size > count:
            raise KernelsError(
                f"{parallel.world_size} ranks need {parallel.world_size} GPUs, this host has "
                f"{count}: one GPU cannot run NCCL between ranks (NCCL fails with "
                f"'Duplicate GPU'); run world size 1, replay the ranks' compute on one GPU "
                f"(replay=True), or use device='cpu' (gloo)")


def _check_tensor_parallel(model: ModelSpec, parallel: ParallelConfig, replay: bool) -> None:
    """Refuse TP splits the layers cannot shard evenly (Megatron pads the vocabulary to a
    multiple of 128*t; the kernels do not), and TP in replay (one process, no TP group)."""
    t = parallel.tp
    if t == 1:
        return
    if replay:
        raise KernelsError(f"replay runs one pipeline rank alone on one device: tp={t} needs "
                           f"its TP group's collectives inside every layer; replay with tp=1")
    parallel.check_model(model)  # heads, query groups, SP sequence split; a grid's q splits
    grid = tp_grid(parallel)
    if grid is not None:
        check_grid_model(model, grid)
        entry = schedule_entry(parallel.schedule) if parallel.schedule in SCHEDULES else None
        untested = [what for what, on in (
            (f"zero_stage={parallel.zero_stage}", parallel.zero_stage == 3),
            ("DualPipe's two stage chains", entry is not None and entry.chains > 1),
            ("weight stashing", entry is not None and entry.stashing is not None)) if on]
        if untested:
            raise KernelsError(f"tp_mode={parallel.tp_mode!r} with {', '.join(untested)}: not "
                               f"verified against the reference in the kernels backend (the "
                               f"grids run with DDP, 2D and 3D also with ZeRO-1/2, on flushed "
                               f"single-chain schedules)")
        return
    for name, size in (("vocab_size", model.vocab_size), ("ffn_hidden_size",
                                                           model.ffn_hidden_size)):
        if size % t:
            raise ConfigError(f"{name}={size} is not divisible by tp={t} (the kernels split "
                              f"it evenly over the TP ranks, without padding)")


def _check_lowered(lowered: Schedule, plan: Plan, check: bool) -> None:
    """Refuse ops the executor cannot run faithfully, naming the op or the rule; with
    `check`, a dry run of the contract (a deadlock reported as the rank x step grid; the
    lowering checked the structure already)."""
    check_recompute_split(lowered, plan.parallel)
    for op in lowered.ops():
        dp_op = op.kind.is_collective and op.group in (DP_GROUPS | TENSOR_GROUPS)
        if op.kind not in SUPPORTED_KINDS or (op.kind.is_collective and not dp_op) or (
                op.kind is OpKind.OPT_STEP and op.group is not None):
            raise KernelsError(f"op {op} ({op.kind.value}, group {op.group}) is not supported "
                               f"by the kernels backend", op=str(op))
    if lowered.chains > 1:
        check_copies(plan)
    check_tied_embeddings(lowered, plan.model, plan.parallel)
    if lowered.asynchronous:
        check_stashing(plan)
    if check:
        dry_run(lowered)


def check_copies(plan: Plan) -> None:
    """DualPipe's two copies of each stage (schedules.chains) run with DDP (their gradient
    all-reduce follows the whole-stage reduction) and untied embeddings (a tied word
    embedding would have four copies on two ranks)."""
    if plan.parallel.zero_stage:
        raise KernelsError(f"zero_stage={plan.parallel.zero_stage} with {plan.schedule}'s "
                           f"stage copies: the kernels backend sums the copies' whole "
                           f"gradients (DDP, zero_stage 0) only")
    if not plan.model.untie_embeddings_and_output_weights:
        raise KernelsError(f"tied embeddings with {plan.schedule}'s stage copies: the word "
                           f"embedding would have four copies on two ranks; untie them "
                           f"(untie_embeddings_and_output_weights=True)")


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["clustersim.kernels.worker"])
    return ctx


def run_schedule(schedule: Schedule, plan: Plan, device: str = "cpu", seed: int = 0,
                 timeout: float = 120.0, warmup_iterations: int = 1, iterations: int = 1,
                 return_grads: bool = False, check: bool = True, replay: bool = False,
                 return_params: bool = False) -> Timeline | tuple:
    """Execute `schedule` (of `plan`'s shape: schedules.plan.resolve, without a cluster)
    for real, lowered by schedules.lowering, and return its measured Timeline; with `return_grads`
    also the gradients by parameter name, (timeline, grads); with `return_params` also
    the parameters after the run, (timeline, grads, params) (grads {} unless asked).
    Gradients are the reduced ones (a sharded gradient merged from its DP shards), of the
    last iteration; parameters merged likewise (gather_state).

    Runs `warmup_iterations` untimed then `iterations` timed iterations; without OPT_STEP
    every iteration computes the same gradients, with it each iteration steps Adam
    (kernels.optimizer; reference: run_reference_steps with warmup + iterations steps).
    The Timeline is the iteration with the median time, and meta['iteration_times'] lists
    all of them. The lowering checks the schedule's structure; `check` also dry-runs it
    (a deadlock is reported before any process starts).
    `timeout` is a no-progress watchdog in seconds: the run fails when no op finished on
    any rank for that long (start-up included), naming each rank's last op and the op it
    is stuck on; a long run that keeps finishing ops is not cut short. (It bounded the
    whole run before issue 15.) `replay` runs each
    pipeline rank's program in turn in one process on one device, P2P and collectives in
    loopback (kernels.worker): per-op compute times of every rank from a single GPU;
    needs dp = tp = 1, returns no gradients. Raises KernelsError on failure, ConfigError on
    bad input.

    Tensor (and sequence) parallelism: parallel.tp ranks per (pp, dp) coordinate run one
    program on their shards (kernels.tensor_parallel; with tp_mode '2d' or '2.5d' on q x q
    grids, kernels.summa and kernels.stage_2d; '3d' on a cube, kernels.stage_3d). The
    lowering adds the TP ops of schedules.intra_layer as the simulator does: the
    collectives run inside the compute ops, and TP ops become spans on their group's lane
    ('tp', or the grid's groups; kernels.tp_ops).

    Like torch.multiprocessing.spawn, rank processes import the caller's main module, so
    a script calling this needs an `if __name__ == '__main__':` guard.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        raise KernelsError("run_schedule was called while a rank process imported the main "
                           "module: guard the script's entry with `if __name__ == '__main__':`")
    if replay and (return_grads or return_params):
        raise ConfigError("replay returns no gradients or parameters (its RECVs are random "
                          "data)")
    _check_run(device, iterations, warmup_iterations, timeout)
    if not replay:
        par = plan.parallel
        check_local_ranks(par.world_size, f"world size tp*cp*dp*pp = {par.tp}*{par.cp}*"
                                          f"{par.dp}*{par.pp} = {par.world_size}")
    _check_layout(plan, device, replay)
    lowered = lower(schedule, plan)
    _check_lowered(lowered, plan, check)
    job = Job(lowered, plan, device, seed, float(timeout), warmup_iterations, iterations,
              return_grads, 0, replay, return_params)  # port: _launch's store
    payloads = _launch(job)
    timeline = merge_timeline(payloads, job)
    parallel = plan.parallel
    if return_params:
        grads = gather_state(payloads, parallel, "grads") if return_grads else {}
        return timeline, grads, gather_state(payloads, parallel, "params")
    if return_grads:
        return timeline, gather_grads(payloads, parallel)
    return timeline


def _launch(job: Job) -> dict[int, dict]:
    """Start the rank processes and collect their payloads, or raise KernelsError. The
    ranks die with this process (kernels.lifecycle) and meet on its loopback store."""
    check_local_ranks(job.world_size, f"world size {job.world_size}")
    ctx = _context()
    world = job.world_size
    with rank_session(ctx, backstop_timeout(job.timeout)) as session:
        job = replace(job, master_port=session.port)
        progress = ctx.Array("i", [STARTUP] * (2 * world), lock=False)
        session.start([ctx.Process(target=run_rank, daemon=True, name=f"clustersim-rank-{r}",
                                   args=(r, job, session.results, progress, session.link))
                       for r in range(world)])
        return _collect(job, session.procs, session.results, progress)


def _collect(job: Job, procs: list, results: Any, progress: Any) -> dict:
    payloads: dict[int, dict] = {}
    dead_since: float | None = None
    watch = ProgressWatch(progress, len(procs), time.monotonic())
    while len(payloads) < len(procs):
        now = time.monotonic()
        watch.poll(now)
        if watch.idle(now) >= job.timeout:
            raise KernelsError(stall_report(job, watch, payloads, now))
        try:
            message = results.get(timeout=_POLL_S)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs)
                    if r not in payloads and p.exitcode not in (None, 0)]
            if dead:
                dead_since = dead_since or now
                if now - dead_since > _ERROR_GRACE_S:
                    r = dead[0]
                    hint = _MAIN_GUARD_HINT if progress[2 * r] == STARTUP else ""
                    raise KernelsError(
                        f"rank {r} died (exit code {procs[r].exitcode}) while "
                        f"{_where(job, r, progress)}; "
                        + _where_stuck(job, progress, {**payloads, r: {}}) + hint, rank=r)
            continue
        if message[0] == "error":
            _, rank, op, text, tb = message
            _wait_for_deaths(procs, rank, _DEATH_GRACE_S)  # a peer's death often is the cause
            dead = "".join(f"; rank {r} had died (exit code {p.exitcode})"
                           for r, p in enumerate(procs) if p.exitcode not in (None, 0, 1))
            raise KernelsError(f"rank {rank} (pipeline rank {job.parallel.coords(rank)[PP]}) "
                               f"failed on {op}: {text}{dead}", rank=rank, op=op, details=tb)
        payloads[message[1]] = message[2]
        watch.touch(time.monotonic())
    return payloads


def _wait_for_deaths(procs: list, failed: int, grace: float) -> None:
    """Poll up to `grace` seconds for a rank other than `failed` to have been killed."""
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if any(p.exitcode not in (None, 0, 1) for r, p in enumerate(procs) if r != failed):
            return
        time.sleep(0.02)


def _where(job: Job, rank: int, progress: Any) -> str:
    program = job.schedule.programs[job.parallel.coords(rank)[PP]]
    return describe_progress(program, job.warmup_iterations + job.iterations,
                             progress[2 * rank], progress[2 * rank + 1])


def _where_stuck(job: Job, progress: Any, finished: dict) -> str:
    return "; ".join(f"rank {r} {_where(job, r, progress)}"
                     for r in range(job.world_size) if r not in finished)
