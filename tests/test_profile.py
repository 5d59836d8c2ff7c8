"""The profile format (schedules.profile) and the costs read from it (sim.profile_cost)."""
import json
import re

import pytest
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.profile import AlphaBeta, Profile, fit_alpha_beta, model_shape
from clustersim.schedules.timeline import Span, Timeline
from clustersim.sim.profile_cost import (AlphaBetaNetwork, ProfileCost, check_profile,
                              profile_collective_time)
from clustersim.schedules.plan import resolve
from clustersim.sim.cost_model import ProfileCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

MODEL = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                  vocab_size=128, micro_batch_size=2, dtype="fp32")


def make_profile(**overrides):
    fields = dict(
        device="cpu",
        compute={"layer": {"F": 1.0, "B": 2.0, "I": 1.25, "W": 0.75},
                 "embedding": {"F": 0.1, "B": 0.2, "I": 0.0, "W": 0.2},
                 "head": {"F": 0.5, "B": 1.0, "I": 0.6, "W": 0.4}},
        p2p=AlphaBeta(1e-3, 1e-9, ((1000, 1.001e-3), (10**6, 2e-3))),
        collectives={"all_reduce": {2: AlphaBeta(2e-3, 4e-9, ((8, 2e-3),))}},
        model=model_shape(MODEL), source="test", versions={"torch": "x"}, date="today",
        threads=1)
    fields.update(overrides)
    return Profile(**fields)


@pytest.mark.parametrize("relative", [True, False])
def test_fit_alpha_beta_recovers_an_exact_line(relative):
    points = [(b, 5e-6 + 2e-10 * b) for b in (0, 1024, 65536, 2**20, 2**30)]
    alpha, beta = fit_alpha_beta(points, relative)
    assert alpha == pytest.approx(5e-6) and beta == pytest.approx(2e-10)


def test_fit_alpha_beta_relative_weights_small_sizes_like_large_ones():
    # 10% noise on the largest point barely moves alpha in the relative fit
    points = [(1000, 1e-5 + 1e-9 * 1000), (10**6, 1e-5 + 1e-3), (10**9, 1.1 * (1e-5 + 1.0))]
    alpha, _ = fit_alpha_beta(points)
    assert alpha == pytest.approx(1e-5, rel=0.05)
    plain_alpha, _ = fit_alpha_beta(points, relative=False)
    assert plain_alpha == 0  # plain least squares: alpha swamped (clamped from negative)


def test_fit_alpha_beta_never_negative():
    assert fit_alpha_beta([(100, 3.0), (200, 1.0)], relative=False) == (2.0, 0.0)
    alpha, beta = fit_alpha_beta([(100, 0.5), (200, 2.0)], relative=False)
    assert alpha == 0 and beta == pytest.approx((100 * 0.5 + 200 * 2.0) / (100**2 + 200**2))
    alpha, beta = fit_alpha_beta([(100, 3.0), (200, 1.0)])  # weighted mean 1/t^2
    assert beta == 0 and alpha == pytest.approx((3 / 9 + 1) / (1 / 9 + 1))
    assert fit_alpha_beta([(1000, 2.0)]) == (0.0, 0.002)
    assert fit_alpha_beta([(0, 2.0), (0, 4.0)], relative=False) == (3.0, 0.0)
    with pytest.raises(ConfigError):
        fit_alpha_beta([])


def test_profile_round_trips_through_json(tmp_path):
    profile = make_profile()
    path = tmp_path / "p.json"
    profile.save(path)
    again = Profile.load(path)
    assert again == profile
    data = json.loads(path.read_text())
    assert data["format"] == "clustersim-profile/1"
    assert data["collectives"]["all_reduce"]["2"]["alpha"] == 2e-3
    assert data["model"]["hidden_size"] == 64


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["compute"]["layer"].pop("W"), "compute.layer.W"),
    (lambda d: d["compute"].pop("head"), "compute.head"),
    (lambda d: d["compute"]["layer"].update(F=-1), "compute.layer.F"),
    (lambda d: d["p2p"].pop("beta"), "p2p.beta"),
    (lambda d: d.pop("device"), "device"),
    (lambda d: d["collectives"]["all_reduce"].update({"x": {}}), "collectives.all_reduce"),
    (lambda d: d["collectives"].update(all_sum={}), "collectives.all_sum"),
    (lambda d: d.update(threads=0), "threads"),
    (lambda d: d.update(format="other/9"), "format"),
    (lambda d: d.update(optimizer_seconds_per_param=0), "optimizer_seconds_per_param"),
    (lambda d: d.update(optimizer_seconds_per_param="1e-9"), "optimizer_seconds_per_param"),
])
def test_profile_validation_names_the_field(mutate, field):
    data = make_profile().to_dict()
    mutate(data)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Profile.from_dict(data)


def test_profile_optimizer_seconds_per_param_round_trips_and_is_optional(tmp_path):
    measured = make_profile(optimizer_seconds_per_param=2.5e-9)
    measured.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["optimizer_seconds_per_param"] == 2.5e-9
    assert Profile.load(tmp_path / "p.json") == measured
    old = make_profile().to_dict()  # an older profile: no such key
    assert "optimizer_seconds_per_param" not in old
    assert Profile.from_dict(old).optimizer_seconds_per_param is None


def test_profile_load_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json.*not valid JSON"):
        Profile.load(path)
    with pytest.raises(ConfigError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")


def test_profile_cost_sums_layers_and_stage_extras():
    cost = ProfileCost(make_profile(), [2, 2])
    assert cost(Op(OpKind.F, 0, 0)) == pytest.approx(2 * 1.0 + 0.1)
    assert cost(Op(OpKind.B, 0, 3)) == pytest.approx(2 * 2.0 + 0.2)
    assert cost(Op(OpKind.F, 1, 0)) == pytest.approx(2 * 1.0 + 0.5)
    assert cost(Op(OpKind.I, 1, 0)) == pytest.approx(2 * 1.25 + 0.6)
    assert cost(Op(OpKind.W, 1, 0)) == pytest.approx(2 * 0.75 + 0.4)
    # stage 0's input needs no gradient: I is empty, W is the whole backward
    assert cost(Op(OpKind.I, 0, 0)) == pytest.approx(0.0)
    assert cost(Op(OpKind.W, 0, 0)) == pytest.approx(2 * 2.0 + 0.2)
    single = ProfileCost(make_profile(), [4])  # first and last stage at once
    assert single(Op(OpKind.B, 0, 0)) == pytest.approx(4 * 2.0 + 0.2 + 1.0)
    assert single(Op(OpKind.W, 0, 0)) == pytest.approx(4 * 2.0 + 0.2 + 1.0)
    assert cost(Op(OpKind.SEND_F, 0, 0, "pp", 100)) == 0.0
    with pytest.raises(ConfigError, match="OPT_STEP"):
        cost(Op(OpKind.OPT_STEP, 0))


def test_full_recompute_adds_one_layer_forward_to_each_layer_backward():
    """K22 Table 4's 22B layer: backward 11.9 ms, 19.5 ms with full recompute, ~ + F 7.7 ms."""
    plain, redo = ProfileCost(make_profile(), [2, 2]), ProfileCost(make_profile(), [2, 2],
                                                                   rerun_layers=len)
    for stage in (0, 1):
        assert redo(Op(OpKind.F, stage, 0)) == plain(Op(OpKind.F, stage, 0))
        assert redo(Op(OpKind.B, stage, 0)) == pytest.approx(plain(Op(OpKind.B, stage, 0)) + 2.0)
    assert redo(Op(OpKind.I, 1, 0)) == pytest.approx(plain(Op(OpKind.I, 1, 0)) + 2.0)
    assert redo(Op(OpKind.W, 1, 0)) == plain(Op(OpKind.W, 1, 0))
    assert redo(Op(OpKind.W, 0, 0)) == pytest.approx(plain(Op(OpKind.W, 0, 0)) + 2.0)  # whole B
    full = ParallelConfig(micro_batch_size=2, recompute="full", pp=2)
    planned = ProfileCost.for_plan(make_profile(), resolve(MODEL, full))
    assert planned(Op(OpKind.B, 1, 0)) == redo(Op(OpKind.B, 1, 0))
    block = ParallelConfig(micro_batch_size=2, recompute="full", pp=2, recompute_method="block")
    first = ProfileCost.for_plan(make_profile(), resolve(MODEL, block))  # 1 of 2 layers
    assert first(Op(OpKind.B, 1, 0)) == pytest.approx(plain(Op(OpKind.B, 1, 0)) + 1.0)
    with pytest.raises(ConfigError, match="selective"):
        check_profile(make_profile(), MODEL, ParallelConfig(micro_batch_size=2,
                                                            recompute="selective"))


@pytest.mark.parametrize("field, value", [
    ("hidden_size", 128), ("seq_length", 64), ("micro_batch_size", 4), ("dtype", "bf16"),
    ("ffn_hidden_size", 128), ("num_attention_heads", 8)])
def test_profile_at_other_shapes_is_refused_naming_the_field(field, value):
    from dataclasses import replace
    other = replace(MODEL, **{field: value})
    with pytest.raises(ConfigError, match=field):
        check_profile(make_profile(), other)


def test_profile_layers_are_per_layer_so_num_layers_may_differ():
    from dataclasses import replace
    check_profile(make_profile(), replace(MODEL, num_layers=8))
    with pytest.raises(ConfigError, match="tp=1"):
        check_profile(make_profile(), MODEL, ParallelConfig(pp=1, tp=2, micro_batch_size=2))


def test_alpha_beta_network_takes_alpha_plus_beta_bytes():
    env = simpy.Environment()
    net = AlphaBetaNetwork(env, 1e-3, 2e-9)
    done = net.transfer("a", "b", 10**6)
    env.run(done)
    assert env.now == pytest.approx(1e-3 + 2e-3)
    with pytest.raises(ConfigError):
        AlphaBetaNetwork(env, -1, 0)


def test_profile_collective_time():
    profile = make_profile()
    assert profile_collective_time(profile, OpKind.ALL_REDUCE, 2, 10**6) == \
        pytest.approx(2e-3 + 4e-3)
    assert profile_collective_time(profile, "all-reduce", 2, 0) == pytest.approx(2e-3)
    assert profile_collective_time(profile, OpKind.ALL_REDUCE, 1, 10**9) == 0.0
    with pytest.raises(ConfigError, match="group sizes 2, not 4"):
        profile_collective_time(profile, OpKind.ALL_REDUCE, 4, 1)
    with pytest.raises(ConfigError, match="no all_gather"):
        profile_collective_time(profile, OpKind.ALL_GATHER, 2, 1)


def test_simulate_with_profile_matches_hand_computed_gpipe():
    """GPipe pp=2, M=2, 2 layers per stage; P2P alpha 1 ms + 1 ns/byte.
    Stage 0 F = 2.1, stage 1 F = 2.5; stage 1 B = 5.0, stage 0 B = 4.2."""
    parallel = ParallelConfig(pp=2, num_microbatches=2, micro_batch_size=2, schedule="gpipe")
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"), None,
                        ProfileCostModel(make_profile()))
    p = 1e-3 + 1e-9 * (2 * 32 * 64 * 4)  # one activation of b*s*h fp32
    # Rank 1 posts RECV_F(1,1) only after F(1,0) ends (Megatron's placement), so:
    # F(1,0) ends 4.6+p, F(1,1) 4.6+2p..7.1+2p, B(1,0) ..12.1+2p, B(1,1) ..17.1+2p;
    # rank 0: B(0,0) 12.1+3p..16.3+3p, B(0,1) from 17.1+3p (its gradient's arrival).
    expected = 17.1 + 3 * p + 4.2
    assert timeline.iteration_time == pytest.approx(expected)
    assert timeline.meta["cost_model"] == "profile(cpu)"


def test_simulate_prices_opt_step_from_the_profile_per_parameter():
    """The GPipe run above with a measured optimizer step of 1 us/param: each OPT_STEP
    takes nbytes / 28 * 1e-6 s, and rank 0's (after its last B) ends the iteration."""
    from clustersim.schedules.dp_sizes import ADAM_BYTES_PER_PARAM
    parallel = ParallelConfig(pp=2, num_microbatches=2, micro_batch_size=2, schedule="gpipe")
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"), None,
                        ProfileCostModel(make_profile(optimizer_seconds_per_param=1e-6)))
    steps = {s.op.stage: s for s in timeline.spans if s.op.kind is OpKind.OPT_STEP}
    assert sorted(steps) == [0, 1]
    for span in steps.values():
        assert span.end - span.start == pytest.approx(span.op.nbytes / ADAM_BYTES_PER_PARAM
                                                      * 1e-6)
    p = 1e-3 + 1e-9 * (2 * 32 * 64 * 4)
    assert timeline.iteration_time == pytest.approx(
        17.1 + 3 * p + 4.2 + steps[0].op.nbytes / ADAM_BYTES_PER_PARAM * 1e-6)


def test_measured_optimizer_step_leaves_offloaded_steps_to_cpu_adam():
    from clustersim.sim.optimizer_cost import CPU_ADAM_SECONDS_PER_PARAM, with_optimizer_steps
    timed = with_optimizer_steps(lambda op: 0.0, lambda s: None, lambda device: 0.8,
                                 gpu_seconds_per_param=3e-9)
    assert timed(Op(OpKind.OPT_STEP, 0, None, None, 28 * 10**6)) == pytest.approx(3e-3)
    assert timed(Op(OpKind.OPT_STEP, 0, None, "host", 28 * 10**6)) == pytest.approx(
        10**6 * CPU_ADAM_SECONDS_PER_PARAM)


# --- CLI: simulate --profile and compare A.json B.json (no torch needed) -----------------
TINY_FLAGS = ("--model", "gpt3-1.3b", "--num-layers", "4", "--hidden-size", "64",
              "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
              "--micro-batch-size", "2", "--dtype", "fp32")


def tiny_model():
    from clustersim.schedules.model_presets import get_model
    return get_model("gpt3-1.3b", num_layers=4, hidden_size=64, num_attention_heads=4,
                     seq_length=32, vocab_size=128, micro_batch_size=2, dtype="fp32")


def test_cli_simulate_with_profile(tmp_path):
    from test_cli import clustersim
    path = tmp_path / "profile.json"
    make_profile(model=model_shape(tiny_model())).save(path)
    out = clustersim("simulate", "--schedule", "gpipe", "--pp", "2", "--microbatches", "2",
                     *TINY_FLAGS, "--profile", str(path), "-o", str(tmp_path / "g.html"),
                     "--timeline-json", str(tmp_path / "sim.json"))
    assert "costs=profile(cpu)" in out.stdout
    timeline = Timeline.load(tmp_path / "sim.json")
    assert timeline.iteration_time == pytest.approx(17.1 + 3 * (1e-3 + 1e-9 * 16384) + 4.2)


def test_cli_simulate_refuses_a_profile_of_other_shapes(tmp_path):
    from test_cli import clustersim
    path = tmp_path / "profile.json"
    make_profile(model=model_shape(tiny_model())).save(path)
    out = clustersim("simulate", "--pp", "2", "--microbatches", "2", *TINY_FLAGS,
                     "--seq-length", "64", "--profile", str(path), check=False)
    assert out.returncode == 2
    assert "seq_length" in out.stderr and out.stderr.count("\n") == 1


def _timeline(f, b, source):
    spans = []
    for m in range(2):
        spans.append(Span(0, "compute", Op(OpKind.F, 0, m), m * f, (m + 1) * f))
    for m in range(2):
        start = 2 * f + m * b
        spans.append(Span(0, "compute", Op(OpKind.B, 0, m), start, start + b))
    spans.append(Span(0, "send", Op(OpKind.SEND_F, 0, 0, "pp", 64), f, f + 0.5))
    return Timeline(spans, source=source)


def test_cli_compare_two_timelines(tmp_path):
    from test_cli import clustersim
    _timeline(1.0, 2.0, "sim").save(tmp_path / "a.json")
    _timeline(1.25, 2.0, "kernels:cpu").save(tmp_path / "b.json")
    out = clustersim("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                     "-o", str(tmp_path / "cmp.html"))
    # A: 2*1 + 2*2 = 6 s; B: 2*1.25 + 2*2 = 6.5 s -> (6 - 6.5) / 6.5 = -7.69%
    assert "error (A-B)/B -7.69%" in out.stdout
    assert re.search(r"^F\s+2\s+2\s+1 s\s+1\.25 s\s+-20\.00%$", out.stdout, re.M)
    assert re.search(r"^B\s+2\s+2\s+2 s\s+2 s\s+\+0\.00%$", out.stdout, re.M)
    assert (tmp_path / "cmp.html").stat().st_size > 100_000
    data = json.loads(clustersim("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                 "--json").stdout)
    assert data["iteration_time_error_pct"] == pytest.approx(-100 / 13)
    assert [k["kind"] for k in data["op_kinds"]] == ["F", "B", "SEND_F"]
    assert [(k["kind"], k["stage"]) for k in data["op_kinds_per_stage"]] == [
        ("F", 0), ("B", 0), ("SEND_F", 0)]


def test_compare_splits_each_op_kind_by_stage():
    from clustersim.sim.timeline_compare import compare_timelines, format_comparison

    def two_stages(f1):
        return Timeline([Span(0, "compute", Op(OpKind.F, 0, 0), 0.0, 1.0),
                         Span(1, "compute", Op(OpKind.F, 1, 0), 1.0, 1.0 + f1)])

    result = compare_timelines(two_stages(3.0), two_stages(2.0))
    per_stage = {r["stage"]: r["error_pct"] for r in result["op_kinds_per_stage"]}
    assert per_stage == {0: 0.0, 1: pytest.approx(50.0)}  # (3 - 2) / 2
    assert result["op_kinds"][0]["error_pct"] == pytest.approx(100 / 3)  # means 2 vs 1.5
    assert re.search(r"^F s1\s+1\s+1\s+3 s\s+2 s\s+\+50\.00%$",
                     format_comparison(result, "a", "b"), re.M)


def test_cli_compare_without_files_still_compares_schedules(tmp_path):
    from test_cli import clustersim
    out = clustersim("compare", "--schedules", "gpipe,1f1b", "--pp", "2", "--microbatches",
                     "4", "--uniform-costs", "1,2")
    assert "gpipe" in out.stdout and "1f1b" in out.stdout
    bad = clustersim("compare", str(tmp_path / "only-one.json"), check=False)
    assert bad.returncode == 2
    assert "two Timeline JSON or PyTorch profiler trace files" in bad.stderr


def test_simulate_with_profile_costs_the_dp_allreduce_from_the_fit():
    """pp=1, dp=2, one microbatch: F, B, then the gradient all-reduce of the whole model
    (alpha 2 ms + 4 ns/byte from the profile's all_reduce fit for 2 ranks)."""
    parallel = ParallelConfig(pp=1, dp=2, num_microbatches=1, micro_batch_size=2,
                              schedule="gpipe")
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"), None,
                        ProfileCostModel(make_profile()))
    grad_bytes = resolve(MODEL, parallel).stage_costs[0].grad_bytes
    compute = (4 * 1.0 + 0.1 + 0.5) + (4 * 2.0 + 0.2 + 1.0)
    assert timeline.iteration_time == pytest.approx(compute + 2e-3 + 4e-9 * grad_bytes)
    [span] = [s for s in timeline.spans if s.op.kind is OpKind.ALL_REDUCE]
    assert span.info["group_size"] == 2


def test_profile_costs_an_op_of_count_collectives_as_count_latencies():
    """An op standing for 4 back-to-back all-reduces of 1 MB each pays 4 alphas."""
    import simpy

    from clustersim.sim.profile_cost import profile_collective_model
    env = simpy.Environment()
    run = profile_collective_model(env, make_profile(),
                                   resolve(MODEL, ParallelConfig(dp=2, micro_batch_size=2)))
    op = Op(OpKind.ALL_REDUCE, 0, None, "dp", 4_000_000, count=4)
    env.run(run(op, 0))
    assert env.now == pytest.approx(4 * (2e-3 + 4e-9 * 1_000_000))
