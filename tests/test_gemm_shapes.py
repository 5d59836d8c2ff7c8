"""GEMM speed by shape (sim.cost.gemm_seconds_at_ceiling) against published H100 GEMM
times that none of its constants came from: XLA's measured bf16 table for the H100
(openxla xla/service/gpu/model/matmul_interpolator_data.h, 'sm_90', b = 1; as vendored in
tensorflow/tensorflow third_party/xla at 9bebee8e), every shape of it with M*N >= 4M and
K >= 1024 (the constants: the MAMF of S. Bekman's table, the HBM ceiling, and the floor
from the table's smallest GEMM, 256x512x256), and one cuBLAS-class measurement of an
other source (H. He's H100 matmul gist: 4224x2048x8192, 780.17 TFLOP/s)."""
import statistics

import pytest

from clustersim.schedules.layer_kernels import Kernel
from clustersim.sim.cost import ATTAINMENT, RooflineCost, gemm_seconds_at_ceiling
from clustersim.topologies import get_device

XLA_H100_BF16_TFLOPS = {  # (M, N, K): TFLOP/s
    (1024, 4096, 1024): 490.29, (1024, 4096, 2048): 633.1, (1024, 4096, 4096): 742.3,
    (2048, 2048, 1024): 492.09, (2048, 2048, 2048): 630.87, (2048, 2048, 4096): 742.3,
    (2048, 4096, 1024): 593.88, (2048, 4096, 2048): 717.5, (2048, 4096, 4096): 760.44,
    (4096, 1024, 1024): 491.64, (4096, 1024, 2048): 633.1, (4096, 1024, 4096): 740.77,
    (4096, 2048, 1024): 590.94, (4096, 2048, 2048): 722.57, (4096, 2048, 4096): 764.09,
    (4096, 4096, 1024): 681.09, (4096, 4096, 2048): 739.87, (4096, 4096, 4096): 786.05,
}
H100 = get_device("h100-sxm")


def gemm(m, n, k, repeats=1):
    """A bf16 (M x K) @ (K x N) GEMM kernel: 2MNK FLOPs, reads A and B, writes C."""
    return Kernel("gemm", repeats * 2 * m * n * k, repeats * 2 * (m * k + k * n + m * n),
                  gemm=(m, n, k))


def tflops(device, shape):
    return 2 * shape[0] * shape[1] * shape[2] / gemm_seconds_at_ceiling(
        device, "bf16", gemm(*shape), 2) / 1e12


def test_the_shape_law_follows_xlas_h100_gemm_times():
    errors = [tflops(H100, s) / v - 1 for s, v in XLA_H100_BF16_TFLOPS.items()]
    assert statistics.mean(abs(e) for e in errors) < 0.07
    assert max(abs(e) for e in errors) < 0.13
    flat = [H100.achievable_flops("bf16") / 1e12 / v - 1 for v in XLA_H100_BF16_TFLOPS.values()]
    assert statistics.mean(abs(e) for e in flat) > 3 * statistics.mean(abs(e) for e in errors)


def test_a_deep_gemm_of_another_source_is_within_two_percent():
    assert tflops(H100, (4224, 2048, 8192)) == pytest.approx(780.17, rel=0.02)


def test_speed_falls_with_shallower_k_and_meets_the_ceiling_at_its_measured_shape():
    by_k = [tflops(H100, (4096, 4096, k)) for k in (1024, 2048, 4096, 8192, 16384)]
    assert by_k == sorted(by_k)
    assert tflops(H100, (2048, 2048, 13312)) == pytest.approx(794.5)  # the MAMF's own shape


def test_merged_gemms_pay_each_output_write_and_floor():
    one = gemm_seconds_at_ceiling(H100, "bf16", gemm(4096, 4096, 1024), 2)
    assert gemm_seconds_at_ceiling(H100, "bf16", gemm(4096, 4096, 1024, 3), 2) == \
        pytest.approx(3 * one)


def test_devices_that_overlap_the_output_write_keep_the_flat_ceiling():
    b200 = get_device("b200")
    assert b200.best_shape_of("bf16") is None
    kernel = gemm(4096, 4096, 1024)
    assert RooflineCost(b200).kernels_time([kernel]) == pytest.approx(
        kernel.flops / (b200.achievable_flops("bf16") * ATTAINMENT))


def test_in_a_layer_the_gemm_runs_at_the_shape_law_over_the_attainment():
    kernel = gemm(4096, 6144, 2048)
    assert RooflineCost(H100).kernels_time([kernel]) == pytest.approx(
        gemm_seconds_at_ceiling(H100, "bf16", kernel, 2) / ATTAINMENT)
    explicit = RooflineCost(H100, compute_efficiency=0.5, memory_efficiency=0.5)
    assert explicit.kernels_time([kernel]) == pytest.approx(
        kernel.flops / (0.5 * H100.peak("bf16")))  # explicit efficiencies: flat
