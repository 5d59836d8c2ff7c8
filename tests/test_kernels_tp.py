"""kernels: tensor and sequence parallelism for real (gloo on CPU, 2 TP ranks) reproduce
the single-process gradients; the TP collectives that ran move Megatron's bytes.

Models are tiny (hidden 64) and fp32, so gradients agree to fp32 round-off."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import (KernelsError, run_reference, run_reference_steps,  # noqa: E402
                     run_schedule)
from clustersim.schedules.data_parallel import add_data_parallel  # noqa: E402
from clustersim.schedules.errors import ConfigError  # noqa: E402
from clustersim.schedules.lowering import lower  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.ops import Op, OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.schedules.schedule import Schedule  # noqa: E402

GPT = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                vocab_size=128, micro_batch_size=2, dtype="fp32")
LLAMA = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=16, vocab_size=128, micro_batch_size=2, dtype="fp32", swiglu=True,
                  normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                  untie_embeddings_and_output_weights=True)
TIMEOUT = 60
B, S, H, FP32 = 2, 16, 64, 4


def parallel(**kw):
    return ParallelConfig(micro_batch_size=2, **kw)


def with_tp_ops(schedule, model, par):
    """The schedule lowered and costed, with the IR's TP collective ops (as simulated):
    the program run_schedule runs (its lowering then leaves it as it is)."""
    return lower(schedule, plan_of(schedule, model, par))


def plan_of(schedule, model, par):
    """The plan run_schedule takes: `par` resolved with `schedule`'s shape."""
    return resolve(model, par, schedule=schedule)


def run(schedule, model, par, **kw):
    return run_schedule(schedule, plan_of(schedule, model, par), timeout=TIMEOUT,
                        warmup_iterations=0, return_grads=True, **kw)


def assert_same_grads(got, want):
    assert set(got) == set(want), set(got) ^ set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


# --- gradients equal the single-process reference -----------------------------------------
@pytest.mark.parametrize("model,sp", [(GPT, False), (LLAMA, False), (GPT, True), (LLAMA, True)],
                         ids=["gpt", "llama-gqa", "gpt-sp", "llama-gqa-sp"])
def test_tensor_parallel_gradients_equal_reference(model, sp):
    """tp=2 (vocab-parallel embedding and cross-entropy, heads and GQA groups split),
    with and without sequence parallelism, program with the IR's TP ops."""
    par = parallel(tp=2, sequence_parallel=sp, num_microbatches=2)
    schedule = with_tp_ops(build_schedule("1f1b", 1, 2), model, par)
    assert any(op.group == "tp" for op in schedule.ops())
    timeline, grads = run(schedule, model, par)
    assert_same_grads(grads, run_reference(model, par))
    assert sorted(timeline.ranks) == [0, 1]
    tp_spans = [s for s in timeline.spans if s.lane == "tp"]
    assert len(tp_spans) == 2 * sum(op.group == "tp" for op in schedule.ops())
    assert all(s.op.group == "tp" and s.end >= s.start for s in tp_spans)


def test_compute_only_program_runs_tensor_parallel_too():
    """A compute-only program runs tensor parallel too: run_schedule's lowering adds the
    IR's TP ops (the 'tp' spans) and the collectives run inside compute."""
    par = parallel(tp=2, sequence_parallel=True, num_microbatches=2)
    timeline, grads = run(build_schedule("1f1b", 1, 2), GPT, par)
    assert_same_grads(grads, run_reference(GPT, par))
    assert {s.lane for s in timeline.spans} == {"compute", "tp"}
    forward = next(s for s in timeline.spans if s.op.kind is OpKind.F)
    assert forward.info["tp_collectives"]["ALL_GATHER:layer"][0] == 2 * GPT.num_layers


def split_backward_schedule():
    """Zero-bubble style on 2 pipeline ranks: I (input grad) now, W (weight grad) later."""
    f, i, w = OpKind.F, OpKind.I, OpKind.W
    programs = [[Op(f, 0, 0), Op(f, 0, 1), Op(i, 0, 0), Op(i, 0, 1), Op(w, 0, 0), Op(w, 0, 1)],
                [Op(f, 1, 0), Op(i, 1, 0), Op(f, 1, 1), Op(i, 1, 1), Op(w, 1, 1), Op(w, 1, 0)]]
    return Schedule("zb-handmade", 2, programs, num_stages=2)


@pytest.mark.parametrize("name,sp", [("1f1b", False), ("1f1b", True), ("zb", True)],
                         ids=["1f1b-tp", "1f1b-sp", "zb-split-sp"])
def test_tensor_and_pipeline_parallel_equal_reference(name, sp):
    """tp=2 x pp=2 (4 ranks), tied embeddings on both ends: P2P between TP peers (the
    sequence shard with SP); 'zb' splits the backward into I and W."""
    par = parallel(tp=2, pp=2, sequence_parallel=sp, num_microbatches=2,
                   schedule="custom" if name == "zb" else name)
    base = split_backward_schedule() if name == "zb" else build_schedule(name, 2, 2)
    schedule = with_tp_ops(base, GPT, par)
    timeline, grads = run(schedule, GPT, par)
    assert_same_grads(grads, run_reference(GPT, par))
    sends = [s for s in timeline.spans if s.op.kind is OpKind.SEND_F]
    assert {s.op.nbytes for s in sends} == {B * (S // 2 if sp else S) * H * FP32}


# --- the collectives move Megatron's bytes ----------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_forward_all_reduce_bytes_per_layer_are_two_bsh(recompute):
    """Per microbatch per layer, the forward all-reduces 2*b*s*h*dtype bytes and the
    backward as much (counted on the collectives that ran): 4 all-reduces, ring volume
    4 * 2(t-1)/t * bsh = 8bsh(t-1)/t per device (Korthikanti et al. 2022, 4.2.2). Full
    recompute reruns the forward's 2 in the backward: 6 all-reduces, 12bsh(t-1)/t."""
    t, layers = 2, GPT.num_layers
    par = parallel(tp=t, num_microbatches=2, recompute=recompute)
    schedule = with_tp_ops(build_schedule("gpipe", 1, 2), GPT, par)
    timeline = run_schedule(schedule, plan_of(schedule, GPT, par), timeout=TIMEOUT,
                            warmup_iterations=0)
    bsh = B * S * H * FP32
    rerun = 2 if recompute == "full" else 0  # forward all-reduces rerun per layer in B
    # the layers' compute (F, B); the lowering's OPT_STEP (compute lane) runs no TP collective
    layer_spans = [s for s in timeline.spans if s.op.kind in (OpKind.F, OpKind.B)]
    for span in layer_spans:
        measured = span.info["tp_collectives"]
        count, nbytes, _ = measured["ALL_REDUCE:layer"]
        per = 2 + (rerun if span.op.kind is OpKind.B else 0)
        assert (count, nbytes) == (per * layers, per * layers * bsh), span.op
    per_layer = sum(s.info["tp_collectives"]["ALL_REDUCE:layer"][1]
                    for s in layer_spans if s.rank == 0
                    ) / (layers * par.num_microbatches)
    assert per_layer * 2 * (t - 1) / t == (8 + 2 * rerun) * bsh * (t - 1) / t
    # the IR's op sizes equal what ran: the measured bytes land on the TP spans
    for span in (s for s in timeline.spans if s.lane == "tp"):
        assert span.info["measured"] == span.info["count"]  # Op.count: not in the text form
        assert span.info["measured_bytes"] == span.op.nbytes, span.op


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_sequence_parallel_moves_the_same_bytes_as_gathers_and_scatters(recompute):
    """With full recompute the backward reruns the forward's gathers and scatters."""
    par = parallel(tp=2, sequence_parallel=True, num_microbatches=1, recompute=recompute)
    schedule = with_tp_ops(build_schedule("gpipe", 1, 1), GPT, par)
    timeline = run_schedule(schedule, plan_of(schedule, GPT, par), timeout=TIMEOUT,
                            warmup_iterations=0)
    bsh, layers = B * S * H * FP32, GPT.num_layers
    forward = next(s for s in timeline.spans if s.op.kind is OpKind.F and s.rank == 0)
    backward = next(s for s in timeline.spans if s.op.kind is OpKind.B and s.rank == 0)
    for span, per in ((forward, 2), (backward, 4 if recompute == "full" else 2)):
        measured = span.info["tp_collectives"]
        assert measured["ALL_GATHER:layer"][:2] == [per * layers, per * layers * bsh]
        assert measured["REDUCE_SCATTER:layer"][:2] == [per * layers, per * layers * bsh]
    assert "ALL_REDUCE:layer" not in forward.info["tp_collectives"]
    for span in (s for s in timeline.spans if s.lane == "tp"):
        assert span.info["measured"] == span.info["count"], span.op
        assert span.info["measured_bytes"] == span.op.nbytes, span.op
    assert any("inside their compute op" in x for x in timeline.meta["limits"])


# --- the measured spans lay TP ops out as the simulator orders them ----------------------
def test_tp_spans_follow_their_compute_op_on_the_tp_lane():
    par = parallel(tp=2, num_microbatches=2)
    schedule = with_tp_ops(build_schedule("1f1b", 1, 2), GPT, par)
    timeline = run_schedule(schedule, plan_of(schedule, GPT, par), timeout=TIMEOUT,
                            warmup_iterations=0)
    for rank in (0, 1):
        mine = sorted((s for s in timeline.spans if s.rank == rank),
                      key=lambda s: (s.start, s.lane != "compute"))
        texts = [str(s.op) for s in mine]
        assert texts == [str(op) for op in schedule.programs[0]]
        assert all(a.end <= b.start + 1e-9 for a, b in zip(mine, mine[1:]))
        assert {s.lane for s in mine} == {"compute", "tp"}


# --- refusals -------------------------------------------------------------------------
def test_tensor_parallel_refusals_name_the_field():
    one = build_schedule("1f1b", 1, 1)
    with pytest.raises(ConfigError, match="vocab_size=127"):
        model = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                          vocab_size=127, micro_batch_size=2, dtype="fp32")
        run_schedule(one, plan_of(one, model, parallel(tp=2, num_microbatches=1)))
    with pytest.raises(KernelsError, match="replay"):
        run_schedule(one, plan_of(one, GPT, parallel(tp=2, num_microbatches=1)), replay=True)
    with pytest.raises(ConfigError, match="expert_tensor_parallel: the model has no experts"):
        run_schedule(one, plan_of(one, GPT, parallel(tp=2, expert_tensor_parallel=1,
                                                     num_microbatches=1)))


@pytest.mark.parametrize("zero_stage", [0, 1], ids=["ddp", "zero1"])
def test_tensor_and_data_parallel_adam_step_equals_reference(zero_stage):
    """tp=2 x dp=2 (4 ranks): DP gradient collectives and Adam over each TP shard, SP on."""
    par = parallel(tp=2, dp=2, sequence_parallel=True, num_microbatches=2,
                   zero_stage=zero_stage, bucket_bytes=100_000)
    base = build_schedule("1f1b", 1, 2)
    schedule = add_data_parallel(base, plan_of(base, LLAMA, par))
    timeline, grads, params = run(with_tp_ops(schedule, LLAMA, par), LLAMA, par,
                                  return_params=True)
    want_grads, want_params = run_reference_steps(LLAMA, par, 1)
    assert_same_grads(grads, want_grads)
    for name in want_params:
        torch.testing.assert_close(params[name], want_params[name], atol=1e-4, rtol=1e-5,
                                   msg=lambda m, n=name: f"param {n}: {m}")
    assert {s.lane for s in timeline.spans} == {"compute", "tp", "dp"}


# --- GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="TP over NCCL needs 2 CUDA devices (one GPU cannot run NCCL "
                    "between ranks)")
def test_tensor_parallel_on_two_gpus_with_nccl():
    par = parallel(tp=2, sequence_parallel=True, num_microbatches=2)
    schedule = with_tp_ops(build_schedule("1f1b", 1, 2), LLAMA, par)
    timeline, grads = run(schedule, LLAMA, par, device="cuda")
    want = run_reference(LLAMA, par)
    for name in want:
        torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-5)
    assert timeline.source.startswith("kernels:cuda:")
    assert all(s.end >= s.start for s in timeline.spans if s.lane == "tp")
