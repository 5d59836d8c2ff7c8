"""kernels: pipelined runs on CPU (gloo) reproduce the single-process gradients, measured
Timelines obey the execution contract, and failures end with a clear error, not a hang.

Models are tiny (4 layers, hidden 64) and fp32, so gradients agree to fp32 round-off."""
import multiprocessing
import os
import re
import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, launch, run_reference, run_schedule  # noqa: E402
from clustersim.kernels.layers import (ColumnParallelLinear, RowParallelLinear,  # noqa: E402
                            count_parameters, init_parameters)
from clustersim.kernels.stage import build_stages  # noqa: E402
from clustersim.kernels.worker import Job  # noqa: E402
from clustersim.schedules.data_parallel import add_dp_allreduce  # noqa: E402
from clustersim.schedules.errors import ConfigError, DeadlockError  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.ops import Op, OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.schedule import Schedule  # noqa: E402

GPT = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, micro_batch_size=2, dtype="fp32")
LLAMA = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=32, vocab_size=128, micro_batch_size=2, dtype="fp32", swiglu=True,
                  normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                  untie_embeddings_and_output_weights=True)
TIMEOUT = 60


def parallel(**kw):
    return ParallelConfig(micro_batch_size=2, **kw)


def assert_same_grads(got, want):
    assert set(got) == set(want), set(got) ^ set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


def with_dp_allreduce(schedule):
    """Each rank reduces each stage's gradients over DP after its last backward op."""
    programs = []
    for program in schedule.programs:
        stages = sorted({op.stage for op in program})
        programs.append(program + [Op(OpKind.ALL_REDUCE, s, None, group="dp") for s in stages])
    return schedule.with_programs(programs)


def plan_of(schedule, model, par):
    """The plan run_schedule takes: `par` resolved with `schedule`'s shape."""
    return resolve(model, par, schedule=schedule)


def gradients_only(schedule):
    """`schedule` with the plain DP all-reduces (a group of one at dp=1, which changes no
    value) and no optimizer step: run_schedule's data-parallel pass then leaves it as it
    is. For a tied model whose first and last stage share one rank, which the kernels
    refuse to step (kernels.tied_embedding), but whose gradients they compute."""
    return add_dp_allreduce(schedule)


def run(schedule, model, par, **kw):
    return run_schedule(schedule, plan_of(schedule, model, par), timeout=TIMEOUT,
                        warmup_iterations=0, return_grads=True, **kw)


# --- layers ----------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_stage_parameters_count_as_the_model_spec_says(spec):
    whole = build_stages(spec, [0], 1, seed=0)[0]
    assert count_parameters(whole) == spec.param_count()
    halves = build_stages(spec, [0, 1], 2, seed=0, split=[2, 2])
    a, b = dict(whole.named_parameters()), {}
    for module in halves.values():
        b.update(module.named_parameters())
    assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def test_tensor_parallel_shards_recombine_to_the_full_linear():
    x = torch.randn(3, 8)
    full_col, full_row = ColumnParallelLinear(8, 6, True), RowParallelLinear(6, 8, True)
    for m in (full_col, full_row):
        init_parameters(m, seed=1)
    cols = [ColumnParallelLinear(8, 6, True, tp_size=2, tp_rank=r) for r in range(2)]
    rows = [RowParallelLinear(6, 8, True, tp_size=2, tp_rank=r) for r in range(2)]
    for r in range(2):
        init_parameters(cols[r], seed=1, tp_rank=r)
        init_parameters(rows[r], seed=1, tp_rank=r)
    linear = torch.nn.functional.linear  # the shards' math (communication: kernels.tensor_parallel)
    h = full_col(x)
    torch.testing.assert_close(torch.cat([linear(x, c.weight, c.bias) for c in cols], -1), h)
    parts = h.chunk(2, dim=-1)  # row-parallel: partial sums, bias added once
    partial = sum(linear(parts[r], rows[r].weight) for r in range(2))
    torch.testing.assert_close(partial + full_row.bias, full_row(h))


# --- gradients equal the single-process reference -----------------------------------------
@pytest.mark.parametrize("name,pp,vpp,model", [
    ("gpipe", 2, 1, GPT), ("1f1b", 2, 1, GPT), ("interleaved-1f1b", 2, 2, LLAMA),
    ("interleaved-1f1b", 1, 2, GPT),  # two chunks on one rank: local hand-off, shared embedding
    # zero bubble (I now, W later): handcrafted, torch's interleaved order, and the V shape
    ("zb-h1", 2, 1, GPT), ("zb-h2", 2, 1, LLAMA), ("interleaved-zero-bubble", 2, 2, GPT),
    ("zbv-zero-bubble", 2, 2, LLAMA),  # first and last stage on rank 0
    ("dualpipev", 2, 2, LLAMA),  # overlapped F&B pairs, run F then B
])
def test_pipelined_gradients_equal_reference(name, pp, vpp, model):
    par = parallel(pp=pp, vpp=vpp, num_microbatches=4, schedule=name)
    schedule = build_schedule(name, pp, 4, vpp)
    if pp == 1:  # both chunks on one rank share the tied embedding: no step (gradients_only)
        schedule = gradients_only(schedule)
    timeline, grads = run(schedule, model, par)
    assert_same_grads(grads, run_reference(model, par))
    assert timeline.source == "kernels:cpu"


def test_split_backward_schedule_equals_reference():
    """Zero-bubble style: I (input grad) now, W (weight grad) later."""
    f, i, w = OpKind.F, OpKind.I, OpKind.W
    programs = [[Op(f, 0, 0), Op(f, 0, 1), Op(i, 0, 0), Op(f, 0, 2), Op(i, 0, 1), Op(w, 0, 0),
                 Op(i, 0, 2), Op(w, 0, 1), Op(w, 0, 2)],
                [Op(f, 1, 0), Op(i, 1, 0), Op(f, 1, 1), Op(i, 1, 1), Op(w, 1, 0), Op(f, 1, 2),
                 Op(i, 1, 2), Op(w, 1, 2), Op(w, 1, 1)]]
    schedule = Schedule("zb-handmade", 3, programs, num_stages=2)
    par = parallel(pp=2, num_microbatches=3, schedule="custom")
    timeline, grads = run(schedule, GPT, par)
    assert_same_grads(grads, run_reference(GPT, par))
    # no B ran; the OPT_STEPs are the lowering's data-parallel pass (one per stage)
    assert {s.op.kind for s in timeline.spans if s.lane == "compute"} == {
        f, i, w, OpKind.OPT_STEP}


@pytest.mark.parametrize("pp", [1, 2])
def test_data_parallel_gradients_equal_reference(pp):
    par = parallel(pp=pp, dp=2, num_microbatches=2, schedule="1f1b")
    schedule = with_dp_allreduce(build_schedule("1f1b", pp, 2))
    timeline, grads = run(schedule, GPT, par)
    assert_same_grads(grads, run_reference(GPT, par))
    reduces = [s for s in timeline.spans if s.op.kind is OpKind.ALL_REDUCE]
    assert len(reduces) == 2 * pp and all(s.lane == "dp" and s.op.nbytes > 0 for s in reduces)
    assert sorted(timeline.ranks) == list(range(2 * pp))


# --- the measured Timeline obeys the contract ----------------------------------------------
def test_measured_timeline_obeys_the_execution_contract():
    par = parallel(pp=2, num_microbatches=4, schedule="1f1b")
    schedule = build_schedule("1f1b", 2, 4)
    timeline = run_schedule(schedule, plan_of(schedule, GPT, par), timeout=TIMEOUT,
                            iterations=2)
    assert len(timeline.meta["iteration_times"]) == 2
    # run_schedule lowers with the data-parallel pass: with dp=1 it adds one OPT_STEP per
    # stage, after the stage's last backward, on the compute lane
    steps = [Op(OpKind.OPT_STEP, rank, None) for rank in (0, 1)]
    compute = [s for s in timeline.spans if s.lane == "compute"]
    assert sorted(str(s.op) for s in compute) == sorted(str(op) for op in
                                                        [*schedule.ops(), *steps])
    for rank in (0, 1):
        mine = sorted((s for s in compute if s.rank == rank), key=lambda s: s.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
        assert [s.op.key for s in mine] == [op.key for op in schedule.programs[rank]] + [
            steps[rank].key]
    at = {(s.op.kind, s.op.stage, s.op.microbatch): s for s in compute}
    for m in range(4):
        assert at[(OpKind.F, 1, m)].start >= at[(OpKind.F, 0, m)].end
        assert at[(OpKind.B, 0, m)].start >= at[(OpKind.B, 1, m)].end
    comm = {(s.op.kind, s.op.stage, s.op.microbatch): s for s in timeline.spans
            if s.op.kind.is_p2p}
    assert len(comm) == 4 * 4 and all(s.end >= s.start for s in comm.values())
    assert {s.lane for s in comm.values()} == {"send", "recv"}
    for m in range(4):  # a transfer completes after it was sent
        assert comm[(OpKind.RECV_F, 1, m)].end >= comm[(OpKind.SEND_F, 0, m)].start
    assert comm[(OpKind.SEND_F, 0, 0)].op.nbytes == 2 * 32 * 64 * 4
    assert 0 <= min(s.start for s in timeline.spans) < timeline.iteration_time
    assert all(s.op.flops > 0 for s in compute  # costed by schedules.annotate
               if s.op.kind is not OpKind.OPT_STEP)
    assert all(s.op.nbytes > 0 for s in compute if s.op.kind is OpKind.OPT_STEP)


# --- failures end with a clear error, not a hang -------------------------------------------
def deadlocked_schedule():
    """Rank 1 never sends its backward, so rank 0's 0B0 waits forever for 0RECV_B0."""
    programs = [[Op(OpKind.F, 0, 0), Op(OpKind.B, 0, 0)], [Op(OpKind.F, 1, 0)]]
    lowered = [[Op(OpKind.F, 0, 0), Op(OpKind.SEND_F, 0, 0, "pp"),
                Op(OpKind.RECV_B, 0, 0, "pp"), Op(OpKind.B, 0, 0)],
               [Op(OpKind.RECV_F, 1, 0, "pp"), Op(OpKind.F, 1, 0), Op(OpKind.B, 1, 0)]]
    return Schedule("deadlock", 1, programs, 2).with_programs(lowered)


def deadlocked_plan():
    return plan_of(deadlocked_schedule(), GPT, parallel(pp=2, num_microbatches=1))


def test_deadlocked_schedule_is_refused_before_running():
    with pytest.raises(DeadlockError):
        run_schedule(deadlocked_schedule(), deadlocked_plan())


def test_deadlock_forced_past_validation_ends_with_kernels_error_within_timeout():
    start = time.monotonic()
    with pytest.raises(KernelsError, match=r"timed out.*rank 0 on op 0B0"):
        run_schedule(deadlocked_schedule(), deadlocked_plan(), timeout=4, check=False)
    assert time.monotonic() - start < 4 + 3  # the timeout, plus killing the ranks


def test_rank_that_dies_ends_the_run_long_before_the_timeout():
    """Kill rank 1 (SIGKILL) while rank 0 waits for it: the run must not wait out its
    30 s timeout, and the error must say which rank failed."""
    errors = []

    def target():
        try:
            run_schedule(deadlocked_schedule(), deadlocked_plan(), timeout=30, check=False)
        except KernelsError as exc:
            errors.append(exc)

    start = time.monotonic()
    thread = threading.Thread(target=target)
    thread.start()
    victim = None
    while victim is None and time.monotonic() - start < 20:
        victim = next((p for p in multiprocessing.active_children()
                       if p.name == "clustersim-rank-1"), None)
        time.sleep(0.05)
    time.sleep(1.0)  # let it reach its program
    os.kill(victim.pid, signal.SIGKILL)
    thread.join(timeout=25)
    assert not thread.is_alive() and errors, "the run did not end"
    assert time.monotonic() - start < 15
    assert re.search(r"rank 1 (had )?died \(exit code -9\)", str(errors[0]))


def test_rank_that_raises_ends_the_run_naming_rank_and_op():
    """A rank whose op raises (here IndexError from the model code: microbatch 7 of 1)
    ends the run with a KernelsError naming the rank, the op and the exception. The
    lowering in run_schedule refuses this program's structure before any rank starts
    (check=False skips only the deadlock dry run), so the program is launched as run_schedule
    launches a lowered one: kernels.launch._launch with a worker Job."""
    programs = [[Op(OpKind.F, 0, 0), Op(OpKind.SEND_F, 0, 0, "pp"), Op(OpKind.F, 0, 7)],
                [Op(OpKind.RECV_F, 1, 0, "pp"), Op(OpKind.F, 1, 0)]]
    schedule = Schedule("bad", 1, programs, 2)
    job = Job(schedule, plan_of(schedule, GPT, parallel(pp=2, num_microbatches=1)), "cpu",
              0, float(TIMEOUT), 1, 1, False, 0)  # port: _launch's store
    start = time.monotonic()
    with pytest.raises(KernelsError, match=r"rank 0 .*failed on 0F7: IndexError: microbatch 7"):
        launch._launch(job)
    assert time.monotonic() - start < 10


def test_unsupported_configurations_fail_clearly(monkeypatch):
    with pytest.raises(KernelsError, match="cp=2"):  # tp runs: tests/test_kernels_tp.py
        one = build_schedule("1f1b", 1, 1)
        run_schedule(one, plan_of(one, GPT, parallel(cp=2, num_microbatches=1)))
    with pytest.raises(KernelsError, match="partition_activations=True: ZeRO-R"):
        one = build_schedule("1f1b", 1, 1)
        run_schedule(one, plan_of(one, GPT, parallel(tp=2, num_microbatches=1,
                                                     recompute="full",
                                                     partition_activations=True)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(KernelsError, match="one GPU cannot run NCCL between ranks"):
        two = build_schedule("1f1b", 2, 2)
        run_schedule(two, plan_of(two, GPT, parallel(pp=2, num_microbatches=2)),
                     device="cuda")


# --- GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_single_gpu_interleaved_gradients_and_cuda_timeline():
    par = parallel(pp=1, vpp=2, num_microbatches=4, schedule="interleaved-1f1b")
    timeline, grads = run(gradients_only(build_schedule("interleaved-1f1b", 1, 4, 2)), GPT, par,
                          device="cuda")
    want = run_reference(GPT, par)
    for name in want:
        torch.testing.assert_close(grads[name], want[name], rtol=1e-4, atol=1e-5)
    assert timeline.source.startswith("kernels:cuda:")
    assert timeline.peak_memory()[0] > 0


# --- replay: every pipeline rank's compute on one device --------------------------------
def test_replay_runs_each_pipeline_ranks_compute_once_from_time_zero():
    sched = build_schedule("1f1b", 2, 4)
    timeline = run_schedule(sched, plan_of(sched, GPT, parallel(pp=2, num_microbatches=4)),
                            timeout=TIMEOUT, warmup_iterations=0, replay=True)
    assert timeline.meta["replay"] is True and any("replay" in x for x in timeline.meta["limits"])
    for rank in (0, 1):
        spans = [s for s in timeline.spans if s.rank == rank]
        assert all(s.lane == "compute" for s in spans)  # P2P is loopback: no comm spans
        step = Op(OpKind.OPT_STEP, rank, None)  # the lowering's data-parallel pass: per stage
        assert sorted(str(s.op) for s in spans) == sorted(
            [str(op) for op in sched.programs[rank] if op.kind.is_compute] + [str(step)])
        assert min(s.start for s in spans) < 0.05  # each rank replayed from its own t0
        ordered = sorted(spans, key=lambda s: s.start)
        assert all(a.end <= b.start + 1e-9 for a, b in zip(ordered, ordered[1:]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_replay_on_one_gpu_times_every_pipeline_rank_with_cuda_events():
    sched = build_schedule("interleaved-1f1b", 2, 4, 2)
    par = parallel(pp=2, vpp=2, num_microbatches=4, schedule="interleaved-1f1b")
    timeline = run_schedule(sched, plan_of(sched, GPT, par), device="cuda", timeout=TIMEOUT,
                            replay=True)
    assert timeline.source.startswith("kernels:cuda:")
    assert {s.rank for s in timeline.spans} == {0, 1}
    # and one OPT_STEP per stage: the lowering's data-parallel pass
    assert len(timeline.spans) == sum(op.kind.is_compute for op in sched.ops()) + 4
    assert all(s.end > s.start for s in timeline.spans)


def test_replay_needs_one_replica():
    with pytest.raises(ConfigError, match="dp must be 1"):
        sched = with_dp_allreduce(build_schedule("gpipe", 2, 2))
        run_schedule(sched, plan_of(sched, GPT, parallel(pp=2, dp=2, num_microbatches=2)),
                     replay=True)
