"""benchmarks/fidelity.py's harness logic on tiny inputs: the throughput it reports is the
paper's formula over the simulated time, each published row maps to its layout, the
summary and targets count right, slow rows are reported as skipped, the attainment
bisection solves the layer equation, and (simulated for real) the one-layer experiments of
K22 Table 4 come out within 8% of the published times. No benchmark row is simulated here."""
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fidelity as fb  # noqa: E402  (benchmarks/ is scripts, not a package)
import fidelity_data as fd  # noqa: E402
from fidelity_report import render  # noqa: E402

from clustersim.sim.cost import ATTAINMENT  # noqa: E402
from clustersim.sim.cost_model import RooflineCostModel  # noqa: E402
from clustersim.topologies import load_topology, single_node  # noqa: E402

# A 2-stage, 2-GPU cut of SC21's 1.7B run: same shape, tiny batch.
TINY = replace(fd.SC21_TABLE_1[0], label="tiny", tp=1, pp=2, dp=1, gpus=2,
               global_batch_size=2, micro_batch_size=1, virtual_stages=1,
               tflops_per_gpu=100.0)


def test_tiny_row_throughput_is_sc21_eq3_over_the_simulated_time():
    row = fb.simulate_row(TINY, single_node("a100", num_gpus=2), RooflineCostModel())
    b, s, l, h, v = 2, 2048, 24, 2304, 51200
    eq3 = 96 * b * s * l * h ** 2 * (1 + s / (6 * h) + v / (16 * l * h))
    assert row["formula"] == "SC21 eq. 3"
    assert row["tflops_per_gpu"] == pytest.approx(eq3 / (row["iteration_time_s"] * 2) / 1e12)
    assert row["iteration_time_s"] > 0 and row["wall_s"] > 0


def test_k22_rows_use_eq7_and_the_published_time():
    run = fd.K22_TABLE_5[1]  # 22B, SP + selective
    b, s, l, h, v = 4, 2048, 48, 6144, 51200
    eq7 = 72 * b * l * s * h ** 2 * (1 + s / (6 * h) + v / (12 * h * l))
    flops, name = fb.paper_flops(run)
    assert name == "K22 eq. 7" and flops == pytest.approx(eq7)
    assert fb.published_tflops(run) == pytest.approx(eq7 / (1.10 * 8) / 1e12)
    assert fb.published_tflops(fd.SC21_TABLE_1[3]) == 135  # SC21: the printed column


@pytest.mark.parametrize("run", fd.PUBLISHED_RUNS,
                         ids=[f"{r.source}:{r.label}:{r.recompute}" for r in fd.PUBLISHED_RUNS])
def test_each_published_row_maps_to_its_layout(run):
    p = fb.parallel_config(run)
    assert (p.tp, p.pp, p.dp, p.vpp, p.world_size) == (run.tp, run.pp, run.dp,
                                                       run.virtual_stages, run.gpus)
    assert (p.global_batch_size, p.micro_batch_size) == (run.global_batch_size,
                                                         run.micro_batch_size)
    assert p.num_microbatches == run.num_microbatches
    assert (p.recompute, p.sequence_parallel) == (run.recompute, run.sequence_parallel)
    assert p.schedule == ("interleaved-1f1b" if run.virtual_stages > 1 else "1f1b")
    torch_ddp = run.source.startswith("SC21") and run.pp == 1  # run_table_1.sh's DDP=torch
    assert p.overlap_grad_reduce is (torch_ddp or run.dp == 1)  # dp 1 reduces no gradient
    assert f"--tp {run.tp} --pp {run.pp} --dp {run.dp}" in fb.cli_command(run, RooflineCostModel())


def _row(error, status="ok"):
    return {"status": status, "error": error}


def test_summary_counts_errors_and_the_targets():
    good = fb.summary([_row(0.05), _row(-0.10), _row(0.0)])
    assert good["mae"] == pytest.approx(0.05) and good["max_abs_error"] == pytest.approx(0.10)
    assert good["within_15"] == 3 and good["targets_met"]
    assert not fb.summary([_row(0.05), _row(-0.16)])["targets_met"]  # one row past 15%
    assert not fb.summary([_row(0.09), _row(-0.09)])["targets_met"]  # MAE not below 8%
    skipped = fb.summary([_row(0.01), {"status": "skipped"}])
    assert skipped["simulated"] == 1 and not skipped["targets_met"]  # a skip is no pass


def test_a_row_over_its_time_limit_is_reported_skipped(monkeypatch):
    monkeypatch.setattr(fb, "simulate_row", lambda *a: time.sleep(30))
    row = fb.run_with_limit(TINY, None, RooflineCostModel(), limit_s=0.3)
    assert row["status"] == "skipped" and "0 s row limit" in row["reason"]
    assert 0.3 <= row["wall_s"] < 10


def test_a_failing_row_is_reported_with_its_error(monkeypatch):
    def fail(*a):
        raise ValueError("no such layout")
    monkeypatch.setattr(fb, "simulate_row", fail)
    row = fb.run_with_limit(TINY, None, RooflineCostModel(), limit_s=10)
    assert row["status"] == "error" and "ValueError: no such layout" in row["reason"]


@pytest.mark.parametrize("comm_s", [0.0, 3e-3])
def test_attainment_solves_the_k22_layer_time(monkeypatch, comm_s):
    """One layer = (F, B) with kernel time C / a + X: the bisection on the attainment a
    returns C / (19.6 ms - X); both efficiencies are the ceilings x a (4 decimals)."""
    compute = 9e-3

    def one_layer(topo, costs, intra=None, **config):
        a = costs.attainment
        return compute / a / 3, 2 * compute / a / 3 + comm_s

    monkeypatch.setattr(fb, "one_layer", one_layer)
    got = fb.k22_layer_attainment(None)
    assert got["attainment"] == pytest.approx(compute / (fb.K22_LAYER_SECONDS - comm_s), rel=1e-3)
    rounded = round(got["attainment"], 4)
    assert got["compute_efficiency"] == pytest.approx(fb.MAMF_EFFICIENCY * rounded)
    assert got["memory_efficiency"] == pytest.approx(fb.MEMORY_EFFICIENCY * rounded)
    assert got["layer_ms"] == pytest.approx(19.6, rel=1e-3)


def test_table_4_rows_carry_published_and_predicted_ms(monkeypatch):
    monkeypatch.setattr(fb, "one_layer", lambda topo, costs, intra=None, sequence_parallel=False,
                        recompute="none": (7e-3, 12e-3 if recompute == "none" else 20e-3))
    rows = fb.k22_table_4(None, RooflineCostModel())
    assert [r["experiment"] for r in rows] == [e[0] for e in fd.K22_TABLE_4_LAYER_MS]
    assert rows[0]["published_ms"] == [7.7, 11.9, 19.6]
    assert rows[0]["predicted_ms"] == pytest.approx([7.0, 12.0, 19.0])
    assert rows[2]["predicted_ms"] == pytest.approx([7.0, 20.0, 27.0])  # full recompute


def test_k22_table_4_layer_experiments_from_one_attainment_factor():
    """Not a mock: the baseline 22B layer's F + B (19.6 ms) fixes one attainment factor on
    both measured ceilings (k22_layer_attainment), the default model's ATTAINMENT; the
    nine other published numbers of K22 Table 4 (F and B apart; SP, full and selective
    recompute) must then come out within 8% (k22_table_4, as the benchmark page shows
    them)."""
    topology, intra = load_topology("selene-a100"), fb.intra_layer_kwargs()
    attainment = fb.k22_layer_attainment(topology, intra)["attainment"]
    # the default cost model's constant is this measurement's factor (sim.cost)
    assert ATTAINMENT == pytest.approx(attainment, abs=1e-4)
    rows = fb.k22_table_4(topology, fb.ceiling_costs(attainment), intra)
    assert len(rows) == len(fd.K22_TABLE_4_LAYER_MS) == 5
    for row in rows:
        for published, predicted in zip(row["published_ms"], row["predicted_ms"]):
            assert predicted == pytest.approx(published, rel=0.08), row


def test_report_marks_skips_and_unmet_targets():
    rows = []
    for run, status in ((fd.SC21_TABLE_1[0], "ok"), (fd.SC21_TABLE_1[-1], "skipped")):
        row = {"source": run.source, "label": run.label, "gpus": run.gpus, "tp": run.tp,
               "pp": run.pp, "dp": run.dp, "vpp": 1, "microbatches": 1,
               "micro_batch_size": run.micro_batch_size, "recompute": "full",
               "sequence_parallel": False, "ddp": "torch", "published_tflops": 137.0,
               "published_iteration_s": None, "status": status, "wall_s": 1.0,
               "command": "clustersim simulate", "reason": "over the 1 s row limit"}
        if status == "ok":
            row.update(formula="SC21 eq. 3", tflops_per_gpu=140.0, error=140 / 137 - 1,
                       iteration_time_s=3.0, bubble_fraction=0.1, compute_idle_fraction=0.1,
                       peak_memory_gb=30.0,
                       oom_ranks=[], comm=["ALL_REDUCE:tp"])
        rows.append(row)
    data = {"rows": rows, "summary": fb.summary(rows), "sensitivity": [],
            "environment": {"date": "today"}, "command": "python benchmarks/fidelity.py",
            "total_wall_s": 2.0, "simulator": {"commit": "abc", "changed_files": [],
                                               "source_sha256": "0", "note": ""},
            "constants": {"peak_tflops": 312.0, "hbm_tb_s": 2.039, "compute_efficiency": 0.5,
                          "efficiency_source": "option", "memory_efficiency": 0.5,
                          "mamf_efficiency": 0.859, "memory_ceiling": 0.88, "mamf_source": "test",
                          "k22_layer": {"attainment": 0.6, "layer_ms": 19.6,
                                        "layer_ms_at_ceilings": 12.0}}}
    page = render(data)
    assert "NOT MET" in page and "SKIPPED: over the 1 s row limit" in page
    assert "**+2.2%**" in page and "TP communication charged by this version: **yes**" in page


def test_megatron_intra_layer_options_and_the_cli_command_parse():
    import shlex

    from clustersim.sim.cli import build_parser
    intra = fb.intra_layer_kwargs()  # ParallelConfig overrides
    assert intra["tp_comm_overlap"] is False
    assert intra["scatter_gather"] is True
    for run in (fd.SC21_TABLE_1[6], fd.K22_TABLE_5[3]):  # 145.6B full; 175B SP + selective
        parallel = fb.with_intra(fb.parallel_config(run), intra)
        assert parallel.tp_comm_overlap is False
        assert parallel.scatter_gather is (not run.sequence_parallel)  # where Megatron used it
        words = shlex.split(fb.cli_command(run, RooflineCostModel(compute_efficiency=0.5),
                                           intra))
        args = build_parser().parse_args(words[1:])
        assert (args.tp, args.pp, args.dp, args.vpp) == (run.tp, run.pp, run.dp,
                                                         run.virtual_stages)
        assert args.global_batch_size == run.global_batch_size
        scatter = "--scatter-gather-tensors-in-pipeline" in words
        assert scatter == (not run.sequence_parallel)
