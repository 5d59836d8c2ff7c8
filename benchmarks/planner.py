"""The planner (issue 20) on the published runs of the fidelity table, and a 175B-class
search on 1,024 GPUs: writes benchmarks/results/planner.md and planner.json.

1. For each run of benchmarks/fidelity_data.py (SC21 Table 1, K22 Table 5, K22's 530B at
   dp 8; on `selene-a100`, the topology benchmarks/fidelity.py uses): `clustersim plan`
   with the run's model, GPUs and global batch (top 5), beside the published layout
   simulated as the planner simulates its candidates (default DDP buckets, no
   scatter/gather: benchmarks/fidelity.py's Megatron-2021 settings would change both
   alike) and its rank among the planner's exact top 5, in the planner's whole space and
   in the authors' space (`authors_space`: what Megatron-LM offered then).
2. GPT-3 175B on 1,024 GPUs of selene-a100 (global batch 1536): the funnel and the time.

Each planner run has a wall-clock limit (a forked child, fidelity.run_in_child); a run
over it is reported as such, never dropped.

    python benchmarks/planner.py                      # both parts
    python benchmarks/planner.py --rows 1.7B,3.6B     # a subset (labels)
    python benchmarks/planner.py --only-175b
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import fidelity_data as fd
from environment import environment
from fidelity import run_in_child
from clustersim.schedules.model_presets import get_model
from clustersim.sim.planner import run_plan
from clustersim.sim.planner.report import candidate_row
from clustersim.sim.planner.space import Layout, SearchSpace
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

RESULTS = Path(__file__).parent / "results"
TOPOLOGY = fd.SELENE.topology


def published_layout(run: fd.PublishedRun) -> Layout:
    """The run's layout in the planner's terms (ZeRO 0: Megatron's DDP of 2021/22)."""
    schedule = "interleaved-1f1b" if run.virtual_stages > 1 else "1f1b"
    return Layout(run.tp, run.pp, run.dp, 1, 1, run.virtual_stages, run.micro_batch_size,
                  0, run.recompute, schedule, run.sequence_parallel)


def authors_space(run: fd.PublishedRun) -> SearchSpace:
    """What the run's authors chose from: Megatron-LM's schedules of the time (1F1B,
    interleaved 1F1B), data parallelism without ZeRO, the run's recompute and sequence
    parallelism; micro-batch sizes 1..16 and the published one."""
    return SearchSpace(micro_batch_size=tuple(sorted({1, 2, 4, 8, 16, run.micro_batch_size})),
                       zero=(0,), recompute=(run.recompute,),
                       schedules=("1f1b", "interleaved-1f1b"),
                       sequence_parallel=(run.sequence_parallel,),
                       max_vpp=max(4, run.virtual_stages))


def _ranked(run: fd.PublishedRun, space: SearchSpace | None, published_s: float,
            layout: Layout, topology) -> dict:
    """The planner's exact top 5 in `space` (None: all of it) and the published layout's
    rank among them (None: not in the top 5)."""
    result, commands = run_plan(run.model, run.gpus, topology, run.global_batch_size, top=5,
                                space=space)
    top = [{**candidate_row(c), "command": cmd, "layout": c.layout.describe()}
           for c, cmd in zip(result.candidates[:5], commands)]
    faster = sum(c["iteration_time"] < published_s for c in top)
    in_top = any(c["layout"] == layout.describe() for c in top)
    return {"funnel": {"enumerated": result.enumerated, "fit_in_memory": result.fit_in_memory,
                       "bounded_out": result.bounded_out, "simulated": result.simulated,
                       "seconds": result.seconds},
            "top": top, "published_rank": faster + 1 if faster < 5 or in_top else None}


def plan_row(run: fd.PublishedRun) -> dict:
    """The planner's top 5 for the run, in its whole space and in the authors' space
    (authors_space), and the published layout simulated and ranked in each."""
    topology = load_topology(TOPOLOGY)
    layout = published_layout(run)
    model = get_model(run.model, micro_batch_size=run.micro_batch_size)
    seconds = simulate(model, layout.parallel(run.global_batch_size), topology).iteration_time
    return {**_ranked(run, None, seconds, layout, topology),
            "authors": _ranked(run, authors_space(run), seconds, layout, topology),
            "published_layout": layout.describe(), "published_simulated_s": seconds}


def part_one(runs, limit_s: float) -> list[dict]:
    rows = []
    for run in runs:
        kind, value, wall = run_in_child(plan_row, (run,), limit_s)
        row = {"source": run.source, "label": run.label, "model": run.model, "gpus": run.gpus,
               "global_batch_size": run.global_batch_size, "status": kind, "wall_s": wall,
               "published_iteration_s": fd.implied_iteration_time_s(run)}
        row.update(value if kind == "ok" else {"reason": value})
        rows.append(row)
        print(run.source, run.label, kind, f"{wall:.0f} s", flush=True)
    return rows


def part_two(limit_s: float) -> dict:
    def search() -> dict:
        started = time.perf_counter()
        result, commands = run_plan("gpt3-175b", 1024, TOPOLOGY, 1536, top=1)
        best = result.candidates[0]
        return {"enumerated": result.enumerated, "rejected": dict(result.rejected),
                "fit_in_memory": result.fit_in_memory, "bounded_out": result.bounded_out,
                "simulated": result.simulated, "path_bounds": result.path_bounds,
                "lowered_bounds": result.lowered_bounds, "seconds": result.seconds,
                "wall_s": time.perf_counter() - started, "best": best.layout.describe(),
                "best_s": best.result["iteration_time"], "command": commands[0]}

    kind, value, wall = run_in_child(search, (), limit_s)
    return {"status": kind, "wall_s": wall, **(value if kind == "ok" else {"reason": value})}


def render(data: dict) -> str:
    env = "\n".join(f"- {k}: {v}" for k, v in data["environment"].items())
    lines = ["# Planner (issue 20): published layouts and a 175B search", "", env, "",
             "## Published runs (selene-a100)", "",
             "Whole space: every layout the planner searches. Authors' space: what the "
             "run's authors chose from (benchmarks/planner.py `authors_space`: 1F1B and "
             "interleaved 1F1B, no ZeRO, the run's recompute and sequence parallelism).", "",
             "| source | model | GPUs | batch | planner best | its time (s) | published "
             "layout | its simulated time (s) | rank in planner top 5 | best in the authors' "
             "space | its time (s) | rank there | funnel (enum / fit / bounded out / "
             "simulated) | wall (s) |",
             "|---|---|---:|---:|---|---:|---|---:|---:|---|---:|---:|---|---:|"]
    for r in data["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['source']} | {r['label']} | {r['gpus']} | "
                         f"{r['global_batch_size']} | {r['status']}: {r['reason']} | | | | | "
                         f"| | | | {r['wall_s']:.0f} |")
            continue
        best, f = r["top"][0], r["funnel"]
        rank = r["published_rank"] or "> 5"
        authors = r.get("authors") or {"top": [{"layout": "", "iteration_time": float("nan")}],
                                       "published_rank": None}
        own = authors["top"][0] if authors["top"] else {"layout": "none fits",
                                                         "iteration_time": float("nan")}
        lines.append(f"| {r['source']} | {r['label']} | {r['gpus']} | {r['global_batch_size']}"
                     f" | {best['layout']} | {best['iteration_time']:.3f} | "
                     f"{r['published_layout']} | {r['published_simulated_s']:.3f} | {rank} | "
                     f"{own['layout']} | {own['iteration_time']:.3f} | "
                     f"{authors['published_rank'] or '> 5'} | "
                     f"{f['enumerated']:,} / {f['fit_in_memory']:,} / {f['bounded_out']:,} / "
                     f"{f['simulated']:,} | {r['wall_s']:.0f} |")
    done = [r for r in data["rows"] if r["status"] == "ok"]
    if done:
        faster = sum(r["top"][0]["iteration_time"] <= r["published_simulated_s"] for r in done)
        whole = sum(r["published_rank"] is not None for r in done)
        authors = sum((r.get("authors") or {}).get("published_rank") is not None for r in done)
        lines += ["", f"Of {len(done)} rows searched within the limit (of "
                  f"{len(data['rows'])}): the planner's best is at least as fast as the "
                  f"published layout in {faster}; the published layout is in the planner's top "
                  f"5 in {whole} (whole space) and {authors} (authors' space)."]
    s = data.get("search_175b")
    if s:
        lines += ["", "## GPT-3 175B on 1,024 GPUs of selene-a100, global batch 1536", ""]
        if s["status"] == "ok":
            secs = s["seconds"]
            lines += [f"- enumerated {s['enumerated']:,}; fit in memory {s['fit_in_memory']:,};"
                      f" bounded out {s['bounded_out']:,}; simulated {s['simulated']:,} "
                      f"({100 * s['simulated'] / s['enumerated']:.2f}% of enumerated); "
                      f"wall {s['wall_s']:.0f} s (screening {secs['screen']:.0f} s, branch "
                      f"and bound {secs['branch_and_bound']:.0f} s)",
                      f"- bounds refined: {s['path_bounds']:,} compute-only critical paths, "
                      f"{s['lowered_bounds']:,} contract walks of the lowered schedule",
                      "- rejected by reason: " + "; ".join(
                          f"{n:,} {why}" for why, n in s["rejected"].items()),
                      f"- best: {s['best']} at {s['best_s']:.3f} s: `{s['command']}`"]
        else:
            lines.append(f"- {s['status']} after {s['wall_s']:.0f} s: {s['reason']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="comma-separated labels of part 1 (default all)")
    parser.add_argument("--row-limit-s", type=float, default=600.0)
    parser.add_argument("--only-175b", action="store_true")
    parser.add_argument("--skip-175b", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS / "planner")
    args = parser.parse_args()
    logging.getLogger("clustersim").setLevel(logging.ERROR)
    runs = fd.PUBLISHED_RUNS
    if args.rows:
        runs = tuple(r for r in runs if r.label in set(args.rows.split(",")))
    data = {"environment": environment(),
            "command": "python " + " ".join(["benchmarks/planner.py", *sys.argv[1:]]),
            "rows": [] if args.only_175b else part_one(runs, args.row_limit_s)}
    if not args.skip_175b:
        data["search_175b"] = part_two(args.row_limit_s)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(data, indent=1))
    args.output.with_suffix(".md").write_text(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
