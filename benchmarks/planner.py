"""The planner (issue 20) on the published runs of the fidelity table, and a 175B-class
search on 1,024 GPUs: writes benchmarks/results/planner.md and planner.json.

1. For each run of benchmarks/fidelity_data.py (SC21 Table 1, K22 Table 5, K22's 530B at
   dp 8; on `selene-a100`, the topology benchmarks/fidelity.py uses): `clustersim plan`
   with the run's model, precision (`--dtype`: SC21's fp16), GPUs and global batch (top
   5), beside the published layout simulated as the planner simulates its candidates
   (default DDP buckets, no scatter/gather: benchmarks/fidelity.py's Megatron-2021
   settings would change both alike) and its rank among the planner's exact top 5, in the
   planner's whole space and in the authors' space (`authors_space`: what Megatron-LM
   offered then).
2. GPT-3 175B on 1,024 GPUs of selene-a100 (global batch 1536): the funnel and the time.

Each planner run has a wall-clock limit (a forked child, fidelity.run_in_child); a run
over it is reported as such, never dropped.

    python benchmarks/planner.py                      # both parts
    python benchmarks/planner.py --rows 1.7B,3.6B     # a subset (labels); the other rows
                                                      # are kept from planner.json
    python benchmarks/planner.py --only-175b          # the saved rows are kept
    python benchmarks/planner.py --only-175b --against COMMIT   # and COMMIT's search first
    python benchmarks/planner.py --only-175b --backends local,ray,dask  # the CLI on each
    python benchmarks/planner.py --render             # the .md again from the .json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fidelity_data as fd
from environment import checked_out, environment, tree_version
from fidelity import run_in_child
from clustersim.sim.planner import run_plan
from clustersim.sim.planner.report import candidate_row
from clustersim.sim.planner.space import Layout, SearchSpace
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

ROOT = Path(__file__).resolve().parents[1]
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


def _searched(run: fd.PublishedRun, space: SearchSpace | None, topology) -> dict:
    """The planner's exact top 5 for the run in `space` (None: all of it), its funnel."""
    result, commands = run_plan(run.model, run.gpus, topology, run.global_batch_size, top=5,
                                space=space, dtype=run.dtype)
    top = [{**candidate_row(c), "command": cmd, "layout": c.layout.describe()}
           for c, cmd in zip(result.candidates[:5], commands)]
    return {"funnel": {"enumerated": result.enumerated, "fit_in_memory": result.fit_in_memory,
                       "bounded_out": result.bounded_out, "simulated": result.simulated,
                       "seconds": result.seconds},
            "top": top}


def _ranked(searched: dict, published_s: float, layout: Layout) -> dict:
    """`searched` with the published layout's rank among its top 5 (None: not in it)."""
    top = searched["top"]
    faster = sum(c["iteration_time"] < published_s for c in top)
    in_top = any(c["layout"] == layout.describe() for c in top)
    return {**searched, "published_rank": faster + 1 if faster < 5 or in_top else None}


def search_key(run: fd.PublishedRun) -> tuple:
    """What the planner's whole-space search of a run depends on: rows that differ only
    in their published layout (K22 Table 5's full and selective recompute) share it."""
    return run.model, run.gpus, run.global_batch_size, run.dtype


def plan_row(run: fd.PublishedRun, whole: dict | None = None) -> dict:
    """The planner's top 5 for the run, in its whole space (`whole`: that search, already
    run for a row with the same `search_key`) and in the authors' space (authors_space),
    and the published layout simulated and ranked in each."""
    topology = load_topology(TOPOLOGY)
    layout = published_layout(run)
    seconds = simulate(fd.model_spec(run), layout.parallel(run.global_batch_size),
                       topology).iteration_time
    whole = whole or _searched(run, None, topology)
    authors = _searched(run, authors_space(run), topology)
    return {**_ranked(whole, seconds, layout), "authors": _ranked(authors, seconds, layout),
            "published_layout": layout.describe(), "published_simulated_s": seconds}


def part_one(runs, limit_s: float, saved: list[dict] | None = None) -> list[dict]:
    """One row per published run: planned for the runs in `runs`, the others taken from
    `saved` (the rows of an earlier planner.json, in fd.PUBLISHED_RUNS order), each with
    the date and tree it was measured on."""
    rows, stamp, searches = [], _stamp(), {}
    for index, run in enumerate(fd.PUBLISHED_RUNS):
        if run not in runs:
            if saved and len(saved) == len(fd.PUBLISHED_RUNS) and \
                    (saved[index]["source"], saved[index]["label"]) == (run.source, run.label):
                rows.append(saved[index])
            continue
        whole = searches.get(search_key(run))
        kind, value, wall = run_in_child(plan_row, (run, whole), limit_s)
        row = {"source": run.source, "label": run.label, "model": run.model, "gpus": run.gpus,
               "global_batch_size": run.global_batch_size, "status": kind, "wall_s": wall,
               "published_iteration_s": fd.implied_iteration_time_s(run), **stamp,
               "shared_search": whole is not None}
        row.update(value if kind == "ok" else {"reason": value})
        if kind == "ok":
            searches[search_key(run)] = {k: value[k] for k in ("funnel", "top")}
        rows.append(row)
        print(run.source, run.label, kind, f"{wall:.0f} s", flush=True)
    return rows


def _stamp() -> dict:
    """When and on which tree a row is measured."""
    return {"measured": environment()["date"], "tree": tree_version(ROOT)}


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


def against(commit: str, limit_s: float) -> dict:
    """The 175B search of `commit`, by its own benchmarks/planner.py in a git worktree
    (`--only-175b`), run just before this tree's part_two: {commit, old, new}."""
    with checked_out(ROOT, commit) as (full, tree, package), \
            tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, str(tree / "benchmarks" / "planner.py"),
                        "--only-175b", "--row-limit-s", str(limit_s), "--output",
                        str(Path(out) / "old")], check=True,
                       env={**os.environ, "PYTHONPATH": str(package)})
        old = json.loads((Path(out) / "old.json").read_text())["search_175b"]
    return {"commit": full, "old": old, "new": part_two(limit_s)}


def _side_by_side(pair: dict) -> list[str]:
    """The lines of `against`'s result."""
    old, new = pair["old"], pair["new"]
    if "ok" != old["status"] or "ok" != new["status"]:
        return [f"- side by side with {pair['commit'][:7]}: {old['status']} / {new['status']}"]
    same = all(old[k] == new[k] for k in ("best", "best_s", "enumerated", "fit_in_memory",
                                          "simulated"))
    return [f"- side by side, one run (`--against {pair['commit'][:7]}`): "
            f"{pair['commit'][:7]} {old['wall_s']:.0f} s (screening "
            f"{old['seconds']['screen']:.0f} s), this tree {new['wall_s']:.0f} s (screening "
            f"{new['seconds']['screen']:.0f} s): {old['wall_s'] / new['wall_s']:.2f}x; "
            f"the same funnel and winner at the same time: {'yes' if same else 'NO'}"]


SEARCH_175B = ("plan", "--model", "gpt3-175b", "--gpus", "1024", "--topology", TOPOLOGY,
               "--global-batch-size", "1536", "--top", "1")


def on_backends(backends: list[str], limit_s: float) -> list[dict]:
    """The 175B search through the CLI (`clustersim plan ... --backend B`, a fresh
    process each, every core) on each backend: a local Ray or Dask cluster is started by
    the CLI itself (sim.backends). {backend, status, wall_s, winner, time, funnel}."""
    rows, stamp = [], _stamp()
    for backend in backends:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            began = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-m", "clustersim", *SEARCH_175B,
                                       "--backend", backend, "--json", str(out)],
                                      capture_output=True, text=True, timeout=limit_s,
                                      env={**os.environ, "RAY_ADDRESS": "",
                                           "DASK_SCHEDULER_ADDRESS": ""})
            except subprocess.TimeoutExpired:
                rows.append({"backend": backend, "status": "skipped", **stamp,
                             "wall_s": time.perf_counter() - began})
                continue
            wall = time.perf_counter() - began
            if proc.returncode:
                rows.append({"backend": backend, "status": "error", "wall_s": wall, **stamp,
                             "reason": proc.stderr.strip().splitlines()[-1:]})
                continue
            found = json.loads(out.read_text())
        best = found["candidates"][0]
        rows.append({"backend": backend, "status": "ok", "wall_s": wall, **stamp,
                     "winner": best["command"], "time": best["iteration_time"],
                     "funnel": {k: found[k] for k in ("enumerated", "fit_in_memory",
                                                      "bounded_out", "simulated")}})
        print("175B on", backend, f"{wall:.0f} s", flush=True)
    return rows


def _backends_table(rows: list[dict]) -> list[str]:
    lines = ["", "### The same search on each backend (`clustersim plan ... --backend B`)", "",
             "| backend | wall (s) | winner | its time (s) | enumerated / fit / bounded out / "
             "simulated | measured |", "|---|---:|---|---:|---|---|"]
    for r in rows:
        measured = f"{r['measured']} {r['tree']}"
        if r["status"] != "ok":
            lines.append(f"| {r['backend']} | {r['wall_s']:.0f} | {r['status']}: "
                         f"{r.get('reason', 'past the limit')} | | | {measured} |")
            continue
        f = r["funnel"]
        lines.append(f"| {r['backend']} | {r['wall_s']:.0f} | `{r['winner']}` | "
                     f"{r['time']!r} | {f['enumerated']:,} / {f['fit_in_memory']:,} / "
                     f"{f['bounded_out']:,} / {f['simulated']:,} | {measured} |")
    done = [r for r in rows if r["status"] == "ok"]
    if len(done) > 1:
        same = len({(r["winner"], r["time"]) for r in done}) == 1
        lines += ["", f"Identical winner and time on {', '.join(r['backend'] for r in done)}: "
                  f"{'yes' if same else 'NO'}."]
    return lines


def render(data: dict) -> str:
    env = "\n".join(f"- {k}: {v}" for k, v in data["environment"].items())
    lines = ["# Planner (issue 20): published layouts and a 175B search", "", env, "",
             f"Produced by `{data['command']}` (method: its docstring); a row or search "
             "not run by that command is kept from the file before, with the date (and "
             "tree) it was measured on.", "",
             "## Published runs (selene-a100)", "",
             "Whole space: every layout the planner searches. Authors' space: what the "
             "run's authors chose from (benchmarks/planner.py `authors_space`: 1F1B and "
             "interleaved 1F1B, no ZeRO, the run's recompute and sequence parallelism).", "",
             "| source | model | GPUs | batch | planner best | its time (s) | published "
             "layout | its simulated time (s) | rank in planner top 5 | best in the authors' "
             "space | its time (s) | rank there | funnel (enum / fit / bounded out / "
             "simulated) | wall (s) | measured |",
             "|---|---|---:|---:|---|---:|---|---:|---:|---|---:|---:|---|---:|---|"]
    for r in data["rows"]:
        measured = " ".join(filter(None, (r.get("measured"), r.get("tree"))))
        wall = f"{r['wall_s']:.0f}" + (" (whole-space search shared with the row above)"
                                       if r.get("shared_search") else "")
        if r["status"] != "ok":
            lines.append(f"| {r['source']} | {r['label']} | {r['gpus']} | "
                         f"{r['global_batch_size']} | {r['status']}: {r['reason']} | | | | | "
                         f"| | | | {wall} | {measured} |")
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
                     f"{f['simulated']:,} | {wall} | {measured} |")
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
        if s.get("measured"):
            lines.append(f"Measured {s['measured']} (not re-run with the rows above).\n")
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
            if data.get("against"):
                lines += _side_by_side(data["against"])
            if data.get("backends"):
                lines += _backends_table(data["backends"])
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
    parser.add_argument("--against", metavar="COMMIT",
                        help="run the 175B search of COMMIT first, then this tree's, and "
                             "report both (the search of this tree is then that run's)")
    parser.add_argument("--backends", metavar="LIST",
                        help="also run the 175B search through the CLI on each backend "
                             "(e.g. local,ray,dask) and check that they agree")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the .md from the saved .json")
    args = parser.parse_args()
    if args.skip_175b and (args.against or args.backends or args.only_175b):
        parser.error("--against, --backends and --only-175b run the 175B search, which "
                     "--skip-175b leaves out: give one or the other")
    if args.rows and args.only_175b:
        parser.error("--rows picks published rows, which --only-175b leaves out")
    if args.render and (args.rows or args.only_175b or args.skip_175b or args.against
                        or args.backends):
        parser.error("--render only rewrites the page from the saved JSON: it runs nothing")
    if args.render:
        data = json.loads(args.output.with_suffix(".json").read_text())
        args.output.with_suffix(".md").write_text(render(data))
        return 0
    logging.getLogger("clustersim").setLevel(logging.ERROR)
    runs = fd.PUBLISHED_RUNS
    if args.rows:
        runs = tuple(r for r in runs if r.label in set(args.rows.split(",")))
    raw = args.output.with_suffix(".json")
    saved = json.loads(raw.read_text()) if raw.exists() else {}
    for row in saved.get("rows", ()):  # rows from before per-row stamps: the file's date
        row.setdefault("measured", saved["environment"]["date"])
    data = {"environment": environment(),
            "command": "python " + " ".join(["benchmarks/planner.py", *sys.argv[1:]]),
            "rows": saved.get("rows", []) if args.only_175b  # kept, with their dates
            else part_one(runs, args.row_limit_s, saved.get("rows"))}
    if args.against and not args.skip_175b:
        data["against"] = against(args.against, args.row_limit_s)
        data["search_175b"] = data["against"]["new"]
    elif not args.skip_175b:
        data["search_175b"] = part_two(args.row_limit_s)
    if args.backends and not args.skip_175b:
        data["backends"] = on_backends(args.backends.split(","), args.row_limit_s)
    elif "backends" in saved:
        data["backends"] = saved["backends"]
    if args.skip_175b and "search_175b" in saved:  # not run: the saved search, its date
        data["search_175b"] = {"measured": saved["environment"]["date"],
                               **saved["search_175b"]}
        if "against" in saved:
            data["against"] = saved["against"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(data, indent=1))
    args.output.with_suffix(".md").write_text(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
