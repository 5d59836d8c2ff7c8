"""Throughput against the published formulas: tokens/s from the batch, model FLOPs by
SC21 eq. (3) (72 B s l h^2 (1 + s/6h + V/12lh), recomputation not counted; 96 ... V/16lh
with full recompute), MFU against the H100's datasheet dense bf16 peak (989.4 TFLOP/s)."""
import json

import pytest

from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.simulate import simulate
from clustersim.sim.throughput import format_throughput
from clustersim.topologies import load_topology
from test_cli import clustersim

H100_BF16 = 989.4e12


def sc21_flops(model, batch: int, recompute: bool) -> float:
    b, s, l, h, v = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    if recompute:
        return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_throughput_follows_the_sc21_formulas(recompute):
    model = get_model("gpt3-1.3b")  # MHA, GeLU, ffn 4h: SC21's layer
    parallel = ParallelConfig(pp=2, dp=2, num_microbatches=4, recompute=recompute)
    timeline = simulate(model, parallel, load_topology("dgx-h100"))
    t, gpus = timeline.iteration_time, 4
    batch = parallel.global_batch_size
    figures = timeline.meta["throughput"]
    assert figures["tokens_per_s"] == pytest.approx(batch * model.seq_length / t)
    assert figures["tokens_per_s_per_gpu"] == pytest.approx(batch * model.seq_length / t / gpus)
    model_flops = sc21_flops(model, batch, recompute=False)
    assert figures["model_tflops_per_gpu"] == pytest.approx(model_flops / t / gpus / 1e12)
    hardware = {"none": model_flops, "full": sc21_flops(model, batch, recompute=True),
                "selective": model_flops + batch * model.num_layers * 4 * model.seq_length ** 2
                * model.hidden_size}[recompute]  # K22: selective redoes the 4bs^2h core
    assert figures["hardware_tflops_per_gpu"] == pytest.approx(hardware / t / gpus / 1e12)
    assert figures["mfu"] == pytest.approx(model_flops / t / gpus / H100_BF16)
    line = format_throughput(figures)
    assert "tokens/s" in line and "MFU" in line and "no recompute" in line


def test_every_output_reports_it(tmp_path):
    metrics = tmp_path / "m.json"
    out = clustersim("simulate", "--pp", "2", "--microbatches", "2", "--model", "llama3-8b",
                     "--num-layers", "4", "-o", str(tmp_path / "g.html"),
                     "--metrics-json", str(metrics)).stdout
    assert "tokens/s" in out and "MFU" in out
    data = json.loads(metrics.read_text())
    assert set(data["throughput"]["formulas"]) >= {"tokens_per_s", "mfu"}
    table = clustersim("compare", "--pp", "2", "--microbatches", "2", "--model", "llama3-8b",
                       "--num-layers", "4", "--json").stdout
    assert all(row["mfu"] > 0 and row["tokens_per_s"] > 0 for row in json.loads(table))
    assert "MFU" in (tmp_path / "g.html").read_text()
