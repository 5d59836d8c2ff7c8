"""Calibration: measure a model's layer ops, P2P and collectives on this device and fit
the simulator's profile (schedules.profile) from them. The benchmarks themselves live in
kernels.microbench; this module starts the rank processes and fits the results.

What is measured (medians over `repeats` after `warmup` untimed runs):
- compute, the work kernels.executor does, at the model's shapes (kernels.stage): one
  transformer layer (a middle stage of one layer), the embedding (stage 0 with its layers
  removed) and the head (the last stage without layers: final norm, output layer, loss).
  F = forward; B = `torch.autograd.backward`; I and W = kernels.split_backward's input-
  and weight-gradient halves (F, B and the I/W pair each on their own forward), as the
  executor runs them; the embedding's input (token ids) needs no gradient, so its I is
  empty and its W is its whole backward. On CPU the compute runs in every rank process at
  once (`concurrent`), so each core is as busy as in a run with that many ranks.
- optimizer step: kernels.optimizer.FlatAdam.step, the kernels' OPT_STEP, on a flat fp32
  vector of microbench.OPTIMIZER_PARAMS (2^24) elements, large enough to be memory-bound
  as a real rank's step is; stored as seconds per parameter (the profile's
  optimizer_seconds_per_param; sim.optimizer_cost prices a GPU OPT_STEP with it). Timed like
  the compute, in the same processes.
- GEMM table: torch.matmul at every (M, N, K) of microbench.gemm_shapes: the model's
  GEMM kernels (schedules.layer_kernels: forward, input- and weight-gradient GEMMs of
  each layer GEMM and of the logits) at tp 1, 2, 4, 8 (where the heads split evenly) and
  T/4, T/2, T, 2T tokens, in the model's dtype; and causal
  scaled_dot_product_attention forward and backward at microbench.attention_shapes (the
  model's attention per rank at those tp degrees). Medians over rounds, each round
  timing every shape once (microbench.measure_gemms), in the same processes as the
  compute; stored as the profile's `gemm` and `attention` (sim.gemm_table reads them).
- serving steps (with `serving`): kernels.serving_steps's real inference of one layer with
  a KV cache, a prompt's prefill at `serving_points`' token counts and a decode step of B
  sequences after c cached tokens at its (B, c), and the output layer sampling S rows; in
  the model's dtype, medians over the measuring ranks' samples like the compute; stored as
  the profile's `serving` (sim.serving.calibration fits the serving rates to them).
- P2P: ping-pong between ranks 0 and 1 with `dist.isend`/`dist.irecv` (as the executor);
  one-way time = half the round trip timed on rank 0 (no cross-process clock needed).
- collectives: each op over the first n ranks for every n in `group_sizes`, started
  together after a barrier of the group and timed on rank 0; sizes are nccl-tests'
  (per-rank buffer, total output for all-gather). gloo has no reduce-scatter: it is timed
  as an all-reduce of the input, and the profile says so.
P2P and collective points are fitted with schedules.profile.fit_alpha_beta.

Processes: `nproc` = max(group_sizes, 2 where P2P is wanted) rank processes, gloo on CPU,
NCCL on CUDA (one GPU per rank: a single GPU measures compute only, no P2P), at most
kernels.preflight.local_rank_limit() (refused before any starts). They die with the
calling process and meet on its loopback store, as kernels.launch's do
(kernels.lifecycle, kernels.rendezvous). `timeout` is a no-progress watchdog: the
calibration fails when no benchmark step finished for that long. Units: seconds, bytes.
Every rank process runs one torch thread.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import platform
import queue
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.profile import (COLLECTIVE_OPS, PROFILED_KINDS, AlphaBeta,
                                          AttentionTimes, GemmTimes, Profile, ServingTimes)
from clustersim.user_files import is_finite_number

from .errors import KernelsError
from .layers import torch_dtype
from .lifecycle import die_with_parent, rank_session
from .microbench import (OPTIMIZER_PARAMS, PARTS, BenchPlan, attention_shapes,
                         default_collective_sizes, default_p2p_sizes, gemm_shapes,
                         measure_attention, measure_collectives, measure_compute,
                         measure_gemms, measure_optimizer, measure_p2p)
from .preflight import check_local_ranks
from .rendezvous import join_group
from .serving_steps import measure_serving
from .worker import backstop_timeout

Progress = Callable[[int, int, str], None]
"""progress(done, total, label): called in the parent as steps complete."""

GLOO_REDUCE_SCATTER = "gloo reduce-scatter is an all-reduce underneath (timed as one)"
CPU_ONLY = "CPU timings calibrate only this CPU (and gloo over loopback), not a GPU cluster"
ONE_GPU = ("one GPU cannot run NCCL between ranks ('Duplicate GPU'): P2P and collectives "
           "were not measured")


# --- the rank process -----------------------------------------------------------------
def _rank_main(rank: int, plan: BenchPlan, results: Any, link: Any) -> None:
    """Process entry point: join the group, run the benchmarks, report to the parent."""
    die_with_parent(link)
    try:
        torch.set_num_threads(1)
        cuda = plan.device == "cuda"
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        join_group("nccl" if cuda else "gloo", rank, plan.nproc, plan.port,
                   backstop_timeout(plan.timeout))

        def step(label: str) -> None:
            if rank == 0:
                results.put(("step", rank, label))

        payload: dict[str, Any] = {}
        measures = rank == 0 or plan.concurrent
        if measures:
            payload["compute"] = measure_compute(plan, device, step)
        dist.barrier()  # the concurrent optimizer steps start together
        if measures:
            payload["optimizer"] = measure_optimizer(plan, device, step)
        dist.barrier()  # and the GEMM tables
        if measures:
            payload["gemm"] = measure_gemms(plan, device, step)
            payload["attention"] = measure_attention(plan, device, step)
            if plan.serving_points:
                payload["serving"] = measure_serving(plan.model, device, *plan.serving_points,
                                                     plan.warmup, plan.repeats, plan.seed,
                                                     step)
        dist.barrier()
        if plan.nproc >= 2:
            payload["p2p"] = measure_p2p(plan, rank, device, step)
        payload["collectives"] = measure_collectives(plan, rank, device, step)
        payload["device_name"] = torch.cuda.get_device_name(device) if cuda else "cpu"
        dist.barrier()
        dist.destroy_process_group()
        results.put(("ok", rank, payload))
    except BaseException as exc:  # noqa: BLE001 (reported to the parent)
        results.put(("error", rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)


def _launch(plan: BenchPlan, progress: Progress | None) -> dict[int, dict]:
    check_local_ranks(plan.nproc, f"nproc={plan.nproc}")
    ctx = mp.get_context("spawn")
    with rank_session(ctx, backstop_timeout(plan.timeout)) as session:
        plan = replace(plan, port=session.port)
        session.start([ctx.Process(target=_rank_main, daemon=True,
                                   name=f"clustersim-calibrate-{r}",
                                   args=(r, plan, session.results, session.link))
                       for r in range(plan.nproc)])
        return _collect(plan, session.procs, session.results, progress)


def _collect(plan: BenchPlan, procs: list, results: Any,
             progress: Progress | None) -> dict[int, dict]:
    """The ranks' payloads; KernelsError when a rank fails or dies, or when no message
    (a finished benchmark step) arrived for `plan.timeout` seconds."""
    payloads: dict[int, dict] = {}
    done = 0
    last = time.monotonic()
    while len(payloads) < plan.nproc:
        if time.monotonic() - last > plan.timeout:
            raise KernelsError(f"calibration timed out: no benchmark step finished for "
                               f"{plan.timeout:g} s (timeout; {done} of {plan.total_steps} "
                               f"steps done)")
        try:
            message = results.get(timeout=0.1)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs)
                    if r not in payloads and p.exitcode not in (None, 0)]
            if dead:
                time.sleep(1.0)  # let its error message arrive
                if results.empty():
                    raise KernelsError(f"calibration rank {dead[0]} died (exit code "
                                       f"{procs[dead[0]].exitcode})", rank=dead[0])
            continue
        last = time.monotonic()
        if message[0] == "step":
            done += 1
            if progress:
                progress(done, plan.total_steps, message[2])
        elif message[0] == "error":
            _, rank, text, tb = message
            raise KernelsError(f"calibration rank {rank} failed: {text}", rank=rank,
                               details=tb)
        else:
            payloads[message[1]] = message[2]
    return payloads


def _median_compute(payloads: dict[int, dict]) -> dict[str, dict[str, float]]:
    """Median over the repeats of every rank that measured compute."""
    out = {}
    for part in PARTS:
        out[part] = {}
        for kind in PROFILED_KINDS:
            samples = [t for p in payloads.values() if "compute" in p
                       for t in p["compute"][part][kind]]
            out[part][kind] = statistics.median(samples)
    return out


def _median_optimizer(payloads: dict[int, dict]) -> float:
    """Median seconds per parameter over the optimizer steps of every measuring rank."""
    return statistics.median(t for p in payloads.values() for t in p.get("optimizer", ()))


SMALLEST_SECONDS = time.get_clock_info("perf_counter").resolution
"""A measured median below the clock's resolution is stored as the resolution (a
profile's times are > 0)."""


def _median_gemm(payloads: dict[int, dict], model: ModelSpec) -> GemmTimes | None:
    """Median seconds per shape over the samples of every measuring rank (shapes no rank
    could measure, microbench.measure_gemms, left out)."""
    tables = [p["gemm"] for p in payloads.values() if p.get("gemm")]
    samples = {shape: [t for table in tables for t in table[shape]] for shape in
               sorted(tables[0])} if tables else {}
    points = tuple((*shape, max(SMALLEST_SECONDS, statistics.median(times)))
                   for shape, times in samples.items() if times)
    return GemmTimes(model.dtype, points) if points else None


def _median_attention(payloads: dict[int, dict], model: ModelSpec) -> AttentionTimes | None:
    """Median forward and backward seconds per shape over every measuring rank."""
    shapes = [p["attention"] for p in payloads.values() if p.get("attention")]
    if not shapes:
        return None
    return AttentionTimes(model.dtype, True, tuple(
        (*shape, *(max(SMALLEST_SECONDS, statistics.median(t[j] for s in shapes
                                                              for t in s[shape]))
                   for j in (0, 1)))
        for shape in shapes[0]))


def serving_points(model: ModelSpec) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...],
                                              tuple[int, ...]]:
    """The serving steps `calibrate(serving=True)` measures, from the model's sequence
    length s: prompts of s/8, s/2 and s tokens; decodes of 1, 8 and 32 sequences after s/2
    and s cached tokens (small batches memory-bound, larger ones nearer compute-bound on
    a GPU: both regimes for the fit); the output layer for 1 and 32 rows."""
    s = model.seq_length
    contexts = sorted({max(1, s // 2), s})
    return (tuple(sorted({max(1, s // 8), max(1, s // 2), s})),
            tuple((b, c) for b in (1, 8, 32) for c in contexts), (1, 32))


def _median_serving(payloads: dict[int, dict], model: ModelSpec) -> ServingTimes | None:
    """Median seconds per serving point over the samples of every measuring rank."""
    runs = [p["serving"] for p in payloads.values() if p.get("serving")]
    if not runs:
        return None

    def medians(kind: str) -> list:
        return [[*(key if isinstance(key, tuple) else (key,)),
                 max(SMALLEST_SECONDS, statistics.median(t for run in runs
                                                         for t in run[kind][key]))]
                for key in runs[0][kind]]
    return ServingTimes(model.dtype, medians("prefill"), medians("decode"), medians("head"))


def calibrate(model: ModelSpec, device: str = "cpu", repeats: int = 7, warmup: int = 2,
              p2p_sizes: Sequence[int] | None = None,
              collective_sizes: Sequence[int] | None = None,
              group_sizes: Sequence[int] = (2,), collectives: Sequence[str] = ("all_reduce",),
              concurrent: bool | None = None, seed: int = 0, timeout: float = 600.0,
              progress: Progress | None = None, serving: bool = False) -> dict[str, Any]:
    """Run the micro-benchmarks and return the profile as JSON-ready data
    (schedules.profile format); `serving`: also the serving steps (serving_points).
    `concurrent` (default: on CPU) runs the compute benchmarks in every rank process at
    once. `timeout`: seconds without a finished
    benchmark step before the calibration fails. Raises KernelsError if a rank fails,
    ConfigError on bad input (before any process starts)."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r} must be 'cpu' or 'cuda'")
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
    unknown = [c for c in collectives if c not in COLLECTIVE_OPS]
    if unknown:
        raise ConfigError(f"unknown collective {unknown[0]!r}: use {', '.join(COLLECTIVE_OPS)}")
    if not is_finite_number(timeout) or not timeout > 0:
        raise ConfigError(f"timeout must be a finite number of seconds > 0 (calibration "
                          f"fails when no benchmark step finished for that long), got "
                          f"{timeout!r}")
    torch_dtype(model)  # fp8 and friends fail here, before any process starts
    notes = []
    nproc = max([2, *group_sizes])
    check_local_ranks(nproc, f"group_sizes (largest {nproc})")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise KernelsError(f"device='cuda' but torch {torch.__version__} sees no CUDA device")
        available = torch.cuda.device_count()
        if available < nproc:
            notes.append(ONE_GPU if available == 1 else
                         f"{available} GPUs: collectives over more ranks were not measured")
            nproc = available
        concurrent = bool(concurrent)
    else:
        notes.append(CPU_ONLY)
        if "reduce_scatter" in collectives:
            notes.append(GLOO_REDUCE_SCATTER)
        concurrent = True if concurrent is None else concurrent
    if concurrent and nproc > 1:
        notes.append(f"compute measured in {nproc} rank processes at once (each core as "
                     "busy as in a run with that many ranks)")
    plan = BenchPlan(model, device, repeats, warmup,
                 tuple(p2p_sizes or default_p2p_sizes(model)),
                 tuple(collective_sizes or default_collective_sizes(model)),
                 tuple(group_sizes), tuple(collectives), concurrent, seed, float(timeout),
                 nproc, 0,  # port: _launch's store
                 gemm_shapes(model), attention_shapes(model),
                 serving_points(model) if serving else ())
    started = time.perf_counter()
    payloads = _launch(plan, progress)
    rank0 = payloads[0]
    p2p = AlphaBeta.fit(rank0.get("p2p", [])) if rank0.get("p2p") else AlphaBeta(0.0, 0.0)
    fits = {op: {n: AlphaBeta.fit(points) for n, points in sizes.items() if points}
            for op, sizes in rank0["collectives"].items()}
    name = rank0["device_name"]
    gemm = _median_gemm(payloads, model)
    if len(plan.gemm_shapes) > (0 if gemm is None else len(gemm.points)):
        notes.append(f"{len(plan.gemm_shapes) - (0 if gemm is None else len(gemm.points))} "
                     f"of {len(plan.gemm_shapes)} GEMM shapes did not fit in memory and "
                     "were not measured")
    profile = Profile(
        device="cpu" if device == "cpu" else f"cuda:{name}",
        source=f"kernels.calibrate: medians of {repeats} after {warmup} warm-up; P2P one-way "
               f"= half the isend/irecv round trip on rank 0; optimizer = FlatAdam.step "
               f"on {OPTIMIZER_PARAMS} fp32 parameters; GEMM table = torch.matmul, "
               f"attention = causal scaled_dot_product_attention, in {model.dtype}; "
               f"{'serving = kernels.serving_steps; ' if serving else ''}"
               f"{nproc} rank processes, "
               f"{'gloo' if device == 'cpu' else 'nccl'}; "
               f"{time.perf_counter() - started:.1f} s",
        versions={"torch": torch.__version__, "python": platform.python_version(),
                  **({"cuda": str(torch.version.cuda)} if device == "cuda" else {})},
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        threads=1, model=asdict(model), tp=1,
        compute=_median_compute(payloads), p2p=p2p,
        optimizer_seconds_per_param=_median_optimizer(payloads),
        gemm=gemm, attention=_median_attention(payloads, model),
        serving=_median_serving(payloads, model),
        collectives={op: f for op, f in fits.items() if f}, notes=tuple(notes))
    return profile.to_dict()
