"""2D tensor parallelism (Optimus' SUMMA grid, `--tp-mode 2d`, schedules/tp_2d.py) against
its closed forms (docs/research/tensor_parallel_nd.md, from Colossal-AI's kernels and the
Optimus paper): per layer and rank, the forward broadcasts (7 T h + 12 h^2) / q elements
(X blocks T h_in / q over the grid's rows, W blocks h_in h_out / q over its columns, GPT:
sum h_in = 7h, sum h_in h_out = 12 h^2) and the backward twice that; all but the first of
each q SUMMA steps run beside the GEMMs; every activation is split over the q^2 ranks
(Korthikanti et al.'s per-layer bytes divided by tp, as with sequence parallelism); each
GEMM runs as q steps of (T/q x h_in/q) @ (h_in/q x h_out/q)."""
import math

import pytest

from clustersim.schedules.comm_spec import Covered
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_forward
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import TP_COL, TP_ROW
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import header_line, resolve
from clustersim.schedules.tp_2d import tp_2d_comms
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

GPT = ModelSpec(num_layers=6, hidden_size=1024, num_attention_heads=16, seq_length=512,
                vocab_size=8192, micro_batch_size=4, ffn_hidden_size=4096)


def config(tp=4, **kw):
    return ParallelConfig.from_kwargs(tp=tp, tp_mode="2d", pp=3, num_microbatches=3,
                                      micro_batch_size=4, **kw)


def by_group(comms):
    total = {}
    for c in comms:
        if c.group in (TP_ROW, TP_COL):
            total[(c.kind, c.group)] = total.get((c.kind, c.group), 0) + c.nbytes
    return total


@pytest.mark.parametrize("tp", [4, 16])
def test_a_layers_summa_traffic_is_optimus_closed_form(tp):
    q = math.isqrt(tp)
    parallel = config(tp)
    tokens, h, d = GPT.micro_batch_size * GPT.seq_length, GPT.hidden_size, GPT.dtype_bytes
    x, w = 7 * tokens * h / q * d, 12 * h * h / q * d  # one layer
    forward = by_group(tp_2d_comms(GPT, parallel, Covered(OpKind.F, 1)))
    assert forward[(OpKind.BROADCAST, TP_ROW)] == pytest.approx(x, rel=1e-6)
    assert forward[(OpKind.BROADCAST, TP_COL)] == pytest.approx(w, rel=1e-6)
    backward = by_group(tp_2d_comms(GPT, parallel, Covered(OpKind.B, 1)))
    assert backward[(OpKind.BROADCAST, TP_ROW)] + backward[(OpKind.REDUCE, TP_ROW)] == \
        pytest.approx(2 * x, rel=1e-6)
    assert backward[(OpKind.BROADCAST, TP_COL)] + backward[(OpKind.REDUCE, TP_COL)] == \
        pytest.approx(2 * w, rel=1e-6)
    split = [by_group(tp_2d_comms(GPT, parallel, Covered(kind, 1)))
             for kind in (OpKind.I, OpKind.W)]
    assert {k: split[0].get(k, 0) + split[1].get(k, 0) for k in backward} == backward
    plan = resolve(GPT, parallel)  # the lowered middle stage carries its layers' traffic
    lowered = lower(plan.build_schedule(), plan)
    posted = sum(op.nbytes for op in lowered.programs[1] if op.microbatch == 0
                 and op.kind is OpKind.BROADCAST)
    assert posted == pytest.approx(plan.stage_layers[1] * 2 * (x + w), rel=1e-6)  # F, B


def test_all_but_the_first_summa_step_runs_beside_the_gemms():
    q = 2
    plan = resolve(GPT, config())
    lowered = lower(plan.build_schedule(), plan)
    summa = [op for op in lowered.programs[1] if op.kind is OpKind.BROADCAST
             and op.microbatch == 0]
    beside = sum(op.nbytes for op in summa if op.alongside)
    assert beside == pytest.approx((q - 1) / q * sum(op.nbytes for op in summa), rel=1e-6)


def test_the_grid_groups_are_rows_and_columns_of_the_tp_group():
    plan = resolve(GPT, config(16))
    line = plan.group("tp", 0)
    rows = [plan.group(TP_ROW, line[t]) for t in range(16)]
    cols = [plan.group(TP_COL, line[t]) for t in range(16)]
    assert rows[5] == line[4:8] and cols[5] == line[1::4]
    assert all(len(set(r) & set(c)) == 1 for r in rows for c in cols)


def test_every_activation_is_split_over_the_grid():
    grid = resolve(GPT, config())
    sequence = resolve(GPT, ParallelConfig.from_kwargs(
        tp=4, sequence_parallel=True, pp=3, num_microbatches=3, micro_batch_size=4))
    replicated = resolve(GPT, ParallelConfig.from_kwargs(
        tp=4, pp=3, num_microbatches=3, micro_batch_size=4))
    for a, b, c in zip(rank_memory(grid), rank_memory(sequence), rank_memory(replicated)):
        assert a.activations == pytest.approx(b.activations) and a.activations < c.activations
    one = resolve(GPT, ParallelConfig.from_kwargs(pp=3, num_microbatches=3,
                                                  micro_batch_size=4))
    assert grid.stage_costs[1].param_count == pytest.approx(one.stage_costs[1].param_count / 4)


def test_each_gemm_runs_as_q_summa_steps_with_the_1d_flops():
    q = 2
    grid = {k.name: k for k in layer_forward(GPT, config())}
    flat = {k.name: k for k in layer_forward(GPT, ParallelConfig.from_kwargs(
        tp=4, pp=3, num_microbatches=3, micro_batch_size=4))}
    tokens, h = GPT.micro_batch_size * GPT.seq_length, GPT.hidden_size
    assert grid["qkv_gemm"].gemm == (tokens / q, 3 * h / q, h / q)
    assert grid["fc2_gemm"].gemm == (tokens / q, h / q, 4 * h / q)
    for name in ("qkv_gemm", "proj_gemm", "fc1_gemm", "fc2_gemm"):
        assert grid[name].flops == pytest.approx(flat[name].flops)


def test_it_simulates_and_names_its_mode():
    parallel = ParallelConfig.from_kwargs(tp=4, tp_mode="2d", pp=2, num_microbatches=2,
                                          micro_batch_size=4)
    timeline = simulate(GPT, parallel, load_topology("dgx-h100"))
    assert "tp=4 tp_mode=2d" in header_line(timeline.meta["plan"])
    assert timeline.time_breakdown()[0]["tp"] > 0
    assert {s.lane for s in timeline.spans} >= {TP_ROW, TP_COL}


@pytest.mark.parametrize("kw, rule", [
    (dict(tp=8), "square"), (dict(sequence_parallel=True), "sequence_parallel"),
    (dict(cp=2), "cp=2"), (dict(tp_mode="4d"), "tp_mode")])
def test_layouts_it_does_not_model_are_refused(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        ParallelConfig.from_kwargs(**{"tp": 4, "tp_mode": "2d", "pp": 3,
                                      "num_microbatches": 3, **kw})


def test_a_model_that_does_not_split_over_the_grid_is_refused():
    with pytest.raises(ConfigError,
                       match="micro_batch_size=1 is not divisible by 2, as tp_mode=.2d. with"):
        resolve(ModelSpec(num_layers=6, hidden_size=1024, num_attention_heads=16,
                          seq_length=512, vocab_size=8192, ffn_hidden_size=4096),
                ParallelConfig.from_kwargs(tp=4, tp_mode="2d", pp=3, num_microbatches=3))


def test_the_run_says_what_it_does_not_charge():
    parallel = ParallelConfig.from_kwargs(tp=4, tp_mode="2d", pp=1, num_microbatches=1,
                                          micro_batch_size=4)
    timeline = simulate(GPT, parallel, load_topology("dgx-h100"))
    assert any("without slowing them" in w for w in timeline.meta["warnings"])
