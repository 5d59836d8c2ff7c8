"""kernels: 2D tensor parallelism (tp_mode='2d', Optimus SUMMA on a 2 x 2 grid, gloo on
CPU) reproduces the single-process gradients and Adam step, and the collectives that run
are the IR's (schedules.tp_2d, one measured collective per counted one, the same bytes)
and the closed forms of docs/research/tensor_parallel_nd.md sections 1.1, 2.3 and 6.1.

Models are tiny fp32 ones (hidden 64, 2 layers), so gradients agree to fp32 round-off;
parameters after Adam to 1e-4 (see tests/test_kernels_zero.py)."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_schedule  # noqa: E402
from clustersim.kernels.tp_ops import tp_owners  # noqa: E402
from clustersim.schedules.errors import ConfigError  # noqa: E402
from clustersim.schedules.lowering import lower  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.names import TP_GRID_GROUPS  # noqa: E402
from clustersim.schedules.ops import OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from test_kernels_tp import GPT, LLAMA, B, S, H  # noqa: E402
from test_kernels_zero import assert_matches_reference  # noqa: E402

Q, TIMEOUT, FP32 = 2, 60, 4
T, V, L = B * S, GPT.vocab_size, GPT.num_layers
GRID_LANES = {"tp_row", "tp_col"}


def grid(pp=1, schedule="1f1b", **kw):
    return ParallelConfig(micro_batch_size=2, tp=Q * Q, tp_mode="2d", pp=pp,
                          num_microbatches=2 * pp, schedule=schedule, **kw)


def run(model, par):
    """The lowered schedule (with the IR's grid ops and the optimizer step) and the run's
    (timeline, grads, params). run_schedule lowers the compute-only schedule itself (a
    lowered 2D schedule fails schedules.validate.check_structure: its BROADCAST and
    REDUCE ops repeat keys, which the check allows only for other collective kinds)."""
    base = build_schedule(par.schedule, par.pp, par.num_microbatches)
    plan = resolve(model, par, schedule=base)
    schedule = lower(base, plan)
    assert {op.group for op in schedule.ops() if op.kind.is_collective} == GRID_LANES
    return schedule, run_schedule(base, plan, timeout=TIMEOUT, warmup_iterations=0,
                                  return_grads=True, return_params=True)


def grid_spans(timeline):
    return [s for s in timeline.spans if s.lane in TP_GRID_GROUPS]


def assert_spans_are_the_programs(timeline, schedule, par, exempt=lambda owner: False):
    """Every grid op of every rank has one span on its group's lane, which measured as
    many collectives of its kind, group and placement as it counts, with its bytes
    (unless `exempt(the compute op it belongs to)`)."""
    for rank in range(par.world_size):
        program = schedule.programs[par.coords(rank)["pp"]]
        owners = tp_owners(program)
        ops = [i for i, op in enumerate(program) if op.group in TP_GRID_GROUPS]
        spans = [s for s in grid_spans(timeline) if s.rank == rank]
        assert [str(s.op) for s in spans] == [str(program[i]) for i in ops]
        for index, span in zip(ops, spans):
            assert span.lane == span.op.group and span.end >= span.start
            if not exempt(program[owners[index]]):
                assert span.info["measured"] == span.info["count"], (rank, span.op)
                assert span.info["measured_bytes"] == span.op.nbytes, (rank, span.op)


# --- gradients and the Adam step equal the single-process reference ----------------------
@pytest.mark.parametrize("model,pp,recompute", [
    (GPT, 1, "none"), (LLAMA, 1, "none"), (GPT, 2, "none"), (LLAMA, 2, "none"),
    (GPT, 2, "full"), (LLAMA, 1, "selective")],
    ids=["gpt-pp1", "llama-gqa-pp1", "gpt-tied-pp2", "llama-gqa-pp2", "gpt-pp2-full-recompute",
         "llama-pp1-selective-recompute"])
def test_2d_step_equals_reference_and_collectives_are_the_irs(model, pp, recompute):
    """tp=4 as a 2 x 2 grid (4 or 8 ranks), 1F1B: LayerNorm/RMSNorm statistics over the
    rows, GQA heads over the columns, SUMMA linears, vocabulary-parallel embedding, head
    and cross-entropy; with pp=2 the tied embedding's copies step as one weight."""
    par = grid(pp, recompute=recompute)
    schedule, (timeline, grads, params) = run(model, par)
    assert_matches_reference(grads, params, par, model)
    assert_spans_are_the_programs(timeline, schedule, par)
    assert {s.lane for s in timeline.spans} >= GRID_LANES | {"compute"}
    if pp > 1:
        sends = {s.op.nbytes for s in timeline.spans if s.op.kind is OpKind.SEND_F}
        assert sends == {B // Q * S * H // Q * FP32}  # the activation block (b/q, s, h/q)


# --- the closed forms (independent of the IR) ----------------------------------------------
def test_forward_and_backward_move_the_closed_form_bytes():
    """Per microbatch on every rank of a whole-model stage (GPT, L layers, T tokens):
    the layers' SUMMA products move (7 T h + 12 h^2) / q elements forward (4q broadcasts
    on each of 'tp_row' and 'tp_col') and twice that backward (section 2.3); the head,
    one product with h_out = V, q broadcasts of V h/q^2 over 'tp_col' and q reduces of
    T V/q^2 over 'tp_row' forward (section 6.1); the norms 2 all-reduces of T/q fp32
    statistics over 'tp_row' forward and 2 backward each, the cross-entropy 3."""
    par = grid(1)
    _, (timeline, _, _) = run(GPT, par)
    th, hh = 7 * T * H // Q * FP32, 12 * H * H // Q * FP32  # per layer, bytes
    norms = 2 * L + 1  # the layers' two each and the final norm
    want_f = {"BROADCAST:tp_row:layer": [4 * Q * L, L * th],
              "BROADCAST:tp_col:layer": [4 * Q * L, L * hh],
              "BROADCAST:tp_col:head": [Q, V * H // Q * FP32],
              "REDUCE:tp_row:head": [Q, T * V // Q * FP32],
              "REDUCE_SCATTER:tp_col:embedding": [1, T * H // Q * FP32],
              "ALL_REDUCE:tp_row:loss": [3, 3 * T // Q * FP32],
              "ALL_REDUCE:tp_col:loss": [1, FP32]}
    want_b = {"BROADCAST:tp_col:layer": [4 * Q * L, L * hh],  # dX = dY W^T
              "REDUCE:tp_row:layer": [4 * Q * L, L * th],
              "BROADCAST:tp_row:layer": [4 * Q * L, L * th],  # dW = X^T dY
              "REDUCE:tp_col:layer": [4 * Q * L, L * hh],
              "ALL_GATHER:tp_col:embedding": [1, T * H // Q * FP32]}
    work = [s for s in timeline.spans if s.op.kind in (OpKind.F, OpKind.B)]
    assert len(work) == 2 * par.num_microbatches * par.world_size
    for span in work:
        measured = {k: v[:2] for k, v in span.info["tp_collectives"].items()}
        want = want_f if span.op.kind is OpKind.F else want_b
        assert {k: measured[k] for k in want} == want, span.op
        stats = sum(measured.get(f"ALL_REDUCE:tp_row:{site}", [0, 0])[0]
                    for site in ("layer", "head"))
        assert stats == 2 * norms  # LayerNorm: mean and variance, or the backward's two sums


# --- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(schedule="dualpipe", pp=2, num_microbatches=4), "DualPipe's two stage chains"),
    (dict(schedule="pipedream", pp=2, num_microbatches=4), "weight stashing"),
    (dict(zero_stage=3, dp=2, num_microbatches=2), "zero_stage=3")])
def test_2d_combinations_not_checked_against_the_reference_are_refused(kw, match):
    model = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=16,
                      vocab_size=128, micro_batch_size=2, ffn_hidden_size=256, dtype="fp32")
    plan = resolve(model, ParallelConfig.from_kwargs(tp=4, tp_mode="2d", micro_batch_size=2,
                                                     **kw))
    with pytest.raises(KernelsError, match=f"tp_mode='2d' with {match}: not verified"):
        run_schedule(plan.build_schedule(), plan, timeout=TIMEOUT)


def test_a_norm_that_does_not_split_in_q_squared_parts_is_refused():
    model = ModelSpec(num_layers=2, hidden_size=66, num_attention_heads=2, seq_length=16,
                      vocab_size=128, micro_batch_size=2, dtype="fp32")
    plan = resolve(model, grid(1))
    with pytest.raises(ConfigError, match="hidden_size=66 is not divisible by q\\^2=4"):
        run_schedule(plan.build_schedule(), plan, timeout=TIMEOUT)
