"""Fidelity: clustersim's predictions against published large-scale training runs.

Simulates every run of benchmarks/fidelity_data.py (SC21 Table 1 on Selene; K22 Table 5
with full recompute and with sequence parallelism + selective recompute; K22's 530B at
8-way data parallelism) on the `selene-a100` preset with the row's TP/PP/DP, global and
micro-batch, interleaving and recompute, and compares throughput (TFLOP/s per GPU by the
paper's FLOP formula applied to the simulated iteration time) and iteration time (where
published). Writes benchmarks/results/fidelity.md and fidelity.json.

Cost-model constants (never fitted to the table; the results page says where each comes
from): peak 312 TFLOP/s and HBM 2.039 TB/s from the A100 80GB datasheet (topologies
device registry). The simulator charges every kernel of a layer its own roofline
(schedules.layer_kernels); its two efficiencies are the measured A100 ceilings (max
achievable bf16 matmul 85.9%, HBM read 88%) times ONE attainment factor, the one at which
the simulated 22B layer takes K22 Table 4's measured 19.6 ms (`k22_layer_attainment`);
the other Table 4 experiments (SP, recompute; forward and backward apart) check it
(`k22_table_4`). Override with --compute-efficiency and --memory-efficiency;
--also-attainment adds sensitivity runs.

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
from dataclasses import replace
from pathlib import Path

import fidelity_data as fd
from environment import environment
from fidelity_report import render, simulator_version
from run_cli import command
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.cost import ATTAINMENT, compute_fraction, memory_fraction
from clustersim.sim.cost_model import RooflineCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology

RESULTS = Path(__file__).parent / "results"

# The A100's measured ceilings, from the device registry (topologies.devices: sources).
A100 = get_device("a100-80gb-sxm")
MAMF_EFFICIENCY = A100.matmul_ceiling_of("bf16")  # max achievable bf16 matmul / peak
MEMORY_EFFICIENCY = A100.hbm_ceiling  # best measured HBM read bandwidth / datasheet
K22_LAYER_SECONDS = 19.6e-3  # K22 Table 4: 22B layer, t=8, b=4, fwd+bwd, no recompute

# run_table_1.sh's DDP= per SC21 row: 'torch' (PyTorch DDP: 25 MiB buckets reduced during
# the backward) for the four smallest, 'local' (Megatron's contiguous-buffer DDP: one
# all-reduce per model chunk after the backward) for the rest. K22 (section 6.3): the
# gradient all-reduce is not overlapped with the backward; we model Megatron's local DDP.
SC21_TORCH_DDP = {"1.7B", "3.6B", "7.5B", "18.4B"}
WHOLE_BUFFER_BUCKET = 1 << 40  # one bucket holds a whole model chunk's gradients


def intra_layer_kwargs(scatter_gather: bool = True) -> dict:
    """The ParallelConfig field overrides (applied with dataclasses.replace, see
    `with_intra`) for Megatron-LM of 2021/22: TP collectives between the GEMMs (no
    --tp-comm-overlap, which came later) and pipeline transfers scattered over the TP
    ranks and all-gathered (SC21 section 4.1; Megatron's default
    scatter_gather_tensors_in_pipeline, used when tp > 1 without SP)."""
    return {"tp_comm_overlap": False, "scatter_gather": scatter_gather}


def with_intra(parallel: ParallelConfig, intra: dict | None = None) -> ParallelConfig:
    """`parallel` with the intra-layer overrides of `intra_layer_kwargs` (None: as is),
    each where it applies: TP options with tp > 1, the scatter/gather without sequence
    parallelism (as Megatron uses it)."""
    tp_options = parallel.tp > 1
    applies = {"tp_comm_overlap": tp_options,
               "scatter_gather": tp_options and not parallel.sequence_parallel}
    return replace(parallel, **{k: v for k, v in (intra or {}).items() if applies.get(k, True)})


def ddp_impl(run: fd.PublishedRun) -> str:
    return "torch" if run.source.startswith("SC21") and run.label in SC21_TORCH_DDP else "local"


def parallel_config(run: fd.PublishedRun) -> ParallelConfig:
    """The row's layout as a ParallelConfig (Megatron semantics, default rank order)."""
    local_ddp = ddp_impl(run) == "local" and run.dp > 1  # (dp 1 reduces no gradient)
    return ParallelConfig(
        pp=run.pp, vpp=run.virtual_stages, dp=run.dp, tp=run.tp,
        sequence_parallel=run.sequence_parallel, global_batch_size=run.global_batch_size,
        micro_batch_size=run.micro_batch_size, recompute=run.recompute,
        schedule="interleaved-1f1b" if run.virtual_stages > 1 else "1f1b",
        overlap_grad_reduce=not local_ddp, bucket_bytes=WHOLE_BUFFER_BUCKET if local_ddp else None)


def cli_command(run: fd.PublishedRun, costs: RooflineCostModel,
                intra: dict | None = None) -> str:
    """The `clustersim simulate` command that simulates the same row."""
    p = with_intra(parallel_config(run), intra)
    args = ["simulate", "--model", run.model, "--topology", run.cluster.topology,
            "--schedule", p.schedule, "--tp", str(p.tp), "--pp", str(p.pp), "--dp", str(p.dp),
            "--global-batch-size", str(p.global_batch_size),
            "--micro-batch-size", str(p.micro_batch_size), "--recompute", p.recompute]
    if p.vpp > 1:
        args += ["--vpp", str(p.vpp)]
    if run.dtype != "bf16":
        args += ["--dtype", run.dtype]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if not p.overlap_grad_reduce:
        args += ["--no-overlap-grad-reduce", "--bucket-mb", str(WHOLE_BUFFER_BUCKET >> 20)]
    if p.scatter_gather and p.tp > 1 and not p.sequence_parallel:
        args.append("--scatter-gather-tensors-in-pipeline")
    if costs.compute_efficiency is not None or costs.attainment != ATTAINMENT:
        compute, memory = a100_fractions(costs)  # the CLI has no attainment flag
        args += ["--compute-efficiency", f"{compute:.4f}", "--memory-efficiency",
                 f"{memory:.4f}"]
    return command(*args)


def a100_fractions(costs: RooflineCostModel) -> tuple[float, float]:
    """(compute, memory) fractions of the A100's bf16 peak and HBM bandwidth that `costs`
    charges (sim.cost: the ceilings x attainment, or the explicit efficiencies)."""
    return (compute_fraction(A100, "bf16", costs.compute_efficiency, costs.attainment),
            memory_fraction(A100, costs.memory_efficiency, costs.attainment))


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


def simulate_row(run: fd.PublishedRun, topology, costs: RooflineCostModel,
                 intra: dict | None = None) -> dict:
    """Simulate one published run; the measured and derived numbers of its table row.
    `intra`: ParallelConfig overrides of intra_layer_kwargs (or None)."""
    started = time.perf_counter()
    timeline = simulate(fd.model_spec(run), with_intra(parallel_config(run), intra), topology,
                        costs=costs)
    wall = time.perf_counter() - started
    seconds = timeline.iteration_time
    flops, formula = paper_flops(run)
    peaks = timeline.peak_memory()
    return {"iteration_time_s": seconds, "tflops_per_gpu": tflops_per_gpu(flops, seconds, run.gpus),
            "bubble_fraction": timeline.bubble_fraction,
            "compute_idle_fraction": timeline.bubble_fraction + timeline.exposed_comm_fraction,
            "formula": formula,
            "peak_memory_gb": max(peaks.values(), default=0) / 1e9,
            "oom_ranks": timeline.meta.get("oom_ranks", []),
            "comm": comm_groups(timeline), "breakdown": breakdown(timeline),
            "spans": len(timeline.spans), "wall_s": wall}


def _child(conn, work, args, refused) -> None:
    logging.getLogger("sim").setLevel(logging.ERROR)
    try:
        conn.send(("ok", work(*args)))
    except refused as err:  # the simulator refuses the layout
        conn.send(("refused", f"{type(err).__name__}: {err}"))
    except Exception as err:  # reported on the row, the benchmark goes on
        conn.send(("error", f"{type(err).__name__}: {err}"))
    conn.close()


def run_in_child(work, args: tuple, limit_s: float,
                 refused: tuple[type[Exception], ...] = ()) -> tuple[str, object, float]:
    """`work(*args)` in a forked child, killed after `limit_s`: (kind, value, seconds),
    kind 'ok' (value: what it returned), 'refused' (it raised one of `refused`), 'error'
    (any other exception, or the child died) or 'skipped' (still running at the limit);
    value otherwise the reason."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    started = time.perf_counter()
    proc = ctx.Process(target=_child, args=(child, work, args, refused), daemon=True)
    proc.start()
    child.close()
    ready = parent.poll(limit_s)
    if not ready:
        proc.kill()
        proc.join()
        return ("skipped", f"simulation still running after the {limit_s:.0f} s row limit "
                f"(killed)", time.perf_counter() - started)
    try:
        kind, value = parent.recv()
    except EOFError:
        kind, value = "error", f"the simulation process died (exit code {proc.exitcode})"
    proc.join()
    return kind, value, time.perf_counter() - started


def run_with_limit(run: fd.PublishedRun, topology, costs: RooflineCostModel, limit_s: float,
                   intra: dict | None = None) -> dict:
    """simulate_row in a forked child, killed after `limit_s`: {'status', ...}."""
    kind, value, elapsed = run_in_child(simulate_row, (run, topology, costs, intra), limit_s)
    if kind == "ok":
        return {"status": "ok", **value, "elapsed_s": elapsed}
    return {"status": kind, "reason": value, "wall_s": elapsed}


def layer_window(topology, layers: int, costs: RooflineCostModel, intra: dict | None = None,
                 sequence_parallel: bool = False, recompute: str = "none") -> tuple[float, float]:
    """(forward, backward) seconds of `layers` 22B layers as K22 Table 4 ran them (t=8,
    micro-batch 4, one micro-batch, no pipeline): forward from the first F to the first B
    (its TP collectives included), backward from there to the end of the last op that is
    neither an optimizer step nor a DP collective."""
    model = get_model("k22-22b", num_layers=layers, micro_batch_size=4)
    parallel = ParallelConfig(tp=8, micro_batch_size=4, num_microbatches=1,
                              sequence_parallel=sequence_parallel, recompute=recompute)
    timeline = simulate(model, with_intra(parallel, intra), topology, costs=costs)
    spans = [s for s in timeline.spans if s.rank == 0 and s.op.kind is not OpKind.OPT_STEP
             and not (s.op.group or "").startswith("dp")]
    start = min(s.start for s in spans)
    backward = min(s.start for s in spans if s.op.kind is OpKind.B)
    return backward - start, max(s.end for s in spans) - backward


def one_layer(topology, costs: RooflineCostModel, intra: dict | None = None,
              **config) -> tuple[float, float]:
    """(forward, backward) seconds of ONE layer: 2 layers minus 1 layer, so embedding,
    logits and optimizer cancel. `config`: sequence_parallel, recompute."""
    two = layer_window(topology, 2, costs, intra, **config)
    one = layer_window(topology, 1, costs, intra, **config)
    return two[0] - one[0], two[1] - one[1]


def ceiling_costs(attainment: float) -> RooflineCostModel:
    """The default roofline (each device's measured ceilings) at another attainment
    factor, rounded to 4 decimals as sim.cost.ATTAINMENT is."""
    return RooflineCostModel(attainment=round(attainment, 4))


def k22_layer_attainment(topology, intra: dict | None = None) -> dict:
    """The attainment factor at which the simulated 22B layer (K22 Table 4 baseline,
    forward + backward) takes the measured 19.6 ms: bisection (time falls as it rises).
    One published micro-measurement, not the benchmark's rows."""
    def layer(a: float) -> float:
        return sum(one_layer(topology, RooflineCostModel(attainment=a), intra))

    at_ceilings = layer(1.0)
    if at_ceilings >= K22_LAYER_SECONDS:
        raise SystemExit(f"even at the measured ceilings the simulated 22B layer takes "
                         f"{at_ceilings * 1e3:.2f} ms > {K22_LAYER_SECONDS * 1e3} ms")
    low, high = 0.05, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if layer(mid) > K22_LAYER_SECONDS else (low, mid)
    attainment = (low + high) / 2
    compute, memory = a100_fractions(ceiling_costs(attainment))
    return {"attainment": attainment, "compute_efficiency": compute,
            "memory_efficiency": memory,
            "layer_ms_at_ceilings": at_ceilings * 1e3, "layer_ms": layer(attainment) * 1e3}


def k22_table_4(topology, costs: RooflineCostModel, intra: dict | None = None) -> list[dict]:
    """Every K22 Table 4 experiment (one 22B layer) simulated: forward and backward ms
    against the published ones. Only the baseline's sum chose the attainment."""
    config = {"baseline, no recompute": (False, "none"),
              "sequence parallelism": (True, "none"),
              "baseline with full recompute": (False, "full"),
              "selective recompute": (False, "selective"),
              "selective recompute + sequence parallelism": (True, "selective")}
    rows = []
    for name, forward_ms, backward_ms, combined_ms, _ in fd.K22_TABLE_4_LAYER_MS:
        sp, recompute = config[name]
        forward, backward = one_layer(topology, costs, intra, sequence_parallel=sp,
                                      recompute=recompute)
        rows.append({"experiment": name, "published_ms": [forward_ms, backward_ms, combined_ms],
                     "predicted_ms": [forward * 1e3, backward * 1e3, (forward + backward) * 1e3]})
    return rows


def run_all(runs, topology, costs: RooflineCostModel, row_limit: float, deadline: float,
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
            "memory_efficiency": old["constants"]["memory_efficiency"],
            "environment_date": old["environment"]["date"], "summary": old["summary"],
            "rows": {f"{r['source']}|{r['label']}|{r['recompute']}":
                     {"error": r.get("error"), "tflops_per_gpu": r.get("tflops_per_gpu"),
                      "wall_s": r["wall_s"], "comm": r.get("comm", [])}
                     for r in old["rows"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-efficiency", type=float,
                        help="fraction of peak FLOP/s for every kernel (with "
                             "--memory-efficiency; default: the ceilings x the K22 attainment)")
    parser.add_argument("--memory-efficiency", type=float)
    parser.add_argument("--also-attainment", type=float, action="append",
                        help="sensitivity run with the ceilings x this factor (repeatable; "
                             "default 1.0, the measured ceilings themselves)")
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
    calibration = k22_layer_attainment(topology, intra)
    if (args.compute_efficiency is None) != (args.memory_efficiency is None):
        parser.error("give both --compute-efficiency and --memory-efficiency, or neither")
    costs = (RooflineCostModel(args.compute_efficiency, args.memory_efficiency)
             if args.compute_efficiency else RooflineCostModel())  # the default model
    compute, memory = a100_fractions(costs)
    print(f"A100 efficiencies {compute:.4f} / {memory:.4f}; attainment constant "
          f"{ATTAINMENT} (K22 layer bisection: {calibration})", flush=True)
    table_4 = k22_table_4(topology, costs, intra)
    rows = run_all(runs, topology, costs, args.row_limit_s, deadline, intra)
    sensitivity = []
    for alt in ([] if args.no_sensitivity else args.also_attainment or [1.0]):
        alt_costs = ceiling_costs(alt)
        print(f"sensitivity: attainment {alt:.4f}", flush=True)
        alt_rows = run_all(runs, topology, alt_costs, args.row_limit_s, deadline, intra)
        alt_compute, alt_memory = a100_fractions(alt_costs)
        sensitivity.append({"attainment": alt, "compute_efficiency": alt_compute,
                            "memory_efficiency": alt_memory,
                            "summary": summary(alt_rows),
                            "errors": {f"{r['source']}|{r['label']}|{r['recompute']}":
                                       r.get("error") for r in alt_rows}})
    data = {"environment": environment(), "simulator": simulator_version(),
            "command": "python " + " ".join(["benchmarks/fidelity.py", *sys.argv[1:]]),
            "constants": {"peak_tflops": fd.SELENE.peak_tflops, "hbm_tb_s": 2.039,
                          "compute_efficiency": compute, "memory_efficiency": memory,
                          "efficiency_source": "option" if args.compute_efficiency
                          else "the default model: device ceilings x sim.cost.ATTAINMENT",
                          "attainment_constant": ATTAINMENT,
                          "k22_layer": calibration, "mamf_efficiency": MAMF_EFFICIENCY,
                          "mamf_source": A100.matmul_ceiling_source,
                          "memory_ceiling": MEMORY_EFFICIENCY},
            "k22_table_4": table_4,
            "intra_layer_options": repr(intra),
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
