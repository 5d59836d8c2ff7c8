"""The planner's outputs: the ranked table, the command line that simulates each
candidate, the funnel, and the JSON of `clustersim plan --json`.

Units as printed: iteration time in s, tokens/s, MFU in % of the device's dense peak
(sim.throughput), peak memory in GB (1e9 bytes: the replay's per-rank peak), bound in s
(sim.planner.bound). The `why` column states each candidate's bubble, exposed
communication (Timeline.bubble_fraction, exposed_comm_fraction: means over pipeline
ranks) and recompute (recomputed FLOPs / model FLOPs), and for every candidate but the
first where its extra time comes from: of the four parts an iteration's seconds split
into (`time_parts`, which sum to it), the one that grew most against the first's.
"""
from __future__ import annotations

import shlex

from tabulate import tabulate

from .search import Candidate, SearchResult
from .space import MEGATRON_ORDER, ZERO_NAMES

GB = 1e9


def simulate_command(candidate: Candidate, model: str, topology: str,
                     global_batch_size: int, seq_length: int | None = None,
                     dtype: str | None = None) -> str:
    """The `clustersim simulate` command line that replays `candidate`."""
    lay = candidate.layout
    args = ["clustersim", "simulate", "--model", model, "--topology", topology,
            "--schedule", lay.schedule, "--tp", str(lay.tp), "--pp", str(lay.pp),
            "--dp", str(lay.dp), "--global-batch-size", str(global_batch_size),
            "--micro-batch-size", str(lay.micro_batch_size), "--zero-stage", str(lay.zero),
            "--recompute", lay.recompute]
    args += ["--vpp", str(lay.vpp)] if lay.vpp > 1 else []
    args += ["--cp", str(lay.cp)] if lay.cp > 1 else []
    args += ["--ep", str(lay.ep)] if lay.ep > 1 else []
    args += ["--sequence-parallel"] if lay.sequence_parallel else []
    args += ["--rank-order", lay.rank_order] if lay.rank_order != MEGATRON_ORDER else []
    args += ["--seq-length", str(seq_length)] if seq_length else []
    args += ["--dtype", dtype] if dtype else []
    return shlex.join(args)


def time_parts(result: dict) -> dict[str, float]:
    """A replay's iteration time T in seconds, split in four parts that sum to it (means
    over pipeline ranks; Timeline.time_breakdown's categories partition each rank's T):
    bubble T b and exposed communication T e; the rest, compute T (1 - b - e), split by
    the recompute overhead r (recomputed FLOPs / model FLOPs, run at the same rate) into
    recompute, its r / (1 + r), and the model's own FLOPs, 1 / (1 + r). Every layout of
    one search trains the same model FLOPs per GPU, so more seconds in that last part
    means slower compute (less efficient kernels, or work repeated across ranks)."""
    t, b, e = result["iteration_time"], result["bubble_fraction"], result["exposed_comm_fraction"]
    r = result["recompute_overhead"]
    compute = t * (1 - b - e)
    return {"bubble": t * b, "exposed comm": t * e, "recompute": compute * r / (1 + r),
            "slower compute": compute / (1 + r)}


def why(candidate: Candidate, best: Candidate) -> str:
    """The `why` column (module docstring)."""
    r = candidate.result
    parts = [f"bubble {r['bubble_fraction']:.1%}", f"exposed comm {r['exposed_comm_fraction']:.1%}",
             f"recompute +{r['recompute_overhead']:.0%} FLOPs"]
    if candidate is best:
        return "fastest: " + ", ".join(parts)
    slower = r["iteration_time"] / best.result["iteration_time"] - 1
    if slower <= 0:
        return "as fast as the first: " + ", ".join(parts)
    mine, first = time_parts(r), time_parts(best.result)
    name = max(mine, key=lambda part: mine[part] - first[part])
    return f"+{slower:.1%} time, most from {name}: " + ", ".join(parts)


def candidate_row(candidate: Candidate) -> dict:
    """One ranked candidate as the JSON and the DataFrame hold it (seconds, bytes)."""
    lay, r = candidate.layout, candidate.result
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
            "vpp": lay.vpp, "micro_batch_size": lay.micro_batch_size, "zero": lay.zero,
            "recompute": lay.recompute, "schedule": lay.schedule,
            "sequence_parallel": lay.sequence_parallel, "rank_order": lay.rank_order,
            "num_microbatches": candidate.plan.num_microbatches,
            "iteration_time": r["iteration_time"], "peak_memory": r["peak_memory"],
            "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"],
            "bound": candidate.bound, "bubble_fraction": r["bubble_fraction"],
            "exposed_comm_fraction": r["exposed_comm_fraction"],
            "recompute_overhead": r["recompute_overhead"], "oom_ranks": r["oom_ranks"]}


def funnel(result: SearchResult) -> dict:
    """The funnel counts of the JSON (`rejected` by reason, memory included)."""
    return {"enumerated": result.enumerated, "rejected": dict(result.rejected.most_common()),
            "fit_in_memory": result.fit_in_memory, "bounded_out": result.bounded_out,
            "simulated": result.simulated, "lowering_refused": result.lowering_refused,
            "path_bounds": result.path_bounds,
            "lowered_bounds": result.lowered_bounds,
            "capacity_bytes": result.capacity_bytes, "seconds": result.seconds}


def to_json(result: SearchResult, commands: list[str]) -> dict:
    """The `--json` document: the funnel and the ranked candidates with their commands."""
    return {**funnel(result),
            "candidates": [{**candidate_row(c), "command": cmd}
                           for c, cmd in zip(result.candidates, commands)]}


def format_report(result: SearchResult, commands: list[str], top: int) -> str:
    """The terminal report: the funnel, the top candidates' table, their commands."""
    before_fit = sum(result.rejected.values()) - result.lowering_refused
    lowered = (f", {result.lowering_refused:,} refused when lowered"
               if result.lowering_refused else "")
    lines = [f"funnel: {result.enumerated:,} layouts enumerated, {before_fit:,} rejected "
             f"(by the checks or the memory model), {result.fit_in_memory:,} fit in "
             f"{result.capacity_bytes / GB:.1f} GB per GPU: {result.bounded_out:,} bounded "
             f"out (lower bound no better than the top {top}){lowered}, "
             f"{result.simulated:,} simulated event by event "
             f"({result.seconds.get('total', 0):.1f} s); refusals by reason:"]
    lines += [f"  rejected {n:,}: {why_}" for why_, n in result.rejected.most_common(8)]
    if not result.candidates:
        return "\n".join(lines + ["no layout fits and runs: see the reasons above"])
    best = result.candidates[0]
    rows = [[i + 1, c.layout.describe(), ZERO_NAMES[c.layout.zero],
             f"{c.result['iteration_time']:.3f}", f"{c.result['tokens_per_s']:,.0f}",
             "n/a" if c.result["mfu"] is None else f"{100 * c.result['mfu']:.1f}",
             f"{c.result['peak_memory'] / GB:.1f}", f"{c.bound:.3f}", why(c, best)]
            for i, c in enumerate(result.candidates[:top])]
    lines.append(tabulate(rows, headers=["#", "layout", "optimizer sharding",
                                         "iteration (s)", "tokens/s", "MFU (%)",
                                         "peak mem (GB)", "bound (s)", "why"]))
    lines.append("iteration: simulated event by event (sim.simulate); tokens/s = global "
                 "batch x seq length / iteration; MFU = model FLOPs (3x forward) / "
                 "(iteration x GPUs x dense peak); peak mem: the replay's busiest rank; "
                 "bound: the lower bound the search used (sim.planner.bound)")
    lines += [f"  #{i + 1}: {cmd}" for i, cmd in enumerate(commands[:top])]
    return "\n".join(lines)
