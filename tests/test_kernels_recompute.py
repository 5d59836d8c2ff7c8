"""kernels: activation recomputation (ParallelConfig.recompute) runs for real, Megatron-style.

'full' checkpoints every transformer layer, 'selective' the core attention; the embedding
and the head are never recomputed. Checked: the recomputed forwards really run (forward
hooks count them; with tp=2 the forward's TP collectives run again in the backward, as
many and as large as the simulator's IR charges), fewer activations are kept, gradients
equal the single-process reference (run without recompute) with pipelines, TP/SP, DP and
ZeRO, and full recompute with a zero-bubble I/W split is refused. The per-layer counts
and bytes of the rerun TP collectives: tests/test_kernels_tp.py (recompute='full').

Models are tiny fp32 ones (as tests/test_kernels*.py), so gradients agree to fp32 round-off."""
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_reference, run_reference_steps  # noqa: E402
from clustersim.kernels.layers import MLP, CoreAttention, TransformerLayer  # noqa: E402
from clustersim.kernels.stage import build_stages, token_batch  # noqa: E402
from clustersim.schedules.data_parallel import add_data_parallel  # noqa: E402
from clustersim.schedules.lowering import lower  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.recompute import Recompute  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.schedules.ops import Op, OpKind  # noqa: E402
from clustersim.schedules.schedule import Schedule  # noqa: E402
from test_kernels import (GPT, LLAMA, assert_same_grads, gradients_only, parallel,  # noqa: E402
                          run)

RECOMPUTE = ["selective", "full"]



def with_tp_ops(schedule, model, par):
    """The schedule lowered and costed, with the IR's TP collective ops (as simulated):
    the program run_schedule runs (its lowering then leaves it as it is)."""
    return lower(schedule, resolve(model, par, schedule=schedule))


# --- in one process: what runs twice, what is kept ---------------------------------------
def forward_and_backward(model, recompute):
    """One microbatch through the whole model (one stage): forward calls per module type
    (TransformerLayer, CoreAttention, MLP, the final Norm) and the gradients."""
    module = build_stages(model, [0], 1, seed=0, recompute=recompute)[0]
    calls = Counter()
    for sub in module.modules():
        if isinstance(sub, (TransformerLayer, CoreAttention, MLP)) or sub is module.final_norm:
            name = "final_norm" if sub is module.final_norm else type(sub).__name__
            sub.register_forward_hook(lambda *_, n=name: calls.update([n]))
    tokens, labels = token_batch(model, model.micro_batch_size, seed=0)
    module(tokens, labels).backward()
    return calls, {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
@pytest.mark.parametrize("recompute,layer,core,mlp", [
    ("none", 1, 1, 1), ("selective", 1, 2, 1), ("full", 2, 2, 2)])
def test_recomputed_modules_run_again_in_the_backward(model, recompute, layer, core, mlp):
    """Forward calls per layer per microbatch: full reruns every layer, selective only its
    core attention; the head (final norm) runs once; gradients are those without."""
    calls, grads = forward_and_backward(model, recompute)
    n = model.num_layers
    assert calls == {"TransformerLayer": layer * n, "CoreAttention": core * n,
                     "MLP": mlp * n, "final_norm": 1}
    _, want = forward_and_backward(model, "none")
    assert_same_grads(grads, want)


@pytest.mark.parametrize("method,n,rerun", [
    ("block", 1, 1), ("block", 3, 3), ("uniform", 2, 4), ("uniform", 3, 4)])
def test_the_recompute_method_picks_the_layers_that_run_again(method, n, rerun):
    """Megatron-Core's TransformerBlock: 'block' reruns the first N of the 4 layers, each
    under its own checkpoint; 'uniform' reruns every layer, N per checkpoint (3 over 4
    layers: chunks of 3 and 1). Gradients are those without recompute."""
    calls, grads = forward_and_backward(GPT, Recompute("full", method, n))
    assert calls["TransformerLayer"] == GPT.num_layers + rerun
    _, want = forward_and_backward(GPT, "none")
    assert_same_grads(grads, want)


def test_uniform_chunks_keep_only_their_inputs():
    """Uniform with 2 layers per checkpoint keeps half the layer inputs of 1 per
    checkpoint (and both far less than no recompute)."""
    one, two = (saved_bytes(Recompute("full", "uniform", n)) for n in (1, 2))
    layer_input = 2 * 32 * 64 * 4  # b*s*h fp32
    assert one - two == 2 * layer_input  # 4 checkpoints -> 2


def saved_bytes(recompute):
    """Bytes autograd keeps for the backward after one microbatch's forward."""
    module = build_stages(LLAMA, [0], 1, seed=0, recompute=recompute)[0]
    tokens, labels = token_batch(LLAMA, LLAMA.micro_batch_size, seed=0)
    kept = []

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            kept.append(t.numel() * t.element_size())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(tokens, labels)
    loss.backward()
    return sum(kept)


def test_recompute_keeps_fewer_activations():
    none, selective, full = (saved_bytes(r) for r in ("none", "selective", "full"))
    assert none > selective > full > 0
    layer_inputs = LLAMA.num_layers * 2 * 32 * 64 * 4  # b*s*h fp32 per layer
    assert full < none / 3 and full >= layer_inputs


def test_unknown_recompute_is_refused():
    with pytest.raises(ValueError, match="recompute='some'"):
        build_stages(GPT, [0], 1, seed=0, recompute="some")


# --- gradients equal the reference, with pipelines, TP/SP, DP/ZeRO -------------------------
@pytest.mark.parametrize("recompute", RECOMPUTE)
@pytest.mark.parametrize("name,pp,vpp,model", [
    ("1f1b", 2, 1, GPT), ("interleaved-1f1b", 2, 2, LLAMA)], ids=["1f1b", "interleaved"])
def test_pipelined_gradients_equal_reference(name, pp, vpp, model, recompute):
    par = parallel(pp=pp, vpp=vpp, num_microbatches=4, schedule=name, recompute=recompute)
    _, grads = run(build_schedule(name, pp, 4, vpp), model, par)
    assert_same_grads(grads, run_reference(model, par))


@pytest.mark.parametrize("recompute", [
    dict(recompute="selective"), dict(recompute="full"),
    dict(recompute="full", recompute_method="block", recompute_num_layers=1)],
    ids=["selective", "full", "full-block-1"])
@pytest.mark.parametrize("model,sp", [(GPT, False), (LLAMA, True)], ids=["gpt", "llama-sp"])
def test_tensor_parallel_gradients_and_tp_ops_equal_the_ir(model, sp, recompute):
    """tp=2, with and without SP: gradients equal the reference, and every TP op of the
    IR (schedules.intra_layer, which charges full recompute's rerun forward to B, for the
    layers the method reruns) finds its count and bytes of collectives measured in its
    compute op."""
    par = parallel(tp=2, sequence_parallel=sp, num_microbatches=2, **recompute)
    schedule = with_tp_ops(build_schedule("1f1b", 1, 2), model, par)
    timeline, grads = run(schedule, model, par)
    assert_same_grads(grads, run_reference(model, par))
    tp_spans = [s for s in timeline.spans if s.lane == "tp"]
    assert len(tp_spans) == 2 * sum(op.group == "tp" for op in schedule.ops())
    for span in tp_spans:
        assert span.info["measured"] == span.info["count"], span.op
        assert span.info["measured_bytes"] == span.op.nbytes, span.op


@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_tensor_and_pipeline_parallel_equal_reference(recompute):
    """tp=2 x pp=2 (4 ranks) with SP: P2P of sequence shards, recompute on both stages."""
    par = parallel(tp=2, pp=2, sequence_parallel=True, num_microbatches=2, schedule="1f1b",
                   recompute=recompute)
    model = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                      vocab_size=128, micro_batch_size=2, dtype="fp32")
    schedule = with_tp_ops(build_schedule("1f1b", 2, 2), model, par)
    _, grads = run(schedule, model, par)
    assert_same_grads(grads, run_reference(model, par))


@pytest.mark.parametrize("recompute,kw", [
    ("full", dict(zero_stage=0)), ("selective", dict(zero_stage=2)), ("full", dict(zero_stage=3))],
    ids=["ddp-full", "zero2-selective", "zero3-full"])
def test_data_parallel_step_equals_reference(recompute, kw):
    """dp=2 with Adam: DDP's bucket groups and ZeRO-3's per-layer units run the backward
    as layer groups (chunked B ops); ZeRO-3 recomputes with the gathered parameters."""
    bucket = {} if kw["zero_stage"] == 3 else {"bucket_bytes": 200_000}  # FSDP: layer units
    par = parallel(dp=2, num_microbatches=2, recompute=recompute, **bucket, **kw)
    base = build_schedule("1f1b", 1, 2)
    schedule = add_data_parallel(base, resolve(LLAMA, par, schedule=base))
    assert schedule.layer_groups > 1
    _, grads, params = run(schedule, LLAMA, par, return_params=True)
    want_grads, want_params = run_reference_steps(LLAMA, par, 1)
    assert_same_grads(grads, want_grads)
    for name in want_params:
        torch.testing.assert_close(params[name], want_params[name], atol=1e-4, rtol=1e-5,
                                   msg=lambda m, n=name: f"param {n}: {m}")


# --- the zero-bubble I/W split ------------------------------------------------------------
def split_backward_schedule():
    """Zero-bubble style on 2 pipeline ranks: I (input grad) now, W (weight grad) later."""
    f, i, w = OpKind.F, OpKind.I, OpKind.W
    programs = [[Op(f, 0, 0), Op(f, 0, 1), Op(i, 0, 0), Op(i, 0, 1), Op(w, 0, 0), Op(w, 0, 1)],
                [Op(f, 1, 0), Op(i, 1, 0), Op(f, 1, 1), Op(i, 1, 1), Op(w, 1, 1), Op(w, 1, 0)]]
    return Schedule("zb-handmade", 2, programs, num_stages=2)


@pytest.mark.parametrize("tp", [1, 2])
def test_selective_recompute_with_split_backward_equals_reference(tp):
    """Selective recompute reruns the core attention in I; W needs none of it."""
    par = parallel(pp=2, tp=tp, sequence_parallel=tp > 1, num_microbatches=2,
                   schedule="custom", recompute="selective")
    schedule = with_tp_ops(split_backward_schedule(), LLAMA, par)
    _, grads = run(schedule, LLAMA, par)
    assert_same_grads(grads, run_reference(LLAMA, par))


def test_full_recompute_with_split_backward_is_refused():
    par = parallel(pp=2, num_microbatches=2, schedule="custom", recompute="full")
    with pytest.raises(KernelsError, match=r"recompute='full' with schedule 'zb-handmade', "
                       r"which splits the backward into I and W ops"):
        run(split_backward_schedule(), GPT, par)


# --- the simulator's timeline and the measured one carry the same ops ----------------------
def test_measured_ops_are_the_simulated_ones_with_full_recompute():
    """tp=2 with SP and full recompute: per op one span on the same lane, the same bytes
    and (TP ops) the same count of collectives, measured as simulated."""
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology
    par = parallel(tp=2, sequence_parallel=True, num_microbatches=2, recompute="full")
    simulated = simulate(LLAMA, par, load_topology("dgx-h100"), build_schedule("1f1b", 1, 2))
    base = build_schedule("1f1b", 1, 2)
    schedule = with_tp_ops(add_data_parallel(base, resolve(LLAMA, par, schedule=base)), LLAMA,
                           par)
    measured, _ = run(schedule, LLAMA, par)

    def ops(spans, count):
        return sorted((s.lane, str(s.op), s.op.nbytes if s.lane == "tp" else 0, count(s))
                      for s in spans)
    tp_count = (lambda s: s.op.count if s.lane == "tp" else 0)
    want = ops((s for s in simulated.spans if s.rank == 0), tp_count)
    assert ops((s for s in measured.spans if s.rank == 0),
               lambda s: s.info["measured"] if s.lane == "tp" else 0) == want


# --- GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_single_gpu_interleaved_recompute_equals_reference(recompute):
    par = parallel(pp=1, vpp=2, num_microbatches=4, schedule="interleaved-1f1b",
                   recompute=recompute)
    # both chunks on one rank share the tied embedding: no step (test_kernels.gradients_only)
    _, grads = run(gradients_only(build_schedule("interleaved-1f1b", 1, 4, 2)), GPT, par,
                   device="cuda")
    want = run_reference(GPT, par)
    for name in want:
        torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-5)
