"""Simulated vs measured on this CPU: calibrate, run for real, simulate with the profile.

The issue's must-show: 2 ranks on this 2-core machine, PP=2 with GPipe and 1F1B, and
DP=2, each run for real (gloo, one torch thread per rank), and the simulator's
prediction from `clustersim calibrate --device cpu` within 10% of the measured median;
also PP=2 1F1B with full recompute (the kernels checkpoint every layer; the profile,
measured without recompute, adds one layer forward to each layer's backward).

Everything goes through the CLI, as a user runs it. This VM's speed drifts (a plain
512x512 matmul varies by +-15% over half a minute), so the script runs ROUNDS rounds of
(calibrate, then every config for real) and reports medians over all rounds: the
measured median iteration time against the median of the rounds' predictions. The box
may be shared: a sampler adds up the CPU time of processes outside this script's process
tree, a round in which they took more than MAX_FOREIGN of the CPUs is discarded and run
again (and reported), and each round waits for a quiet machine first.
Writes benchmarks/results/calibration_cpu.md and the raw numbers beside it (.json).

    python benchmarks/calibration_cpu.py            # about 9 minutes on 2 cores
    python benchmarks/calibration_cpu.py --render   # the .md again from the .json
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from environment import environment_markdown
from run_cli import ROOT, clustersim, command

RESULTS = ROOT / "benchmarks" / "results"
ROUNDS = 5
MAX_FOREIGN = 0.10  # of all CPUs, used by other processes during a round
ITERATIONS, WARMUP = 3, 1
# 4 layers, hidden 512, seq 256, micro-batch 2, fp32: one layer's forward is ~55 ms on one
# core (3.5 GFLOP), so every op lasts 50-300 ms, far above gloo's ~0.5 ms P2P latency,
# Python's per-op overhead and the scheduler's millisecond jitter; and an iteration stays
# ~2-4 s, so several rounds fit in minutes. Vocab 4096 makes the head ~2/3 of a layer.
MODEL = ("--model", "gpt3-1.3b", "--num-layers", "4", "--hidden-size", "512",
         "--num-attention-heads", "8", "--seq-length", "256", "--vocab-size", "4096",
         "--micro-batch-size", "2", "--dtype", "fp32")
CONFIGS = {
    "PP=2 GPipe": ("--schedule", "gpipe", "--pp", "2", "--microbatches", "4"),
    "PP=2 1F1B": ("--schedule", "1f1b", "--pp", "2", "--microbatches", "4"),
    "DP=2": ("--schedule", "1f1b", "--pp", "1", "--dp", "2", "--microbatches", "4"),
    "PP=2 1F1B, full recompute": ("--schedule", "1f1b", "--pp", "2", "--microbatches", "4",
                                  "--recompute", "full"),
}


class ForeignLoad:
    """CPU seconds used, while active, by processes outside this process's tree (sampled
    from /proc every `interval` s; a process's ancestry decides whose it is)."""

    def __init__(self, interval: float = 0.25):
        self.interval, self.me = interval, os.getpid()
        self.foreign = self.own = self.wall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _snapshot() -> dict[int, tuple[int, float]]:
        tick, procs = os.sysconf("SC_CLK_TCK"), {}
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            rest = text[text.rindex(")") + 2:].split()  # state ppid ... utime stime
            procs[int(name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
        return procs

    def _ours(self, pid: int, procs: dict) -> bool:
        for _ in range(64):
            if pid == self.me:
                return True
            if pid <= 1:
                return False
            pid = procs.get(pid, (0, 0.0))[0]
        return False

    def _sample(self) -> None:
        now = self._snapshot()
        for pid, (_, cpu) in now.items():
            delta = cpu - self._last.get(pid, (0, 0.0))[1]
            if delta > 0:
                if self._ours(pid, now):
                    self.own += delta
                else:
                    self.foreign += delta
        self._last = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ForeignLoad:
        self._last, self._started = self._snapshot(), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self._started

    @property
    def fraction(self) -> float:
        return self.foreign / (self.wall * (os.cpu_count() or 1)) if self.wall else 0.0


def wait_for_quiet(limit_s: float = 900.0) -> float:
    """Wait (up to limit_s) until other processes use <= MAX_FOREIGN of the CPUs over 5 s;
    the last measured fraction."""
    deadline = time.monotonic() + limit_s
    while True:
        with ForeignLoad() as probe:
            time.sleep(5)
        if probe.fraction <= MAX_FOREIGN or time.monotonic() > deadline:
            return probe.fraction
        print(f"waiting: other processes use {probe.fraction:.0%} of the CPUs",
              file=sys.stderr)
        time.sleep(20)


def one_round(index: int, work: Path) -> dict:
    profile = f"profile{index}.json"
    started = time.perf_counter()
    clustersim("calibrate", "--device", "cpu", *MODEL, "-o", profile, cwd=work)
    out = {"calibrate_s": time.perf_counter() - started,
           "profile": json.loads((work / profile).read_text()), "configs": {}}
    for name, flags in CONFIGS.items():
        tag = f"{index}-{name.replace('=', '').replace(',', '').replace(' ', '-').lower()}"
        clustersim("run", "--device", "cpu", *flags, *MODEL, "--iterations", str(ITERATIONS),
                   "--warmup-iterations", str(WARMUP), "--timeline-json", f"measured{tag}.json",
                   "-o", f"measured{tag}.html", cwd=work)
        clustersim("simulate", *flags, *MODEL, "--profile", profile,
                   "--timeline-json", f"sim{tag}.json", "-o", f"sim{tag}.html", cwd=work)
        compare = json.loads(clustersim("compare", f"sim{tag}.json", f"measured{tag}.json",
                                        "--json", cwd=work).stdout)
        measured = json.loads((work / f"measured{tag}.json").read_text())
        out["configs"][name] = {
            "iteration_times": measured["meta"]["iteration_times"],
            "predicted": compare["a"]["iteration_time_s"], "compare": compare}
        print(f"round {index} {name}: measured {measured['meta']['iteration_times']}, "
              f"predicted {compare['a']['iteration_time_s']:.3f}", file=sys.stderr)
    return out


def summarise(rounds: list[dict]) -> list[dict]:
    rows = []
    for name in CONFIGS:
        times = [t for r in rounds for t in r["configs"][name]["iteration_times"]]
        predicted = [r["configs"][name]["predicted"] for r in rounds]
        measured, pred = statistics.median(times), statistics.median(predicted)
        kinds: dict[str, list[float]] = {}
        for r in rounds:
            for k in r["configs"][name]["compare"]["op_kinds"]:
                if k["error_pct"] is not None and k["kind"] in ("F", "B", "ALL_REDUCE"):
                    kinds.setdefault(k["kind"], []).append(k["error_pct"])
        rows.append({"config": name, "measured": measured, "min": min(times), "max": max(times),
                     "runs": len(times), "predicted": pred, "pred_min": min(predicted),
                     "pred_max": max(predicted), "error": (pred - measured) / measured * 100,
                     "round_errors": [(r["configs"][name]["predicted"]
                                       - statistics.median(r["configs"][name]["iteration_times"]))
                                      / statistics.median(r["configs"][name]["iteration_times"])
                                      * 100 for r in rounds],
                     "kind_errors": {k: statistics.median(v) for k, v in kinds.items()}})
    return rows


def markdown(rows: list[dict], data: dict, rounds: list[dict]) -> str:
    load, elapsed, env = data["load"], data["elapsed_s"], data["environment"]
    discarded = data.get("discarded_foreign", [])
    profile = rounds[-1]["profile"]
    layer = profile["compute"]["layer"]
    lines = [
        "# Calibrated simulator vs measured runs on this CPU",
        "",
        "Two rank processes on this 2-core machine (gloo over loopback, one torch thread "
        "each). Per round: `clustersim calibrate --device cpu`, then every configuration "
        f"run for real ({WARMUP} warm-up + {ITERATIONS} timed iterations) and simulated "
        f"with that round's profile; {len(rounds)} rounds. Measured = median of all timed "
        "iterations; predicted = median of the rounds' predictions; error = "
        "(predicted - measured) / measured. Target: within 10%.",
        "",
        "| configuration | measured median (min-max, runs) | predicted (min-max) | error | "
        "error per round | mean F / B / all-reduce duration error |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        kinds = " / ".join(f"{r['kind_errors'][k]:+.1f}%" for k in ("F", "B", "ALL_REDUCE")
                           if k in r["kind_errors"])
        lines.append(
            f"| {r['config']} | {r['measured'] * 1e3:.0f} ms ({r['min'] * 1e3:.0f}-"
            f"{r['max'] * 1e3:.0f}, {r['runs']}) | {r['predicted'] * 1e3:.0f} ms "
            f"({r['pred_min'] * 1e3:.0f}-{r['pred_max'] * 1e3:.0f}) | **{r['error']:+.1f}%** | "
            + ", ".join(f"{e:+.1f}%" for e in r["round_errors"]) + f" | {kinds} |")
    p2p = profile["p2p"]
    reduce2 = profile["collectives"].get("all_reduce", {}).get("2")
    lines += [
        "",
        "Last round's profile: one layer F {:.1f} ms, B {:.1f} ms, I {:.1f} ms, W {:.1f} ms; "
        "head F {:.1f} ms, B {:.1f} ms; P2P alpha {:.0f} us, {:.2f} GB/s{}.".format(
            layer["F"] * 1e3, layer["B"] * 1e3, layer["I"] * 1e3, layer["W"] * 1e3,
            profile["compute"]["head"]["F"] * 1e3, profile["compute"]["head"]["B"] * 1e3,
            p2p["alpha"] * 1e6, 1 / p2p["beta"] / 1e9 if p2p["beta"] else float("inf"),
            "" if not reduce2 else "; all-reduce (2 ranks) alpha {:.0f} us, {:.2f} GB/s".format(
                reduce2["alpha"] * 1e6, 1 / reduce2["beta"] / 1e9 if reduce2["beta"]
                else float("inf"))),
        f"Calibration took {statistics.median(r['calibrate_s'] for r in rounds):.0f} s "
        f"(median) per round; the whole benchmark {elapsed / 60:.1f} min. Load average "
        f"before it: {load[0]:.2f} (1 min). Other processes' share of the CPUs during the "
        "kept rounds: " + ", ".join(f"{r.get('foreign', 0):.1%}" for r in rounds)
        + (f"; {len(discarded)} round(s) discarded for more than {MAX_FOREIGN:.0%} ("
           + ", ".join(f"{f:.0%}" for f in discarded) + ")" if discarded else
           f"; no round was discarded (limit {MAX_FOREIGN:.0%})") + ".",
        "",
        "Model: 4 layers, hidden 512, 8 heads, seq 256, micro-batch 2, vocab 4096, fp32; "
        "4 microbatches per iteration. One layer's forward is ~3.5 GFLOP (~55 ms on one "
        "core), so each op lasts 50-300 ms: far above gloo's sub-millisecond P2P latency, "
        "the per-op Python overhead and scheduler jitter, so the comparison tests the "
        "model of the schedule rather than noise.",
        "",
        "## Commands (one round)",
        "",
        "```bash",
        command("calibrate", "--device", "cpu", *MODEL, "-o", "profile.json"),
    ]
    for name, flags in CONFIGS.items():
        lines += [f"# {name}",
                  command("run", "--device", "cpu", *flags, *MODEL, "--iterations",
                          str(ITERATIONS), "--warmup-iterations", str(WARMUP),
                          "--timeline-json", "measured.json"),
                  command("simulate", *flags, *MODEL, "--profile", "profile.json",
                          "--timeline-json", "sim.json"),
                  command("compare", "sim.json", "measured.json", "-o", "compare.html")]
    lines += [
        "```",
        "",
        "## Limits",
        "",
        "- CPU timings calibrate only this CPU and gloo over loopback; they say nothing "
        "about a GPU cluster.",
        "- The simulator's P2P and all-reduce are measured alpha-beta fits with no "
        "contention model; compute is per layer plus first-/last-stage extras measured in "
        "isolation, so cache and allocator interactions between a stage's layers and "
        "between microbatches are not modelled.",
        "- Compute was calibrated with both rank processes busy at once (as in a 2-rank "
        "run); while one rank idles in a pipeline bubble the other runs a little faster "
        "than the profile says.",
        "- GPipe and 1F1B are predicted equal (two stages: same ops, same bubble); their "
        "measured medians differ by a few percent, in either direction from one benchmark "
        "run to the next. GPipe holds all 4 microbatches' activations; allocator and cache "
        "effects of the memory in flight are not in a profile measured with one "
        "microbatch in flight.",
        "- DP=2: the measured all-reduce span runs from this rank's post to completion, so "
        "it includes waiting for the slower replica (the two cores drift apart by ~0.1-0.2 s "
        "per iteration); the simulator's replicas are identical, so its all-reduce is the "
        "fitted transfer only (hence the large all-reduce duration error). The executor "
        "also flattens the gradients into one buffer before posting (~0.1 s for 59 MB on "
        "this CPU), a gap the simulator does not model.",
        "- This VM's speed drifts by +-15% over tens of seconds (see the min-max columns); "
        "the medians over rounds average that out, a single run may not.",
        "",
        "## Environment",
        "",
        env,
        f"- torch: {profile['versions']['torch']}",
        f"- profile source: {profile['source']}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    raw = RESULTS / "calibration_cpu.json"
    if "--render" in sys.argv[1:]:
        data = json.loads(raw.read_text())
    else:
        load = os.getloadavg()
        started = time.perf_counter()
        rounds, discarded = [], []
        with tempfile.TemporaryDirectory(prefix="clustersim-calibration-") as tmp:
            for attempt in range(3 * ROUNDS):
                if len(rounds) == ROUNDS:
                    break
                wait_for_quiet()
                with ForeignLoad() as foreign:
                    result = one_round(attempt, Path(tmp))
                result["foreign"] = foreign.fraction
                print(f"round {attempt}: other processes used {foreign.fraction:.1%} of "
                      "the CPUs", file=sys.stderr)
                (rounds if foreign.fraction <= MAX_FOREIGN else discarded).append(result)
        data = {"rounds": rounds, "discarded_foreign": [r["foreign"] for r in discarded],
                "load": load, "elapsed_s": time.perf_counter() - started,
                "environment": environment_markdown()}
        RESULTS.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(data, indent=1))
    text = markdown(summarise(data["rounds"]), data, data["rounds"])
    (RESULTS / "calibration_cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
