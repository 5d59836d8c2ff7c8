"""Fidelity: clustersim's predictions against published large-scale training runs.

Simulates every run of benchmarks/fidelity_data.py (SC21 Table 1 on Selene; K22 Table 5
with full recompute and with sequence parallelism + selective recompute; K22's 530B at
8-way data parallelism) on the `selene-a100` preset with the row's TP/PP/DP, global and
micro-batch, interleaving and recompute, and compares throughput (TFLOP/s per GPU by the
paper's FLOP formula applied to the simulated iteration time) and iteration time (where
published). Writes benchmarks/results/fidelity.md and fidelity.json.

Cost-model constants (never fitted to the table; the results page says where each comes
from): peak 312 TFLOP/s and HBM 2.039 TB/s from the A100 80GB datasheet (topologies
device registry); memory efficiency 0.88 (a measured A100 80GB read bandwidth); compute
efficiency = the measured throughput of ONE transformer layer (K22 Table 4, Megatron on
Selene), less what the simulator charges separately (its TP communication), found by
simulating that layer experiment (`k22_layer_efficiency`). Override with
--compute-efficiency / --memory-efficiency; --also-efficiency adds sensitivity runs.

Each row runs in a forked child with a time limit; a row over it, or past the total
budget, is reported as skipped with the time measured, never dropped.

    python benchmarks/fidelity.py                      # ~3-6 min on 2 cores
    python benchmarks/fidelity.py --rows 1.7B,22B      # a subset (labels)
    python benchmarks/fidelity.py --render             # .md again from the .json
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import sys
import time
from pathlib import Path

import fidelity_data as fd
from environment import environment
from fidelity_report import render, simulator_version
from run_cli import command
from schedules.model_presets import get_model
from schedules.ops import OpKind
from schedules.parallel import ParallelConfig
from sim.simulate import CostOptions, simulate
from topologies import load_topology

RESULTS = Path(__file__).parent / "results"

# Datasheet / documented constants (see the results page for the sources).
MEMORY_EFFICIENCY = 0.88  # 1.80 of 2.04 TB/s read on an A100 80GB SXM (NVIDIA forum, 2025)
MAMF_EFFICIENCY = 267.9 / 312  # max achievable bf16 matmul on A100 SXM (ml-engineering)
K22_LAYER_SECONDS = 19.6e-3  # K22 Table 4: 22B layer, t=8, b=4, fwd+bwd, no recompute

# run_table_1.sh's DDP= per SC21 row: 'torch' (PyTorch DDP: 25 MiB buckets reduced during
# the backward) for the four smallest, 'local' (Megatron's contiguous-buffer DDP: one
# all-reduce per model chunk after the backward) for the rest. K22 (section 6.3): the
# gradient all-reduce is not overlapped with the backward; we model Megatron's local DDP.
SC21_TORCH_DDP = {"1.7B", "3.6B", "7.5B", "18.4B"}
WHOLE_BUFFER_BUCKET = 1 << 40  # one bucket holds a whole model chunk's gradients


def intra_layer_kwargs(scatter_gather: bool = True) -> dict:
    """simulate()'s `intra` for Megatron-LM of 2021/22: TP collectives between the GEMMs
    (no --tp-comm-overlap, which came later) and pipeline transfers scattered over the TP
    ranks and all-gathered (SC21 section 4.1; Megatron's default
    scatter_gather_tensors_in_pipeline, used when tp > 1 without SP). {} for a simulator
    without intra-layer options (before TP communication)."""
    try:
        from schedules.intra_layer import IntraLayerOptions
    except ImportError:
        return {}
    names = set(IntraLayerOptions.__dataclass_fields__)
    options = {"tp_comm_overlap": False, "scatter_gather": scatter_gather}
    return {"intra": IntraLayerOptions(**{k: v for k, v in options.items() if k in names})}


def ddp_impl(run: fd.PublishedRun) -> str:
    return "torch" if run.source.startswith("SC21") and run.label in SC21_TORCH_DDP else "local"


def parallel_config(run: fd.PublishedRun) -> ParallelConfig:
    """The row's layout as a ParallelConfig (Megatron semantics, default rank order)."""
    torch_ddp = ddp_impl(run) == "torch"
    return ParallelConfig(
        pp=run.pp, vpp=run.virtual_stages, dp=run.dp, tp=run.tp,
        sequence_parallel=run.sequence_parallel, global_batch_size=run.global_batch_size,
        micro_batch_size=run.micro_batch_size, recompute=run.recompute,
        schedule="interleaved-1f1b" if run.virtual_stages > 1 else "1f1b",
        overlap_grad_reduce=torch_ddp, bucket_bytes=None if torch_ddp else WHOLE_BUFFER_BUCKET)


def cli_command(run: fd.PublishedRun, costs: CostOptions, intra: dict | None = None) -> str:
    """The `clustersim simulate` command that simulates the same row."""
    p = parallel_config(run)
    args = ["simulate", "--model", run.model, "--topology", run.cluster.topology,
            "--schedule", p.schedule, "--tp", str(p.tp), "--pp", str(p.pp), "--dp", str(p.dp),
            "--global-batch-size", str(p.global_batch_size),
            "--micro-batch-size", str(p.micro_batch_size), "--recompute", p.recompute]
    if p.vpp > 1:
        args += ["--vpp", str(p.vpp)]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if not p.overlap_grad_reduce:
        args += ["--no-overlap-grad-reduce", "--bucket-mb", str(WHOLE_BUFFER_BUCKET >> 20)]
    options = (intra or {}).get("intra")
    if getattr(options, "scatter_gather", False) and p.tp > 1 and not p.sequence_parallel:
        args.append("--scatter-gather-tensors-in-pipeline")
    args += ["--compute-efficiency", f"{costs.compute_efficiency:.4f}",
             "--memory-efficiency", f"{costs.memory_efficiency}"]
    return command(*args)


def paper_flops(run: fd.PublishedRun) -> tuple[int, str]:
    """One iteration's FLOPs by the paper's own formula, and its name: SC21 eq. (3) for
    Table 1 (what its TFLOP/s column uses); K22 eq. (7), model FLOPs (what its MFU uses)."""
    if run.source.startswith("SC21"):
        return fd.sc21_flops(run), "SC21 eq. 3"
    return fd.k22_model_flops(run), "K22 eq. 7"


def tflops_per_gpu(flops: float, seconds: float, gpus: int) -> float:
    return flops / (seconds * gpus) / 1e12


def published_tflops(run: fd.PublishedRun) -> float:
    """SC21: the printed column. K22 prints times only: its formula over the time."""
    if run.tflops_per_gpu is not None:
        return run.tflops_per_gpu
    return tflops_per_gpu(paper_flops(run)[0], run.iteration_time_s, run.gpus)


def comm_groups(timeline) -> list[str]:
    """'KIND:group' of the communication ops rank 0 ran (which axes the simulator charged)."""
    return sorted({f"{s.op.kind.name}:{s.op.group}" for s in timeline.spans
                   if s.rank == 0 and s.lane != "compute" and s.op.group})


def breakdown(timeline) -> dict[str, float]:
    """Mean over pipeline ranks of each time category's share of the iteration (compute,
    exposed tp/cp/ep/pp/dp communication, bubble), where the simulator reports one."""
    total = timeline.iteration_time  # a property that scans every span: read it once
    if not hasattr(timeline, "time_breakdown") or not total:
        return {}
    per_rank = timeline.time_breakdown()
    shares: dict[str, float] = {}
    for seconds in per_rank.values():
        for category, value in seconds.items():
            shares[category] = shares.get(category, 0.0) + value / total
    return {c: v / len(per_rank) for c, v in shares.items()}


def simulate_row(run: fd.PublishedRun, topology, costs: CostOptions,
                 intra: dict | None = None) -> dict:
    """Simulate one published run; the measured and derived numbers of its table row.
    `intra`: simulate()'s intra-layer keyword ({'intra': IntraLayerOptions} or {})."""
    started = time.perf_counter()
    timeline = simulate(fd.model_spec(run), parallel_config(run), topology, costs=costs,
                        **(intra or {}))
    wall = time.perf_counter() - started
    seconds = timeline.iteration_time
    flops, formula = paper_flops(run)
    peaks = timeline.peak_memory()
    return {"iteration_time_s": seconds, "tflops_per_gpu": tflops_per_gpu(flops, seconds, run.gpus),
            "bubble_fraction": timeline.bubble_fraction, "formula": formula,
            "peak_memory_gb": max(peaks.values(), default=0) / 1e9,
            "oom_ranks": timeline.meta.get("oom_ranks", []),
            "comm": comm_groups(timeline), "breakdown": breakdown(timeline),
            "spans": len(timeline.spans), "wall_s": wall}


def _child(conn, run, topology, costs, intra) -> None:
    logging.getLogger("sim").setLevel(logging.ERROR)
    try:
        conn.send(("ok", simulate_row(run, topology, costs, intra)))
    except Exception as err:  # reported on the row, the benchmark goes on
        conn.send(("error", f"{type(err).__name__}: {err}"))
    conn.close()


def run_with_limit(run: fd.PublishedRun, topology, costs: CostOptions, limit_s: float,
                   intra: dict | None = None) -> dict:
    """simulate_row in a forked child, killed after `limit_s`: {'status', ...}."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    started = time.perf_counter()
    proc = ctx.Process(target=_child, args=(child, run, topology, costs, intra), daemon=True)
    proc.start()
    child.close()
    ready = parent.poll(limit_s)
    elapsed = time.perf_counter() - started
    if not ready:
        proc.kill()
        proc.join()
        return {"status": "skipped", "reason": f"simulation still running after the "
                f"{limit_s:.0f} s row limit (killed)", "wall_s": elapsed}
    try:
        kind, value = parent.recv()
    except EOFError:
        kind, value = "error", f"the simulation process died (exit code {proc.exitcode})"
    proc.join()
    elapsed = time.perf_counter() - started
    if kind == "ok":
        return {"status": "ok", **value, "elapsed_s": elapsed}
    return {"status": "error", "reason": value, "wall_s": elapsed}


def layer_window(topology, layers: int, efficiency: float, memory_efficiency: float,
                 intra: dict | None = None) -> float:
    """Seconds from the first F to the end of the last op that is neither an optimizer
    step nor a DP collective: forward + backward of `layers` 22B layers as K22 Table 4
    ran them (t=8, micro-batch 4, one micro-batch, no recompute, no pipeline)."""
    model = get_model("k22-22b", num_layers=layers, micro_batch_size=4)
    parallel = ParallelConfig(tp=8, micro_batch_size=4, num_microbatches=1)
    timeline = simulate(model, parallel, topology,
                        costs=CostOptions(compute_efficiency=efficiency,
                                          memory_efficiency=memory_efficiency), **(intra or {}))
    spans = [s for s in timeline.spans if s.rank == 0 and s.op.kind is not OpKind.OPT_STEP
             and not (s.op.group or "").startswith("dp")]
    return max(s.end for s in spans) - min(s.start for s in spans)


def k22_layer_efficiency(topology, memory_efficiency: float, intra: dict | None = None) -> dict:
    """The compute efficiency at which the simulator reproduces K22 Table 4's measured
    layer (19.6 ms forward + backward): the simulated time of 2 layers minus 1 layer (so
    embedding, logits and optimizer cancel) is one layer's F + B plus whatever TP
    communication the simulator charges; bisection on the efficiency (time falls as it
    rises). One published micro-measurement, not the benchmark's rows."""
    def one_layer(e: float) -> float:
        return (layer_window(topology, 2, e, memory_efficiency, intra)
                - layer_window(topology, 1, e, memory_efficiency, intra))

    at_peak = one_layer(1.0)
    if at_peak >= K22_LAYER_SECONDS:
        raise SystemExit(f"even at 100% efficiency the simulated 22B layer takes "
                         f"{at_peak * 1e3:.2f} ms > {K22_LAYER_SECONDS * 1e3} ms")
    low, high = 0.05, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if one_layer(mid) > K22_LAYER_SECONDS else (low, mid)
    efficiency = (low + high) / 2
    model = get_model("k22-22b", micro_batch_size=4)
    flops = 3 * model.layer_forward_flops() / 8
    return {"efficiency": efficiency, "layer_ms_at_peak": at_peak * 1e3,
            "layer_ms": one_layer(efficiency) * 1e3,
            "compute_ms": flops / (312e12 * efficiency) * 1e3,
            "efficiency_with_comm": flops / (312e12 * K22_LAYER_SECONDS)}


def run_all(runs, topology, costs: CostOptions, row_limit: float, deadline: float,
            intra: dict | None = None) -> list[dict]:
    rows = []
    for run in runs:
        row = {"source": run.source, "label": run.label, "model": run.model,
               "gpus": run.gpus, "tp": run.tp, "pp": run.pp, "dp": run.dp,
               "vpp": run.virtual_stages, "microbatches": run.num_microbatches,
               "micro_batch_size": run.micro_batch_size, "global_batch_size": run.global_batch_size,
               "recompute": run.recompute, "sequence_parallel": run.sequence_parallel,
               "ddp": ddp_impl(run), "published_tflops": published_tflops(run),
               "published_iteration_s": run.iteration_time_s,
               "implied_iteration_s": fd.implied_iteration_time_s(run),
               "published_mfu": run.mfu_percent, "command": cli_command(run, costs, intra)}
        left = deadline - time.monotonic()
        if left <= 1:
            row.update(status="skipped", wall_s=0.0,
                       reason="the benchmark's total time budget was spent before this row")
        else:
            row.update(run_with_limit(run, topology, costs, min(row_limit, left), intra))
        if row["status"] == "ok":
            row["error"] = row["tflops_per_gpu"] / row["published_tflops"] - 1
            if run.iteration_time_s is not None:
                row["time_error"] = row["iteration_time_s"] / run.iteration_time_s - 1
            if run.mfu_percent is not None:
                row["mfu"] = 100 * fd.k22_model_flops(run) / (
                    row["iteration_time_s"] * run.gpus * run.cluster.peak_tflops * 1e12)
        rows.append(row)
        print(f"{run.source:16s} {run.label:9s} {run.recompute:9s} {row['status']:7s} "
              f"wall {row['wall_s']:6.1f} s (with process {row.get('elapsed_s', 0):6.1f} s)  "
              + (f"pred {row['tflops_per_gpu']:6.1f} pub {row['published_tflops']:6.1f} "
                 f"err {100 * row['error']:+6.1f}%" if row["status"] == "ok"
                 else row.get("reason", "")), flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows if r["status"] == "ok"]
    return {"rows": len(rows), "simulated": len(errors),
            "mae": sum(errors) / len(errors) if errors else None,
            "max_abs_error": max(errors, default=None),
            "within_15": sum(e <= 0.15 for e in errors),
            "targets_met": bool(errors) and len(errors) == len(rows)
            and max(errors) <= 0.15 and sum(errors) / len(errors) < 0.08}


def earlier_run(path: Path) -> dict:
    """What the page shows of an earlier run: its simulator, efficiency, summary, errors."""
    old = json.loads(path.read_text())
    return {"file": path.name, "simulator": old["simulator"],
            "compute_efficiency": old["constants"]["compute_efficiency"],
            "environment_date": old["environment"]["date"], "summary": old["summary"],
            "rows": {f"{r['source']}|{r['label']}|{r['recompute']}":
                     {"error": r.get("error"), "tflops_per_gpu": r.get("tflops_per_gpu"),
                      "wall_s": r["wall_s"], "comm": r.get("comm", [])}
                     for r in old["rows"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-efficiency", type=float,
                        help="fraction of peak FLOP/s (default: from K22 Table 4's layer)")
    parser.add_argument("--memory-efficiency", type=float, default=MEMORY_EFFICIENCY)
    parser.add_argument("--also-efficiency", type=float, action="append",
                        help=f"sensitivity run at this compute efficiency (repeatable; "
                             f"default {MAMF_EFFICIENCY:.3f}, the A100 matmul ceiling)")
    parser.add_argument("--no-sensitivity", action="store_true")
    parser.add_argument("--no-scatter-gather", action="store_true",
                        help="send whole pipeline activations from one GPU (default: "
                             "Megatron's scatter/gather over the TP ranks, SC21 4.1)")
    parser.add_argument("--rows", help="comma-separated row labels (default all)")
    parser.add_argument("--row-limit-s", type=float, default=150.0)
    parser.add_argument("--budget-s", type=float, default=570.0,
                        help="total simulation time; rows after it are reported skipped")
    parser.add_argument("--earlier", type=Path,
                        help="an earlier run's .json (another simulator version) to show "
                             "beside this one")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    parser.add_argument("--output", type=Path, default=RESULTS / "fidelity")
    args = parser.parse_args()
    if args.render:
        data = json.loads(args.output.with_suffix(".json").read_text())
        if args.earlier:
            data["earlier"] = earlier_run(args.earlier)
            args.output.with_suffix(".json").write_text(json.dumps(data, indent=1))
        args.output.with_suffix(".md").write_text(render(data))
        return 0
    logging.getLogger("sim").setLevel(logging.ERROR)
    started, deadline = time.perf_counter(), time.monotonic() + args.budget_s
    runs = fd.PUBLISHED_RUNS
    if args.rows:
        wanted = set(args.rows.split(","))
        runs = tuple(r for r in runs if r.label in wanted)
    topology = load_topology(fd.SELENE.topology)
    intra = intra_layer_kwargs(scatter_gather=not args.no_scatter_gather)
    calibration = k22_layer_efficiency(topology, args.memory_efficiency, intra)
    efficiency = args.compute_efficiency or calibration["efficiency"]
    print(f"compute efficiency {efficiency:.4f} (K22 layer: {calibration})", flush=True)
    costs = CostOptions(compute_efficiency=efficiency, memory_efficiency=args.memory_efficiency)
    rows = run_all(runs, topology, costs, args.row_limit_s, deadline, intra)
    sensitivity = []
    for alt in ([] if args.no_sensitivity else args.also_efficiency or [MAMF_EFFICIENCY]):
        alt_costs = CostOptions(compute_efficiency=alt, memory_efficiency=args.memory_efficiency)
        print(f"sensitivity: compute efficiency {alt:.4f}", flush=True)
        alt_rows = run_all(runs, topology, alt_costs, args.row_limit_s, deadline, intra)
        sensitivity.append({"compute_efficiency": alt, "summary": summary(alt_rows),
                            "errors": {f"{r['source']}|{r['label']}|{r['recompute']}":
                                       r.get("error") for r in alt_rows}})
    data = {"environment": environment(), "simulator": simulator_version(),
            "command": "python " + " ".join(["benchmarks/fidelity.py", *sys.argv[1:]]),
            "constants": {"peak_tflops": fd.SELENE.peak_tflops, "hbm_tb_s": 2.039,
                          "compute_efficiency": efficiency,
                          "compute_efficiency_source": "option" if args.compute_efficiency
                          else "K22 Table 4 layer", "memory_efficiency": args.memory_efficiency,
                          "k22_layer": calibration, "mamf_efficiency": MAMF_EFFICIENCY},
            "intra_layer_options": repr(intra.get("intra", "not supported by this simulator")),
            "rows": rows, "summary": summary(rows), "sensitivity": sensitivity,
            "total_wall_s": time.perf_counter() - started}
    if args.earlier:
        data["earlier"] = earlier_run(args.earlier)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(data, indent=1))
    args.output.with_suffix(".md").write_text(render(data))
    print(f"MAE {data['summary']['mae']}, wrote {args.output}.md/.json "
          f"in {data['total_wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
