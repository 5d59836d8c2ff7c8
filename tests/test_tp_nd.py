"""2.5D (Tesseract) and 3D (Colossal-AI's 3D) tensor parallelism (`--tp-mode 2.5d|3d`,
schedules/tp_grid.py, tp_2d.py, tp_3d.py) against the closed forms of
docs/research/tensor_parallel_nd.md, section 2.3 (derived from Colossal-AI's kernels):
- 2.5D on q x q x d: per layer and rank the forward's SUMMA broadcasts move
  (7 T h / d + 12 h^2) / q elements (GPT: sum h_in = 7h, sum h_in h_out = 12 h^2), the
  backward twice that; each GPU holds 1/q^2 of every matrix (d replicas), and the
  replicas' gradients are summed once per iteration over the dp x d ranks;
- 3D on q^3: a ring moves (q-1)/q^3 (16 T h + 12 h^2) elements per layer and rank in the
  forward and as much in the backward; each GPU holds 1/q^3 of every matrix and keeps each
  linear's gathered input (1/q^2) and weight (1/q^2) until its backward.
GPT here: hidden 1024, ffn 4096, LayerNorm, biases, learned positions."""
import math

import pytest

from clustersim.schedules.comm_spec import Covered
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_forward
from clustersim.schedules.lowering import lower
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import (DP_DEP, TP_COL, TP_DEP, TP_GRID_GROUPS, TP_INPUT,
                                        TP_INPUT_WEIGHT, TP_OUTPUT, TP_OUTPUT_WEIGHT, TP_ROW,
                                        TP_WEIGHT)
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import header_line, resolve
from clustersim.schedules.tp_2d import tp_2d_comms
from clustersim.schedules.tp_3d import tp_3d_comms
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

GPT = ModelSpec(num_layers=6, hidden_size=1024, num_attention_heads=16, seq_length=512,
                vocab_size=8192, micro_batch_size=8, ffn_hidden_size=4096)
H, T, D = GPT.hidden_size, GPT.micro_batch_size * GPT.seq_length, GPT.dtype_bytes
MATRICES, VECTORS = 12 * H * H, 4 * H + 9 * H  # a layer's weights; its norms and biases


def config(**kw):
    return ParallelConfig.from_kwargs(**{"pp": 3, "num_microbatches": 3,
                                         "micro_batch_size": 8, **kw})


def volume(comms, kinds, groups, ring=None):
    """Bytes of `comms` of those kinds on those groups, times (n-1)/n for a ring of n."""
    return sum(c.nbytes * (1 if ring is None else (ring - 1) / ring) for c in comms
               if c.kind in kinds and c.group in groups)


@pytest.mark.parametrize("tp, d", [(8, 2), (16, 4)])
def test_25d_summa_traffic_is_the_closed_form(tp, d):
    q = math.isqrt(tp // d)
    parallel = config(tp=tp, tp_mode="2.5d", tp_depth=d)
    summa = (OpKind.BROADCAST, OpKind.REDUCE)
    grid = (TP_ROW, TP_COL)
    x, w = 7 * T * H / d / q * D, MATRICES / q * D
    forward = tp_2d_comms(GPT, parallel, Covered(OpKind.F, 1))
    assert volume([c for c in forward if c.in_linear], summa, grid) == \
        pytest.approx(x + w, rel=1e-6)
    backward = tp_2d_comms(GPT, parallel, Covered(OpKind.B, 1))
    assert volume([c for c in backward if c.in_linear], summa, grid) == \
        pytest.approx(2 * (x + w), rel=1e-6)
    assert volume(backward, (OpKind.REDUCE,), (TP_COL,)) > 0  # biases and norms to row 0
    assert not any(c.kind is OpKind.ALL_GATHER for c in backward)


def test_25d_holds_a_qth_squared_of_each_matrix_and_sums_the_replicas_gradients():
    q, d, dp = 2, 2, 2
    plan = resolve(GPT, config(tp=8, tp_mode="2.5d", tp_depth=d, dp=dp))
    layers = plan.stage_layers[1]
    assert plan.stage_costs[1].param_count == pytest.approx(
        layers * (MATRICES / q ** 2 + VECTORS / q), abs=1)
    assert plan.grad_group == DP_DEP and plan.group_size(DP_DEP) == dp * d
    assert set(plan.group(DP_DEP, 0)) == {*plan.group("dp", 0), *plan.group(TP_DEP, 0),
                                          *plan.group(TP_DEP, plan.group("dp", 0)[1])}
    lowered = lower(plan.build_schedule(), plan)
    reduced = sum(op.nbytes for op in lowered.programs[1]
                  if op.kind is OpKind.ALL_REDUCE and op.group == DP_DEP)
    assert reduced == pytest.approx(plan.stage_costs[1].param_count * D, rel=1e-6)


def test_25d_activations_split_over_all_tp_ranks():
    grid = resolve(GPT, config(tp=8, tp_mode="2.5d", tp_depth=2))
    flat = resolve(GPT, config(tp=8, sequence_parallel=True))
    assert grid.stage_costs[1].activation_bytes == flat.stage_costs[1].activation_bytes


@pytest.mark.parametrize("tp", [8, 27])
def test_3d_traffic_is_the_closed_form(tp):
    q = round(tp ** (1 / 3))
    model = ModelSpec(num_layers=6, hidden_size=1152, num_attention_heads=18,
                      seq_length=512, vocab_size=9 * 1024, micro_batch_size=9,
                      ffn_hidden_size=4 * 1152) if q == 3 else GPT
    h, t = model.hidden_size, model.micro_batch_size * model.seq_length
    parallel = config(tp=tp, tp_mode="3d", micro_batch_size=model.micro_batch_size)
    lines = (TP_INPUT, TP_WEIGHT, TP_OUTPUT)
    kinds = (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)
    expected = (q - 1) / q ** 3 * (16 * t * h + 12 * h * h) * D
    for kind in (OpKind.F, OpKind.B):
        comms = tp_3d_comms(model, parallel, Covered(kind, 1))
        assert volume(comms, kinds, lines, ring=q) == pytest.approx(expected, rel=1e-6)
    split = [tp_3d_comms(model, parallel, Covered(kind, 1)) for kind in (OpKind.I, OpKind.W)]
    assert sum(volume(c, kinds, lines) for c in split) == pytest.approx(
        volume(tp_3d_comms(model, parallel, Covered(OpKind.B, 1)), kinds, lines))


def test_3d_roles_alternate_so_input_and_output_lines_both_carry_activations():
    comms = tp_3d_comms(GPT, config(tp=8, tp_mode="3d"), Covered(OpKind.F, 1))
    gathers = {c.group: c.nbytes for c in comms if c.kind is OpKind.ALL_GATHER}
    q = 2  # X gathered: QKV and fc1 inputs (h each) over input, projection h, fc2 4h
    assert gathers[TP_INPUT] == pytest.approx(2 * T * H / q ** 2 * D, rel=1e-6)
    assert gathers[TP_OUTPUT] == pytest.approx(5 * T * H / q ** 2 * D, rel=1e-6)
    assert gathers[TP_WEIGHT] == pytest.approx(MATRICES / q ** 2 * D, rel=1e-6)


def test_3d_memory_holds_a_qth_cubed_and_the_gathered_copies():
    q = 2
    grid = resolve(GPT, config(tp=8, tp_mode="3d"))
    flat = resolve(GPT, config(tp=8, sequence_parallel=True))
    layers = grid.stage_layers[1]
    assert grid.stage_costs[1].param_count == pytest.approx(
        layers * (MATRICES / q ** 3 + VECTORS / q), abs=1)
    inputs = (3 * H + 4 * H) * T  # QKV, projection, fc1, fc2 inputs
    extra = layers * ((q - 1) * inputs / q ** 3 + MATRICES / q ** 2) * D
    assert grid.stage_costs[1].activation_bytes - flat.stage_costs[1].activation_bytes == \
        pytest.approx(extra, abs=layers)


def test_3d_runs_one_local_gemm_with_the_1d_flops():
    q = 2
    grid = {k.name: k for k in layer_forward(GPT, config(tp=8, tp_mode="3d"))}
    flat = {k.name: k for k in layer_forward(GPT, config(tp=8))}
    assert grid["qkv_gemm"].gemm == (T / q, 3 * H / q, H / q)
    for name in ("qkv_gemm", "proj_gemm", "fc1_gemm", "fc2_gemm"):
        assert grid[name].flops == pytest.approx(flat[name].flops)


def test_the_3d_groups_are_the_lines_and_planes_of_the_cube():
    plan = resolve(GPT, config(tp=8, tp_mode="3d"))
    line = plan.group("tp", 0)
    members = {g: [plan.group(g, r) for r in line] for g in
               (TP_WEIGHT, TP_INPUT, TP_OUTPUT, TP_INPUT_WEIGHT, TP_OUTPUT_WEIGHT)}
    assert members[TP_WEIGHT][0] == line[0:2] and members[TP_INPUT][0] == line[0:4:2]
    assert members[TP_OUTPUT][0] == line[0:8:4] and members[TP_INPUT_WEIGHT][0] == line[0:4]
    assert members[TP_OUTPUT_WEIGHT][0] == [line[0], line[1], line[4], line[5]]
    for a, b in ((TP_WEIGHT, TP_INPUT), (TP_INPUT, TP_OUTPUT), (TP_WEIGHT, TP_OUTPUT)):
        assert all(set(members[a][t]) & set(members[b][t]) == {r} for t, r in enumerate(line))
    for axis in (TP_WEIGHT, TP_INPUT, TP_OUTPUT):  # each axis' lines partition the cube
        assert sorted(r for g in {tuple(m) for m in members[axis]} for r in g) == sorted(line)


def test_the_25d_depth_groups_join_the_slices():
    plan = resolve(GPT, config(tp=8, tp_mode="2.5d", tp_depth=2))
    line = plan.group("tp", 0)
    assert plan.group(TP_DEP, line[1]) == [line[1], line[5]]
    assert plan.group(TP_ROW, line[5]) == line[4:6] and plan.group(TP_COL, line[5]) == \
        [line[5], line[7]]


def test_every_grid_group_is_named_in_one_place():
    from clustersim.schedules.tp_grid import _GROUPS
    assert {g for groups in _GROUPS.values() for g in groups} == TP_GRID_GROUPS


@pytest.mark.parametrize("kw", [dict(tp=8, tp_mode="2.5d", tp_depth=2),
                                dict(tp=8, tp_mode="3d")])
def test_it_simulates_and_names_its_mode(kw):
    parallel = ParallelConfig.from_kwargs(pp=2, num_microbatches=2, micro_batch_size=8, **kw)
    timeline = simulate(GPT, parallel, load_topology("dgx-h100-x16-ndr"))
    assert f"tp_mode={kw['tp_mode']}" in header_line(timeline.meta["plan"])
    assert timeline.time_breakdown()[0]["tp"] > 0
    assert {s.lane for s in timeline.spans} & TP_GRID_GROUPS


@pytest.mark.parametrize("kw, rule", [
    (dict(tp=8, tp_mode="2.5d"), "needs tp_depth >= 2"),
    (dict(tp=8, tp_mode="2.5d", tp_depth=1), "needs tp_depth >= 2"),
    (dict(tp=12, tp_mode="2.5d", tp_depth=2), "tp_depth \\* q\\^2"),
    (dict(tp=4, tp_mode="2d", tp_depth=2), "leave it out"),
    (dict(tp=4, tp_mode="3d"), "a cube"),
    (dict(tp=8, tp_mode="3d", sequence_parallel=True), "sequence_parallel"),
    (dict(tp=8, tp_mode="2.5d", tp_depth=2, zero_stage=1), "zero_stage=1")])
def test_layouts_it_does_not_model_are_refused(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        ParallelConfig.from_kwargs(pp=3, num_microbatches=3, micro_batch_size=8, **kw)


@pytest.mark.parametrize("kw, rule", [
    (dict(tp=8, tp_mode="3d", micro_batch_size=2), "micro_batch_size=2 is not divisible by 4"),
    (dict(tp=8, tp_mode="2.5d", tp_depth=2, micro_batch_size=2),
     "micro_batch_size=2 is not divisible by 4")])
def test_a_model_that_does_not_split_over_the_grid_is_refused(kw, rule):
    model = ModelSpec(num_layers=6, hidden_size=1024, num_attention_heads=16, seq_length=512,
                      vocab_size=8192, micro_batch_size=kw["micro_batch_size"],
                      ffn_hidden_size=4096)
    with pytest.raises(ConfigError, match=rule):
        resolve(model, ParallelConfig.from_kwargs(pp=3, num_microbatches=3, **kw))


@pytest.mark.parametrize("kw", [dict(tp=4, tp_mode="2d"),
                                dict(tp=8, tp_mode="2.5d", tp_depth=2),
                                dict(tp=8, tp_mode="3d")])
def test_lowering_a_lowered_grid_schedule_changes_nothing(kw):
    """The lowering's rule (docs/architecture.md): a schedule past a pass is left as it is,
    so lowering twice changes nothing; the grids' broadcasts and reduces are placed by
    position as every intra-layer collective is (schedules.validate.positional)."""
    plan = resolve(GPT, config(**kw))
    once = lower(plan.build_schedule(), plan)
    assert lower(once, plan).programs == once.programs


def test_a_bare_parameter_count_under_25d_is_split_q_squared_ways_per_stage():
    """Each depth slice holds a whole copy of the stage: params / (pp q^2) per GPU."""
    from clustersim.schedules.memory_model import bare_rank_memory
    parallel = ParallelConfig.from_kwargs(tp=8, tp_mode="2.5d", tp_depth=2, pp=2)
    assert [r.params for r in bare_rank_memory(7e9, parallel)] == [7e9 / (2 * 4)] * 2
