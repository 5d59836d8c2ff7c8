"""kernels: DDP, ZeRO-1/2/3 and HSDP run for real (gloo, CPU): gradients and Adam-updated
parameters equal the single-process reference, the measured Timeline carries the
collectives on their groups' lanes with the IR's sizes, and a ZeRO-3 schedule that
forgets a parameter gather fails (resharded parameters are NaN) instead of passing.

Schedules come from schedules.data_parallel.add_data_parallel (helper C's passes). Models
are tiny fp32 ones, mostly untied (ZeRO-3 at pp=1 and ZeRO across pipeline ranks need
untied embeddings; with DDP tied copies on two pipeline ranks are summed before the step:
see test_tied_embedding*). Gradients are compared at fp32 round-off;
parameters after Adam to 1e-4: Adam's first step moves each weight by about lr * sign(g)
(lr = 1e-3), and where |g| is near eps = 1e-8 that step depends on g's last bits."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_reference_steps, run_schedule  # noqa: E402
from clustersim.kernels.optimizer import FlatAdam, reference_optimizer  # noqa: E402
from clustersim.kernels.param_units import ParamUnit, owned_ranges  # noqa: E402
from clustersim.kernels.stage import build_stages, token_batch  # noqa: E402
from clustersim.schedules.data_parallel import add_data_parallel  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.ops import OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402

LLAMA = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=32, vocab_size=128, micro_batch_size=2, dtype="fp32", swiglu=True,
                  normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                  untie_embeddings_and_output_weights=True)
GPT = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, micro_batch_size=2, dtype="fp32")  # tied embeddings
BUCKET = 200_000  # bytes: about one layer of these models, so several buckets per stage
DP_KINDS = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER)
TIMEOUT = 90


def setup(model=LLAMA, pp=1, dp=2, **kw):
    bucket = {} if ParallelConfig(dp=dp, **kw).zero_stage == 3 else {"bucket_bytes": BUCKET}
    par = ParallelConfig(pp=pp, dp=dp, micro_batch_size=2, num_microbatches=2, **bucket, **kw)
    base = build_schedule("1f1b", pp, 2)
    schedule = add_data_parallel(base, resolve(model, par, schedule=base))
    return schedule, par


def run(schedule, par, model=LLAMA, warmup=0, **kw):
    return run_schedule(schedule, resolve(model, par, schedule=schedule), timeout=TIMEOUT,
                        warmup_iterations=warmup, return_grads=True, return_params=True, **kw)


def assert_matches_reference(grads, params, par, model=LLAMA, steps=1):
    want_grads, want_params = run_reference_steps(model, par, steps)
    assert set(grads) == set(want_grads) == set(params)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name],
                                   msg=lambda m, n=name: f"grad {n}: {m}")
        torch.testing.assert_close(params[name], want_params[name], atol=1e-4, rtol=1e-5,
                                   msg=lambda m, n=name: f"param {n}: {m}")


def assert_collectives_as_programmed(timeline, schedule, par):
    """Every DP op of every rank has one span on its group's lane, and per rank and kind
    the spans carry the bytes of the IR's ops (nccl-tests sizes: a bucket's gradients, a
    gathered range). Bucket edges inside an element move with the next bucket, so only
    the sums per kind are exact."""
    for rank in range(par.world_size):
        program = schedule.programs[par.coords(rank)["pp"]]
        for kind in DP_KINDS:
            ops = [op for op in program if op.kind is kind]
            spans = [s for s in timeline.spans if s.rank == rank and s.op.kind is kind]
            assert len(spans) == len(ops)
            assert all(s.lane == s.op.group and s.end >= s.start for s in spans)
            assert sum(s.op.nbytes for s in spans) == sum(op.nbytes for op in ops) > 0 \
                or not ops


# --- each ZeRO stage, dp=2 pp=1 ----------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(zero_stage=0), dict(zero_stage=1), dict(zero_stage=2), dict(zero_stage=3),
    dict(zero_stage=3, reshard_after_forward=False),
], ids=["ddp", "zero1", "zero2", "zero3", "zero3-no-reshard"])
def test_data_parallel_step_equals_reference(kw):
    schedule, par = setup(**kw)
    timeline, grads, params = run(schedule, par)
    assert_matches_reference(grads, params, par)
    assert_collectives_as_programmed(timeline, schedule, par)
    assert any(s.op.kind is OpKind.OPT_STEP and s.lane == "compute" for s in timeline.spans)
    if par.zero_stage == 1:
        assert any(GLOO in x for x in timeline.meta["limits"])


GLOO = "REDUCE_SCATTER runs as an all-reduce"


def test_ddp_bucket_all_reduces_are_posted_during_the_backward():
    schedule, par = setup(zero_stage=0)
    assert schedule.layer_groups > 1  # the last backward is split into bucket groups
    timeline, _, _ = run(schedule, par)
    for rank in (0, 1):
        reduces = [s for s in timeline.spans if s.rank == rank and s.op.kind is OpKind.ALL_REDUCE]
        last_b = max(s.start for s in timeline.spans
                     if s.rank == rank and s.op.kind is OpKind.B)
        assert min(s.start for s in reduces) < last_b  # overlaps the remaining backward


def test_zero3_state_carries_over_iterations():
    """Two steps (one warm-up): Adam state, the owned shards and the reshard at start."""
    schedule, par = setup(zero_stage=3)
    _, grads, params = run(schedule, par, warmup=1)
    assert_matches_reference(grads, params, par, steps=2)


@pytest.mark.parametrize("kw", [dict(zero_stage=0), dict(zero_stage=3)], ids=["ddp", "zero3"])
def test_measured_spans_are_the_simulated_ones(kw):
    """Same schedule, both backends: per op one span on the same lane with the same bytes
    (the simulator draws one DP replica: its rank r is the kernels' pipeline rank r of
    replica 0), so the two Timelines compare op for op."""
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology
    schedule, par = setup(**kw)
    simulated = simulate(LLAMA, par, load_topology("dgx-h100"), build_schedule("1f1b", 1, 2))
    measured, _, _ = run(schedule, par)

    def ops(spans):
        return sorted((par.coords(s.rank)["pp"], s.lane, str(s.op), s.op.nbytes if
                       s.op.kind.is_collective else 0) for s in spans)
    assert ops(simulated.spans) == ops(s for s in measured.spans
                                       if par.coords(s.rank)["dp"] == 0)


# --- 4 ranks: a pipeline with ZeRO-1, and HSDP ------------------------------------------
def test_zero1_with_a_pipeline_equals_reference():
    schedule, par = setup(pp=2, zero_stage=1)
    timeline, grads, params = run(schedule, par)
    assert_matches_reference(grads, params, par)
    assert_collectives_as_programmed(timeline, schedule, par)


def test_hybrid_shard_equals_reference():
    schedule, par = setup(dp=4, fsdp="hybrid", shard_size=2)
    timeline, grads, params = run(schedule, par)
    assert_matches_reference(grads, params, par)
    lanes = {(s.op.kind, s.lane) for s in timeline.spans if s.op.kind in DP_KINDS}
    assert lanes == {(OpKind.ALL_GATHER, "dp_shard"), (OpKind.REDUCE_SCATTER, "dp_shard"),
                     (OpKind.ALL_REDUCE, "dp_replicate")}


# --- a missing gather cannot pass ---------------------------------------------------------
def test_zero3_schedule_missing_a_gather_fails_clearly():
    """Remove the first gather of layer group 1: its first forward finds it sharded.
    (Removing a later gather is no error: by the contract's positional rule the previous
    gather's parameters then stay until their last user, as reshard_after_forward=False.)"""
    schedule, par = setup(zero_stage=3)
    program = schedule.programs[0]
    victim = next(i for i, op in enumerate(program)
                  if op.kind is OpKind.ALL_GATHER and op.chunk == 1)
    broken = schedule.with_programs([program[:victim] + program[victim + 1:]])
    with pytest.raises(KernelsError, match=r"0F0\.1 computes with the parameters of stage 0 "
                       r"layer group 1, which are sharded here \(\d+ elements not gathered, "
                       r"NaN\)"):
        run(broken, par)


def test_resharded_parameters_are_nan_so_a_forgotten_gather_poisons_the_loss():
    """Without the executor's check: a unit resharded on rank 0 of 2 computes NaN."""
    module = build_stages(LLAMA, [0], 1, seed=0)[0]
    params = [p for _, p in module.chunk_parameters(None, 1)]
    unit = ParamUnit(0, None, [n for n, _ in module.chunk_parameters(None, 1)], params,
                     {None: (0, sum(p.numel() for p in params))})
    unit.buckets = [(0, unit.numel)]
    unit.owned = owned_ranges(unit.buckets, 2, 0)
    before = unit.read_owned().clone()
    unit.poison()
    assert unit.missing == unit.numel - unit.owned_count > 0
    assert torch.equal(unit.read_owned(), before)  # the owned shard survives
    tokens, labels = token_batch(LLAMA, 2, seed=0)
    assert torch.isnan(module(tokens, labels)).item()


# --- the optimizer ------------------------------------------------------------------------
def test_adam_on_shards_equals_torch_adam_on_the_whole():
    gen = torch.Generator().manual_seed(0)
    full = torch.nn.Parameter(torch.randn(1001, generator=gen))
    reference = reference_optimizer([full])
    shards = [FlatAdam(full.detach()[a:b]) for a, b in owned_ranges([(0, 1001)], 3, 0)
              + owned_ranges([(0, 1001)], 3, 1) + owned_ranges([(0, 1001)], 3, 2)]
    bounds = [0, 334, 668, 1001]
    for _ in range(3):
        grad = torch.randn(1001, generator=gen)
        full.grad = grad.clone()
        reference.step()
        for i, shard in enumerate(shards):
            shard.step(grad[bounds[i]:bounds[i + 1]])
    torch.testing.assert_close(torch.cat([s.master for s in shards]), full.detach(),
                               rtol=0, atol=0)


# --- tied embeddings on two pipeline ranks: Megatron's embedding all-reduce ---------------
def capture_payloads(monkeypatch):
    """The rank payloads of the next run_schedule (each rank's own tensors, unmerged)."""
    import clustersim.kernels.launch as launch
    payloads, launch_ranks = {}, launch._launch
    monkeypatch.setattr(launch, "_launch", lambda job: payloads.update(launch_ranks(job))
                        or payloads)
    return payloads


@pytest.mark.parametrize("dp,schedule_name,steps", [
    (1, "1f1b", 1), (1, "1f1b", 2), (2, "1f1b", 1), (2, "1f1b", 2),
    (1, "interleaved-1f1b", 2)])
def test_tied_embedding_copies_step_as_one_weight(monkeypatch, dp, schedule_name, steps):
    """pp=2, DDP: the OPT_STEPs of the first and last stage sum the two word-embedding
    copies' gradients first, so both equal the reference's one weight after each step."""
    import io
    vpp = 2 if schedule_name == "interleaved-1f1b" else 1
    par = ParallelConfig(pp=2, vpp=vpp, dp=dp, micro_batch_size=2, num_microbatches=2,
                         schedule=schedule_name, **({"bucket_bytes": BUCKET} if dp > 1 else {}))
    base = build_schedule(schedule_name, 2, 2, vpp)
    schedule = add_data_parallel(base, resolve(GPT, par, schedule=base))
    payloads = capture_payloads(monkeypatch)
    timeline, grads, params = run(schedule, par, model=GPT, warmup=steps - 1)
    assert_matches_reference(grads, params, par, model=GPT, steps=steps)
    assert any("embedding all-reduce" in x for x in timeline.meta["limits"])
    copies = {}
    for rank, payload in payloads.items():
        held = torch.load(io.BytesIO(payload["params"]))
        copies.setdefault(par.coords(rank)["dp"], []).append(held["word_embeddings.weight"])
    assert all(len(c) == 2 and torch.equal(*c) for c in copies.values())


# --- what the backend refuses -------------------------------------------------------------
def test_tied_embeddings_across_pipeline_ranks_with_zero_are_refused():
    schedule, par = setup(model=GPT, pp=2, zero_stage=1)
    with pytest.raises(KernelsError, match=r"zero_stage=1 with tied embeddings on different "
                       r"pipeline ranks: .*embedding all-reduce.* only where each copy's "
                       r"gradient is whole .*shard-aligned"):
        run(schedule, par, model=GPT)


def test_tied_embedding_shared_by_two_stages_of_a_rank_reduces_once_per_stage():
    """pp=1 vpp=2: one shared weight in both stages' all-reduces (the IR's sizes) still
    gives the reference gradients (a mean of means); a step on it is refused."""
    from clustersim.schedules.data_parallel import add_dp_allreduce
    par = ParallelConfig(pp=1, vpp=2, dp=2, micro_batch_size=2, num_microbatches=2,
                         schedule="interleaved-1f1b")
    plain = add_dp_allreduce(build_schedule("interleaved-1f1b", 1, 2, 2))
    _, grads = run_schedule(plain, resolve(GPT, par, schedule=plain), timeout=TIMEOUT,
                            warmup_iterations=0, return_grads=True)
    want, _ = run_reference_steps(GPT, par, 1)
    for name in want:
        torch.testing.assert_close(grads[name], want[name])
    base = build_schedule("interleaved-1f1b", 1, 2, 2)
    stepped = add_data_parallel(base, resolve(GPT, par, schedule=base))
    with pytest.raises(KernelsError, match="first and last stage on one rank"):
        run(stepped, par, model=GPT)


def test_tied_embeddings_with_zero3_at_pp1_are_refused_before_the_run():
    """The IR gathers the tied word embedding again for the head (the last layer group);
    the kernels' parameter units do not: refused with the reason before any process
    starts, rather than computing with NaN."""
    schedule, par = setup(model=GPT, zero_stage=3)
    with pytest.raises(KernelsError, match="gathers the word embedding again"):
        run(schedule, par, model=GPT)


def test_offload_is_refused():
    schedule, par = setup(zero_stage=2, offload=True)
    with pytest.raises(KernelsError, match="offload"):
        run(schedule, par)


# --- replay: a ZeRO-3 schedule's compute, layer group by layer group, on one device --------
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_replay_times_a_zero3_schedule_per_layer_group(device):
    """Loopback: collectives are a group of one (no spans), so the compute of every layer
    group and the optimizer step are timed alone on one device (calibration)."""
    schedule, _ = setup(zero_stage=3)
    # one replica; the plan takes the schedule's 4 layer groups (Plan.layer_groups)
    one = ParallelConfig(dp=1, micro_batch_size=2, num_microbatches=2)
    timeline = run_schedule(schedule, resolve(LLAMA, one, schedule=schedule), device=device,
                            replay=True, timeout=TIMEOUT, warmup_iterations=0)
    computed = [op for op in schedule.programs[0] if op.kind.is_compute]
    assert sorted(str(s.op) for s in timeline.spans) == sorted(str(op) for op in computed)
    assert {s.op.chunk for s in timeline.spans if s.op.kind is OpKind.F} == {0, 1, 2, 3}
