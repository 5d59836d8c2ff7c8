"""Engine speed (issue 19, "a much faster engine"): the old commit f07ec0a, the commit the
speed-up started from (13dc3f2) and this working tree, timed side by side in one run, from
the command line, with the simulated answers printed next to each other.

Workloads:
1. `gpt3`: the README's GPT-3 175B on 1,024 GPUs, the command exactly as README.md spells
   it (read from README.md), HTML report written; best of `--repeat` runs of each version.
   Its exact iteration time comes from one more run of each version with `--no-html
   --metrics-json` (not timed).
2. `deep`: 1F1B, pp P, 4 P micro-batches, one Llama-3 8B layer per stage, on
   dgx-h100-x128-ndr-ft (benchmarks/results/engine_profile.md, section 3):
   - `--no-html --max-ops ...`, the issue's command: this tree for P = 32..512 and 13dc3f2
     where it finishes in a few minutes (`--start-max`);
   - with the HTML report (f07ec0a has neither --no-html nor --max-ops): f07ec0a and this
     tree for P up to `--old-max`.
   Each run adds `--metrics-json` for its exact answers (a few kB, written after the
   replay).

Method: every run is a process of its own (`python -m sim` for f07ec0a, whose packages
were top-level then; `python -m clustersim` for the others, each from a folder holding only
a `clustersim` link to its tree, so nothing is installed from the old trees); wall time is
taken around the process (interpreter start and imports included) and peak memory is its
peak resident set (ru_maxrss of os.wait4; MB = 2^20 bytes). The old trees are
temporary detached git worktrees (environment.checked_out), removed after. The 1-minute
load average is read before each run: the machine is shared, and a run with another job
on the CPUs is slower, so the versions alternate run by run.

Writes benchmarks/results/engine_speed.json (raw) and .md (tables).

    python benchmarks/engine_speed.py [--repeat 2] [--deep 32,64,128,256,512]
    python benchmarks/engine_speed.py --render      # the .md from the saved .json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environment import checked_out, environment, importable, uncommitted

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RAW, PAGE = RESULTS / "engine_speed.json", RESULTS / "engine_speed.md"
MB = 2 ** 20
OLD, START = "f07ec0a", "13dc3f2"
DEEP_PP = (32, 64, 128, 256, 512)
FABRIC = "dgx-h100-x128-ndr-ft"


def readme_command() -> list[str]:
    """The README's GPT-3 175B command, its continuation lines joined, without the
    leading `clustersim`."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines)
                 if line.startswith("clustersim simulate --model gpt3-175b"))
    text = ""
    for line in lines[first:]:
        text += line.rstrip().rstrip("\\") + " "
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(text)[1:]


def deep_args(pp: int) -> list[str]:
    return ["simulate", "--model", "llama3-8b", "--num-layers", str(pp), "--pp", str(pp),
            "--microbatches", str(4 * pp), "--schedule", "1f1b", "--topology", FABRIC]


def deep_no_html(pp: int) -> list[str]:
    """The issue's deep-pipeline command (engine_profile.deep_argv)."""
    return [*deep_args(pp), "--no-html", "--max-ops", str(16 * pp * 4 * pp + 1)]


# --- the versions ------------------------------------------------------------------------
def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def versions(stack: contextlib.ExitStack) -> dict[str, dict]:
    """How to run each version: argv prefix and PYTHONPATH (module docstring); the old
    trees' worktrees live as long as `stack`."""
    sha, tree, package = stack.enter_context(checked_out(ROOT, START))
    out = {START: {"module": "clustersim", "path": str(package), "tree": str(tree),
                   "commit": sha}}
    link = stack.enter_context(importable(ROOT))
    out["new"] = {"module": "clustersim", "path": str(link), "tree": str(ROOT),
                  "commit": git("rev-parse", "HEAD") + uncommitted(ROOT)}
    sha, old, _ = stack.enter_context(checked_out(ROOT, OLD))
    out[OLD] = {"module": "sim", "path": str(old), "tree": str(old), "commit": sha}
    return out


# --- one run -----------------------------------------------------------------------------
def run(version: dict, args: list[str], cwd: Path) -> dict:
    """One process of `version` on `args`: wall s, peak RSS MB, exit status, output."""
    env = {**os.environ, "PYTHONPATH": version["path"]}
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out:
        began = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", version["module"], *args], cwd=cwd,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode:
        raise SystemExit(f"{version['module']} {' '.join(args)} exited {proc.returncode}:\n"
                         f"{text[-3000:]}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss * 1024 / MB, "load_1min": load,
            "cpu_s": usage.ru_utime + usage.ru_stime, "output_tail": text[-600:]}


def answers(path: Path) -> dict:
    """The iteration time and peak memory of a metrics JSON file."""
    data = json.loads(path.read_text())
    peaks = data["per_rank"]["peak_memory_bytes"]
    return {"iteration_time_s": data["iteration_time"],
            "bubble_fraction": data["bubble_fraction"],
            "peak_memory_bytes_max": max(peaks.values()) if peaks else 0}


def best(runs: list[dict]) -> dict:
    top = min(runs, key=lambda r: r["wall_s"])
    return {**top, "walls_s": [r["wall_s"] for r in runs],
            "loads_1min": [r["load_1min"] for r in runs]}


def measure_gpt3(vs: dict, work: Path, repeat: int) -> dict:
    command = readme_command()
    runs: dict[str, list] = {name: [] for name in (OLD, START, "new")}
    for i in range(repeat):
        for name in runs:  # alternate, so a busy spell hits every version alike
            print(f"gpt3 {name} run {i + 1}", flush=True)
            runs[name].append(run(vs[name], command, work))
    out = {"command": "clustersim " + shlex.join(command), "rows": {}}
    for name in runs:
        metrics = work / f"gpt3-{name}.json"
        args = [a for a in command if a not in ("-o", "gpt3.html")]
        run(vs[name], [*args, *(["--no-html"] if name != OLD else ["-o", "x.html"]),
                       "--metrics-json", str(metrics)], work)
        out["rows"][name] = {**best(runs[name]), **answers(metrics)}
    return out


def measure_deep(vs: dict, work: Path, sizes: tuple[int, ...], start_max: int,
                 old_max: int) -> dict:
    rows = []
    for pp in sizes:
        row: dict = {"pp": pp, "microbatches": 4 * pp}
        plans = [("new", deep_no_html(pp), "no_html")]
        if pp <= start_max:
            plans.append((START, deep_no_html(pp), "no_html"))
        if pp <= old_max:
            plans += [(OLD, [*deep_args(pp), "-o", "x.html"], "html"),
                      ("new", [*deep_args(pp), "-o", "x.html"], "html")]
        for name, args, kind in plans:
            print(f"deep P={pp} {name} {kind}", flush=True)
            metrics = work / f"deep-{pp}-{name}-{kind}.json"
            record = run(vs[name], [*args, "--metrics-json", str(metrics)], work)
            row[f"{name}/{kind}"] = {**record, **answers(metrics)}
        rows.append(row)
    return {"command": "clustersim " + shlex.join(deep_no_html(DEEP_PP[0])), "rows": rows}


# --- the page ----------------------------------------------------------------------------
def _table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def _cell(record: dict | None, key: str, fmt: str) -> str:
    return "" if record is None else format(record[key], fmt)


def _agree(a: dict | None, b: dict | None) -> str:
    if a is None or b is None:
        return ""
    same = all(a[k] == b[k] for k in ("iteration_time_s", "peak_memory_bytes_max"))
    return "identical" if same else (
        f"DIFFER: {a['iteration_time_s']!r} vs {b['iteration_time_s']!r}")


def _measured(part: dict) -> list[str]:
    """Which tree was `new` in a section, and when (`--only` keeps the other section)."""
    found = part.get("measured")
    return ["", f"Measured {found['date']}, new = {found['new']}."] if found else []


def render(data: dict) -> str:
    env, vs = data["environment"], data["versions"]
    lines = ["# Engine speed (issue 19)", "",
             "The old commit, the commit the speed-up started from and this tree, timed side "
             "by side in one run by `python benchmarks/engine_speed.py` (method: its "
             "docstring). Wall = seconds of the whole process, best of the runs; peak RSS "
             "in MB (2^20 bytes); load = the 1-minute load average of the machine before a "
             "run (above the core count: other jobs shared the CPUs).", "",
             *(f"- {name}: {v['commit']}" for name, v in vs.items()),
             f"- whole benchmark: {data['benchmark_wall_s'] / 60:.0f} min",
             *(f"- {k}: {v}" for k, v in env.items()), ""]
    if "gpt3" in data:
        g = data["gpt3"]["rows"]
        new = g["new"]
        lines += ["## 1. GPT-3 175B on 1,024 GPUs, the README's command", "",
                  f"`{data['gpt3']['command']}`", *_measured(data["gpt3"]), ""]
        lines += _table(
            ["version", "wall (s)", "runs (s)", "loads", "CPU (s)", "peak RSS (MB)",
             "iteration time (s)", "bubble fraction", "largest peak memory (B)",
             "new is faster by"],
            [[name, f"{r['wall_s']:.2f}", ", ".join(f"{w:.2f}" for w in r["walls_s"]),
              ", ".join(f"{x:.1f}" for x in r["loads_1min"]), f"{r['cpu_s']:.2f}",
              f"{r['peak_rss_mb']:.0f}", f"{r['iteration_time_s']!r}",
              f"{r['bubble_fraction']:.6f}", f"{r['peak_memory_bytes_max']:,}",
              f"{r['wall_s'] / new['wall_s']:.2f}x"] for name, r in g.items()])
        lines += ["", f"Answers of {START} and this tree: {_agree(g[START], new)}. "
                  f"An old commit's answer differs where the model changed since it "
                  f"(f07ec0a: e.g. issue 16's kernel ceilings; {START}: issue 22's NCCL "
                  f"collectives), not because of the engine: each speed-up is checked to "
                  f"change no answer of the commit before it.", ""]
    if "deep" in data:
        lines += ["## 2. Deep pipeline: 1F1B, pp P, 4 P micro-batches", "",
                  f"`{data['deep']['command']}` (P = 32; likewise for each P).",
                  *_measured(data["deep"]), "",
                  "With `--no-html` (the issue's command):", ""]
        rows = []
        for r in data["deep"]["rows"]:
            new, start = r.get("new/no_html"), r.get(f"{START}/no_html")
            rows.append([r["pp"], f"{4 * r['pp']}", _cell(start, "wall_s", ".2f"),
                         _cell(start, "peak_rss_mb", ".0f"), _cell(new, "wall_s", ".2f"),
                         _cell(new, "peak_rss_mb", ".0f"),
                         f"{start['wall_s'] / new['wall_s']:.2f}x" if start else "",
                         repr(new["iteration_time_s"]), _agree(start, new),
                         _cell(new, "load_1min", ".1f")])
        lines += _table(["P", "micro-batches", f"{START} wall (s)", f"{START} RSS (MB)",
                         "new wall (s)", "new RSS (MB)", "speed-up", "iteration time (s)",
                         f"answers vs {START}", "load"], rows)
        lines += ["", "With the HTML report (f07ec0a has no --no-html):", ""]
        rows = []
        for r in data["deep"]["rows"]:
            old, new = r.get(f"{OLD}/html"), r.get("new/html")
            if old is None:
                continue
            rows.append([r["pp"], f"{old['wall_s']:.2f}", f"{old['peak_rss_mb']:.0f}",
                         f"{new['wall_s']:.2f}", f"{new['peak_rss_mb']:.0f}",
                         f"{old['wall_s'] / new['wall_s']:.2f}x",
                         f"{old['iteration_time_s']!r}", f"{new['iteration_time_s']!r}"])
        lines += _table(["P", f"{OLD} wall (s)", f"{OLD} RSS (MB)", "new wall (s)",
                         "new RSS (MB)", "speed-up", f"{OLD} iteration (s)",
                         "new iteration (s)"], rows)
        lines.append("")
    lines += verdict(data)
    return "\n".join(lines) + "\n"


GOALS = {"gpt3_speedup": 3.0, "deep_pp": 512, "deep_wall_s": 30.0, "deep_rss_mb": 2048}
"""Issue 19's must-shows: the README's run 3x faster than f07ec0a; pp 512 in under 30 s
and 2 GB."""


def verdict(data: dict) -> list[str]:
    """The issue's must-shows against this run's numbers, met or not."""
    lines = ["## Against the issue's targets", ""]
    if "gpt3" in data:
        rows = data["gpt3"]["rows"]
        ratio = rows[OLD]["wall_s"] / rows["new"]["wall_s"]
        cpu = rows[OLD]["cpu_s"] / rows["new"]["cpu_s"]
        lines.append(f"- README's 175B run, new vs {OLD}: {ratio:.2f}x wall, {cpu:.2f}x CPU "
                     f"(target {GOALS['gpt3_speedup']:.0f}x): "
                     f"{'met' if ratio >= GOALS['gpt3_speedup'] else 'NOT met'}; vs {START}: "
                     f"{rows[START]['wall_s'] / rows['new']['wall_s']:.2f}x wall, answers "
                     f"{_agree(rows[START], rows['new'])}.")
    deep = {r["pp"]: r.get("new/no_html") for r in data.get("deep", {}).get("rows", [])}
    top = deep.get(GOALS["deep_pp"])
    if top:
        ok = top["wall_s"] < GOALS["deep_wall_s"] and top["peak_rss_mb"] < GOALS["deep_rss_mb"]
        lines.append(f"- pp {GOALS['deep_pp']}, 4 micro-batches per rank, --no-html: "
                     f"{top['wall_s']:.0f} s and {top['peak_rss_mb']:,.0f} MB (target under "
                     f"{GOALS['deep_wall_s']:.0f} s and {GOALS['deep_rss_mb']:,} MB): "
                     f"{'met' if ok else 'NOT met'}.")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--deep", default=",".join(map(str, DEEP_PP)))
    parser.add_argument("--start-max", type=int, default=256,
                        help=f"largest P run on {START} (default 256, ~70 s)")
    parser.add_argument("--old-max", type=int, default=128,
                        help=f"largest P run on {OLD} and this tree with HTML")
    parser.add_argument("--only", choices=["gpt3", "deep"], action="append")
    parser.add_argument("--render", action="store_true")
    args = parser.parse_args()
    if args.render:
        PAGE.write_text(render(json.loads(RAW.read_text())))
        print(f"wrote {PAGE}")
        return 0
    saved = json.loads(RAW.read_text()) if args.only and RAW.exists() else {}
    for part in ("gpt3", "deep"):  # a kept section keeps the tree and date it measured
        if part in saved and "measured" not in saved[part]:
            saved[part]["measured"] = {"new": saved["versions"]["new"]["commit"],
                                       "date": saved["environment"]["date"]}
    data = {**saved, "environment": environment()}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        vs = versions(stack)
        data["versions"] = {k: {"commit": v["commit"], "tree": v["tree"]}
                            for k, v in vs.items()}
        parts = args.only or ["gpt3", "deep"]
        measured = {"new": vs["new"]["commit"], "date": data["environment"]["date"]}
        if "gpt3" in parts:
            data["gpt3"] = {**measure_gpt3(vs, work, args.repeat), "measured": measured}
        if "deep" in parts:
            sizes = tuple(int(x) for x in args.deep.split(","))
            data["deep"] = {**measure_deep(vs, work, sizes, args.start_max, args.old_max),
                            "measured": measured}
    data["benchmark_wall_s"] = time.perf_counter() - began
    RESULTS.mkdir(parents=True, exist_ok=True)
    RAW.write_text(json.dumps(data, indent=1) + "\n")
    PAGE.write_text(render(data))
    print(f"wrote {RAW} and {PAGE}")
    print(re.sub(r"\n{3,}", "\n\n", render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
