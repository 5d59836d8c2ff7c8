"""Bad input through the real command line (issue 15): every case ends within the
harness's time bound with exit code 2 and one `clustersim: error:` line on stderr that
names the flag, field or file and the rule, never a traceback, a hang or runaway memory.
The time bound lives here, in the harness (TIMEOUT_S), not in the code under test.

Files handed in (schedules, profiles, topologies, timelines) are made in a temporary
folder by the `files` fixture; `{name}` in a case's arguments is that file's path.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT_S = 60  # per case, generous on a loaded 2-core machine; a hang fails the case
GOOD_CSV = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


FILES = {
    "good.csv": GOOD_CSV,
    "binary.csv": b"\xff\xfe\x00\x81garbage\x00",
    "huge-stage.csv": "1000000000F0\n",
    "binary.json": b"\x89PNG\r\n\x1a\n\x00\x00",
    "nested.json": _nested(100_000),
    "builder-list.json": json.dumps({"builder": ["single_node"], "params": {}}),
    "nics-yes.json": json.dumps({"builder": "node", "params": {"kind": "dgx-h100",
                                                               "nics": "yes"}}),
    "many-gpus.json": json.dumps({"builder": "single_node",
                                  "params": {"device": "h100", "num_gpus": 10_000_000}}),
    "many-nodes.json": json.dumps({"builder": "fat_tree",
                                   "params": {"node_kind": "dgx-h100", "num_nodes": 100_000}}),
    "timeline-op5.json": json.dumps({"source": "sim", "meta": {}, "memory": [], "spans": [
        {"rank": 0, "lane": "compute", "op": 5, "start": 0, "end": 1}]}),
    "timeline-info.json": json.dumps({"source": "sim", "meta": {}, "memory": [], "spans": [
        {"rank": 0, "lane": "compute", "op": "0F0", "start": 0, "end": 1, "info": [1]}]}),
    "timeline-nan.json": json.dumps({"source": "sim", "meta": {}, "memory": [], "spans": [
        {"rank": 0, "lane": "compute", "op": "0F0", "start": 0, "end": float("nan")}]}),
    "timeline-empty.json": json.dumps({"source": "sim", "meta": {}, "memory": [],
                                       "spans": []}),
}

GPT = ["--model", "gpt3-1.3b"]

CASES = [  # (id, arguments, what the error line must name)
    # a huge value echoed back is cut in the error line
    ("long-model-name", ["simulate", "--model", "x" * 5000], "...(5,003 characters)"),
    # sizes that used to grow memory or run for minutes: refused before any work
    ("microbatches-1e9", ["simulate", "--pp", "1", "--microbatches", "1000000000"],
     "--max-ops"),
    ("global-batch-1e9", ["simulate", "--global-batch-size", "1000000007"],
     "global_batch_size"),
    ("show-microbatches-1e9", ["show", "gpipe", "--pp", "4", "--microbatches", "1000000000"],
     "--max-ops"),
    ("memory-microbatches", ["memory", *GPT, "--pp", "2", "--microbatches", "100000"],
     "--max-ops"),
    ("layers-1e8", ["simulate", *GPT, "--num-layers", "100000000", "--pp", "1"],
     "num_layers"),
    ("show-pp-1e5-grid", ["show", "1f1b", "--pp", "100000", "--microbatches", "1"],
     "grid"),
    ("memory-pp-1e6", ["memory", *GPT, "--pp", "1000000"], "num_layers=24"),
    ("sweep-factor", ["collective", "all_reduce", "--sweep", "--factor", "1.0001"],
     "--factor"),
    ("csv-stage-1e9", ["simulate", *GPT, "--schedule-csv", "{huge-stage.csv}"],
     "huge-stage.csv"),
    ("topology-1e7-gpus", ["simulate", "--topology", "{many-gpus.json}"], "many-gpus.json"),
    ("topology-1e5-nodes", ["simulate", "--topology", "{many-nodes.json}"],
     "many-nodes.json"),
    # tracebacks that must be one line
    ("csv-binary", ["simulate", *GPT, "--schedule-csv", "{binary.csv}"], "binary.csv"),
    ("profile-binary", ["simulate", *GPT, "--profile", "{binary.json}"], "binary.json"),
    ("topology-nested", ["simulate", "--topology", "{nested.json}"], "nested.json"),
    ("profile-nested", ["simulate", *GPT, "--profile", "{nested.json}"], "nested.json"),
    ("compare-nested", ["compare", "{nested.json}", "{timeline-empty.json}"], "nested.json"),
    ("memory-topology-nested", ["memory", *GPT, "--topology", "{nested.json}"],
     "nested.json"),
    ("bucket-nan", ["simulate", "--dp", "2", "--pp", "1", "--bucket-mb", "nan"],
     "bucket_cap_mb"),
    ("bucket-inf", ["simulate", "--dp", "2", "--pp", "1", "--bucket-mb", "inf"],
     "bucket_cap_mb"),
    ("collective-size-1e400", ["collective", "all_reduce", "--size", "1e400"], "--size"),
    ("builder-unhashable", ["simulate", "--topology", "{builder-list.json}"],
     "builder-list.json"),
    ("timeline-op-int", ["compare", "{timeline-op5.json}", "{timeline-op5.json}"],
     "timeline-op5.json"),
    ("timeline-info-list", ["compare", "{timeline-info.json}", "{timeline-info.json}"],
     "timeline-info.json"),
    # accepted but wrong: now refused
    ("csv-conflicting-pp", ["simulate", *GPT, "--schedule-csv", "{good.csv}", "--pp", "4"],
     "--pp 4 conflicts with --schedule-csv"),
    ("csv-conflicting-microbatches", ["simulate", *GPT, "--schedule-csv", "{good.csv}",
                                      "--microbatches", "8"], "--microbatches 8 conflicts"),
    ("csv-conflicting-schedule", ["simulate", *GPT, "--schedule-csv", "{good.csv}",
                                  "--schedule", "gpipe"], "--schedule gpipe conflicts"),
    ("vpp-0", ["simulate", "--vpp", "0"], "vpp"),
    ("compare-vpp-0", ["compare", *GPT, "--pp", "2", "--schedules", "interleaved-1f1b:0"],
     "vpp"),
    ("csv-empty-path", ["simulate", "--schedule-csv", ""], "--schedule-csv"),
    ("uniform-costs-inf", ["simulate", "--uniform-costs", "inf,1"], "uniform cost"),
    ("protocol-on-an-all-to-all", ["collective", "all-to-all", "--size", "1M", "--ranks", "8",
                                   "--topology", "dgx-h100", "--protocol", "Simple"],
     "--protocol: NCCL picks all-to-all's protocol itself (send/recv: LL up to 16 KiB"),
    ("uniform-costs-zero", ["simulate", "--uniform-costs", "0,0"],
     "forward and backward both 0 s"),
    ("slow-link-at-1", ["simulate", *GPT, "--pp", "2", "--dp", "2", "--microbatches", "4",
                        "--slow-link", "gpu0=1"], "1 would change nothing"),
    ("moe-imbalance-on-a-dense-model", ["simulate", *GPT, "--pp", "2", "--microbatches", "4",
                                        "--moe-imbalance", "2"], "the model has no experts"),
    ("etp-on-a-dense-model", ["simulate", *GPT, "--pp", "2", "--tp", "2",
                              "--sequence-parallel", "--microbatches", "4", "--etp", "2"],
     "expert_tensor_parallel: the model has no experts"),
    ("params-with-recompute", ["memory", "--params", "7.5B", "--recompute", "full"],
     "--recompute would change nothing"),
    ("params-with-schedule", ["memory", "--params", "7.5B", "--schedule", "gpipe"],
     "--schedule would change nothing"),
    ("moe-imbalance-inf", ["simulate", "--model", "mixtral-8x7b", "--pp", "1", "--dp", "8",
                           "--ep", "8", "--moe-imbalance", "inf"], "moe_imbalance"),
    ("moe-imbalance-above-all-tokens", ["simulate", "--model", "mixtral-8x7b", "--pp", "1",
                                        "--dp", "8", "--ep", "8", "--moe-imbalance", "5"],
     "moe_imbalance"),
    ("timeline-nan", ["compare", "{timeline-nan.json}", "{timeline-nan.json}"],
     "timeline-nan.json"),
    ("timeline-no-spans", ["compare", "{timeline-empty.json}", "{timeline-empty.json}"],
     "timeline-empty.json"),
    ("params-1e-5", ["memory", "--params", "1e-5"], "--params"),
    ("nics-yes", ["simulate", "--topology", "{nics-yes.json}"], "nics"),
    ("max-ops-0", ["show", "1f1b", "--pp", "2", "--microbatches", "2", "--max-ops", "0"],
     "--max-ops"),
    # outputs never overwrite inputs
    ("output-is-csv", ["simulate", *GPT, "--schedule-csv", "{good.csv}", "-o", "{good.csv}"],
     "never overwrites an input"),
    ("metrics-is-topology", ["simulate", "--topology", "{nics-yes.json}", "--metrics-json",
                             "{nics-yes.json}"], "never overwrites an input"),
    ("two-outputs-one-path", ["simulate", "-o", "{out.html}", "--timeline-json",
                              "{out.html}"], "both write"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    for name, content in FILES.items():
        target = folder / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    return folder


def run_cli(args: list[str], folder: Path) -> tuple[subprocess.CompletedProcess, float]:
    for name in [*FILES, "out.html"]:
        args = [a.replace("{" + name + "}", str(folder / name)) for a in args]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=folder)
    return done, time.perf_counter() - started


@pytest.mark.parametrize("args, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(args, names, files):
    done, _ = run_cli(args, files)
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("clustersim"), done.stderr
    assert "error:" in lines[0] and names in lines[0], lines[0]


def test_the_inputs_are_left_as_they_were(files):
    """The refused outputs above did not touch the inputs they named."""
    assert (files / "good.csv").read_text() == GOOD_CSV
    assert json.loads((files / "nics-yes.json").read_text())["params"]["nics"] == "yes"


def test_swapped_sends_are_refused_naming_the_pair(tmp_path):
    """NCCL pairs a rank pair's P2P ops in issue order: rank 0 sends F0 then F1, rank 1
    receives F1 first: on hardware F1 would get F0's tensor."""
    csv = tmp_path / "swapped.csv"
    csv.write_text("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                   "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n")
    done, _ = run_cli(["simulate", *GPT, "--schedule-csv", str(csv)], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "rank 0 sends 0SEND_F0 to rank 1 where rank 1 receives 1RECV_F1" in done.stderr
