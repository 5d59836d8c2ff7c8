"""Issue 19's faster engine changed no answer: a fixed set of runs (the README's GPT-3 175B
on 1,024 GPUs, GPipe, 1F1B, interleaved, zero-bubble, DualPipe, PipeDream, ZeRO/FSDP,
offload, TP/SP/CP/EP, overlap, a deep pipeline) through the command line, in this process,
compared with recorded values. Its only purpose is to show that the speed-up changed no
answer: it checks the simulator against its own earlier output, not against the world
(the other tests do that). The values were recorded on commit 13dc3f2, before the speed-up,
and held through it up to 24d2dd7; issue 22 then changed the model on purpose (NCCL's
collectives, achievable link rates, the attainment re-derived), so they were recorded
again on 17cc2de, the commit that made that change, and hold the speed work after it.
The all-to-alls' send/recv latency (sim.nccl_tuning.p2p_latency_us) changed mixtral-ep4's
answer on purpose, and one optimizer step per rank over all its model chunks
(schedules.contract) the README's 175B (interleaved, dp 8: 8.2002 -> 8.2074 s): those
cases alone were recorded again with their change (`recorded` in the data file).

Recorded: iteration time, the time breakdown and peak in-flight microbatches of every
rank, peak memory and the time it is first reached, held to 1e-9 relative (the 175B
iteration time, which the issue asks to hold to 0.1%, too).

    python tests/test_engine_speed_unchanged.py --record          # on 17cc2de only
    python tests/test_engine_speed_unchanged.py --record NAME ... --why "..."  # those only
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "data" / "engine_speed_baseline.json"
GPT = ["--model", "gpt3-1.3b"]
SMALL = ["--model", "llama3-8b", "--num-layers", "8"]

GPT3_175B = ["--model", "gpt3-175b", "--topology", "dgx-h100-x128-ndr-ft", "--tp", "8",
             "--pp", "16", "--vpp", "2", "--schedule", "interleaved-1f1b", "--dp", "8",
             "--global-batch-size", "1536", "--recompute", "selective",
             "--sequence-parallel"]  # README.md, "GPT-3 175B on 1024 GPUs"

CASES = {
    "gpt3-175b-readme": GPT3_175B,
    "gpipe": ["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", *GPT,
              "--topology", "dgx-a100"],
    "1f1b-dp2": ["--pp", "4", "--dp", "2", "--microbatches", "8", *GPT],
    "interleaved": ["--schedule", "interleaved-1f1b", "--pp", "4", "--vpp", "2",
                    "--microbatches", "16", *GPT, "--topology", "dgx-a100"],
    "zb-h1": ["--schedule", "zb-h1", "--pp", "4", "--microbatches", "8", *GPT],
    "zbv": ["--schedule", "zbv-zero-bubble", "--pp", "4", "--microbatches", "8", *SMALL],
    "dualpipe": ["--schedule", "dualpipe", "--pp", "4", "--microbatches", "8", *SMALL,
                 "--dp", "2"],
    "pipedream": ["--schedule", "pipedream", "--pp", "4", "--microbatches", "4", *SMALL],
    "zero3-dp8": ["--pp", "1", "--dp", "8", "--zero", "3", "--microbatches", "2", *GPT],
    "fsdp-pp2": ["--pp", "2", "--dp", "4", "--fsdp", "full", "--microbatches", "4", *SMALL],
    "zero1-offload": ["--pp", "2", "--dp", "2", "--zero", "1", "--offload",
                      "--microbatches", "4", *GPT],
    "tp2-sp-cp2-overlap": ["--tp", "2", "--sequence-parallel", "--tp-comm-overlap",
                           "--cp", "2", "--pp", "2", "--microbatches", "4", *SMALL],
    "mixtral-ep4": ["--model", "mixtral-8x7b", "--num-layers", "4", "--ep", "4", "--dp", "4",
                    "--pp", "2", "--microbatches", "4"],
    "full-recompute-pa-cpu": ["--tp", "2", "--pp", "2", "--microbatches", "4",
                              "--recompute", "full", "--partition-activations",
                              "--cpu-checkpointing", *SMALL],
    "uniform-1f1b": ["--pp", "4", "--microbatches", "8", "--uniform-costs", "1,2", *SMALL],
    "deep-1f1b-pp32": ["--model", "llama3-8b", "--num-layers", "32", "--pp", "32",
                       "--microbatches", "128", "--schedule", "1f1b",
                       "--topology", "dgx-h100-x128-ndr-ft"],
}


def numbers(args: list[str]) -> dict:
    """The recorded numbers of `clustersim simulate ARGS` (module docstring)."""
    return _numbers(tuple(args))


@functools.cache
def _numbers(args: tuple[str, ...]) -> dict:
    from clustersim.sim.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.json"
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["simulate", *args, "--no-html", "--metrics-json", str(path)])
        assert code == 0, f"clustersim simulate {' '.join(args)} exited {code}"
        data = json.loads(path.read_text())
    per_rank = data["per_rank"]
    return {"iteration_time": data["iteration_time"],
            "time_breakdown": data["time_breakdown"]["per_rank"],
            "peak_in_flight": per_rank["peak_in_flight_microbatches"],
            "peak_memory_bytes": per_rank["peak_memory_bytes"],
            "peak_memory_time": per_rank["peak_memory_time"]}


def flatten(value, path: str = "") -> dict[str, float]:
    """{'a/b/0': number} for every number in nested dicts."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items()
                for k, v in flatten(item, f"{path}/{key}").items()}
    return {path: value}


@pytest.fixture(scope="module")
def baseline() -> dict:
    return json.loads(BASELINE.read_text())


@pytest.mark.parametrize("name", CASES)
def test_speed_up_changed_no_answer(baseline, name):
    """Only purpose: show the speed-up changed no answer (module docstring)."""
    recorded = flatten(baseline["cases"][name])
    got = flatten(numbers(CASES[name]))
    assert got.keys() == recorded.keys()
    assert got == pytest.approx(recorded, rel=1e-9, abs=1e-12)


def test_gpt3_175b_iteration_time_unchanged(baseline):
    """Only purpose: show the speed-up changed no answer. The README's GPT-3 175B run on
    1,024 GPUs keeps the iteration time it had when recorded (8.0696 s at 13dc3f2, 8.2002 s
    at 17cc2de under issue 22's model, 8.2074 s once a rank's optimizer step waits for all
    its chunks' gradients), within the 0.1% the issue allows (and, per the test above,
    within 1e-9)."""
    recorded = baseline["cases"]["gpt3-175b-readme"]["iteration_time"]
    assert recorded == pytest.approx(8.2074, abs=5e-5)
    got = numbers(GPT3_175B)["iteration_time"]
    assert got == pytest.approx(recorded, rel=1e-3)


def _record(names: list[str], why: str) -> None:
    """Record every case (`names` empty), or only `names` into the saved baseline, noting
    `why` for each of them under 'recorded'."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT, check=True).stdout.strip()
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        sys.exit(f"unknown cases: {', '.join(unknown)}; known: {', '.join(CASES)}")
    data = json.loads(BASELINE.read_text()) if names else {"commit": commit, "cases": {}}
    for name in names or CASES:
        print(name, file=sys.stderr)
        data["cases"][name] = numbers(CASES[name])
        if names:
            data.setdefault("recorded", {})[name] = f"after {commit[:7]}: {why}"
    BASELINE.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Record the baseline (module docstring).")
    parser.add_argument("--record", nargs="*", metavar="NAME", required=True,
                        help="the cases to record again (none: all, a new baseline)")
    parser.add_argument("--why", default="", help="the model change that moved them")
    args = parser.parse_args()
    if args.record and not args.why:
        parser.error("--why: say which model change moved the cases recorded again")
    _record(args.record, args.why)
