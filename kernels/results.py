"""Turn the rank processes' payloads into results: one measured Timeline, and gradients
or parameters by name merged over the ranks (kernels.worker says what a payload holds).
Units: seconds from the selected iteration's earliest post-barrier t0; tensors by name.
"""
from __future__ import annotations

import io
from typing import Any

import torch

from clustersim.schedules.names import DP, PP, TP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.weight_stashing import steady_window

from .errors import KernelsError
from .split_backward import EXACT_SPLIT
from .tied_embedding import summing_ranks

CPU_MEMORY = ("memory: not measured on CPU (torch keeps allocator statistics for CUDA "
              "devices only, torch.cuda.memory_allocated); the Timeline has no memory samples")
TP_INSIDE = ("TP collectives run inside their compute op (autograd); each TP op's span is "
             "the measured time of its collectives, laid out after the op's compute, whose "
             "span is shortened by as much (kernels.tp_ops); with SP, the gradient sum "
             "of the norm weights, row biases and position embedding (one all-reduce "
             "per B/W op here, one per iteration in Megatron) stays inside the compute span")
GLOO_REDUCE_SCATTER = ("REDUCE_SCATTER runs as an all-reduce of the bucket and a slice (gloo "
                       "has no reduce-scatter; one code path on NCCL too): its times are "
                       "all-reduce times")

STASH_COPY = ("weight stashing: each version in use is a copy beside the live weights, one "
              "copy more than the versions the memory model counts (kernels.stashing)")
SUMMA_BLOCKING = ("tp_mode='2d' and '2.5d': SUMMA's broadcasts and reduces run blocking, one step "
                  "after another, inside their compute op (Colossal-AI double-buffers them "
                  "beside the GEMMs); the spans of the ops the IR places alongside carry "
                  "the measured times of steps 2..q")
TIED_SUM = ("tied embeddings: the word-embedding gradients of the first and last stage are "
            "summed over their two ranks (Megatron's embedding all-reduce, not an op of the "
            "IR) right before those stages' OPT_STEP, outside any span")


def merge_timeline(payloads: dict[int, dict], job: Any) -> Timeline:
    """One Timeline from every rank's spans: the measured iteration with the median time,
    times in seconds from the earliest post-barrier t0 of that iteration."""
    count = len(next(iter(payloads.values()))["iterations"])
    times, origins = [], []
    for i in range(count):
        its = [p["iterations"][i] for p in payloads.values()]
        origin = min(it["t0"] for it in its)
        spans = [s for it in its for s in it["spans"]]
        times.append(max(s["end"] for s in spans) - min(s["start"] for s in spans))
        origins.append(origin)
    chosen = sorted(range(count), key=times.__getitem__)[(count - 1) // 2]
    spans, memory = [], []
    for rank, payload in sorted(payloads.items()):
        it = payload["iterations"][chosen]
        origin = origins[chosen]
        spans += [{**s, "start": s["start"] - origin, "end": s["end"] - origin}
                  for s in it["spans"]]
        memory += [[m[2] if len(m) > 2 else rank, m[0] - origin, m[1]] for m in it["memory"]]
    spans.sort(key=lambda s: (s["start"], s["rank"]))
    name = next(iter(payloads.values()))["device_name"]
    source = "kernels:cpu" if job.device == "cpu" else f"kernels:cuda:{name}"
    s, p = job.schedule, job.parallel
    meta = {
        "plan": job.plan.describe(), "device": name,
        "backend": "nccl" if job.device == "cuda" else "gloo",
        "torch": torch.__version__, "seed": job.seed,
        "warmup_iterations": job.warmup_iterations, "iteration_times": times,
        "selected_iteration": chosen, "replay": job.replay,
        "limits": (["replay: each pipeline rank's compute alone on one device, one rank "
                    "after another, each from t = 0; P2P not run (RECVs are random data)"]
                   if job.replay else [])
        + ([] if EXACT_SPLIT else ["W re-traverses the activation-gradient chain "
                                           "(old torch): W times are overstated"])
        + (["gloo: CPU timings calibrate only this CPU and gloo", CPU_MEMORY]
           if job.device == "cpu" else [])
        + ([GLOO_REDUCE_SCATTER] if any(op.kind is OpKind.REDUCE_SCATTER
                                        for op in s.ops()) or p.sequence_parallel else [])
        + ([TP_INSIDE] if p.tp > 1 else [])
        + ([SUMMA_BLOCKING] if p.tp > 1 and p.tp_mode in ("2d", "2.5d") else [])
        + ([TIED_SUM] if summing_ranks(s, job.model) and not job.replay else []),
    }
    timeline = Timeline.from_dict({"source": source, "meta": meta, "spans": spans,
                                   "memory": memory})
    run = s.asynchronous
    if run is not None:  # the reported iteration is the steady state's window
        start, end = steady_window(timeline.spans, run)
        timeline.meta["steady_state"] = {"start": start, "end": end,
                                         **run.describe(p.pp)}
        timeline.meta["limits"].append(STASH_COPY)
    return timeline


def gather_grads(payloads: dict[int, dict], parallel: ParallelConfig) -> dict[str, torch.Tensor]:
    """Gradients by parameter name (gather_state): shards merged over each DP group, then
    the copies of a tied embedding on the first and last stage summed (Megatron's
    embedding all-reduce), unless the run's OPT_STEP summed them already."""
    return gather_state(payloads, parallel, "grads")


def gather_state(payloads: dict[int, dict], parallel: ParallelConfig,
                 what: str) -> dict[str, torch.Tensor]:
    """`what` ('grads' or 'params') by name, full (unsharded) tensors. Per TP rank: per
    pipeline rank, DP replica 0's tensors, their NaN elements (not held: a shard of
    another rank) filled from the other DP ranks in DP order; then across pipeline ranks,
    tied copies summed ('grads') or the first kept ('params', and the 'grads' a payload
    lists in 'summed_grads': summed before the optimizer step, kernels.tied_embedding).
    Then the TP blocks are put in their place in the full tensor (payload 'shard_blocks':
    along each (dim, index, parts) part index of parts; a 1D shard is part t along its
    shard dim, a grid's blocks kernels.layers_2d's or layers_3d's; copies the forward
    never reads, blocks None, are left out); a replicated tensor is TP rank 0's (every
    TP rank holds the same)."""
    by_tp: dict[int, dict[int, dict]] = {}
    for rank, payload in payloads.items():
        by_tp.setdefault(parallel.coords(rank)[TP], {})[rank] = payload
    merged = {t: _merge_tp_rank(by_tp[t], parallel, what) for t in sorted(by_tp)}
    if len(merged) == 1:
        return merged[0]
    blocks = {t: {n: b for p in by_tp[t].values() for n, b in p.get("shard_blocks", {}).items()}
              for t in by_tp}
    return {name: _assemble({t: (merged[t][name], blocks[t].get(name, ())) for t in merged
                             if blocks[t].get(name, ()) is not None})
            for name in merged[0]}


def _assemble(parts: dict[int, tuple[torch.Tensor, tuple]]) -> torch.Tensor:
    """The full tensor from each TP rank's (block, its (dim, index, parts) blocks)."""
    first, blocks = parts[min(parts)]
    if not blocks:
        return first
    shape = list(first.shape)
    for dim, _, count in blocks:
        shape[dim] *= count
    out = first.new_empty(shape)
    for tensor, where in parts.values():
        view = out
        for dim, index, count in where:
            size = shape[dim] // count
            view = view.narrow(dim, index * size, size)
        view.copy_(tensor)
    return out


def _merge_tp_rank(payloads: dict[int, dict], parallel: ParallelConfig,
                   what: str) -> dict[str, torch.Tensor]:
    per_pp: dict[int, dict[str, torch.Tensor]] = {}
    summed = {n for p in payloads.values() for n in p.get("summed_grads", ())}
    for rank, payload in sorted(payloads.items(), key=lambda kv: parallel.coords(kv[0])[DP]):
        if payload.get(what) is None:
            continue
        merged = per_pp.setdefault(parallel.coords(rank)[PP], {})
        for name, t in torch.load(io.BytesIO(payload[what])).items():
            if name not in merged:
                merged[name] = t
            else:
                hole = torch.isnan(merged[name])
                merged[name] = torch.where(hole, t, merged[name])
    out: dict[str, torch.Tensor] = {}
    for pp in sorted(per_pp):
        for name, t in per_pp[pp].items():
            if what == "params" and name in out and not torch.equal(
                    torch.nan_to_num(out[name]), torch.nan_to_num(t)):
                raise KernelsError(f"parameter {name}: its copies on two pipeline ranks "
                                   f"differ after the run (a tied weight's or DualPipe's "
                                   f"stage copies must step alike)")
            add = name in out and what == "grads" and name not in summed
            out[name] = out[name] + t if add else out.get(name, t)
    return out
