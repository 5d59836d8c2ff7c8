"""Flash attention at its backend's published speed (topologies.attention_kernels): the
curves return the published TFLOP/s at the measured lengths, the derived backward agrees
with the published fwd+bwd rate, a flash kernel's time is its work at that speed x the
attainment, and the flags that would change nothing are refused."""
import subprocess
import sys
from dataclasses import replace

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_backward, layer_forward, merge
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.cost import ATTAINMENT, RooflineCost
from clustersim.sim.cost_model import RooflineCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology
from clustersim.topologies.attention_kernels import (A100_FLASH, H100_FLASH, H100_FUSED,
                                                     attention_curve, resolve_backend)

LLAMA = get_model("llama3-8b", num_layers=2)  # head dim 128, flash attention, s = 8192


@pytest.mark.parametrize("curve, seq, tflops", [
    (H100_FUSED, 4096, 518.0),   # FA3 paper Fig. 5(d), cuDNN, causal d128
    (H100_FLASH, 16384, 335.0),  # same figure, FlashAttention-2
    (H100_FLASH, 512, 191.0),
])
def test_curves_give_the_published_forward_speed_at_measured_lengths(curve, seq, tflops):
    assert curve.fraction(seq, "forward") * 989.4 == pytest.approx(tflops)


def test_curves_interpolate_between_and_hold_beyond_the_measured_lengths():
    low, high = H100_FUSED.fraction(4096, "forward"), H100_FUSED.fraction(8192, "forward")
    middle = H100_FUSED.fraction(4096 * 2 ** 0.5, "forward")
    assert middle == pytest.approx((low + high) / 2)  # log-linear: midpoint in log(s)
    assert H100_FUSED.fraction(100, "forward") == H100_FUSED.fraction(512, "forward")
    assert H100_FUSED.fraction(10 ** 6, "backward") == H100_FUSED.fraction(16384, "backward")


@pytest.mark.parametrize("seq, fwd_bwd", [(512, 163.0), (4096, 294.0), (16384, 328.0)])
def test_flash_backward_reproduces_the_published_fwd_bwd_speed(seq, fwd_bwd):
    """FA2 paper Fig. 7 (H100, causal d128): fwd+bwd runs 3.5 forward FLOP units in the
    time of one forward unit at F plus 2.5 units at B."""
    f = H100_FLASH.fraction(seq, "forward") * 989.4
    b = H100_FLASH.fraction(seq, "backward") * 989.4
    assert 3.5 / (1 / f + 2.5 / b) == pytest.approx(fwd_bwd)


def test_auto_is_transformer_engines_choice_per_device():
    assert resolve_backend("h100-sxm", "auto") == "fused"
    assert resolve_backend("b200", "auto") == "fused"
    assert resolve_backend("a100-80gb-sxm", "auto") == "flash"
    assert attention_curve("a100-80gb-sxm", "auto") is A100_FLASH
    assert attention_curve("mi300x", "auto") is None


@pytest.mark.parametrize("backend, curve", [("fused", H100_FUSED), ("flash", H100_FLASH)])
def test_a_flash_kernel_runs_its_work_at_the_published_speed_x_attainment(backend, curve):
    device = get_device("h100-sxm")
    cost = RooflineCost(device, "bf16", attention_backend=backend)
    parallel = ParallelConfig()
    (fwd,) = [k for k in layer_forward(LLAMA, parallel) if k.name == "flash_attention"]
    (bwd,) = [k for k in layer_backward(LLAMA, parallel) if k.name == "flash_attention"]
    for kernel, phase in ((fwd, "forward"), (bwd, "backward")):
        rate = 989.4e12 * curve.fraction(8192, phase) * ATTAINMENT
        assert cost.kernels_time([kernel]) == pytest.approx(kernel.executed / rate)
    # a GEMM keeps the matmul ceiling
    gemm = next(k for k in layer_forward(LLAMA, parallel) if k.gemm)
    assert cost.kernels_time([gemm]) == pytest.approx(RooflineCost(device).kernels_time([gemm]))


def test_context_parallelism_looks_the_speed_up_at_the_per_rank_length():
    (fwd,) = [k for k in layer_forward(LLAMA, ParallelConfig(cp=4))
              if k.name == "flash_attention"]
    assert fwd.attention[:2] == (8192 / 4, "forward")


def test_recomputed_forward_and_backward_keep_their_own_speeds_in_a_stage():
    plan_kernels = layer_backward(LLAMA, ParallelConfig()) + layer_forward(LLAMA,
                                                                           ParallelConfig())
    merged = [k for k in merge(plan_kernels) if k.name == "flash_attention"]
    assert sorted(k.attention[1] for k in merged) == ["backward", "forward"]


def test_auto_is_fused_on_an_h100_both_slower_than_the_matmul_ceiling_flash_slowest():
    topology = load_topology("dgx-h100")
    parallel = ParallelConfig(dp=8)
    device = get_device("h100-sxm")

    def seconds(**kwargs):
        return simulate(LLAMA, parallel, topology,
                        costs=RooflineCostModel(**kwargs)).iteration_time

    at_matmul_ceiling = seconds(  # the same fractions, attention at the GEMMs' rate
        compute_efficiency=device.matmul_ceiling_of("bf16") * ATTAINMENT,
        memory_efficiency=device.hbm_ceiling * ATTAINMENT)
    fused, flash = seconds(attention_backend="fused"), seconds(attention_backend="flash")
    assert seconds() == pytest.approx(fused)
    assert at_matmul_ceiling < fused < flash


def test_refusals_name_the_flag_and_the_rule():
    with pytest.raises(ConfigError, match="attention_backend must be one of"):
        RooflineCostModel(attention_backend="triton")
    with pytest.raises(ConfigError, match="--compute-efficiency replaces every ceiling"):
        RooflineCostModel(attention_backend="flash", compute_efficiency=0.5)
    with pytest.raises(ConfigError, match="no published speed of flash attention on b200"):
        RooflineCost(get_device("b200"), attention_backend="flash")
    unfused = replace(LLAMA, use_flash_attn=False)
    with pytest.raises(ConfigError, match="this model runs unfused attention"):
        simulate(unfused, ParallelConfig(dp=8), load_topology("dgx-h100"),
                 costs=RooflineCostModel(attention_backend="fused"))


def test_a_device_without_a_published_speed_says_what_it_assumed():
    timeline = simulate(LLAMA, ParallelConfig(dp=8), load_topology("mi300x-8"),
                        costs=RooflineCostModel())
    assert any("flash attention on mi300x at the matmul ceiling" in w
               for w in timeline.meta["warnings"])


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_flag_reaches_the_run_and_is_refused_where_it_changes_nothing(tmp_path):
    base = ["simulate", "--model", "llama3-8b", "--num-layers", "2", "--pp", "1", "--dp", "8",
            "--topology", "dgx-h100", "-o", str(tmp_path / "g.html")]
    runs = {b: cli(*base, "--attention-backend", b, cwd=tmp_path) for b in ("fused", "flash")}
    assert all(r.returncode == 0 for r in runs.values()), runs
    assert "attention: published speed of the flash kernel" in runs["flash"].stdout
    times = {b: float(r.stdout.split("iteration time ")[1].split(" s")[0])
             for b, r in runs.items()}
    assert times["flash"] > times["fused"]
    refused = cli(*base, "--attention-backend", "flash", "--uniform-costs", "1,2",
                  cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("clustersim: error: --attention-backend refines the "
                                      "roofline: --profile and --uniform-costs replace it; "
                                      "give one of them")
