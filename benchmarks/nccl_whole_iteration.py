"""The whole-iteration effect of issue 22's collective model (NCCL's algorithms, protocols
and tuner; achievable link rates): the README's GPT-3 175B on 1,024 GPUs and the Hopper
fidelity table of issue 10, before and after.

Before = a checkout of the commit before the change (`--before-tree`, a git worktree at
24d2dd7), run in a subprocess with that tree first on the import path; after = this tree.
The Hopper table's rows come from the two runs of benchmarks/fidelity_hopper.py
(`--before-fidelity`: the JSON the old commit wrote, e.g. `git show
24d2dd7:benchmarks/results/fidelity_hopper.json`; after: results/fidelity_hopper.json).

    python benchmarks/nccl_whole_iteration.py --before-tree /tmp/before \\
        --before-fidelity /tmp/fidelity_hopper_before.json
Writes benchmarks/results/nccl_whole_iteration.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from environment import environment_markdown, importable

HERE = Path(__file__).parent
RESULTS = HERE / "results"
GPT3_175B = ["simulate", "--model", "gpt3-175b", "--topology", "dgx-h100-x128-ndr-ft",
             "--tp", "8", "--pp", "16", "--vpp", "2", "--schedule", "interleaved-1f1b",
             "--dp", "8", "--global-batch-size", "1536", "--recompute", "selective",
             "--sequence-parallel", "--no-html"]


def run_175b(tree: Path | None) -> dict:
    """The README job's iteration time, bubble and exposed communication, from `tree`
    (a checkout: its root is the clustersim package), or this tree."""
    with importable(tree if tree is not None else HERE.parent) as folder:
        out = subprocess.run([sys.executable, "-m", "clustersim", *GPT3_175B], cwd=folder,
                             env={**os.environ, "PYTHONPATH": str(folder)},
                             capture_output=True, text=True, check=True).stdout
    found = re.search(r"iteration time ([\d.]+) s, bubble fraction ([\d.]+).*exposed "
                      r"communication ([\d.]+)", out)
    return {"iteration_s": float(found[1]), "bubble": float(found[2]),
            "exposed_comm": float(found[3])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-tree", type=Path, required=True)
    parser.add_argument("--before-fidelity", type=Path, required=True)
    args = parser.parse_args()
    before, after = run_175b(args.before_tree), run_175b(None)
    old = json.loads(args.before_fidelity.read_text())
    new = json.loads((RESULTS / "fidelity_hopper.json").read_text())
    lines = ["# Issue 22: the whole-iteration effect of NCCL's collectives", "",
             environment_markdown(), "",
             "Produced by `python benchmarks/nccl_whole_iteration.py` (method: its "
             "docstring). Before: commit 24d2dd7 (step-synchronous alpha-beta collectives, "
             "links at line rate). After: this tree (NCCL's algorithm, protocol and tuner; "
             "links at NCCL's achievable rates).", "",
             "## GPT-3 175B on 1,024 H100 (the README's command)", "",
             "| | iteration (s) | bubble fraction | exposed communication |",
             "|---|---:|---:|---:|"]
    for name, r in (("before", before), ("after", after)):
        lines.append(f"| {name} | {r['iteration_s']:.3f} | {r['bubble']:.4f} | "
                     f"{r['exposed_comm']:.4f} |")
    lines += ["", f"Change: {after['iteration_s'] / before['iteration_s'] - 1:+.1%}.", "",
              "## Hopper fidelity table (issue 10, benchmarks/fidelity_hopper.py)", "",
              "Error = published s / predicted s - 1 (positive: the simulator predicts a "
              "faster iteration than was measured).", "",
              "| | mean abs error | mean signed error | max abs error | within 10% |",
              "|---|---:|---:|---:|---:|"]
    for name, s in (("before", old["summary"]), ("after", new["summary"])):
        lines.append(f"| {name} | {s['mean_abs_error']:.1%} | {s['mean_error']:+.1%} | "
                     f"{s['max_abs_error']:.1%} | {s['within_10']} of {s['rows']} |")
    lines += ["", "| row | published s | before s | before error | after s | after error "
              "| predicted time change |", "|---|---:|---:|---:|---:|---:|---:|"]
    by_id = {r["id"]: r for r in old["rows"]}
    for r in new["rows"]:
        o = by_id.get(r["id"])
        if not o or not r.get("predicted_s") or not o.get("predicted_s"):
            continue
        lines.append(f"| {r['id']} | {r['published_s']:.3f} | {o['predicted_s']:.3f} | "
                     f"{o['error']:+.1%} | {r['predicted_s']:.3f} | {r['error']:+.1%} | "
                     f"{r['predicted_s'] / o['predicted_s'] - 1:+.1%} |")
    (RESULTS / "nccl_whole_iteration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))


if __name__ == "__main__":
    main()
