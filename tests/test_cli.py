"""The clustersim command line, run as a user runs it (a real subprocess)."""
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def clustersim(*args, cwd=None, check=True):
    result = subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True,
                            text=True, cwd=cwd or ROOT, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {result.stderr}")
    return result


def test_simulate_defaults_write_gantt(tmp_path):
    out = clustersim("simulate", cwd=tmp_path)
    html = tmp_path / "gantt.html"
    assert html.exists() and html.stat().st_size > 1_000_000  # plotly.js inlined
    assert "1f1b" in out.stdout and "bubble fraction" in out.stdout


@pytest.mark.parametrize("schedule, vpp, expected_time, idle", [
    ("gpipe", 1, 33, 9), ("1f1b", 1, 33, 9), ("interleaved-1f1b", 2, 57, 9)])
def test_uniform_costs_metrics_match_closed_form(tmp_path, schedule, vpp, expected_time, idle):
    metrics = tmp_path / "m.json"
    clustersim("simulate", "--schedule", schedule, "--pp", "4", "--vpp", str(vpp),
               "--microbatches", "8", "--uniform-costs", "1,2", "--num-layers", "32",
               "-o", str(tmp_path / "g.html"), "--metrics-json", str(metrics),
               "--trace-json", str(tmp_path / "t.json"))
    data = json.loads(metrics.read_text())
    assert data["iteration_time"] == expected_time
    assert Fraction(data["bubble_fraction"]).limit_denominator(1000) == Fraction(idle, expected_time)
    assert set(data["per_rank"]["bubble_fraction"]) == {"0", "1", "2", "3"}
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_show_grid_and_torch_csv_round_trip(tmp_path):
    grid = clustersim("show", "1f1b", "--pp", "4", "--microbatches", "8").stdout
    assert grid.splitlines()[1].split()[2] == "0F0"  # rank 0 starts with 0F0
    csv = clustersim("show", "interleaved-1f1b", "--pp", "2", "--microbatches", "4",
                     "--vpp", "2", "--format", "torch-csv").stdout
    rows = csv.strip().splitlines()
    assert len(rows) == 2 and rows[0].split(",")[0] == "0F0"
    path = tmp_path / "custom.csv"
    path.write_text(csv)
    metrics = tmp_path / "m.json"
    clustersim("simulate", "--schedule-csv", str(path), "--uniform-costs", "1,2",
               "--num-layers", "32", "-o", str(tmp_path / "g.html"),
               "--metrics-json", str(metrics))
    # interleaved closed form: M*V*(F+B) + (P-1)*(F+B) = 4*2*3 + 1*3
    assert json.loads(metrics.read_text())["iteration_time"] == 27


def test_compare_table_and_html(tmp_path):
    out = clustersim("compare", "--schedules", "gpipe,1f1b,interleaved-1f1b:2", "--pp", "4",
                     "--microbatches", "8", "--uniform-costs", "1,2", "--num-layers", "32",
                     "--json", "-o", str(tmp_path / "c.html"))
    rows = json.loads(out.stdout[:out.stdout.rindex("]") + 1])
    assert [r["iteration_time_s"] for r in rows] == [33, 33, 57]
    assert rows[0]["peak_in_flight"] == [8, 8, 8, 8]  # GPipe holds every microbatch
    assert rows[1]["peak_in_flight"] == [4, 3, 2, 1]  # 1F1B holds P - rank
    assert (tmp_path / "c.html").exists()


@pytest.mark.parametrize("args, words", [
    (["simulate", "--pp", "3"], ["num_layers", "divisible"]),
    (["simulate", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6"],
     ["multiple of pp"]),
    (["simulate", "--schedule", "zigzag"], ["unknown schedule", "1f1b"]),
    (["simulate", "--model", "gpt5"], ["gpt5"]),
    (["simulate", "--topology", "nowhere.json"], ["nowhere.json"]),
    (["simulate", "--uniform-costs", "1"], ["--uniform-costs"]),
    (["simulate", "--pp", "16"], ["16 GPUs"]),
    (["show", "1f1b", "--pp", "0", "--microbatches", "4"], ["pp"]),
    (["simulate", "--pp", "abc"], ["--pp", "invalid int"]),
    (["show", "1f1b"], ["--microbatches", "required"]),
])
def test_user_errors_are_one_clear_line(args, words):
    result = clustersim(*args, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("clustersim") and ": error: " in lines[0]
    for word in words:
        assert word in lines[0]


def test_deadlocked_csv_is_reported_with_stuck_ops(tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1B1,1B0,1F1\n")
    result = clustersim("simulate", "--schedule-csv", str(path), "--uniform-costs", "1,2",
                        "--num-layers", "32", "-o", str(tmp_path / "g.html"), check=False)
    assert result.returncode == 3
    assert "deadlock" in result.stderr and "1B1" in result.stderr
    assert ">1B1<" in result.stderr and "Traceback" not in result.stderr
