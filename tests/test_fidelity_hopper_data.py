"""benchmarks/fidelity_hopper_data.py: the Hopper/Blackwell numbers agree with each other,
with the layouts they claim and with their sources' own formulas, to the rounding they are
printed with, so a typo shows up here."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fidelity_hopper_data as fd  # noqa: E402  (benchmarks/ is scripts, not a package)

from clustersim.schedules.model_presets import MODEL_PRESETS  # noqa: E402

RUNS = fd.PUBLISHED_RUNS
ids = [f"{r.source}:{r.label}" for r in RUNS]


def test_enough_rows_from_enough_independent_sources():
    assert len(RUNS) >= 15
    organisations = {"MLM": "NVIDIA", "NEMO2407": "NVIDIA", "NEMO2502": "NVIDIA",
                     "LLAMA3": "Meta Llama team", "TITAN": "PyTorch team",
                     "TRAINY": "Trainy", "MOSAIC": "MosaicML"}
    assert {r.source for r in RUNS} <= set(organisations)
    assert len({organisations[r.source] for r in RUNS}) >= 4
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_layout_multiplies_out(run):
    assert run.tp * run.pp * run.cp * run.dp == run.gpus  # EP lives inside DP
    assert run.dp % run.ep == 0
    assert run.model.num_attention_heads % run.tp == 0
    assert run.model.num_query_groups % run.tp == 0 or run.tp % run.model.num_query_groups == 0
    if run.micro_batch_size is not None:
        assert run.global_batch_size % (run.dp * run.micro_batch_size) == 0
    if run.grad_accum is not None:
        assert run.grad_accum == run.global_batch_size // (run.dp * run.micro_batch_size)
    if run.nodes is not None:
        assert run.nodes * run.cluster.gpus_per_node == run.gpus
    assert run.tp <= run.cluster.gpus_per_node
    assert run.dtype in ("bf16", "fp8")
    assert run.recompute in (None, "none", "selective", "full")
    assert (run.dtype == "fp8") or run.fp8_recipe is None


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_every_row_has_a_metric_and_a_plausible_iteration(run):
    assert any(m is not None for m in (run.tokens_per_s_per_gpu, run.tflops_per_gpu,
                                       run.mfu_percent, run.step_time_s))
    assert 0.2 < fd.iteration_time_s(run) < 120  # seconds: not a units slip
    for name in run.assumed:
        assert getattr(run, name) is None or name in ("seq_length", "dtype", "fp8_recipe",
                                                      "attention_backend")


@pytest.mark.parametrize("run", [r for r in RUNS if r.model.preset], ids=lambda r: r.label)
def test_shape_matches_the_clustersim_preset(run):
    m, p = run.model, MODEL_PRESETS[run.model.preset]
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
            m.num_query_groups, m.vocab_size, m.swiglu, m.num_experts, m.moe_router_topk) == \
        (p.num_layers, p.hidden_size, p.ffn_hidden_size, p.num_attention_heads,
         p.num_query_groups, p.vocab_size, p.swiglu, p.num_experts, p.moe_router_topk)


# --- the Megatron formula, against clustersim's independent FLOP count ---------------------

DENSE = [r for r in RUNS if r.flop_formula == "megatron" and not r.model.num_experts]


@pytest.mark.parametrize("run", DENSE, ids=[f"{r.source}:{r.label}" for r in DENSE])
def test_megatron_formula_is_modelspec_flops(run):
    spec = run.model.spec(run.seq_length)
    assert fd.megatron_flops(run.model, run.global_batch_size, run.seq_length) == \
        pytest.approx(spec.iteration_flops(run.global_batch_size), rel=1e-12)


def test_megatron_formula_for_moe_differs_from_modelspec_by_the_router_only():
    run = next(r for r in RUNS if r.model.num_experts)
    spec = run.model.spec(run.seq_length)
    router = 6 * run.tokens_per_iteration * run.model.hidden_size * run.model.num_experts \
        * run.model.num_layers
    assert fd.megatron_flops(run.model, run.global_batch_size, run.seq_length) + router == \
        pytest.approx(spec.iteration_flops(run.global_batch_size), rel=1e-12)


# --- MLM -----------------------------------------------------------------------------------

MLM = fd.MLM_WEAK_SCALING


@pytest.mark.parametrize("run", MLM, ids=[r.label for r in MLM])
def test_mlm_mfu_and_aggregate(run):
    # MFU printed as a whole percent, TFLOP/s to 0.1, PFLOP/s to 0.1
    assert round(100 * run.tflops_per_gpu / run.peak_tflops) == run.mfu_percent
    aggregate = run.tflops_per_gpu * run.gpus / 1000
    assert abs(aggregate - run.extra["aggregate_pflops"]) <= 0.05 + 0.05 * run.gpus / 1000
    assert run.dp == 48 and run.global_batch_size % run.dp == 0


def test_mlm_peak_is_989_not_989_4():
    """989.4 (the datasheet's 1979/2 rounded) misrounds the 462B row; 989 fits all."""
    last = MLM[-1]
    assert round(100 * last.tflops_per_gpu / 989.4) == 46 != last.mfu_percent
    assert all(round(100 * r.tflops_per_gpu / 989.0) == r.mfu_percent for r in MLM)


def test_mlm_text_endpoints():
    """README: MFU from 41 % (smallest) to 47-48 % (largest), 6144 GPUs for 462B."""
    assert MLM[0].mfu_percent == 41 and {r.mfu_percent for r in MLM[-2:]} == {47, 48}
    assert MLM[-1].gpus == 6144


# --- NeMo ----------------------------------------------------------------------------------

NEMO = fd.NEMO_2407_H100 + fd.NEMO_2502


@pytest.mark.parametrize("run", NEMO, ids=[f"{r.source}:{r.label}" for r in NEMO])
def test_nemo_tflops_over_tokens_is_the_megatron_formula(run):
    printed = run.tflops_per_gpu * 1e12 / run.tokens_per_s_per_gpu      # FLOPs per token
    formula = fd.megatron_flops(run.model, run.global_batch_size, run.seq_length) \
        / run.tokens_per_iteration
    rounding = 0.5 / run.tflops_per_gpu + 0.5 / run.tokens_per_s_per_gpu
    if run.label == "LLAMA3-405B B200":  # the documented 1 % outlier
        assert 0.005 < printed / formula - 1 < 0.015
    else:
        assert abs(printed / formula - 1) <= rounding + 1e-9


def test_nemo_2502_grad_accum_columns():
    for run in fd.NEMO_2502:
        assert run.grad_accum * run.micro_batch_size * run.dp == run.global_batch_size


# --- Llama 3 -------------------------------------------------------------------------------

@pytest.mark.parametrize("run", fd.LLAMA3_TABLE_4, ids=[r.label for r in fd.LLAMA3_TABLE_4])
def test_llama3_table_4(run):
    assert run.dp * run.extra["batch_size_per_dp"] * run.seq_length == 16 * 2 ** 20  # "16M"
    # MFU is whole percent; TFLOPs/GPU reads as rounded to tens (module docstring)
    assert abs(100 * run.tflops_per_gpu / run.peak_tflops - run.mfu_percent) \
        <= 0.5 + 100 * 5 / run.peak_tflops


def test_llama3_mfu_rounds_exactly_where_it_can():
    rows = fd.LLAMA3_TABLE_4
    assert [round(100 * r.tflops_per_gpu / 989) for r in rows] == [43, 40, 38]
    assert [r.mfu_percent for r in rows] == [43, 41, 38]  # the 41 is the noted oddity


# --- torchtitan and Trainy -----------------------------------------------------------------

def test_titan_printed_global_batches():
    by_label = {r.label: r.global_batch_size for r in fd.TITAN_2412}
    assert by_label["8B FSDP 8"] == 16 and by_label["8B FSDP 128"] == 256
    assert by_label["70B FSDP 32 TP 8"] == 512 and by_label["405B 3D 1F1B"] == 256


def test_titan_8b_bf16_mfu_is_within_the_stated_33_to_39_percent():
    """The file: 1D 8B without Float8 on 8 or 128 GPUs gets 33 % to 39 % MFU (its own
    formula over 989 TFLOP/s)."""
    rows = [r for r in fd.TITAN_2412 if r.model is fd.LLAMA3_8B and r.dtype == "bf16"]
    assert len(rows) == 2
    for run in rows:
        mfu = 100 * fd.titan_flops_per_token(run.model, run.seq_length) \
            * run.tokens_per_s_per_gpu / (run.peak_tflops * 1e12)
        assert 32.5 <= mfu < 39.5


def test_trainy_batches():
    for run in fd.TRAINY_H200:
        assert run.global_batch_size == 2 * run.gpus and run.gpus in (32, 64)


# --- MosaicML --------------------------------------------------------------------------------

@pytest.mark.parametrize("run", fd.MOSAIC_H100_RUNS, ids=[r.label for r in fd.MOSAIC_H100_RUNS])
def test_mosaic_columns_agree(run):
    e = run.extra
    s = run.seq_length
    assert run.micro_batch_size * run.grad_accum * run.gpus == run.global_batch_size
    assert e["global_batch_tokens"] == run.global_batch_size * s
    assert int(e["throughput_tokens_per_s"] / run.gpus) == run.tokens_per_s_per_gpu
    assert int(e["throughput_tokens_per_s"] / s) == e["throughput_samples_per_s"]
    flops = fd.mosaic_flops_per_token(run) * e["throughput_tokens_per_s"]   # FLOP/s, all GPUs
    assert int(flops / run.gpus / 1e12) == run.tflops_per_gpu
    # MFU/HFU are printed to 0.01 but computed from an unrounded throughput, which the
    # printed (truncated) tokens/s only approximates: 70b on 128 GPUs misses by 0.0002
    mfu = 100 * flops / (run.gpus * run.peak_tflops * 1e12)
    assert abs(mfu - run.mfu_percent) <= 0.006
    hfu = mfu * (4 / 3 if run.recompute == "full" else 1)
    assert abs(hfu - run.hfu_percent) <= 0.008
