"""kernels: 2.5D (Tesseract, tp = d q^2) and 3D (Colossal-AI, tp = q^3) tensor parallelism
on gloo (CPU), whole models (2D's own cases: tests/test_kernels_tp_2d.py; the zero-bubble
split here covers all three grids): gradients and the Adam step equal the single-process
reference, every collective that runs is one the IR counts (schedules.tp_2d, tp_3d: same
kind, group, placement and bytes), and a layer moves the closed-form bytes of
docs/research/tensor_parallel_nd.md (sections 1.2, 1.3, 6.2 and 6.3), derived here from
the model's dimensions, not from the IR.

Tiny fp32 models (hidden 64, 2 layers, micro-batch 4: q = 2, d = 2, so 8 ranks per
pipeline stage), so gradients agree to fp32 round-off and parameters after Adam to 1e-4
(tests/test_kernels_zero.py)."""
import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_schedule  # noqa: E402
from clustersim.schedules.errors import ConfigError  # noqa: E402
from clustersim.schedules.lowering import lower  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.names import TP_GRID_GROUPS  # noqa: E402
from clustersim.schedules.ops import OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from test_kernels_tp import GPT, LLAMA, S, H  # noqa: E402
from test_kernels_tp_2d import assert_spans_are_the_programs, grid_spans  # noqa: E402
from test_kernels_zero import assert_matches_reference  # noqa: E402

Q, D, MB, TIMEOUT, FP32 = 2, 2, 4, 90, 4
GPT4, LLAMA4 = (dataclasses.replace(m, micro_batch_size=MB) for m in (GPT, LLAMA))
T, V, L = MB * S, GPT.vocab_size, GPT.num_layers  # tokens of a micro-batch
MODES = {"2d": dict(tp=Q * Q, tp_mode="2d"),
         "2.5d": dict(tp=D * Q * Q, tp_mode="2.5d", tp_depth=D),
         "3d": dict(tp=Q ** 3, tp_mode="3d")}


def config(mode, pp=1, schedule="1f1b", **kw):
    return ParallelConfig(micro_batch_size=MB, pp=pp, num_microbatches=2 * pp,
                          schedule=schedule, **MODES[mode], **kw)


def run(model, par):
    """The lowered schedule and the run's (timeline, grads, params)."""
    base = build_schedule(par.schedule, par.pp, par.num_microbatches)
    plan = resolve(model, par, schedule=base)
    return lower(base, plan), run_schedule(base, plan, timeout=TIMEOUT, warmup_iterations=0,
                                           return_grads=True, return_params=True)


# --- gradients and the Adam step equal the single-process reference ----------------------
@pytest.mark.parametrize("mode,model,pp,kw", [
    ("2.5d", GPT4, 1, {}), ("2.5d", LLAMA4, 2, {}), ("2.5d", GPT4, 2, dict(recompute="full")),
    ("2.5d", GPT4, 1, dict(dp=2)),
    ("3d", GPT4, 1, {}), ("3d", LLAMA4, 1, dict(recompute="selective")), ("3d", GPT4, 2, {}),
    ("3d", LLAMA4, 1, dict(dp=2, zero_stage=1))],
    ids=["2.5d-gpt", "2.5d-llama-gqa-pp2", "2.5d-gpt-tied-pp2-full-recompute", "2.5d-gpt-dp2",
         "3d-gpt", "3d-llama-gqa-selective-recompute", "3d-gpt-tied-pp2",
         "3d-llama-dp2-zero1"])
def test_grid_step_equals_reference_and_collectives_are_the_irs(mode, model, pp, kw):
    """Norm statistics and vector gradients on their groups, the grid's linears,
    vocabulary-parallel embedding, head and cross-entropy; with pp = 2 a tied embedding's
    copies step as one weight; 2.5D's depth slices (and DP replicas) average their
    gradients over 'dp_dep', and the norm weights and biases off row 0, never read, are
    left out of the comparison."""
    par = config(mode, pp, **kw)
    schedule, (timeline, grads, params) = run(model, par)
    assert_matches_reference(grads, params, par, model)
    assert_spans_are_the_programs(timeline, schedule, par)
    lanes = {s.lane for s in timeline.spans}
    assert lanes & TP_GRID_GROUPS == {op.group for op in schedule.ops()} & TP_GRID_GROUPS
    if mode == "2.5d":
        assert "dp_dep" in lanes
    if pp > 1:  # the activation block: b/(d q) or b/q^2 samples by h/q
        sends = {s.op.nbytes for s in timeline.spans if s.op.kind is OpKind.SEND_F}
        assert sends == {MB // (Q * Q) * S * H // Q * FP32}


@pytest.mark.parametrize("mode", ["2d", "2.5d", "3d"])
def test_zero_bubble_split_runs_each_gradient_once(mode):
    """zb-h1: I runs the input gradient's collectives and W the weight gradient's (W's
    gathers' reduce-scatters, the vector gradients' all-reduces or reduces), each once, as
    counted; only stage 0's I computes nothing (its input is token ids: its W runs the
    whole backward, kernels.split_backward)."""
    par = config(mode, 2, "zb-h1")
    schedule, (timeline, grads, params) = run(LLAMA4, par)
    assert_matches_reference(grads, params, par, LLAMA4)

    def stage0_input_grad(op):
        return op.kind is OpKind.I and op.stage == 0
    assert_spans_are_the_programs(timeline, schedule, par, stage0_input_grad)
    unclaimed = [s for s in grid_spans(timeline) if s.info["measured"] != s.info["count"]]
    assert all(s.op.stage == 0 and s.info["measured"] == 0 for s in unclaimed)


# --- the closed forms (independent of the IR) ----------------------------------------------
def measured(timeline, kind):
    """Per F or B span of a whole-model stage: {'KIND:group:site': [count, bytes]}."""
    work = [s for s in timeline.spans if s.op.kind is kind]
    assert work
    return [{k: v[:2] for k, v in s.info["tp_collectives"].items()} for s in work]


def test_3d_moves_the_closed_form_bytes():
    """GPT (h_in over QKV, projection, fc1, fc2: h, h, h, 4h; h_out: 3h, h, 4h, h), per
    micro-batch on every rank, in nccl-tests bytes (an all-gather's output, a
    reduce-scatter's input). Forward per layer: X all-gathered T h_in/q^2 (QKV and fc1
    over 'tp_input': 2Th, projection and fc2 over 'tp_output': 5Th), W over 'tp_weight'
    (12h^2/q^2), Y reduce-scattered T h_out/q^2 (7Th over 'tp_output', 2Th over
    'tp_input'): 16Th + 12h^2 over q^2 in all; LayerNorm statistics over 'tp_output'
    (one all-reduce of 2 T/q^2 fp32 per norm, forward and backward: section 1.3's
    LayerNorm3D). Backward: dY all-gathered over the output groups, dX
    reduce-scattered over the input groups, dW over 'tp_weight', the biases' gradients
    all-reduced over their planes (h_out/q) and the norm weights' over 'tp_input_weight'
    (h/q each). Embedding: table all-gathered over 'tp_weight' (V h/q^2), output
    reduce-scattered over 'tp_input' (T h/q^2); head: one more product (h_in = h,
    h_out = V); loss: 3 all-reduces of T/q^2 fp32 over 'tp_input', a scalar over
    'tp_output' and one over 'tp_weight'."""
    _, (timeline, _, _) = run(GPT4, config("3d"))
    t2, hh = T // Q ** 2 * FP32, H * H // Q ** 2 * FP32  # bytes per (token-row x h) / q^2
    want_f = {"ALL_GATHER:tp_input:layer": [2 * L, L * 2 * H * t2],
              "ALL_GATHER:tp_output:layer": [2 * L, L * 5 * H * t2],
              "ALL_GATHER:tp_weight:layer": [4 * L, L * 12 * hh],
              "REDUCE_SCATTER:tp_output:layer": [2 * L, L * 7 * H * t2],
              "REDUCE_SCATTER:tp_input:layer": [2 * L, L * 2 * H * t2],
              "ALL_GATHER:tp_weight:embedding": [1, V * H // Q ** 2 * FP32],
              "REDUCE_SCATTER:tp_input:embedding": [1, H * t2],
              "ALL_GATHER:tp_input:head": [1, H * t2],
              "ALL_GATHER:tp_weight:head": [1, V * H // Q ** 2 * FP32],
              "REDUCE_SCATTER:tp_output:head": [1, V * t2],
              "ALL_REDUCE:tp_input:loss": [3, 3 * t2],
              "ALL_REDUCE:tp_output:loss": [1, FP32],
              "ALL_REDUCE:tp_weight:loss": [1, FP32]}
    bias, vec = H // Q * FP32, H // Q * FP32
    want_b = {"ALL_GATHER:tp_output:layer": [2 * L, L * 7 * H * t2],  # dY of QKV, fc1
              "ALL_GATHER:tp_input:layer": [2 * L, L * 2 * H * t2],  # dY of proj, fc2
              "REDUCE_SCATTER:tp_input:layer": [2 * L, L * 2 * H * t2],  # dX of QKV, fc1
              "REDUCE_SCATTER:tp_output:layer": [2 * L, L * 5 * H * t2],  # dX of proj, fc2
              "REDUCE_SCATTER:tp_weight:layer": [4 * L, L * 12 * hh],
              "ALL_REDUCE:tp_output_weight:layer": [2 * L, L * 7 * bias],  # QKV, fc1 biases
              "ALL_REDUCE:tp_input_weight:layer": [2 * L + 4 * L, L * (2 * bias + 4 * vec)],
              "ALL_GATHER:tp_input:embedding": [1, H * t2],
              "REDUCE_SCATTER:tp_weight:embedding": [1, V * H // Q ** 2 * FP32],
              "ALL_REDUCE:tp_input_weight:embedding": [1, S * H // Q * FP32]}
    for kind, want in ((OpKind.F, want_f), (OpKind.B, want_b)):
        for spans in measured(timeline, kind):
            assert {k: spans.get(k) for k in want} == want, kind
            assert spans["ALL_REDUCE:tp_output:layer"] == [2 * L, 2 * L * 2 * t2]
            assert spans["ALL_REDUCE:tp_output:head"] == [1, 2 * t2]  # the final norm


def test_25d_moves_the_closed_form_bytes():
    """GPT on d slices of T/d tokens each (section 1.2): per layer forward the SUMMA
    steps broadcast X blocks over 'tp_row', 7 T h/(d q) in all (4q broadcasts), and W
    blocks over 'tp_col', 12 h^2/q; the biases (9h per layer) and norm weights (4h) are
    broadcast from row 0 over 'tp_col', h_out/q each (8 broadcasts); the backward
    broadcasts and reduces twice the SUMMA volume and reduces the vectors back to row 0.
    Embedding: the slice's T h/(d q) reduce-scattered over 'tp_col'."""
    _, (timeline, _, _) = run(GPT4, config("2.5d"))
    th, hh = 7 * T * H // (D * Q) * FP32, 12 * H * H // Q * FP32
    vectors = (9 * H + 4 * H) // Q * FP32
    want_f = {"BROADCAST:tp_row:layer": [4 * Q * L, L * th],
              "BROADCAST:tp_col:layer": [4 * Q * L + 8 * L, L * (hh + vectors)],
              "REDUCE_SCATTER:tp_col:embedding": [1, T * H // (D * Q) * FP32]}
    want_b = {"BROADCAST:tp_row:layer": [4 * Q * L, L * th],
              "REDUCE:tp_row:layer": [4 * Q * L, L * th],
              "BROADCAST:tp_col:layer": [4 * Q * L, L * hh],
              "REDUCE:tp_col:layer": [4 * Q * L + 8 * L, L * (hh + vectors)]}
    for kind, want in ((OpKind.F, want_f), (OpKind.B, want_b)):
        for spans in measured(timeline, kind):
            assert {k: spans.get(k) for k in want} == want, kind


# --- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode,kw,match", [
    ("3d", dict(schedule="dualpipe", pp=2, num_microbatches=4), "DualPipe's two stage chains"),
    ("2.5d", dict(schedule="pipedream", pp=2, num_microbatches=4), "weight stashing"),
    ("3d", dict(zero_stage=3, dp=2, num_microbatches=2), "zero_stage=3")])
def test_combinations_not_checked_against_the_reference_are_refused(mode, kw, match):
    plan = resolve(GPT4, ParallelConfig.from_kwargs(micro_batch_size=MB, **MODES[mode], **kw))
    with pytest.raises(KernelsError, match=f"tp_mode='{mode}' with {match}: not verified"):
        run_schedule(plan.build_schedule(), plan, timeout=TIMEOUT)


def test_a_25d_position_table_that_does_not_split_in_q_squared_parts_is_refused():
    model = ModelSpec(num_layers=2, hidden_size=66, num_attention_heads=2, seq_length=16,
                      vocab_size=128, micro_batch_size=MB, dtype="fp32")
    plan = resolve(model, config("2.5d"))
    with pytest.raises(ConfigError, match="hidden_size=66 is not divisible by q\\^2=4: "
                       "tp_mode='2.5d' cuts the learned position table"):
        run_schedule(plan.build_schedule(), plan, timeout=TIMEOUT)
