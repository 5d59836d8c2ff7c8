"""Simulator speed: wall time and ops/s of a 1F1B replay for growing P x M.

Each case builds the schedule, checks it, lowers and costs it (Llama-3 8B stages scaled to
P), and replays it on a P-GPU NVSwitch domain with the roofline cost model; timings are
the best of `--repeat` runs. Writes benchmarks/results/sim_speed.md.
Target (issue 2): P=16, M=256 under 1 s on the 2-core dev machine.

    python benchmarks/sim_speed.py [--repeat 3] [--quick]
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from environment import environment_markdown
from schedules.model import get_model
from schedules.parallel import ParallelConfig
from sim.simulate import simulate
from topologies import single_node

CASES = [(4, 16), (8, 64), (16, 128), (16, 256), (32, 256), (64, 256), (64, 512)]
RESULTS = Path(__file__).parent / "results" / "sim_speed.md"


def time_case(pp: int, microbatches: int, repeat: int) -> tuple[float, int, float]:
    model = get_model("llama3-8b", num_layers=pp * 4)
    parallel = ParallelConfig(pp=pp, num_microbatches=microbatches, schedule="1f1b")
    topology = single_node("h100-sxm", num_gpus=pp)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        timeline = simulate(model, parallel, topology)
        best = min(best, time.perf_counter() - start)
    ops = pp * microbatches * 2 + 4 * (pp - 1) * microbatches  # compute + P2P ops
    return best, ops, timeline.iteration_time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the cases up to P=16")
    args = parser.parse_args()
    logging.getLogger("sim").setLevel(logging.ERROR)  # deep pipelines of 8B layers exceed HBM
    cases = [c for c in CASES if not args.quick or c[0] <= 16]
    rows = ["| P | M | ops | wall time (s) | ops/s | simulated iteration (s) |",
            "|---:|---:|---:|---:|---:|---:|"]
    for pp, mb in cases:
        wall, ops, sim_time = time_case(pp, mb, args.repeat)
        rows.append(f"| {pp} | {mb} | {ops} | {wall:.3f} | {ops / wall:,.0f} | {sim_time:.3f} |")
        print(rows[-1], flush=True)
    RESULTS.write_text(
        "# Simulator speed: 1F1B, Llama-3 8B layers scaled to P, roofline costs\n\n"
        f"Best of {args.repeat} runs of `simulate()` (check, lower, cost, replay).\n\n"
        + environment_markdown() + "\n\n" + "\n".join(rows) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
