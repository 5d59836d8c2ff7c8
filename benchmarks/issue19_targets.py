"""Issue 19's speed targets, each measured here in one run of this script, against its goal:
the workloads of benchmarks/engine_speed.py and collective_speed.py that name a target,
the Llama-3 405B iteration on 16,384 GPUs, the full replay of the README's 175B job, and
the 1,024-GPU all-reduce that ASTRA-sim's analytical backend takes 19-20 s for (the
figure issue 19 gives for this kind of machine; ASTRA-sim is not installable from the
package registries this machine reaches, so it is cited, not re-run).

Method: each workload is one fresh `python -m clustersim` process of this tree, run from
a temporary folder; wall = seconds around the process (interpreter start and imports
included), CPU = its user + system seconds, peak RSS = its ru_maxrss (MB = 2^20 bytes);
the 1-minute load average is read before each run (2 cores: above 2, other work shared
them). Every simulated answer is printed next to its time. The old commit of the 3x goal
(f07ec0a) is timed side by side in benchmarks/engine_speed.py, not here.

    python benchmarks/issue19_targets.py [--repeat N] [--skip pp512,...]
    python benchmarks/issue19_targets.py --against COMMIT [--rounds N] [--skip ...]

Writes benchmarks/results/issue19_targets.json and .md: each workload's best (least wall)
of `--repeat` runs (default 1), with every wall and when and on which tree it was
measured; a skipped workload keeps the row the file already holds, with its own date and
tree (this machine's speed drifts by half over an hour, so a slow phase can be re-measured
without re-running the long rows). With --against, each workload runs
on this tree and then on a git worktree of COMMIT (a temporary one), one after the other,
N rounds in turn (default 1), and the speed-ups of the best (least) wall of each side and
whether the answers are equal go to issue19_speedups_COMMIT.json and .md (COMMIT's first
seven hex digits), where a skipped workload likewise keeps its saved pair.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from environment import checked_out, environment, importable, tree_version

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RAW, PAGE = RESULTS / "issue19_targets.json", RESULTS / "issue19_targets.md"

GPT3 = ("simulate --model gpt3-175b --topology dgx-h100-x128-ndr-ft --tp 8 --pp 16 --vpp 2 "
        "--schedule interleaved-1f1b --dp 8 --global-batch-size 1536 --recompute selective "
        "--sequence-parallel")
WORKLOADS = {  # name -> (command, goal wall s, goal RSS MB or None, what the goal is)
    "a2a1024": ("collective all-to-all --size 1G --topology dgx-h100-x128-ndr-ft --ranks 1024",
                5, 1024, "1,024-GPU all-to-all of 1 GiB: under 5 s and 1 GB"),
    "ar16k": ("collective all-reduce --size 1G --ranks 16384 --topology llama3-24k-roce",
              3, None, "16,384-GPU all-reduce: under 3 s"),
    "ar1024": ("collective all-reduce --size 1G --ranks 1024 --topology dgx-h100-x128-ndr-ft",
               19, None, "1,024-GPU all-reduce: ASTRA-sim's analytical backend 19-20 s"),
    "pp512": ("simulate --model llama3-8b --num-layers 512 --pp 512 --microbatches 2048 "
              "--schedule 1f1b --topology dgx-h100-x128-ndr-ft --no-html --max-ops 16777217",
              30, 2048, "pp 512, 4 micro-batches per rank: under 30 s and 2 GB"),
    "llama405b16k": ("simulate --model llama3-405b --topology llama3-24k-roce --tp 8 --pp 16 "
                     "--dp 128 --global-batch-size 2048 --micro-batch-size 1 "
                     "--first-stage-layers 7 --last-stage-layers 7 --no-html",
                     10, None, "Llama-3 405B on 16,384 GPUs (tp 8, pp 16, dp 128): under 10 s"),
    "gpt3full": (GPT3 + " --no-html --replay all", 60, None,
                 "the README's 175B/1,024 with --replay all: under 60 s"),
}


def run(command: str, work: Path) -> dict:
    """One fresh process of `clustersim COMMAND` (module docstring)."""
    argv = [sys.executable, "-m", "clustersim", *command.split()]
    answer = work / "answer.json"
    simulating = command.startswith("simulate")
    argv += ["--metrics-json", str(answer)] if simulating else ["--json"]
    answer.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    with open(work / "out.txt", "w") as out, open(work / "err.txt", "w") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=work, stdout=out, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(work)})
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU and peak RSS
        wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{command}: {(work / 'err.txt').read_text()[-500:]}")
    if simulating:
        found = f"iteration {json.loads(answer.read_text())['iteration_time']!r} s"
    else:
        data = json.loads((work / "out.txt").read_text())
        found = (f"{data['time_s']!r} s, busbw {data['busbw_GBps']:.2f} GB/s "
                 f"({data['algorithm']}, {data['flows']:,} flows)")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "load": load, "answer": found}


def render(data: dict) -> str:
    lines = ["# Issue 19's speed targets, measured", "",
             "Each row: the least wall of its runs, each a fresh process of the tree and at "
             "the time it names (`python benchmarks/issue19_targets.py`; method: its "
             "docstring). Goal met only if wall (and RSS, where the goal names memory) are "
             "under it.", "",
             "| workload | goal | wall (s) | all walls (s) | CPU (s) | peak RSS (MB) | load | "
             "met | measured | answer |",
             "|---|---|---:|---|---:|---:|---:|---|---|---|"]
    for name, (command, goal_s, goal_mb, what) in WORKLOADS.items():
        row = data["runs"].get(name)
        if row is None:
            lines.append(f"| {name} | {what} | not run |  |  |  |  |  |  |  |")
            continue
        met = row["wall_s"] < goal_s and (goal_mb is None or row["rss_mb"] < goal_mb)
        walls = ", ".join(f"{w:.2f}" for w in row.get("walls_s", [row["wall_s"]]))
        when = " ".join(filter(None, (row.get("measured") or data["environment"]["date"],
                                      row.get("tree"))))
        lines.append(f"| {name} | {what} | {row['wall_s']:.2f} | {walls} | {row['cpu_s']:.2f}"
                     f" | {row['rss_mb']:,.0f} | {row['load']:.1f} | "
                     f"{'yes' if met else 'NO'} | {when} | {row['answer']} |")
    lines += ["", "Commands (`clustersim ...`):", ""]
    lines += [f"- {name}: `clustersim {command}`" for name, (command, *_)
              in WORKLOADS.items()]
    lines += ["", "The README's 175B job against f07ec0a (the 3x goal): "
              "benchmarks/results/engine_speed.md. ASTRA-sim's 19-20 s for the 1,024-GPU "
              "all-reduce is issue 19's figure for this kind of machine, not re-run here.",
              "", "Environment:", ""]
    lines += [f"- {k}: {v}" for k, v in data["environment"].items()]
    return "\n".join(lines) + "\n"


def render_speedups(data: dict) -> str:
    old, rounds = data["commit"][:7], data.get("rounds", 1)
    counts = {pair.get("rounds", rounds) for pair in data["runs"].values()}
    shown = str(rounds) if counts <= {rounds} else "N"  # rows of runs with other counts
    lines = ["# Issue 19's workloads: this tree against " + old, "",
             f"Each workload run on this tree and then on {old} (`python "
             f"benchmarks/issue19_targets.py --against {old} --rounds {shown}`), one fresh "
             "process each, one "
             "after the other in one run (rounds in turn; the best wall of each side "
             "compared): the ratio of their wall times is the speed-up (these machines are "
             "noisy: a ratio measured in one run is the figure to read). A workload left "
             "out of a later run (--skip) keeps its saved row, with when and on which tree "
             "that pair was measured.", "",
             f"| workload | this tree wall (s) | {old} wall (s) | speed-up | this tree RSS (MB) "
             f"| {old} RSS (MB) | answers | rounds | measured |",
             "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for name, pair in data["runs"].items():
        new, was = best(pair["new"]), best(pair["old"])
        answers = sorted({run["answer"] for side in ("new", "old") for run in every(pair[side])})
        same = "identical" if len(answers) == 1 else f"differ: {' vs '.join(answers)}"
        when = pair.get("measured") or data["environment"]["date"]
        lines.append(f"| {name} | {new['wall_s']:.2f} | {was['wall_s']:.2f} | "
                     f"{was['wall_s'] / new['wall_s']:.2f}x | {new['rss_mb']:,.0f} | "
                     f"{was['rss_mb']:,.0f} | {same} | {pair.get('rounds', rounds)} | "
                     f"{when} |")
    lines += ["", f"Every wall (s), this tree / {old}:", ""]
    lines += [f"- {name}: " + ", ".join(f"{n['wall_s']:.2f}" for n in every(pair["new"]))
              + " / " + ", ".join(f"{o['wall_s']:.2f}" for o in every(pair["old"]))
              for name, pair in data["runs"].items()]
    lines += ["", "Environment:", ""]
    lines += [f"- {k}: {v}" for k, v in data["environment"].items()]
    return "\n".join(lines) + "\n"


def every(runs: dict | list[dict]) -> list[dict]:
    """A side's runs (older files hold one run per side, not a list)."""
    return runs if isinstance(runs, list) else [runs]


def best(runs: dict | list[dict]) -> dict:
    """A side's run of least wall time."""
    return min(every(runs), key=lambda run: run["wall_s"])


def against(commit: str, skip: set[str], rounds: int = 1) -> int:
    """--against (module docstring)."""
    with checked_out(ROOT, commit) as (sha, _, old_dir), importable(ROOT) as new_dir:
        named = RESULTS / f"issue19_speedups_{sha[:7]}"
        saved = (json.loads(named.with_suffix(".json").read_text())
                 if named.with_suffix(".json").exists() else {"runs": {}})
        data = {"environment": environment(), "commit": sha, "rounds": rounds, "runs": {}}
        stamp = f"{data['environment']['date']} {tree_version(ROOT)}"
        for name, (command, *_) in WORKLOADS.items():
            if name in skip:
                if name in saved["runs"]:  # measured before: its own date, tree and rounds
                    data["runs"][name] = {"measured": saved.get("environment", {}).get(
                        "date"), "rounds": saved.get("rounds", 1), **saved["runs"][name]}
                continue
            pair = data["runs"][name] = {"new": [], "old": [], "measured": stamp,
                                         "rounds": rounds}
            for _ in range(rounds):
                pair["new"].append(run(command, new_dir))
                pair["old"].append(run(command, old_dir))
                print(name, pair["new"][-1], pair["old"][-1], flush=True)
    named.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    named.with_suffix(".md").write_text(render_speedups(data))
    print(render_speedups(data))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", default="", help="workloads to leave out, comma-separated")
    parser.add_argument("--against", metavar="COMMIT",
                        help="also run each workload on COMMIT, side by side (docstring)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --against: runs per side, in turn (the best is compared)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per workload (the least wall is reported)")
    parser.add_argument("--render", action="store_true")
    args = parser.parse_args()
    if args.against and args.repeat != 1:
        parser.error("--repeat counts runs of this tree alone; with --against give --rounds")
    if args.rounds != 1 and not args.against:
        parser.error("--rounds counts side-by-side rounds: it needs --against")
    if args.render and (args.against or args.skip or args.repeat != 1):
        parser.error("--render only rewrites the page from the saved JSON: it runs nothing")
    if args.render:
        PAGE.write_text(render(json.loads(RAW.read_text())))
        return 0
    skip = set(filter(None, args.skip.split(",")))
    if args.against:
        return against(args.against, skip, args.rounds)
    data = {"environment": environment(), "runs": {}}
    kept = json.loads(RAW.read_text()) if RAW.exists() else {"runs": {}}
    stamp = {"date": data["environment"]["date"], "tree": tree_version(ROOT)}
    with importable(ROOT) as work:
        for name, (command, *_) in WORKLOADS.items():
            if name in skip:
                if name in kept["runs"]:  # measured before: its own date and tree
                    data["runs"][name] = {"measured": kept.get("environment", {}).get("date"),
                                          **kept["runs"][name]}
                continue
            runs = [run(command, work) for _ in range(args.repeat)]
            data["runs"][name] = {**best(runs), "walls_s": [r["wall_s"] for r in runs],
                                  "measured": stamp["date"], "tree": stamp["tree"]}
            print(name, data["runs"][name], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    RAW.write_text(json.dumps(data, indent=1) + "\n")
    PAGE.write_text(render(data))
    print(re.sub(r"\n{3,}", "\n\n", render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
