"""The clustersim command line, run as a user runs it (a real subprocess)."""
import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def clustersim(*args, cwd=None, check=True):
    result = subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                            text=True, cwd=cwd or ROOT, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {result.stderr}")
    return result


def test_simulate_defaults_write_gantt(tmp_path):
    out = clustersim("simulate", cwd=tmp_path)
    html = tmp_path / "gantt.html"
    assert html.exists() and html.stat().st_size > 1_000_000  # plotly.js inlined
    assert "1f1b" in out.stdout and "bubble fraction" in out.stdout


def test_each_command_is_in_its_module_and_a_command_line_imports_only_it():
    """sim.cli.MODULES names, for every command `clustersim --help` lists, the module that
    runs it; running `collective` imports neither the planner, serving nor plotting."""
    import importlib

    from clustersim.sim.cli import MODULES, build_parser
    listed = build_parser()._subparsers._group_actions[0].choices
    assert set(listed) == set(MODULES)
    for command, module in MODULES.items():
        assert command in importlib.import_module(f"clustersim.sim.cli.{module}").COMMANDS
    probe = ("import sys; from clustersim.sim.cli import main; "
             "code = main(['collective', 'all-reduce', '--size', '1M', '--ranks', '8']); "
             "print(code, sorted(m for m in sys.modules if m.startswith(('clustersim.sim.planner',"
             " 'clustersim.sim.serving', 'plotly', 'pandas'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.splitlines()[-1] == "0 []", out.stdout + out.stderr


def test_the_program_leaves_fast_with_every_output_whole(tmp_path):
    """`clustersim simulate` ends its process right after flushing (sim.cli.LEAVE_FAST):
    every file it wrote is complete, its stdout is all there, its exit code is kept, and an
    error still exits 2 with one line."""
    out = clustersim("simulate", "--pp", "2", "--microbatches", "4", "-o", "g.html",
                     "--metrics-json", "m.json", "--trace-json", "t.json", cwd=tmp_path)
    assert json.loads((tmp_path / "m.json").read_text())["iteration_time"] > 0
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "g.html").read_text().rstrip().endswith("</html>")
    assert "wrote g.html" in out.stdout
    bad = clustersim("simulate", "--pp", "0", "--no-html", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_ctrl_c_ends_with_one_line_and_exit_130(tmp_path):
    """SIGINT during a replay (a deep pipeline: seconds of replay) ends the command with one
    line and the shell's 128 + SIGINT, no traceback, no partial output file."""
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-m", "clustersim", "simulate", "--model",
                             "llama3-8b", "--num-layers", "128", "--pp", "128", "--microbatches",
                             "512", "--topology", "dgx-h100-x128-ndr-ft", "--max-ops",
                             "1100000", "-o", "g.html"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(5.0)  # past the imports (0.6 s unloaded), into the replay (about 12 s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["clustersim: interrupted"]
    assert not (tmp_path / "g.html").exists()


@pytest.mark.parametrize("schedule, vpp, expected_time, idle", [
    ("gpipe", 1, 33, 9), ("1f1b", 1, 33, 9), ("interleaved-1f1b", 2, 57, 9)])
def test_uniform_costs_metrics_match_closed_form(tmp_path, schedule, vpp, expected_time, idle):
    metrics = tmp_path / "m.json"
    clustersim("simulate", "--schedule", schedule, "--pp", "4", "--vpp", str(vpp),
               "--microbatches", "8", "--uniform-costs", "1,2", "--model", "llama3-8b",
               "--num-layers", "32",
               "-o", str(tmp_path / "g.html"), "--metrics-json", str(metrics),
               "--trace-json", str(tmp_path / "t.json"))
    data = json.loads(metrics.read_text())
    assert data["iteration_time"] == expected_time
    assert Fraction(data["bubble_fraction"]).limit_denominator(1000) == Fraction(idle, expected_time)
    assert set(data["per_rank"]["bubble_fraction"]) == {"0", "1", "2", "3"}
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


@pytest.mark.parametrize("layout", [
    ["--pp", "1", "--dp", "2", "--microbatches", "2"],
    ["--pp", "1", "--dp", "2", "--microbatches", "2", "--zero", "3"],
    ["--pp", "2", "--dp", "2", "--microbatches", "4"],
    ["--pp", "2", "--dp", "2", "--microbatches", "4", "--zero", "1"],
])
def test_uniform_costs_closed_form_holds_with_data_parallelism(tmp_path, layout):
    """Free communication: a DP pass that splits the last backward into layer groups must
    not change the 1F1B closed form (M + P - 1)(F + B) (issue 14, item 2)."""
    metrics = tmp_path / "m.json"
    clustersim("simulate", *layout, "--uniform-costs", "1,2", "-o", str(tmp_path / "g.html"),
               "--metrics-json", str(metrics))
    pp, mb = int(layout[1]), int(layout[5])
    assert json.loads(metrics.read_text())["iteration_time"] == pytest.approx((mb + pp - 1) * 3)


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
               "--model", "llama3-8b", "--num-layers", "32", "-o", str(tmp_path / "g.html"),
               "--metrics-json", str(metrics))
    # interleaved closed form: M*V*(F+B) + (P-1)*(F+B) = 4*2*3 + 1*3
    assert json.loads(metrics.read_text())["iteration_time"] == 27


def test_compare_table_and_html(tmp_path):
    out = clustersim("compare", "--schedules", "gpipe,1f1b,interleaved-1f1b:2", "--pp", "4",
                     "--microbatches", "8", "--uniform-costs", "1,2", "--model", "llama3-8b",
               "--num-layers", "32",
                     "--json", "-o", str(tmp_path / "c.html"))
    rows = json.loads(out.stdout[:out.stdout.rindex("]") + 1])
    assert [r["iteration_time_s"] for r in rows] == [33, 33, 57]
    assert rows[0]["peak_in_flight"] == [8, 8, 8, 8]  # GPipe holds every microbatch
    assert rows[1]["peak_in_flight"] == [4, 3, 2, 1]  # 1F1B holds P - rank
    assert (tmp_path / "c.html").exists()


@pytest.mark.parametrize("args, words", [
    (["simulate", "--pp", "3"], ["num_layers", "divisible"]),
    (["simulate", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "9"],
     ["multiple of 2", "got 9"]),
    (["simulate", "--schedule", "zigzag"], ["unknown schedule", "1f1b"]),
    (["simulate", "--model", "gpt5"], ["gpt5"]),
    (["simulate", "--topology", "nowhere.json"], ["nowhere.json"]),
    (["simulate", "--uniform-costs", "1"], ["--uniform-costs"]),
    (["simulate", "--pp", "16"], ["16 GPUs"]),
    (["show", "1f1b", "--pp", "0", "--microbatches", "4"], ["pp"]),
    (["simulate", "--pp", "abc"], ["--pp", "invalid int"]),
    (["show", "1f1b"], ["--microbatches", "required"]),
    (["simulate", "--pp", "1", "--moe-imbalance", "0.5"], ["moe_imbalance", ">= 1"]),
    (["simulate", "--pp", "1", "--cp", "3"], ["seq_length", "2*cp"]),
    (["simulate", "--pp", "1", "--tp", "2", "--etp", "3"],
     ["expert_tensor_parallel*ep=3*1", "tp*cp*dp"]),
    (["simulate", "--pp", "1", "--cp-comm", "ring", "--cp-comm-type", "a2a"],
     ["cp_comm given twice"]),
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


def test_intra_layer_and_etp_flags_set_parallel_config_fields():
    from clustersim.schedules.parallel import ParallelConfig
    from clustersim.sim.cli import build_parser
    from clustersim.sim.cli.flags import parallel_from_args

    args = build_parser().parse_args([
        "simulate", "--tp", "2", "--cp", "2", "--dp", "2", "--ep", "2",
        "--expert-tensor-parallel-size", "1", "--cp-comm-type", "a2a",
        "--moe-imbalance", "1.5", "--scatter-gather-tensors-in-pipeline"])
    p = parallel_from_args(args, args.schedule)
    assert (p.tp_comm_overlap, p.cp_comm, p.moe_imbalance, p.scatter_gather) == (
        False, "ulysses", 1.5, True)
    overlap = build_parser().parse_args(["simulate", "--tp", "2", "--sequence-parallel",
                                         "--tp-comm-overlap"])
    assert parallel_from_args(overlap, overlap.schedule).tp_comm_overlap
    assert (p.expert_tensor_parallel, p.etp, p.edp) == (1, 1, 4)  # tp*cp*dp / (etp*ep)
    plain = build_parser().parse_args(["simulate"])
    assert parallel_from_args(plain, plain.schedule) == ParallelConfig(pp=8, num_microbatches=16)


def test_memory_without_a_device_does_not_claim_a_fit():
    """No --topology or --device: nothing to compare the peak with, so the JSON says null
    (not checked) rather than false (fits), and the text says so."""
    out = json.loads(clustersim("memory", "--model", "llama2-7b", "--json").stdout)
    assert out["config"]["device"] is None and out["oom_ranks"] is None
    assert all(rank["oom"] is None for rank in out["ranks"])
    text = clustersim("memory", "--model", "llama2-7b").stdout
    assert "no device given (--topology or --device): whether a rank fits is not checked" \
        in text


def test_the_header_names_sharding_micro_batch_size_and_attention():
    """Settings that move the numbers by tens of percent are in the summary's first lines:
    the ZeRO stage, the micro-batch size, flash or unfused attention (a preset's)."""
    out = clustersim("simulate", "--no-html", "--model", "llama2-7b", "--num-layers", "4",
                     "--pp", "2", "--dp", "2", "--microbatches", "4", "--zero", "1",
                     "--micro-batch-size", "2").stdout.splitlines()
    assert " dp=2 zero=1 microbatches=4 mbs=2 " in out[0]
    assert ", flash attention:" in out[1]


def test_an_expert_group_across_nodes_runs(tmp_path):
    """tp 2 x ep 8 puts each expert all-to-all over two DGX nodes: it runs (its choice,
    NCCL's send/recv with Simple, is handed back on every repeat) and pays expert
    communication."""
    from clustersim.sim.cli import main

    metrics = tmp_path / "m.json"
    assert main(["simulate", "--no-html", "--model", "mixtral-8x7b", "--num-layers", "2",
                 "--topology", "dgx-h100-x16-ndr", "--tp", "2", "--pp", "1", "--dp", "8",
                 "--ep", "8", "--microbatches", "2", "--metrics-json", str(metrics)]) == 0
    breakdown = json.loads(metrics.read_text())["time_breakdown"]["per_rank"]["0"]
    assert breakdown["ep"] > 0


def test_deadlocked_csv_is_reported_with_stuck_ops(tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1B1,1B0,1F1\n")
    result = clustersim("simulate", "--schedule-csv", str(path), "--uniform-costs", "1,2",
                        "--model", "llama3-8b", "--num-layers", "32",
                        "-o", str(tmp_path / "g.html"), check=False)
    assert result.returncode == 3
    assert "deadlock" in result.stderr and "1B1" in result.stderr
    assert ">1B1<" in result.stderr and "Traceback" not in result.stderr


# --- `clustersim memory`: ZeRO (Rajbhandari et al. SC20) Table 1 --------------------------
# GB (1e9 bytes) per device of model states: DP degree -> (baseline, Pos, Pos+g, Pos+g+p),
# as printed in the paper's Table 1 (the DP=1 row is the baseline for every stage).
ZERO_TABLE1 = {
    7.5e9: {1: (120, 120, 120, 120), 4: (120, 52.5, 41.3, 30), 16: (120, 35.6, 21.6, 7.5),
            64: (120, 31.4, 16.6, 1.88), 256: (120, 30.4, 15.4, 0.47),
            1024: (120, 30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048, 2048), 4: (2048, 896, 704, 512), 16: (2048, 608, 368, 128),
            64: (2048, 536, 284, 32), 256: (2048, 518, 263, 8), 1024: (2048, 513, 257, 2)},
    1e12: {1: (16000,) * 4, 4: (16000, 7000, 5500, 4000), 16: (16000, 4750, 2875, 1000),
           64: (16000, 4187, 2218, 250), 256: (16000, 4046, 2054, 62.5),
           1024: (16000, 4011, 2013, 15.6)},
}


def _printed_digits(cell: float) -> int:
    text = repr(float(cell)).rstrip("0").rstrip(".")
    return len(text.partition(".")[2])


def test_memory_reproduces_zero_table1_headline():
    """The issue's cells, through the real command line."""
    got = []
    for stage in range(4):
        out = clustersim("memory", "--params", "7.5e9", "--dp", "64", "--zero", str(stage),
                         "--json").stdout
        got.append(json.loads(out)["model_states_bytes"][0] / 1e9)
    assert [round(g, 1) for g in got[:3]] == [120, 31.4, 16.6] and round(got[3], 2) == 1.88


@pytest.mark.parametrize("params", sorted(ZERO_TABLE1))
def test_memory_reproduces_every_zero_table1_cell(params, capsys):
    """Every cell, compared at the table's printed precision: within one unit of its last
    digit (the table rounds 7.5B's cells and truncates the 128B/1T ones: 513.5 -> 513)."""
    from clustersim.sim.cli import main
    for dp, row in ZERO_TABLE1[params].items():
        for stage, cell in enumerate(row):
            assert main(["memory", "--params", f"{params:g}", "--dp", str(dp),
                         "--zero", str(stage), "--json"]) == 0
            got = json.loads(capsys.readouterr().out)["model_states_bytes"][0] / 1e9
            unit = 10.0 ** -_printed_digits(cell)
            assert abs(got - cell) <= unit, (params, dp, stage, got, cell)


def test_memory_breakdown_of_a_model_and_oom(tmp_path):
    out = json.loads(clustersim("memory", "--model", "llama3-8b", "--pp", "4",
                                "--microbatches", "8", "--zero", "1", "--dp", "8",
                                "--topology", "dgx-h100", "--json").stdout)
    ranks = out["ranks"]
    assert [r["in_flight"] for r in ranks] == [4, 3, 2, 1]  # 1F1B: min(P - rank, M)
    for r in ranks:
        assert r["model_states_bytes"] == pytest.approx(
            4 * r["params"] + 12 * r["params"] / 8)
        assert r["total_bytes"] == pytest.approx(
            r["model_states_bytes"] + r["activations"] + r["communication_buffers"])
    assert out["config"]["device_memory_bytes"] == 79.11 * 2**30 and out["oom_ranks"] == []
    big = clustersim("memory", "--model", "llama3-70b", "--dp", "8", "--fsdp", "full",
                     "--microbatches", "1", "--device", "h100").stdout
    assert "OOM: rank 0 needs" in big and "ZeRO-3 fsdp=full" in big and " GiB" in big
    offload = json.loads(clustersim("memory", "--params", "7B", "--dp", "8",
                                    "--use-distributed-optimizer", "--offload",
                                    "--json").stdout)
    assert offload["host_bytes"][0] == pytest.approx(12 * 7e9 / 8)
    assert offload["model_states_bytes"][0] == pytest.approx(4 * 7e9)



@pytest.mark.parametrize("flags", [
    ["--zero", "3", "--pp", "4", "--tp", "2"],  # FSDP with a pipeline: unsharded gradients
    ["--zero", "1", "--pp", "2", "--recompute", "full"],
])
def test_memory_table_parts_sum_to_the_total(flags):
    """Every byte of a rank's total is in a printed column: states, activ., recomp.,
    buffers, gathered and (FSDP with a pipeline) unsh. grads add up to total, to the
    table's rounding (a column once left FSDP's unsharded gradients out)."""
    text = clustersim("memory", "--model", "llama3-8b", "--dp", "2", "--microbatches", "8",
                      "--topology", "dgx-h100", *flags).stdout.splitlines()
    header = text[2].split()
    parts = ("states", "activ.", "recomp.", "buffers", "gathered", "unsh. grads")
    columns = [c for c in re.split(r"\s{2,}", text[2].strip())]
    for row in text[3:3 + 4]:
        if not row.strip() or not row.strip()[0].isdigit():
            break
        cells = dict(zip(columns, re.split(r"\s{2,}", row.strip())))
        shown = sum(float(cells[p]) for p in parts if p in cells)
        assert shown == pytest.approx(float(cells["total"]), abs=0.01), (header, row)
    assert ("unsh. grads" in columns) == ("3" in flags)


@pytest.mark.parametrize("argv, message", [
    (["--params", "7B", "--model", "gpt3-1.3b"], "--params is a bare parameter count: drop --model"),
    (["--params", "seven"], "'seven' is not a parameter count"),
    (["--params", "7B", "--dp", "4", "--zero", "1", "--fsdp", "full"],
     r"fsdp='full' shards parameters \(ZeRO-3\) but zero_stage=1"),
    (["--params", "7B", "--dp", "4", "--pp", "2", "--zero", "3", "--quantized-weights"],
     "incompatible with pipeline parallelism"),
    (["--params", "7B", "--dp", "4", "--offload"], "offload .*needs zero_stage >= 1"),
    (["--params", "7B", "--dp", "4", "--fsdp", "hybrid"], "needs shard_size, or a topology"),
    (["--model", "gpt3-1.3b", "--recompute", "full", "--recompute-granularity", "selective"],
     "recompute given twice"),
    (["--params", "7B", "--device", "h100", "--topology", "dgx-h100"], "not both"),
])
def test_memory_errors_are_one_line(argv, message):
    result = clustersim("memory", *argv, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert re.search(message, result.stderr), result.stderr


def test_simulate_accepts_sharding_flags_and_reports_oom(tmp_path):
    metrics = tmp_path / "m.json"
    out = clustersim("simulate", "--model", "llama3-70b", "--num-layers", "8", "--pp", "1",
                     "--dp", "2", "--zero", "2", "--recompute", "selective", "--bucket-mb",
                     "50", "--microbatches", "2", "-o", str(tmp_path / "g.html"),
                     "--metrics-json", str(metrics), cwd=tmp_path).stdout
    data = json.loads(metrics.read_text())
    (oom,) = data["meta"]["oom"]
    assert oom["rank"] == 0 and oom["peak_bytes"] > oom["capacity_bytes"] == 79.11 * 2**30
    assert oom["time_s"] == data["per_rank"]["peak_memory_time"]["0"]
    assert oom["activations_bytes"] > 0 and oom["optimizer_states_bytes"] > 0
    assert "OOM: rank 0 peaks at" in out
    assert set(data["per_rank"]["peak_memory_time"]) == {"0"}


def test_simulate_tp_cp_ep_flags_and_the_time_breakdown(tmp_path):
    metrics = tmp_path / "m.json"
    out = clustersim("simulate", "--model", "mixtral-8x7b", "--num-layers", "4", "--pp", "2",
                     "--tp", "2", "--cp", "2", "--dp", "2", "--ep", "2", "--sequence-parallel",
                     "--cp-comm", "ulysses", "--tp-comm-overlap", "--moe-imbalance", "1.2",
                     "--microbatches", "4", "--topology", "dgx-h100-x16-ndr",
                     "-o", str(tmp_path / "g.html"), "--metrics-json", str(metrics))
    assert "tp=2 cp=2 ep=2" in out.stdout and "time breakdown" in out.stdout
    data = json.loads(metrics.read_text())
    parallel = data["meta"]["plan"]["parallel"]
    assert parallel["cp_comm"] == "ulysses" and parallel["tp_comm_overlap"]
    for rank, row in data["time_breakdown"]["per_rank"].items():
        assert sum(row.values()) == pytest.approx(data["iteration_time"], rel=1e-9)
        assert row["cp"] > 0 and row["ep"] > 0  # Ulysses and MoE all-to-alls block


def _model(*flags):
    from clustersim.sim.cli import build_parser
    from clustersim.sim.cli.flags import model_from_args
    return model_from_args(build_parser().parse_args(["simulate", *flags]))


def test_model_dimensions_without_a_preset_take_megatron_defaults():
    """Issue 14, item 1: SC21's 1T from its Megatron flags alone (no llama3-8b leftovers):
    ffn 4h, a KV group per head, GeLU, LayerNorm, learned positions, tied embeddings, no
    flash attention; SC21 Table 1 prints 1008.0 B parameters."""
    m = _model("--num-layers", "128", "--hidden-size", "25600", "--num-attention-heads",
               "160", "--seq-length", "2048", "--vocab-size", "51200")
    assert (m.ffn_hidden_size, m.num_query_groups) == (4 * 25600, 160)
    assert (m.swiglu, m.normalization, m.position_embedding_type) == (
        False, "LayerNorm", "learned_absolute")
    assert not m.untie_embeddings_and_output_weights and not m.use_flash_attn
    assert round(m.param_count() / 1e9, 1) == 1008.0
    with pytest.raises(Exception, match="no value for --seq-length, --vocab-size"):
        _model("--num-layers", "128", "--hidden-size", "25600", "--num-attention-heads", "160")
    assert _model().name == "llama3-8b"  # no model flag: the built-in default job


def test_a_preset_rederives_what_follows_an_override_and_every_switch_turns_off():
    """Megatron's SwiGLU sizing (arguments.py): ffn = int(4h * 2/3 / 64) * 64 when --swiglu
    is given without --ffn-hidden-size: 5440 for GPT-3 1.3B's h = 2048."""
    assert _model("--model", "gpt3-1.3b", "--swiglu").ffn_hidden_size == 5440
    assert _model("--model", "gpt3-1.3b", "--swiglu", "--ffn-hidden-size", "6000"
                  ).ffn_hidden_size == 6000
    assert _model("--model", "gpt3-1.3b", "--hidden-size", "1024").ffn_hidden_size == 4096
    off = _model("--model", "llama3-8b", "--no-swiglu", "--no-use-flash-attn",
                 "--no-untie-embeddings-and-output-weights", "--normalization", "LayerNorm")
    assert not (off.swiglu or off.use_flash_attn or off.untie_embeddings_and_output_weights)
    assert not _model("--model", "gpt3-1.3b", "--disable-bias-linear").add_bias_linear


def test_the_summary_prints_the_resolved_model(tmp_path):
    out = clustersim("simulate", "--num-layers", "4", "--hidden-size", "512",
                     "--num-attention-heads", "8", "--seq-length", "1024", "--vocab-size",
                     "32000", "--pp", "2", "--microbatches", "2", "-o", str(tmp_path / "g.html"))
    assert ("model custom: 4 layers, hidden 512, ffn 2048 (GeLU), heads 8 / KV groups 8, "
            "vocabulary 32000 (tied), sequence 1024") in out.stdout


def test_scripted_use_no_html_and_metrics_on_stdout(tmp_path):
    """--no-html writes no page; --metrics-json - makes stdout the metrics JSON alone (the
    summary goes to stderr), whose iteration time is the --uniform-costs closed form
    (1F1B, P=2, M=2, F=1, B=2: (M + P - 1)(F + B) = 9 s)."""
    run = clustersim("simulate", "--pp", "2", "--microbatches", "2", "--uniform-costs", "1,2",
                     "--no-html", "--metrics-json", "-", cwd=tmp_path)
    assert json.loads(run.stdout)["iteration_time"] == pytest.approx(9.0)
    assert "iteration time" in run.stderr and not list(tmp_path.iterdir())
    both = clustersim("simulate", "--no-html", "-o", "x.html", cwd=tmp_path, check=False)
    assert both.returncode == 2 and "--no-html and --output x.html" in both.stderr


def test_chakra_out_writes_one_trace_per_gpu(tmp_path):
    """--chakra-out: one Chakra ET file per GPU of the run (pp 2 x dp 2 = 4) and the
    communicator groups, decodable by mlc-chakra (tests/test_chakra.py checks contents)."""
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    run = clustersim("simulate", "--pp", "2", "--dp", "2", "--microbatches", "2",
                     "--no-html", "--chakra-out", "et", cwd=tmp_path)
    names = sorted(p.name for p in (tmp_path / "et").iterdir())
    assert names == ["clustersim.0.et", "clustersim.1.et", "clustersim.2.et",
                     "clustersim.3.et", "comm_group.json"]
    assert "wrote 5 Chakra files to et" in run.stdout
