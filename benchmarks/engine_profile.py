"""Engine profile (issue 19, "Measure first"): where the wall time and memory of
clustersim's large runs go, before any optimisation. Nothing here changes the simulator.

Workloads (the issue's "must show" list, at the sizes this 2-core machine runs in minutes):
1. `gpt3`: the README's GPT-3 175B on 1,024 GPUs (TP 8, PP 16 interleaved with 2 virtual
   stages, DP 8, batch 1536, selective recompute, sequence parallel, on
   dgx-h100-x128-ndr-ft) with its HTML report and Perfetto trace, end to end from the CLI
   (`python -m clustersim ...`); the same argv in-process split into phases; a cProfile.
2. `collectives`: `clustersim collective all-to-all --size 1G` on the first N GPUs of
   dgx-h100-x128-ndr-ft (N up to 1,024), `all-reduce --size 1G` on 1,024 GPUs of it and on
   16,384 GPUs of llama3-24k-roce (the largest preset, 24,576 GPUs): from the CLI, and
   in-process with the route finding (`topologies.routes`), the route choice
   (`FlowNetwork.path_links`), the max-min solver and the flow component search timed and
   their calls counted.
3. `deep`: 1F1B with pp P and 4 P micro-batches (4 per rank), Llama-3 8B layers, P layers
   (one per stage), on dgx-h100-x128-ndr-ft, `--no-html` (the replay, not the page): wall
   time and peak memory against the op count; a cProfile of one size.
4. `events`: SimPy events the engine processes per second of replay (the events each
   Environment scheduled, `next(env._eid)`, all processed when a run ends), next to a bare
   SimPy loop of timeouts (one process, and 16 interleaved) measured in the same run.

Method: every measurement runs in a Python process of its own; its wall time is taken
around the process (so it includes interpreter start and imports) and its peak memory is
the process's peak resident set (ru_maxrss of os.wait4, reported in MB = 2^20 bytes). The
in-process runs (`--child phases`) call `clustersim.sim.cli.main(argv)` as
`python -m clustersim` does, with timers wrapped around the functions named in COARSE
(and FINE, for the collectives): each phase's time is exclusive (a wrapped function
called inside another is charged to the inner one only), so the phases add up to the
in-process total. The 1-minute load average is read before every measurement; the machine
is a shared 2-core box, so the best of `--repeat` runs is reported. cProfile runs are
slower than the plain runs (its overhead is per Python call), so only their shares count.

Writes benchmarks/results/engine_profile.json (raw) and .md (tables).

    python benchmarks/engine_profile.py [--repeat 3] [--quick] [--render]
    python benchmarks/engine_profile.py --only deep --deep 32,64,128   # one part, merged
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import functools
import importlib
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from environment import environment
from run_cli import ROOT, command

RESULTS = ROOT / "benchmarks" / "results"
RAW, PAGE = RESULTS / "engine_profile.json", RESULTS / "engine_profile.md"
MB = 2 ** 20

GPT3 = ("simulate", "--model", "gpt3-175b", "--topology", "dgx-h100-x128-ndr-ft", "--tp", "8",
        "--pp", "16", "--vpp", "2", "--schedule", "interleaved-1f1b", "--dp", "8",
        "--global-batch-size", "1536", "--recompute", "selective", "--sequence-parallel")
GPT3_OUTPUTS = ("-o", "gpt3.html", "--trace-json", "gpt3.trace.json")
FABRIC = "dgx-h100-x128-ndr-ft"
A2A_RANKS = (128, 256, 512, 1024)
ALL_REDUCES = ((1024, FABRIC), (16384, "llama3-24k-roce"))
DEEP_PP = (32, 64, 128, 256)
DEEP_PROFILE_PP = 128
BARE_TIMEOUTS = 1_000_000
TOP = 25


def a2a_argv(ranks: int) -> tuple[str, ...]:
    return ("collective", "all-to-all", "--size", "1G", "--ranks", str(ranks),
            "--topology", FABRIC)


def all_reduce_argv(ranks: int, topology: str) -> tuple[str, ...]:
    return ("collective", "all-reduce", "--size", "1G", "--ranks", str(ranks),
            "--topology", topology)


def deep_argv(pp: int) -> tuple[str, ...]:
    """1F1B, pp P, 4 P micro-batches, one Llama-3 8B layer per stage; --max-ops lifted
    (schedules.limits estimates 16 ops per stage and micro-batch)."""
    return ("simulate", "--model", "llama3-8b", "--num-layers", str(pp), "--pp", str(pp),
            "--microbatches", str(4 * pp), "--schedule", "1f1b", "--topology", FABRIC,
            "--no-html", "--max-ops", str(16 * pp * 4 * pp + 1))


# --- in-process instrumentation (the child side) ---------------------------------------
# (module[:class], attribute, phase); a phase's time is exclusive of the phases inside it
COARSE = (
    ("clustersim.sim.cli.commands", "load_topology", "topology load"),
    ("clustersim.topologies", "load_topology", "topology load"),
    ("clustersim.sim.cli.commands", "simulate_schedule",
     "simulate: rest (warnings, steady window, throughput)"),
    ("clustersim.sim.simulate", "checked_plan", "plan (resolve, checks)"),
    ("clustersim.schedules.plan:Plan", "build_schedule", "schedule build"),
    ("clustersim.sim.simulate", "lower", "lowering (P2P, DP, costs, TP collectives)"),
    ("clustersim.sim.cost_model:RooflineCostModel", "compute_time", "cost model set-up"),
    ("clustersim.sim.cost_model:RooflineCostModel", "collectives", "cost model set-up"),
    ("clustersim.sim.simulate", "rank_memory", "memory model"),
    ("clustersim.sim.simulate", "memory_model", "memory model"),
    ("clustersim.sim.simulate", "compute_slowdowns", "memory model"),
    ("clustersim.sim.simulate:Replay", "__init__", "replay set-up (contracts)"),
    ("clustersim.sim.simulate:Replay", "run", "replay (engine)"),
    ("clustersim.sim.simulate", "oom_report", "OOM report"),
    ("clustersim.sim.cli.commands", "format_summary", "summary (text)"),
    ("clustersim.schedules.timeline:Timeline", "metrics", "metrics"),
    ("clustersim.sim.html_report", "write_report", "HTML report"),
    ("clustersim.sim.trace", "write_trace", "trace (Perfetto JSON)"),
    ("clustersim.sim.collectives", "sweep_collective", "collective: engine and the rest"),
    ("clustersim.sim.collectives", "collective_phases", "collective: algorithm phases"),
)
ROUTES_FLOWS = ("route finding for flows (a pair's parts, sim.ecmp.EcmpRoutes._pair: "
                "topologies.route_sets)")
ROUTES_ESTIMATE = ("route finding for the algorithm choice (sim.route_shares, from "
                   "sim.collective_algorithms.estimate_time)")
FINE = (
    ("clustersim.sim.ecmp:EcmpRoutes", "_pair", ROUTES_FLOWS),
    ("clustersim.sim.collective_algorithms", "route_shares", ROUTES_ESTIMATE),
    ("clustersim.sim.flows:FlowNetwork", "path_links", "route choice (path_links)"),
    ("clustersim.sim.flows:FlowNetwork", "paths_links", "route choice (path_links)"),
    ("clustersim.sim.collectives", "estimate_time", "alpha-beta estimate"),
    ("clustersim.sim.flows", "max_min_entries", "max-min rates (sim.maxmin)"),
    ("clustersim.sim.flows:FlowNetwork", "_component", "flow component search"),
)
OTHER = "CLI: rest (argument parsing, checks, printing)"


class Phases:
    """Exclusive wall time and calls per phase label, from wrapped functions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter = Counter()
        self.stack: list[list] = []  # [label, start, time spent in wrapped callees]
        self.results: dict[str, object] = {}

    def wrap(self, target: str, name: str, label: str, keep=None) -> None:
        module, _, cls = target.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, name)
        phases, clock = self, time.perf_counter

        @functools.wraps(original)
        def timed(*args, **kwargs):
            phases.calls[label] += 1
            frame = [label, clock(), 0.0]
            phases.stack.append(frame)
            try:
                result = original(*args, **kwargs)
            finally:
                elapsed = clock() - frame[1]
                phases.stack.pop()
                phases.seconds[label] += elapsed - frame[2]
                if phases.stack:
                    phases.stack[-1][2] += elapsed
            if keep is not None:
                keep(phases.results, result)
            return result

        setattr(owner, name, timed)


def _keep_lowered(results: dict, schedule) -> None:
    results["ops"] = results.get("ops", 0) + sum(len(p) for p in schedule.programs)
    results["ranks_replayed"] = schedule.num_ranks


def _keep_timeline(results: dict, pair) -> None:
    timeline = pair[1]
    results["spans"] = len(timeline.spans)
    results["iteration_s"] = timeline.iteration_time


def _counting_environments() -> list:
    """Make every simpy.Environment the simulator creates record itself."""
    import simpy

    made: list = []

    class Recorded(simpy.Environment):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    simpy.Environment = Recorded
    return made


def child_phases(argv: list[str], fine: bool) -> dict:
    """Run `clustersim ARGV` in this process with the phase timers (module docstring)."""
    from clustersim.sim.cli import main

    phases = Phases()
    keep = {"lower": _keep_lowered, "simulate_schedule": _keep_timeline}
    for target, name, label in COARSE + (FINE if fine else ()):
        phases.wrap(target, name, label, keep.get(name))
    made = _counting_environments()
    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    total = time.perf_counter() - began
    if code:
        raise SystemExit(f"clustersim {' '.join(argv)} exited {code}")
    phases.seconds[OTHER] = total - sum(phases.seconds.values())
    events = sum(next(env._eid) - len(env._queue) for env in made)
    lines = out.getvalue().strip().splitlines()
    return {"total_s": total, "events": events,
            "phases": {k: {"s": v, "calls": phases.calls.get(k, 0)}
                       for k, v in sorted(phases.seconds.items(), key=lambda kv: -kv[1])},
            **phases.results, "output_line": lines[0] if lines else ""}


def _function_name(key: tuple) -> str:
    path, line, name = key
    if path == "~":
        return name
    for prefix in (str(ROOT) + os.sep, *(p + os.sep for p in sys.path if p)):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    return f"{path}:{line}({name})"


def child_profile(argv: list[str]) -> dict:
    """cProfile of `clustersim ARGV` in this process: the TOP functions by cumulative and
    by own (total) time."""
    from clustersim.sim.cli import main

    profiler = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        profiler.enable()
        code = main(argv)
        profiler.disable()
    if code:
        raise SystemExit(f"clustersim {' '.join(argv)} exited {code}")
    stats = pstats.Stats(profiler)
    rows = {key: (calls, total_calls, tottime, cumtime)
            for key, (calls, total_calls, tottime, cumtime, _) in stats.stats.items()}

    def top(column: int) -> list[dict]:
        keys = sorted(rows, key=lambda k: -rows[k][column])[:TOP]
        return [{"function": _function_name(k), "ncalls": rows[k][1],
                 "primitive_calls": rows[k][0], "tottime_s": rows[k][2],
                 "cumtime_s": rows[k][3]} for k in keys]

    return {"profiled_s": stats.total_tt, "by_cumulative": top(3), "by_tottime": top(2)}


def child_bare(timeouts: int, processes: int) -> dict:
    """A bare SimPy loop: `processes` processes yielding timeouts, `timeouts` in all."""
    import simpy

    env = simpy.Environment()

    def process(count: int):
        timeout = env.timeout
        for _ in range(count):
            yield timeout(1.0)

    for _ in range(processes):
        env.process(process(timeouts // processes))
    began = time.perf_counter()
    env.run()
    seconds = time.perf_counter() - began
    events = next(env._eid)
    return {"events": events, "seconds": seconds, "events_per_s": events / seconds}


def child(args: list[str]) -> int:
    kind, rest = args[0], args[1:]
    if kind == "phases":
        fine = rest[0] == "fine"
        data = child_phases(rest[1:], fine)
    elif kind == "profile":
        data = child_profile(rest)
    elif kind == "bare":
        data = child_bare(int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown child {kind}")
    print(json.dumps(data))
    return 0


# --- the parent side: processes, repeats, load --------------------------------------------
def run_process(argv: list[str], cwd: Path) -> dict:
    """Run argv; its wall time (s), peak RSS (MB), the load average before, and the JSON
    of its last stdout line when it prints one."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)}
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    record = {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss * 1024 / MB, "load_1min": load,
              "cpu_s": usage.ru_utime + usage.ru_stime}
    lines = stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        record["data"] = json.loads(lines[-1])
    elif lines:
        record["output_line"] = lines[0]
    return record


def best_of(repeat: int, measure, label: str, key=lambda r: r["wall_s"]) -> dict:
    """`repeat` runs of `measure()`; the fastest by `key` (default: the process's wall
    time), with every run's wall, RSS and load."""
    runs = []
    for i in range(repeat):
        runs.append(measure())
        print(f"  {label} run {i + 1}/{repeat}: {runs[-1]['wall_s']:.2f} s, "
              f"{runs[-1]['peak_rss_mb']:.0f} MB, load {runs[-1]['load_1min']:.2f}",
              flush=True)
    best = min(runs, key=key)
    return {**best, "repeat": repeat, "walls_s": [r["wall_s"] for r in runs],
            "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
            "loads_1min": [r["load_1min"] for r in runs]}


def cli(argv: tuple[str, ...], cwd: Path) -> dict:
    return run_process([sys.executable, "-m", "clustersim", *argv], cwd)


def instrumented(kind: str, argv: tuple[str, ...], cwd: Path, mode: str = "coarse") -> dict:
    extra = [mode] if kind == "phases" else []
    return run_process([sys.executable, str(Path(__file__).resolve()), "--child", kind,
                        *extra, *argv], cwd)


def _profiled(argv: tuple[str, ...], work: Path) -> dict:
    record = instrumented("profile", argv, work)
    return {**record.pop("data"), **record}


def measure_gpt3(work: Path, repeat: int) -> dict:
    argv = GPT3 + GPT3_OUTPUTS
    print("gpt3: the README's command from the CLI", flush=True)
    plain = best_of(repeat, lambda: cli(argv, work), "gpt3 cli")
    print("gpt3: in-process phases", flush=True)
    phases = best_of(repeat, lambda: instrumented("phases", argv, work), "gpt3 phases")
    print("gpt3: cProfile", flush=True)
    profile = _profiled(argv, work)
    return {"argv": list(argv), "command": command(*argv), "cli": plain, "phases": phases,
            "profile": profile}


def measure_collectives(work: Path, repeat: int, a2a: tuple[int, ...]) -> dict:
    cases = [(f"all-to-all 1 GiB, {n} GPUs of {FABRIC}", a2a_argv(n)) for n in a2a]
    cases += [(f"all-reduce 1 GiB, {n} GPUs of {topo}", all_reduce_argv(n, topo))
              for n, topo in ALL_REDUCES]
    out = []
    for name, argv in cases:
        # the 1,024-GPU all-to-all takes minutes a run: once, plain and instrumented
        times = 1 if "all-to-all" in name and int(argv[5]) >= 1024 else repeat
        print(f"collective: {name}", flush=True)
        plain = best_of(times, lambda: cli(argv, work), "cli")
        fine = best_of(1, lambda: instrumented("phases", argv, work, "fine"), "instrumented")
        out.append({"name": name, "argv": list(argv), "command": command(*argv),
                    "cli": plain, "instrumented": fine})
    return {"cases": out}


def measure_deep(work: Path, repeat: int, sizes: tuple[int, ...], profile_pp: int) -> dict:
    rows = []
    for pp in sizes:
        argv = deep_argv(pp)
        print(f"deep: pp {pp}, {4 * pp} micro-batches", flush=True)
        rows.append({"pp": pp, "microbatches": 4 * pp, "argv": list(argv),
                     "command": command(*argv),
                     "phases": best_of(repeat, lambda: instrumented("phases", argv, work),
                                       f"pp {pp}")})
    print(f"deep: cProfile of pp {profile_pp}", flush=True)
    profile = _profiled(deep_argv(profile_pp), work)
    return {"rows": rows, "profile_pp": profile_pp, "profile": profile}


def measure_bare(work: Path, repeat: int) -> dict:
    out = {}
    for processes in (1, 16):
        print(f"bare SimPy: {BARE_TIMEOUTS:,} timeouts in {processes} process(es)", flush=True)
        out[str(processes)] = best_of(repeat, lambda: instrumented(
            "bare", (str(BARE_TIMEOUTS), str(processes)), work), f"bare x{processes}",
            key=lambda r: r["data"]["seconds"])
    return out


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD") + (" + uncommitted changes (git status: "
                                       + ", ".join(line.split()[-1] for line
                                                   in dirty.splitlines()) + ")"
                                       if dirty else "")


# --- the page ----------------------------------------------------------------------------
def _table(head: list[str], rows: list[list], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(head) - 1)
    return ["| " + " | ".join(head) + " |",
            "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def _phase_rows(phases: dict, total: float) -> list[list]:
    return [[label, f"{p['s']:.3f}", f"{p['s'] / total:.1%}", f"{p['calls']:,}"]
            for label, p in phases.items()]


def _profile_tables(profile: dict) -> list[str]:
    lines = []
    for key, title in (("by_cumulative", "cumulative"), ("by_tottime", "total (own)")):
        lines += ["", f"Top {TOP} by {title} time (cProfile; {profile['profiled_s']:.2f} s "
                      f"profiled in all):", ""]
        lines += _table(["function", "calls", "own time (s)", "cumulative (s)",
                         "cumulative share"],
                        [[f"`{r['function']}`", f"{r['ncalls']:,}", f"{r['tottime_s']:.3f}",
                          f"{r['cumtime_s']:.3f}",
                          f"{r['cumtime_s'] / profile['profiled_s']:.1%}"]
                         for r in profile[key]])
    return lines


def _loads(record: dict) -> str:
    return "/".join(f"{x:.2f}" for x in record["loads_1min"])


def render(data: dict) -> str:
    env = data["environment"]
    lines = ["# Engine profile (issue 19, step 1: measure first)", "",
             "Where the wall time and memory of clustersim's large runs go, measured before "
             "any optimisation by `python benchmarks/engine_profile.py` (method: its "
             "docstring). Wall times in seconds (s) of wall clock, best of the runs; peak "
             "memory = the process's peak resident set in MB (2^20 bytes); load = the "
             "1-minute load average of the 2-core machine before each run (above 1: "
             "another job shared the CPUs).", "",
             f"- commit measured: {data['commit']}"
             + ("" if data.get("commit_end", data["commit"]) == data["commit"] else
                f" at the start, {data['commit_end']} at the end (others committed "
                f"during the run)"),
             f"- whole benchmark: {data.get('benchmark_wall_s', 0) / 60:.0f} min; load "
             f"average (1 min) at the end {data.get('load_1min_end', 0):.2f}",
             *(f"- {k}: {v}" for k, v in env.items()), ""]
    lines += data.get("headline_md", [])
    if "gpt3" in data:
        g = data["gpt3"]
        cli_rec, ph = g["cli"], g["phases"]
        inner = ph["data"]
        lines += ["## 1. GPT-3 175B on 1,024 GPUs, the README's command", "",
                  f"`{g['command']}`", "",
                  f"From the CLI (`python -m clustersim`, HTML report and trace written): "
                  f"**{cli_rec['wall_s']:.2f} s** wall (runs: "
                  f"{', '.join(f'{w:.2f}' for w in cli_rec['walls_s'])} s; load "
                  f"{_loads(cli_rec)}), peak RSS **{cli_rec['peak_rss_mb']:.0f} MB**. "
                  f"{inner.get('ops', 0):,} ops replayed on {inner.get('ranks_replayed')} "
                  f"ranks, {inner.get('spans', 0):,} spans, simulated iteration "
                  f"{inner.get('iteration_s', 0):.4f} s.", "",
                  f"In-process phases (the same argv through `clustersim.sim.cli.main`; "
                  f"best of {ph['repeat']} processes at {ph['wall_s']:.2f} s wall, "
                  f"{ph['peak_rss_mb']:.0f} MB; load {_loads(ph)}); exclusive seconds:", ""]
        lines += _table(["phase", "s", "share of in-process total", "calls"],
                        _phase_rows(inner["phases"], inner["total_s"])
                        + [["**in-process total**", f"{inner['total_s']:.3f}", "100%", ""]])
        lines += _profile_tables(g["profile"])
        lines.append("")
    if "collectives" in data:
        lines += ["## 2. One collective: `clustersim collective`", "",
                  "Wall and peak RSS from the CLI (best of the runs, plain process); the "
                  "split from one instrumented in-process run (its wall includes the "
                  "timers' overhead, one pair of clock reads per wrapped call).", ""]
        rows = []
        for c in data["collectives"]["cases"]:
            inst = c["instrumented"]["data"]
            ph = inst["phases"]
            route = {k: sum(ph.get(label, {}).get(k, 0) for label in (ROUTES_FLOWS,
                                                                      ROUTES_ESTIMATE))
                     for k in ("s", "calls")}
            choice = ph.get("route choice (path_links)", {"s": 0.0, "calls": 0})
            mm = ph.get("max-min rates (sim.maxmin)", {"s": 0.0, "calls": 0})
            comp = ph.get("flow component search", {"s": 0.0, "calls": 0})
            total = inst["total_s"]
            rows.append([c["name"], f"{c['cli']['wall_s']:.2f}", str(c["cli"]["repeat"]),
                         f"{c['cli']['peak_rss_mb']:.0f}", f"{inst['events']:,}",
                         f"{route['calls']:,}",
                         f"{route['s']:.2f} ({route['s'] / total:.0%})",
                         f"{choice['s']:.2f} ({choice['s'] / total:.0%})",
                         f"{mm['s']:.2f} ({mm['s'] / total:.0%}; {mm['calls']:,} calls)",
                         f"{comp['s']:.2f} ({comp['s'] / total:.0%})",
                         f"{c['instrumented']['wall_s']:.2f}", _loads(c["cli"])])
        lines += _table(["collective", "CLI wall (s)", "runs", "CLI peak RSS (MB)",
                         "SimPy events", "routes() calls", "route finding s (share)",
                         "path_links s (share)", "max-min s (share)",
                         "component search s (share)", "instrumented wall (s)",
                         "load (CLI runs)"], rows)
        lines += ["", "Simulated answers (CLI output):", ""]
        lines += [f"- `{c['command']}`: {c['cli'].get('output_line', '')}"
                  for c in data["collectives"]["cases"]]
        lines += ["", "Exclusive phases of each instrumented run (s):", ""]
        labels = []
        for c in data["collectives"]["cases"]:
            for label in c["instrumented"]["data"]["phases"]:
                if label not in labels:
                    labels.append(label)
        head = ["phase"] + [c["name"].split(",")[0] + ", " + c["argv"][5] + " GPUs"
                            for c in data["collectives"]["cases"]]
        lines += _table(head, [[label] + [
            f"{c['instrumented']['data']['phases'].get(label, {'s': 0.0})['s']:.3f}"
            for c in data["collectives"]["cases"]] for label in labels])
        lines.append("")
    if "deep" in data:
        d = data["deep"]
        lines += ["## 3. Deep pipeline: 1F1B, pp P, 4 P micro-batches", "",
                  f"`{d['rows'][0]['command']}` (P = {d['rows'][0]['pp']}; likewise for each "
                  f"P). Wall and peak RSS of the process running `clustersim.sim.cli.main` "
                  f"in-process with the phase timers (best of the runs); ops = ops of the "
                  f"lowered schedule (compute, P2P, collectives).", ""]
        rows, base = [], None
        for r in d["rows"]:
            p = r["phases"]
            inner = p["data"]
            replay = inner["phases"]["replay (engine)"]["s"]
            per_op = p["wall_s"] / inner["ops"] * 1e6
            base = base or (inner["ops"], p["wall_s"], p["peak_rss_mb"])
            rows.append([r["pp"], r["microbatches"], f"{inner['ops']:,}",
                         f"{inner['ops'] / base[0]:.1f}", f"{p['wall_s']:.2f}",
                         f"{p['wall_s'] / base[1]:.1f}", f"{replay:.2f}",
                         f"{per_op:.1f}", f"{replay / inner['ops'] * 1e6:.1f}",
                         f"{p['peak_rss_mb']:.0f}",
                         f"{(p['peak_rss_mb'] * MB) / inner['ops']:.0f}",
                         f"{inner['events']:,}", f"{inner['events'] / replay:,.0f}",
                         _loads(p)])
        lines += _table(["P", "micro-batches", "ops", "ops ratio", "wall (s)", "wall ratio",
                         "replay (s)", "wall per op (µs)", "replay per op (µs)",
                         "peak RSS (MB)", "peak RSS per op (bytes)", "SimPy events",
                         "events/s in replay", "load"], rows)
        lines += ["", "Exclusive phases per P (s):", ""]
        labels = []
        for r in d["rows"]:
            for label in r["phases"]["data"]["phases"]:
                if label not in labels:
                    labels.append(label)
        lines += _table(["phase"] + [f"P = {r['pp']}" for r in d["rows"]],
                        [[label] + [f"{r['phases']['data']['phases'].get(label, {'s': 0})['s']:.3f}"
                                    for r in d["rows"]] for label in labels])
        lines += ["", f"### cProfile of P = {d['profile_pp']}"]
        lines += _profile_tables(d["profile"])
        lines.append("")
    if "bare" in data:
        lines += ["## 4. Events per second: the engine next to bare SimPy", "",
                  f"Bare SimPy: {BARE_TIMEOUTS:,} `env.timeout(1.0)` yields in one process, "
                  f"and spread over 16 processes; events = every event scheduled (timeouts, "
                  f"process starts and ends). Engine: SimPy events the replay scheduled "
                  f"and processed / the wall time of `Replay.run` (set-up and reports "
                  f"excluded), in the best in-process run of each workload.", ""]
        bare = data["bare"]
        ref = bare["1"]["data"]["events_per_s"]
        rows = [[f"bare SimPy, {k} process(es)", f"{v['data']['events']:,}",
                 f"{v['data']['seconds']:.3f}", f"{v['data']['events_per_s']:,.0f}",
                 f"{v['data']['events_per_s'] / ref:.3f}", _loads(v)] for k, v in bare.items()]
        for name, events, seconds in data.get("engine_rates", []):
            rows.append([name, f"{events:,}", f"{seconds:.3f}", f"{events / seconds:,.0f}",
                         f"{events / seconds / ref:.3f}", ""])
        lines += _table(["loop", "events", "s", "events/s", "ratio to bare (1 process)",
                         "load"], rows)
        lines.append("")
    lines += data.get("reading_md", [])
    return "\n".join(lines) + "\n"


def engine_rates(data: dict) -> list[tuple[str, int, float]]:
    rates = []
    if "gpt3" in data:
        inner = data["gpt3"]["phases"]["data"]
        rates.append(("engine: GPT-3 175B / 1,024 GPUs replay", inner["events"],
                      inner["phases"]["replay (engine)"]["s"]))
    for r in data.get("deep", {}).get("rows", []):
        inner = r["phases"]["data"]
        rates.append((f"engine: deep pipeline P = {r['pp']} replay", inner["events"],
                      inner["phases"]["replay (engine)"]["s"]))
    return rates


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--render", action="store_true",
                        help="rewrite the .md from the saved .json, measuring nothing")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes only (a check of this script)")
    parser.add_argument("--only", action="append",
                        choices=["gpt3", "collectives", "deep", "bare"],
                        help="measure only these parts, keeping the others saved in the .json")
    parser.add_argument("--deep", help=f"pipeline depths (default "
                                       f"{','.join(map(str, DEEP_PP))})")
    parser.add_argument("--deep-profile", type=int, default=DEEP_PROFILE_PP)
    parser.add_argument("--a2a", help=f"all-to-all sizes (default "
                                      f"{','.join(map(str, A2A_RANKS))})")
    args = parser.parse_args()
    saved = json.loads(RAW.read_text()) if RAW.exists() else {}
    if args.render:
        PAGE.write_text(render(saved))
        print(f"wrote {PAGE}")
        return 0
    parts = args.only or ["bare", "gpt3", "collectives", "deep", "bare"]
    deep = tuple(int(x) for x in args.deep.split(",")) if args.deep else (
        (16, 32) if args.quick else DEEP_PP)
    a2a = tuple(int(x) for x in args.a2a.split(",")) if args.a2a else (
        (64, 128) if args.quick else A2A_RANKS)
    data = dict(saved) if args.only else {}
    data.update({"commit": commit(), "environment": environment()})
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bare_runs = []
        for part in parts:
            if part == "bare":  # before and after the rest: the best of both
                bare_runs.append(measure_bare(work, args.repeat))
            elif part == "gpt3":
                data["gpt3"] = measure_gpt3(work, args.repeat)
            elif part == "collectives":
                data["collectives"] = measure_collectives(work, args.repeat, a2a)
            elif part == "deep":
                data["deep"] = measure_deep(work, args.repeat, deep, min(args.deep_profile,
                                                                          max(deep)))
        if bare_runs:
            data["bare"] = {k: min((b[k] for b in bare_runs),
                                   key=lambda r: r["data"]["seconds"])
                            for k in bare_runs[0]}
    data["engine_rates"] = engine_rates(data)
    data["benchmark_wall_s"] = time.perf_counter() - began
    data["commit_end"] = commit()
    data["load_1min_end"] = os.getloadavg()[0]
    RESULTS.mkdir(parents=True, exist_ok=True)
    RAW.write_text(json.dumps(data, indent=1) + "\n")
    PAGE.write_text(render(data))
    print(f"wrote {RAW} and {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
