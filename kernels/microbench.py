"""Calibration micro-benchmarks, run inside each rank process of kernels.calibrate:
a model's layer ops at its shapes, the optimizer step (kernels.optimizer.FlatAdam, the
kernels' OPT_STEP), a table of GEMM shapes and the attention kernel at the model's
shapes, P2P ping-pong and collective size sweeps.

See kernels.calibrate for what is measured and how the profile is fitted. Units: seconds,
bytes. Functions return raw samples; `step(label)` is called after each unit of work.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import head_forward, layer_forward
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.profile import PROFILED_KINDS

from .layers import torch_dtype
from .optimizer import FlatAdam
from .split_backward import backward_input, backward_weight
from .stage import build_stages

PARTS = ("layer", "embedding", "head")


def default_p2p_sizes(model: ModelSpec) -> tuple[int, ...]:
    """1 KiB to 4 MiB, plus one activation b*s*h of the model (what a stage sends)."""
    boundary = model.micro_batch_size * model.seq_length * model.hidden_size * model.dtype_bytes
    return tuple(sorted({2**10, 2**14, 2**18, 2**20, 2**22, boundary}))


def default_collective_sizes(model: ModelSpec) -> tuple[int, ...]:
    """1 KiB to 16 MiB, plus the model's gradient bytes (a DP all-reduce), capped at 1 GiB."""
    grads = min(model.param_count() * model.dtype_bytes, 2**30)
    return tuple(sorted({2**10, 2**16, 2**20, 2**22, 2**24, int(grads)}))


@dataclass(frozen=True)
class BenchPlan:
    """What every rank process measures (picklable: it travels to the spawned ranks)."""

    model: ModelSpec
    device: str
    repeats: int
    warmup: int
    p2p_sizes: tuple[int, ...]
    collective_sizes: tuple[int, ...]
    group_sizes: tuple[int, ...]
    collectives: tuple[str, ...]
    concurrent: bool
    seed: int
    timeout: float  # seconds without a finished step before calibration fails
    nproc: int
    port: int  # the launcher's loopback TCPStore (kernels.rendezvous)
    gemm_shapes: tuple[tuple[int, int, int], ...] = ()  # (M, N, K): gemm_shapes(model)
    attention_shapes: tuple[tuple[int, int, int, int, int], ...] = ()  # attention_shapes
    serving_points: tuple = ()  # () or (prefill tokens, decode (batch, context), head rows)

    @property
    def compute_steps(self) -> int:
        return len(PARTS) * (self.warmup + self.repeats)

    @property
    def total_steps(self) -> int:
        p2p = len(self.p2p_sizes) if self.nproc >= 2 else 0
        groups = [n for n in self.group_sizes if 2 <= n <= self.nproc]
        rounds = self.warmup + self.repeats  # the optimizer's, and the tables' (one each)
        tables = rounds * (bool(self.gemm_shapes) + bool(self.attention_shapes))
        serving = sum(map(len, self.serving_points))  # one step per measured point
        return self.compute_steps + rounds + tables + serving + p2p + len(groups) * len(
            self.collectives) * len(self.collective_sizes)


# --- compute --------------------------------------------------------------------------
BACK_TO_BACK = 4  # calls per CUDA compute measurement (time_part, measure_optimizer)


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def stage_parts(model: ModelSpec, seed: int, device: torch.device) -> dict[str, nn.Module]:
    """One-layer middle stage, embedding-only first stage, head-only last stage: the
    stages of a one-layer model split (0, 1, 0)."""
    spec = replace(model, num_layers=1)
    return {part: build_stages(spec, [stage], 3, seed, device, split=(0, 1, 0))[stage]
            for part, stage in (("embedding", 0), ("layer", 1), ("head", 2))}


def _timed(timer: Timer, count: int, call: Callable[[int], Any]) -> tuple[float, list]:
    """Mean seconds of `count` back-to-back calls call(0..count-1), and their results."""
    t0 = timer.now()
    results = [call(i) for i in range(count)]
    return (timer.now() - t0) / count, results


QUEUE_AHEAD_CYCLES = 2_000_000
"""GPU clock cycles (about 1 ms at H100 clocks) of torch.cuda._sleep queued before a
kernel-table measurement, so the host has queued every timed call before the GPU reaches
them (device_timed)."""


def device_timed(timer: Timer, count: int, call: Callable[[int], Any],
                 queue_ahead: int = QUEUE_AHEAD_CYCLES) -> tuple[float, list]:
    """Mean device seconds of `count` back-to-back calls: on CUDA, CUDA events around the
    calls, queued behind a kernel sleeping `queue_ahead` cycles (long enough for the host to
    queue the calls) so the time is the kernels' alone, without the host's launch latency
    (which the simulator's kernel sums leave out: on an H100 a single F.linear of
    (8192 x 4096) @ (4096 x 4096) timed with events around it alone ran at 690 TFLOP/s, its
    kernel at 810; benchmarks/results/layer_gpu.md).
    On a CPU the host clock, as _timed."""
    if not timer.cuda:
        return _timed(timer, count, call)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(queue_ahead)
    start.record()
    results = [call(i) for i in range(count)]
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / count, results


def time_part(part: str, module: nn.Module, inputs: dict, timer: Timer) -> dict[str, float]:
    """One F, B, I, W measurement of a module (F, B and the I/W pair on their own forwards).
    On CUDA each is the mean of BACK_TO_BACK calls queued back to back, so the host's kernel
    launches overlap GPU work as they do between the ops of a schedule (one call between two
    synchronizes would count a layer's launch time too: F came out 2-9% slow on an H100)."""
    first, last = part == "embedding", part == "head"
    grad = None if last else inputs["grad"]
    labels = inputs["labels"] if last else None
    params = [p for p in module.parameters() if p.requires_grad]
    count = BACK_TO_BACK if timer.cuda else 1

    def forward(_: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x = inputs["tokens"] if first else inputs["x"].detach().clone().requires_grad_()
        return x, module(x, labels)

    times = {}
    times["F"], graphs = _timed(timer, count, forward)
    times["B"], _ = _timed(timer, count, lambda i: torch.autograd.backward(graphs[i][1], grad))
    graphs = [forward() for _ in range(count)]
    # stage 0: I is empty, W does it all
    times["I"], saved = _timed(timer, count, lambda i: backward_input(
        graphs[i][1], grad, graphs[i][0], params)[1])
    times["W"], _ = _timed(timer, count, lambda i: backward_weight(params, saved[i]))
    return times


def measure_compute(plan: BenchPlan, device: torch.device, step: Callable[[str], None]
                    ) -> dict[str, dict[str, list[float]]]:
    model = plan.model
    modules = stage_parts(model, plan.seed, device)
    gen = torch.Generator().manual_seed(plan.seed)
    b, s, h = model.micro_batch_size, model.seq_length, model.hidden_size
    dtype = torch_dtype(model)
    tokens = torch.randint(0, model.vocab_size, (b, s + 1), generator=gen)
    inputs = {"tokens": tokens[:, :-1].contiguous().to(device),
              "labels": tokens[:, 1:].contiguous().to(device),
              "x": torch.randn(b, s, h, generator=gen).to(device, dtype),
              "grad": (torch.randn(b, s, h, generator=gen) * 1e-3).to(device, dtype)}
    timer = Timer(device)
    samples = {part: {k: [] for k in PROFILED_KINDS} for part in PARTS}
    for part in PARTS:
        for i in range(plan.warmup + plan.repeats):
            times = time_part(part, modules[part], inputs, timer)
            if i >= plan.warmup:
                for k, t in times.items():
                    samples[part][k].append(t)
            step(f"{part} F/B/I/W")
    return samples


# --- optimizer step -------------------------------------------------------------------
OPTIMIZER_PARAMS = 2**24
"""fp32 elements of the optimizer-step benchmark, fixed rather than one layer's parameters
(a small model's layer fits in cache): 64 MiB a vector, master/m/v/gradient touched by
every step, far past a CPU's last-level cache and a GPU's L2 (50 MiB on an H100), so the
step is memory-bound like a real rank's step of millions of parameters. FlatAdam.step on
this 2-core CPU, one thread: 2.1 ns/param at 2^18 elements (in cache), 8.5 at 2^20, 10.1
at 2^22, 10.0 at 2^24."""


def measure_optimizer(plan: BenchPlan, device: torch.device, step: Callable[[str], None]
                      ) -> list[float]:
    """Seconds per parameter of FlatAdam.step (the kernels' OPT_STEP) on OPTIMIZER_PARAMS
    fp32 elements, the gradient in the model's dtype as the executor hands it over; timed
    like time_part (on CUDA the mean of BACK_TO_BACK steps queued back to back)."""
    gen = torch.Generator().manual_seed(plan.seed)
    adam = FlatAdam(torch.randn(OPTIMIZER_PARAMS, generator=gen).to(device))
    grad = (torch.randn(OPTIMIZER_PARAMS, generator=gen) * 1e-3).to(device,
                                                                     torch_dtype(plan.model))
    timer = Timer(device)
    count = BACK_TO_BACK if timer.cuda else 1
    samples = []
    for i in range(plan.warmup + plan.repeats):
        seconds, _ = _timed(timer, count, lambda _: adam.step(grad))
        if i >= plan.warmup:
            samples.append(seconds / OPTIMIZER_PARAMS)
        step("optimizer step")
    return samples


# --- GEMM table and attention ---------------------------------------------------------
TOKEN_SCALES = (0.25, 0.5, 1.0, 2.0)
"""Token counts of the GEMM grid, as multiples of the model's T = b*s: micro-batches
from a quarter to twice the calibrated one interpolate (sim.gemm_table)."""
TP_DEGREES = (1, 2, 4, 8)
"""TP degrees of the GEMM grid and attention shapes (those dividing the attention heads
and query groups): the column- and row-parallel shards of each GEMM, so other TP
degrees than the calibrated one interpolate."""


def tp_degrees(model: ModelSpec) -> tuple[int, ...]:
    """The TP_DEGREES that split the model's heads and query groups evenly."""
    return tuple(t for t in TP_DEGREES if model.num_attention_heads % t == 0
                 and model.num_query_groups % t == 0)


def _forward_gemms(model: ModelSpec, tp: int) -> list:
    """The forward GEMM kernels (schedules.layer_kernels) of each kind of layer and of the
    head at TP degree `tp`; [] when that layout is not valid for the model."""
    try:
        parallel = ParallelConfig(tp=tp)
    except ConfigError:
        return []
    layers = (None, 0) if model.is_moe else (None,)  # MoE: the dense first layers too
    kernels = [k for layer in layers for k in layer_forward(model, parallel, layer)]
    return [k for k in kernels + head_forward(model, parallel) if k.gemm is not None]


def gemm_shapes(model: ModelSpec, token_scales: tuple[float, ...] = TOKEN_SCALES
                ) -> tuple[tuple[int, int, int], ...]:
    """(M, N, K) of every GEMM kernel of the model's layers and head
    (schedules.layer_kernels: the forward (T x K) @ (K x N) and the two GEMMs of its
    backward, Kernel.gradient_gemms), at each of `tp_degrees(model)` and with the T tokens
    scaled by each of `token_scales` (at least 1 token); sorted, each once. Shapes with a
    dimension that is not a whole number (a layout the model does not split evenly) are
    left out. At scale 1 and tp=1 these are exactly the shapes a tp=1 run prices."""
    shapes = set()
    for tp in tp_degrees(model):
        for kernel in _forward_gemms(model, tp):
            tokens, n, k = kernel.gemm
            for scale in token_scales:
                scaled = replace(kernel, gemm=(max(1, round(tokens * scale)), n, k))
                for g in (scaled, *scaled.gradient_gemms()):
                    if all(float(d).is_integer() and d >= 1 for d in g.gemm):
                        shapes.add(tuple(int(d) for d in g.gemm))
    return tuple(sorted(shapes))


def attention_shapes(model: ModelSpec) -> tuple[tuple[int, int, int, int, int], ...]:
    """(batch, heads, kv_heads, seq, head_dim) of the model's core attention on one rank
    at each of `tp_degrees(model)` (heads and query groups split over tp)."""
    head_dim = model.hidden_size // model.num_attention_heads
    return tuple((model.micro_batch_size, model.num_attention_heads // t,
                  model.num_query_groups // t, model.seq_length, head_dim)
                 for t in tp_degrees(model))


def measure_gemms(plan: BenchPlan, device: torch.device, step: Callable[[str], None]
                  ) -> dict[tuple[int, int, int], list[float]]:
    """Seconds of one torch.matmul(a, b, out=c), a: M x K, b: K x N, in the model's dtype,
    per shape of `plan.gemm_shapes`. Rounds: each of warmup + repeats rounds times every
    shape once (fresh random operands each round, allocated outside the timing), so a
    burst of noise hits one sample of many shapes rather than all samples of one; timed
    by device_timed (on CUDA the kernels' device time, the mean of BACK_TO_BACK). Operands
    are row-major (NN); autograd's transposed layouts may run at other speeds. A shape
    whose operands do not fit in GPU memory is left out (no samples; kernels.calibrate
    notes how many)."""
    dtype = torch_dtype(plan.model)
    timer = Timer(device)
    count = BACK_TO_BACK if timer.cuda else 1
    torch.manual_seed(plan.seed)
    samples: dict[tuple[int, int, int], list[float]] = {s: [] for s in plan.gemm_shapes}
    too_big: set[tuple[int, int, int]] = set()
    for i in range(plan.warmup + plan.repeats):
        for m, n, k in plan.gemm_shapes:
            if (m, n, k) in too_big:
                continue
            try:
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                c = torch.empty(m, n, device=device, dtype=dtype)
            except torch.cuda.OutOfMemoryError:
                too_big.add((m, n, k))
                samples[(m, n, k)] = []
                a = b = c = None
                torch.cuda.empty_cache()
                continue
            seconds, _ = device_timed(timer, count, lambda _: torch.matmul(a, b, out=c))
            if i >= plan.warmup:
                samples[(m, n, k)].append(seconds)
            a = b = c = None  # free this shape's operands before the next's
        step("gemm table")
    return samples


def measure_attention(plan: BenchPlan, device: torch.device, step: Callable[[str], None]
                      ) -> dict[tuple[int, int, int, int, int], list[tuple[float, float]]]:
    """(forward, backward) seconds of causal torch.nn.functional.scaled_dot_product_attention
    per shape of `plan.attention_shapes`, in the model's dtype: the forward with autograd
    recording (as in training), the backward torch.autograd.backward of its output with a
    random gradient; rounds and timing as measure_gemms. With kv_heads < heads,
    K and V are expanded to `heads` (repeat_interleave, as kernels.layers does) outside the
    timing: the time is the attention kernel's, on whichever backend torch picks."""
    dtype = torch_dtype(plan.model)
    timer = Timer(device)
    count = BACK_TO_BACK if timer.cuda else 1
    torch.manual_seed(plan.seed)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    samples: dict[tuple, list[tuple[float, float]]] = {s: [] for s in plan.attention_shapes}
    for i in range(plan.warmup + plan.repeats):
        for shape in plan.attention_shapes:
            batch, heads, kv_heads, seq, head_dim = shape
            q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype,
                            requires_grad=True)
            k, v = (torch.randn(batch, kv_heads, seq, head_dim, device=device, dtype=dtype)
                    .repeat_interleave(heads // kv_heads, dim=1).requires_grad_()
                    for _ in range(2))
            grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)
            forward, outs = device_timed(timer, count,
                                          lambda _: sdpa(q, k, v, is_causal=True))
            backward, _ = device_timed(timer, count,
                                 lambda j: torch.autograd.backward(outs[j], grad))
            if i >= plan.warmup:
                samples[shape].append((forward, backward))
            q = k = v = grad = outs = None  # free them before the next shape's
        step("attention")
    return samples


# --- communication --------------------------------------------------------------------
def comm_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """fp32 elements holding `nbytes` (rounded down to whole elements)."""
    return torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)


def measure_p2p(plan: BenchPlan, rank: int, device: torch.device,
                step: Callable[[str], None]) -> list[tuple[int, float]]:
    """Half round trips between ranks 0 and 1 (rank 0's clock)."""
    points = []
    for size in plan.p2p_sizes:
        buf = comm_buffer(size, device)
        rtts = []
        dist.barrier()
        for i in range(plan.warmup + plan.repeats):
            if rank == 0:
                t0 = time.perf_counter()
                dist.isend(buf, 1).wait()
                dist.irecv(buf, 1).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= plan.warmup:
                    rtts.append(time.perf_counter() - t0)
            elif rank == 1:
                dist.irecv(buf, 0).wait()
                dist.isend(buf, 0).wait()
        if rank == 0:
            points.append((buf.numel() * 4, statistics.median(rtts) / 2))
        step(f"p2p {size} B")
    return points


def run_collective(op: str, buf: torch.Tensor, n: int, group: Any, gloo: bool) -> None:
    if op == "all_reduce" or (op == "reduce_scatter" and gloo):
        dist.all_reduce(buf, group=group)
    elif op == "broadcast":
        dist.broadcast(buf, src=0, group=group)
    elif op == "reduce":  # to the group's first rank, as torch.nn.DataParallel's gradients
        dist.reduce(buf, dst=0, group=group)
    elif op == "all_gather":  # buf is one rank's share of the nccl-tests size
        outs = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(outs, buf, group=group)
    elif op == "reduce_scatter":
        out = torch.empty(buf.numel() // n, dtype=buf.dtype, device=buf.device)
        dist.reduce_scatter_tensor(out, buf[: out.numel() * n], group=group)
    else:  # all_to_all
        dist.all_to_all_single(torch.empty_like(buf), buf, group=group)


def measure_collectives(plan: BenchPlan, rank: int, device: torch.device,
                         step: Callable[[str], None]
                         ) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """(bytes, median seconds) per collective and group size: the first n ranks start
    together after a barrier of their group; rank 0's clock."""
    gloo = device.type != "cuda"
    result: dict[str, dict[int, list[tuple[int, float]]]] = {op: {} for op in plan.collectives}
    for n in plan.group_sizes:
        if not 2 <= n <= plan.nproc:
            continue
        group = dist.new_group(list(range(n)))  # every rank must create every group
        for op in plan.collectives:
            points = []
            for size in plan.collective_sizes:
                if rank < n:
                    share = size // n if op == "all_gather" else size
                    share -= share % (4 * n)  # whole fp32 elements (n of them for r-s)
                    buf = comm_buffer(max(share, 4 * n), device)
                    times = []
                    for i in range(plan.warmup + plan.repeats):
                        dist.barrier(group=group)
                        t0 = time.perf_counter()
                        run_collective(op, buf, n, group, gloo)
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        if i >= plan.warmup:
                            times.append(time.perf_counter() - t0)
                    nbytes = buf.numel() * 4 * (n if op == "all_gather" else 1)
                    points.append((nbytes, statistics.median(times)))
                step(f"{op.replace('_', '-')} n={n} {size} B")
            result[op][n] = points
        dist.barrier()
    return result
