"""kernels.calibrate's GEMM table and attention times (kernels.microbench.gemm_shapes,
measure_gemms, measure_attention), for real on CPU with a tiny fp32 model, and the
simulator's table read from the profile it writes (sim.gemm_table)."""
import json
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels.calibrate import calibrate  # noqa: E402
from clustersim.kernels.microbench import (TOKEN_SCALES, BenchPlan,  # noqa: E402
                                           attention_shapes, gemm_shapes,
                                           measure_attention, measure_gemms, tp_degrees)
from clustersim.schedules import layer_kernels as lk  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.profile import Profile  # noqa: E402
from clustersim.sim.gemm_table import GemmTable, gemm_seconds_of  # noqa: E402

MODEL = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                  vocab_size=128, micro_batch_size=2, dtype="fp32")
TOKENS = MODEL.micro_batch_size * MODEL.seq_length


def model_gemms(model, tp=1):
    """Every GEMM shape a run of `model` at `tp` prices: the kernels of a layer's and the
    head's forward and backward (schedules.layer_kernels)."""
    p = ParallelConfig(tp=tp)
    kernels = (lk.layer_forward(model, p) + lk.layer_backward(model, p)
               + lk.head_forward(model, p) + lk.head_backward(model, p))
    return {tuple(int(d) for d in k.gemm) for k in kernels if k.gemm is not None}


@pytest.fixture(scope="module")
def profile():
    data = calibrate(MODEL, repeats=3, warmup=1, p2p_sizes=(1024,), collective_sizes=(1024,))
    return Profile.from_dict(json.loads(json.dumps(data)))  # JSON-clean and valid


def test_calibration_writes_every_gemm_shape_of_the_model(profile):
    measured = {p[:3] for p in profile.gemm.points}
    assert profile.gemm.dtype == "fp32"
    assert len(measured) == len(profile.gemm.points) == len(gemm_shapes(MODEL))
    for tp in (1, 2, 4):  # the calibrated layout and the TP shards of the grid
        assert model_gemms(MODEL, tp) <= measured, tp
    assert all(p[3] > 0 for p in profile.gemm.points)


def test_calibrated_gemm_times_grow_with_their_work(profile):
    """Robust on a noisy 2-core VM: totals over many shapes, and factors of 8 or more."""
    seconds = {p[:3]: p[3] for p in profile.gemm.points}
    by_tokens = {}  # the model's GEMMs at tp=1 with T scaled: Y = XW, dX = dY W^T, dW
    forward = [k.gemm for k in lk.layer_forward(MODEL, ParallelConfig())
               + lk.head_forward(MODEL, ParallelConfig()) if k.gemm]
    for _, n, k in forward:
        for scale in TOKEN_SCALES:
            t = round(TOKENS * scale)
            shapes = [(t, int(n), int(k)), (t, int(k), int(n)), (int(k), int(n), t)]
            by_tokens.setdefault(scale, []).extend(seconds[s] for s in shapes)
    assert sum(by_tokens[2.0]) > sum(by_tokens[0.25])  # 8x the FLOPs
    flops = {s: 2 * s[0] * s[1] * s[2] for s in seconds}
    smallest, largest = min(flops, key=flops.get), max(flops, key=flops.get)
    assert flops[largest] >= 100 * flops[smallest]
    assert seconds[largest] > seconds[smallest]
    for shape, t in seconds.items():  # a CPU core: between 1 MFLOP/s and 10 TFLOP/s
        assert 1e6 < flops[shape] / t < 1e13, shape


def test_calibration_writes_the_attention_at_the_model_shapes(profile):
    attention = profile.attention
    assert attention.dtype == "fp32" and attention.causal is True
    assert [p[:5] for p in attention.points] == list(attention_shapes(MODEL))
    assert attention.points[0][:5] == (2, 4, 4, 32, 16)  # b, heads, kv heads, s, h/a at tp=1
    assert all(p[5] > 0 and p[6] > 0 for p in attention.points)
    # the backward recomputes and runs more GEMMs than the forward: in total, longer
    assert sum(p[6] for p in attention.points) > sum(p[5] for p in attention.points)


def test_the_calibrated_table_prices_every_gemm_of_a_run_and_other_micro_batches(profile):
    hook = gemm_seconds_of(profile)
    table = GemmTable(profile.gemm)
    for mbs in (1, 2, 3, 4):  # T/2 .. 2T tokens: inside the grid
        for tp in (1, 2, 4):
            model = replace(MODEL, micro_batch_size=mbs)
            plan = resolve(model, ParallelConfig(tp=tp, pp=2, schedule="1f1b",
                                                 micro_batch_size=mbs))
            for stage in (0, 1):
                costs = plan.costs_of(stage, None)
                for kernel in costs.forward_kernels + costs.backward_kernels:
                    if kernel.gemm is not None:
                        seconds = hook(kernel, "fp32")
                        assert seconds is not None and seconds > 0, (mbs, tp, kernel)
                        one = table.gemm_time(*kernel.gemm)
                        assert seconds == pytest.approx(
                            one * kernel.executed / (2 * kernel.gemm[0] * kernel.gemm[1]
                                                     * kernel.gemm[2]))
    assert hook(lk.Kernel("qkv_gemm", 1.0, 1.0, gemm=(64, 192, 64)), "bf16") is None


@pytest.mark.parametrize("model", [
    ModelSpec(num_layers=2, hidden_size=256, num_attention_heads=8, num_query_groups=2,
              swiglu=True, seq_length=64, vocab_size=512, micro_batch_size=1),
    ModelSpec(num_layers=3, hidden_size=128, num_attention_heads=4, seq_length=32,
              vocab_size=256, num_experts=8, moe_router_topk=2, moe_first_dense_layers=1),
], ids=["gqa-swiglu", "moe"])
def test_gemm_shapes_cover_every_gemm_of_the_model_at_each_tp(model):
    shapes = set(gemm_shapes(model))
    assert len(shapes) == len(gemm_shapes(model))
    for tp in tp_degrees(model):
        p = ParallelConfig(tp=tp)
        layers = (None, 0) if model.is_moe else (None,)
        kernels = [k for layer in layers for k in lk.layer_forward(model, p, layer)
                   + lk.layer_backward(model, p, layer)]
        kernels += lk.head_forward(model, p) + lk.head_backward(model, p)
        assert {tuple(int(d) for d in k.gemm) for k in kernels if k.gemm} <= shapes, tp
    assert all(1 <= d and isinstance(d, int) for s in shapes for d in s)
    heads, groups = model.num_attention_heads, model.num_query_groups
    assert [s[1:3] for s in attention_shapes(model)] == [
        (heads // t, groups // t) for t in tp_degrees(model)]


def test_gemm_and_attention_benchmarks_run_in_process_for_a_gqa_model():
    """measure_gemms / measure_attention in this process (one rank's view): one sample per
    repeat of every shape, grouped-query K and V included."""
    model = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4,
                      num_query_groups=2, seq_length=16, vocab_size=64, micro_batch_size=1,
                      dtype="fp32")
    plan = BenchPlan(model, "cpu", 2, 1, (), (), (), (), False, 0, 60.0, 1, 0,
                     gemm_shapes(model)[:6], attention_shapes(model))
    steps = []
    gemms = measure_gemms(plan, torch.device("cpu"), steps.append)
    attention = measure_attention(plan, torch.device("cpu"), steps.append)
    assert steps == ["gemm table"] * 3 + ["attention"] * 3  # warmup + repeats rounds each
    assert list(gemms) == list(gemm_shapes(model)[:6])
    assert all(len(v) == 2 and min(v) > 0 for v in gemms.values())
    assert [s[2] for s in attention] == [2, 1]  # kv heads at tp 1 and 2 (4 heads split)
    assert all(len(v) == 2 and min(f for f, _ in v) > 0 and min(b for _, b in v) > 0
               for v in attention.values())
