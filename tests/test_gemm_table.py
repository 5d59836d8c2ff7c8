"""The profile's optional `gemm` and `attention` sections (schedules.profile) and the GEMM
table interpolated from them (sim.gemm_table), against closed-form truth."""
import json
import math
import random
from itertools import product

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import Kernel, merge
from clustersim.schedules.profile import GemmTimes, Profile
from clustersim.sim.cost import RooflineCost
from clustersim.sim.gemm_table import GemmTable, gemm_seconds_of
from clustersim.topologies import get_device

COMPUTE = {p: {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0} for p in ("layer", "embedding", "head")}


def profile_dict(**sections):
    return {"device": "cpu", "compute": COMPUTE, "p2p": {"alpha": 1e-5, "beta": 1e-9},
            **sections}


GEMM = {"dtype": "bf16", "points": [[128, 256, 64, 1e-5], [256, 256, 64, 1.5e-5]]}
ATTENTION = {"dtype": "bf16", "causal": True,
             "points": [[2, 8, 2, 1024, 64, 1e-4, 2.5e-4]]}


# --- the profile sections -----------------------------------------------------------------
def test_sections_round_trip_through_a_file(tmp_path):
    profile = Profile.from_dict(profile_dict(gemm=GEMM, attention=ATTENTION))
    profile.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    assert loaded == profile
    assert loaded.gemm.points == ((128, 256, 64, 1e-5), (256, 256, 64, 1.5e-5))
    assert loaded.attention.seconds(2, 8, 2, 1024, 64) == (1e-4, 2.5e-4)
    assert loaded.attention.seconds(2, 8, 8, 1024, 64) is None
    assert json.loads((tmp_path / "p.json").read_text())["gemm"] == GEMM


def test_profiles_without_the_sections_stay_valid_and_write_none():
    profile = Profile.from_dict(profile_dict())
    assert profile.gemm is None and profile.attention is None
    assert "gemm" not in profile.to_dict() and "attention" not in profile.to_dict()
    assert gemm_seconds_of(profile) is None and gemm_seconds_of(None) is None


def _with(section, path, value):
    data = json.loads(json.dumps(section))
    where = data
    for key in path[:-1]:
        where = where[key]
    if value is KeyError:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return data


@pytest.mark.parametrize("path, value, message", [
    (("dtype",), "int4", r"gemm\.dtype must be one of bf16, fp16, fp32, fp8, got 'int4'"),
    (("dtype",), KeyError, r"gemm\.dtype is missing"),
    (("points",), [], r"gemm\.points must be a non-empty list of \[M, N, K, seconds\] rows"),
    (("points",), "x", r"gemm\.points must be a non-empty list"),
    (("points", 1), [256, 256, 64], r"gemm\.points\[1\] must be a list \[M, N, K, seconds\]"),
    (("points", 0, 0), 0, r"gemm\.points\[0\] M must be an integer 1\.\.1000000000, got 0"),
    (("points", 0, 1), 2.5, r"gemm\.points\[0\] N must be an integer 1\.\.1000000000"),
    (("points", 0, 2), True, r"gemm\.points\[0\] K must be an integer"),
    (("points", 0, 2), 10 ** 10, r"gemm\.points\[0\] K must be an integer 1\.\.1000000000"),
    (("points", 0, 3), 0, r"gemm\.points\[0\] seconds must be a finite number of seconds > 0"),
    (("points", 0, 3), -1e-3, r"gemm\.points\[0\] seconds must be a finite number"),
    (("points", 0, 3), float("inf"), r"gemm\.points\[0\] seconds must be a finite number"),
    (("points", 0, 3), 1e7, r"gemm\.points\[0\] seconds .* <= 1e\+06"),
    (("points", 0, 3), "1", r"gemm\.points\[0\] seconds must be a finite number"),
    (("points", 1, 0), 128, r"gemm\.points\[1\]: shape \[128, 256, 64\] appears twice "
                            r"\(also gemm\.points\[0\]\)"),
])
def test_bad_gemm_sections_are_one_error_naming_field_and_rule(path, value, message):
    with pytest.raises(ConfigError, match=message):
        Profile.from_dict(profile_dict(gemm=_with(GEMM, path, value)))


@pytest.mark.parametrize("path, value, message", [
    (("causal",), "yes", r"attention\.causal must be true or false"),
    (("causal",), KeyError, r"attention\.causal is missing"),
    (("dtype",), None, r"attention\.dtype must be one of"),
    (("points", 0), [2, 8, 2, 1024, 64, 1e-4],
     r"attention\.points\[0\] must be a list \[batch, heads, kv_heads, seq, head_dim, "
     r"forward seconds, backward seconds\]"),
    (("points", 0, 2), 3, r"attention\.points\[0\]: kv_heads=3 must divide heads=8"),
    (("points", 0, 3), -1, r"attention\.points\[0\] seq must be an integer 1\.\."),
    (("points", 0, 6), 0.0, r"attention\.points\[0\] backward seconds must be a finite "
                            r"number of seconds > 0"),
])
def test_bad_attention_sections_are_one_error_naming_field_and_rule(path, value, message):
    with pytest.raises(ConfigError, match=message):
        Profile.from_dict(profile_dict(attention=_with(ATTENTION, path, value)))


def test_load_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile_dict(gemm=_with(GEMM, ("points", 0, 0), -4))))
    with pytest.raises(ConfigError) as err:
        Profile.load(path)
    assert str(err.value).startswith(f"{path}: profile field gemm.points[0] M must be")
    assert "\n" not in str(err.value)


def test_sections_are_checked_when_built_in_python_too():
    with pytest.raises(ConfigError, match=r"gemm\.points\[0\] M"):
        GemmTimes("bf16", ((0, 1, 1, 1.0),))
    with pytest.raises(ConfigError, match="profile field gemm must be a GemmTimes"):
        Profile(device="cpu", compute=COMPUTE, p2p=Profile.from_dict(profile_dict()).p2p,
                gemm={"dtype": "bf16"})


# --- the table against a closed form -------------------------------------------------------
def power_rate(m, n, k):
    """FLOP/s = c M^a N^b K^g: ln(rate) is linear in the ln shape, so log-linear
    interpolation is exact."""
    return 3e11 * m ** 0.35 * n ** 0.2 * k ** 0.15


def times(shapes, rate=power_rate, dtype="bf16"):
    return GemmTimes(dtype, tuple((m, n, k, 2 * m * n * k / rate(m, n, k))
                                  for m, n, k in shapes))


GRID = list(product((64, 256, 1024, 4096), (128, 512, 2048), (256, 1024, 4096)))


def test_measured_shapes_answer_their_measured_time():
    table = GemmTable(times(GRID))
    for m, n, k, seconds in table_points(GRID):
        assert table.gemm_time(m, n, k) == seconds
        assert table.gemm_time(float(m), float(n), float(k)) == seconds  # layer_kernels' floats


def table_points(shapes):
    return times(shapes).points


def test_interpolation_reproduces_a_power_law_rate_exactly():
    table = GemmTable(times(GRID))
    rng = random.Random(7)
    for _ in range(300):  # anywhere inside the grid, off-grid on every axis
        q = [math.exp(rng.uniform(math.log(lo), math.log(hi)))
             for lo, hi in ((64, 4096), (128, 2048), (256, 4096))]
        assert table.rate(*q) == pytest.approx(power_rate(*q), rel=1e-9)
        assert table.gemm_time(*q) == pytest.approx(2 * q[0] * q[1] * q[2] / power_rate(*q),
                                                    rel=1e-9)


def test_a_power_law_is_exact_from_scattered_families_of_shapes_too():
    """The calibrated grid is not a tensor product: families (N, K) each along M."""
    families = [(384, 128), (128, 128), (512, 128), (128, 512), (256, 256), (192, 128),
                (128, 64), (64, 128), (96, 128), (128, 32)]
    shapes = [(m, n, k) for n, k in families for m in (32, 64, 128, 256)]
    table = GemmTable(times(shapes))
    for q in [(100, 384, 128), (48, 256, 128), (200, 160, 128), (128, 128, 96),
              (77, 200, 200)]:
        assert table.rate(*q) == pytest.approx(power_rate(*q), rel=1e-9), q
    # (N, K) = (300, 180) is outside the measured (N, K): no family has N >= 300 and
    # K >= 180 (in log space (512, 128), (256, 256), (128, 512) lie on one line)
    assert table.rate(77, 300, 180) is None


def test_queries_outside_the_measured_range_are_not_extrapolated():
    table = GemmTable(times(GRID))
    assert table.gemm_time(8192, 512, 1024) is None  # M above the largest measured
    assert table.gemm_time(32, 512, 1024) is None  # below the smallest
    assert table.gemm_time(256, 4096, 1024) is None
    assert table.gemm_time(256, 512, 100) is None
    assert table.gemm_time(0, 512, 1024) is None
    assert table.neighbours(8192, 512, 1024) is None
    # one family along M spans no other N: off its line is outside
    line = GemmTable(times([(m, 512, 512) for m in (64, 256, 1024)]))
    assert line.gemm_time(128, 512, 512) is not None
    assert line.gemm_time(128, 600, 512) is None


NOISY_RATE = {}


def noisy_rate(m, n, k):
    """A non-monotone, noisy rate: no closed form the interpolation could reproduce."""
    key = (m, n, k)
    if key not in NOISY_RATE:
        NOISY_RATE[key] = power_rate(m, n, k) * random.Random(hash(key)).uniform(0.5, 2.0)
    return NOISY_RATE[key]


def test_along_one_family_the_rate_is_log_linear_between_its_two_neighbours():
    ms = (16, 64, 128, 512, 2048)
    table = GemmTable(times([(m, 256, 256) for m in ms], rate=noisy_rate))
    for lo, hi in zip(ms, ms[1:]):
        for f in (0.1, 0.5, 0.9):
            m = math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo)))
            r_lo, r_hi = noisy_rate(lo, 256, 256), noisy_rate(hi, 256, 256)
            expected = math.exp(math.log(r_lo) + f * (math.log(r_hi) - math.log(r_lo)))
            assert table.rate(m, 256, 256) == pytest.approx(expected, rel=1e-9)
            assert min(r_lo, r_hi) * (1 - 1e-12) <= table.rate(m, 256, 256) \
                <= max(r_lo, r_hi) * (1 + 1e-12)
            assert sorted(table.neighbours(m, 256, 256)) == [(lo, 256, 256), (hi, 256, 256)]


def test_interpolated_rate_lies_between_its_neighbours_and_they_surround_the_query():
    table = GemmTable(times(GRID, rate=noisy_rate))
    rng = random.Random(3)
    for _ in range(200):
        q = [math.exp(rng.uniform(math.log(lo), math.log(hi)))
             for lo, hi in ((64, 4096), (128, 2048), (256, 4096))]
        near = table.neighbours(*q)
        rates = [noisy_rate(*s) for s in near]
        assert min(rates) * (1 - 1e-12) <= table.rate(*q) <= max(rates) * (1 + 1e-12)
        for axis in range(3):  # the query is inside their range on every axis
            assert min(s[axis] for s in near) <= q[axis] <= max(s[axis] for s in near)


def test_the_answer_tends_to_a_measured_time_as_the_query_approaches_it():
    table = GemmTable(times(GRID, rate=noisy_rate))
    m, n, k = 256, 512, 1024
    measured = table.gemm_time(m, n, k)
    assert table.gemm_time(m * (1 + 1e-7), n, k * (1 - 1e-7)) == pytest.approx(measured,
                                                                             rel=1e-5)


# --- as sim.cost.GemmSeconds -----------------------------------------------------------------
def test_seconds_of_a_kernel_counts_the_gemms_it_stands_for():
    table = GemmTable(times(GRID))
    m, n, k = 256.0, 512.0, 1024.0
    one = Kernel("fc1_gemm", 2 * m * n * k, 1.0, gemm=(m, n, k))
    single = table.gemm_time(m, n, k)
    assert table.seconds(one, "bf16") == pytest.approx(single)
    four_layers = merge([one] * 4)[0]  # a stage of 4 layers: one kernel, 4x the FLOPs
    assert table.seconds(four_layers, "bf16") == pytest.approx(4 * single)
    assert table.seconds(one.scaled(0.5), "bf16") == pytest.approx(single / 2)  # I or W
    assert table.seconds(one, "fp8") is None  # not measured in that dtype
    assert table.seconds(Kernel("norm", 0.0, 1e6), "bf16") is None  # not a GEMM
    assert table.seconds(Kernel("x", 2 * 8192 * n * k, 1.0, gemm=(8192, n, k)), "bf16") is None


def test_the_hook_prices_measured_gemms_in_the_roofline():
    profile = Profile.from_dict(profile_dict(gemm=times(GRID).to_dict()))
    hook = gemm_seconds_of(profile)
    device = get_device("a100-80gb-sxm")
    roofline = RooflineCost(device, "bf16", gemm_seconds=hook)
    inside = Kernel("fc1_gemm", 2 * 256 * 512 * 1024, 0.0, gemm=(256, 512, 1024))
    outside = Kernel("fc1_gemm", 2 * 8192 * 512 * 1024, 0.0, gemm=(8192, 512, 1024))
    assert roofline.kernels_time([inside]) == pytest.approx(
        2 * 256 * 512 * 1024 / power_rate(256, 512, 1024))
    assert roofline.kernels_time([outside]) == pytest.approx(
        RooflineCost(device, "bf16").kernels_time([outside]))


# --- --gemm-table in the cost model ----------------------------------------------------------
def test_a_gemm_table_prices_the_forward_gemms_of_a_run_and_the_roofline_the_rest():
    """Every forward GEMM shape of a one-layer model measured at 1 s: the simulated F op is
    one second per GEMM kernel plus the roofline of its other kernels."""
    from clustersim.schedules.model import ModelSpec
    from clustersim.schedules.ops import OpKind
    from clustersim.schedules.parallel import ParallelConfig
    from clustersim.schedules.plan import resolve
    from clustersim.sim.cost_model import RooflineCostModel
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology

    model = ModelSpec(num_layers=1, hidden_size=256, num_attention_heads=4, seq_length=128,
                      vocab_size=512, micro_batch_size=2)
    par = ParallelConfig(num_microbatches=1, micro_batch_size=2)
    forward = resolve(model, par).stage_costs[0].forward_kernels
    gemms = [k for k in forward if k.gemm]
    points = sorted({tuple(int(d) for d in k.gemm) for k in gemms})
    table = Profile.from_dict(profile_dict(gemm={"dtype": "bf16",
                                                  "points": [[*p, 1.0] for p in points]}))
    topology = load_topology("dgx-h100")

    def f_seconds(costs):
        spans = simulate(model, par, topology, costs=costs).spans
        return next(s.duration for s in spans if s.op.kind is OpKind.F)

    rest = RooflineCost(get_device("h100")).kernels_time([k for k in forward if not k.gemm])
    assert f_seconds(RooflineCostModel(gemm_table=table)) == pytest.approx(
        len(gemms) * 1.0 + rest, rel=1e-9)
    assert f_seconds(RooflineCostModel()) < 0.01  # the roofline alone: far below a second


def test_a_gemm_table_of_another_dtype_is_refused_not_ignored():
    from clustersim.schedules.model_presets import get_model
    from clustersim.schedules.parallel import ParallelConfig
    from clustersim.sim.cost_model import RooflineCostModel
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology

    fp32 = Profile.from_dict(profile_dict(gemm={**GEMM, "dtype": "fp32"}))
    with pytest.raises(ConfigError, match=r"--gemm-table was measured in fp32, the model's "
                                          r"GEMMs run in bf16: it would price none of them"):
        simulate(get_model("gpt3-1.3b", num_layers=2), ParallelConfig(num_microbatches=1),
                 load_topology("dgx-h100"), costs=RooflineCostModel(gemm_table=fp32))
    with pytest.raises(ConfigError, match="the profile has no gemm section"):
        RooflineCostModel(gemm_table=Profile.from_dict(profile_dict()))
