"""benchmarks/fidelity_data.py: the published numbers agree with each other and with the
papers' formulas to the rounding they are printed with, so a typo shows up here."""
import sys
from fractions import Fraction
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fidelity_data as fd  # noqa: E402  (benchmarks/ is scripts, not a package)

from clustersim.schedules.model_presets import MODEL_PRESETS  # noqa: E402
from clustersim.topologies import device_of, gpu_nodes, load_topology  # noqa: E402

RUNS = fd.PUBLISHED_RUNS
ids = [f"{r.source}:{r.label}:{r.recompute}" for r in RUNS]


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_layout_multiplies_out(run):
    assert run.tp * run.pp * run.dp == run.gpus
    assert run.global_batch_size % (run.dp * run.micro_batch_size) == 0
    assert run.num_layers % (run.pp * run.virtual_stages) == 0
    if run.virtual_stages > 1:  # Megatron's interleaved schedule needs m % p == 0
        assert run.num_microbatches % run.pp == 0
    assert run.num_attention_heads % run.tp == 0 and run.gpus % run.tp == 0
    assert run.tp <= run.cluster.gpus_per_node  # TP stays inside a DGX node in both papers


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_shape_matches_the_preset(run):
    model = MODEL_PRESETS[run.model]
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == \
        (run.num_layers, run.hidden_size, run.num_attention_heads)
    assert (model.seq_length, model.vocab_size) == (run.seq_length, run.vocab_size)
    if run.params_billion is not None:
        assert round(model.param_count() / 1e9, 1) == run.params_billion


def test_cluster_is_a_topology_preset_that_fits_every_run():
    graph = load_topology(fd.SELENE.topology)
    gpus = gpu_nodes(graph)
    assert len(gpus) >= max(r.gpus for r in RUNS)
    assert graph.graph["gpus_per_node"] == fd.SELENE.gpus_per_node
    assert device_of(graph, gpus[0]).peak_flops["bf16"] == fd.SELENE.peak_tflops * 1e12


@pytest.mark.parametrize("run", fd.SC21_TABLE_1, ids=[r.label for r in fd.SC21_TABLE_1])
def test_sc21_aggregate_and_percent_of_peak(run):
    # per-GPU TFLOP/s is printed to 1 (+-0.5), so the aggregate may differ by 0.5 * GPUs
    aggregate = run.tflops_per_gpu * run.gpus / 1000
    assert abs(aggregate - run.aggregate_pflops) <= 0.5 * run.gpus / 1000 + 0.05
    assert abs(100 * run.tflops_per_gpu / run.cluster.peak_tflops - run.percent_of_peak) \
        <= 0.5 + 100 * 0.5 / run.cluster.peak_tflops


def test_sc21_weak_scaling_endpoints():
    """Section 5.1's text: 44 % of peak for the smallest model, 52 % (502 PFLOP/s on 3072
    GPUs) for the largest."""
    first, last = fd.SC21_TABLE_1[0], fd.SC21_TABLE_1[-1]
    assert first.percent_of_peak == 44 and last.percent_of_peak == 52
    assert (last.gpus, last.aggregate_pflops) == (3072, 502.0)


@pytest.mark.parametrize("run", fd.SC21_TABLE_1, ids=[r.label for r in fd.SC21_TABLE_1])
def test_sc21_eq3_and_implied_iteration_time(run):
    B, s, l, h, V = (run.global_batch_size, run.seq_length, run.num_layers, run.hidden_size,
                     run.vocab_size)
    eq3 = 96 * B * s * l * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * l * h))
    assert fd.sc21_flops(run) == eq3
    seconds = fd.implied_iteration_time_s(run)
    assert eq3 / (seconds * run.gpus) == pytest.approx(run.tflops_per_gpu * 1e12)
    assert 1 < seconds < 120  # a plausible iteration, not a units slip


def _k22_utilisation(flops: float, run, seconds: float) -> float:
    return 100 * flops / (seconds * run.gpus * run.cluster.peak_tflops * 1e12)


K22_MEASURED = [r for r in fd.K22_TABLE_5 if r.mfu_percent is not None] + [fd.K22_530B_DP8]


@pytest.mark.parametrize("run", K22_MEASURED, ids=[r.label for r in K22_MEASURED])
def test_k22_mfu_and_hfu_follow_eq7_and_eq8(run):
    """MFU = eq. (7) / (time * GPUs * 312 TFLOP/s) and HFU likewise with eq. (8), within
    the rounding of the printed time (+-0.005 s) and percentage (+-0.05)."""
    B, s, l, h, V = (run.global_batch_size, run.seq_length, run.num_layers, run.hidden_size,
                     run.vocab_size)
    eq7 = 72 * B * l * s * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * h * l))
    eq8 = 72 * B * l * s * h * h * (1 + Fraction(s, 3 * h) + Fraction(V, 12 * h * l))
    assert fd.k22_model_flops(run) == eq7 and fd.k22_hardware_flops(run) == eq8
    t = run.iteration_time_s
    for flops, published in ((eq7, run.mfu_percent), (eq8, run.hfu_percent)):
        if published is None:
            continue
        low = _k22_utilisation(flops, run, t + 0.005)
        high = _k22_utilisation(flops, run, t - 0.005)
        assert low - 0.05 <= published <= high + 0.05


@pytest.mark.parametrize("label", fd.K22_THROUGHPUT_INCREASE_PERCENT)
def test_k22_throughput_increase_is_the_time_ratio(label):
    full, present = [r for r in fd.K22_TABLE_5 if r.label == label]
    assert (full.recompute, present.recompute) == ("full", "selective")
    assert not full.sequence_parallel and present.sequence_parallel
    lo = 100 * ((full.iteration_time_s - 0.005) / (present.iteration_time_s + 0.005) - 1)
    hi = 100 * ((full.iteration_time_s + 0.005) / (present.iteration_time_s - 0.005) - 1)
    assert lo - 0.05 <= fd.K22_THROUGHPUT_INCREASE_PERCENT[label] <= hi + 0.05


def test_k22_dp8_keeps_the_per_replica_batch():
    single = [r for r in fd.K22_TABLE_5 if r.label == "530B" and r.recompute == "selective"][0]
    dp8 = fd.K22_530B_DP8
    assert dp8.global_batch_size == 8 * single.global_batch_size
    assert dp8.num_microbatches == single.num_microbatches
    assert dp8.iteration_time_s > single.iteration_time_s


def test_k22_table4_rows_add_up():
    baseline = fd.K22_TABLE_4_LAYER_MS[0][3]
    for _, forward, backward, combined, overhead in fd.K22_TABLE_4_LAYER_MS:
        assert forward + backward == pytest.approx(combined, abs=0.051)
        if overhead is not None:
            assert round(100 * (combined / baseline - 1)) == pytest.approx(overhead, abs=1)
