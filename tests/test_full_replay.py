"""The full replay (`--replay all`, sim.world): every rank of every replica replayed, each
collective run once its group's members have all posted it. Checked against the
symmetric replay where nothing is asymmetric (the same answer), against closed forms for
a straggler and a degraded NIC, and for the refusals."""
import pytest

import clustersim
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ops import OpKind
from clustersim.sim.cli import main
from clustersim.sim.simulate import simulate
from clustersim.sim.waits import waited_for
from clustersim.sim.world import Replaying
from clustersim.topologies.faults import degrade

NDR = 48e9  # a 400 Gb/s NIC's achievable bytes/s per direction (sim.link_capacity)


def job(topology="dgx-h100", model="llama3-8b", micro_batch_size=1, model_kw=None, **kw):
    spec = clustersim.get_model(model, micro_batch_size=micro_batch_size, **(model_kw or {}))
    parallel = clustersim.ParallelConfig.from_kwargs(micro_batch_size=micro_batch_size, **kw)
    return spec, parallel, clustersim.load_topology(topology)


@pytest.mark.parametrize("topology,kw", [
    ("dgx-h100", dict(tp=2, pp=2, dp=2, num_microbatches=4)),
    ("dgx-h100", dict(pp=4, dp=2, num_microbatches=8, schedule="interleaved-1f1b", vpp=2)),
    ("dgx-h100-x16-ndr", dict(tp=2, pp=2, dp=4, num_microbatches=4, zero_stage=3)),
    ("dgx-h100-x16-ndr", dict(tp=8, pp=4, dp=4, num_microbatches=8, sequence_parallel=True))],
    ids=["tp-pp-dp", "interleaved", "zero3-across-nodes", "tp8-sp-pp4-dp4"])
def test_every_rank_gives_the_symmetric_answer_on_a_symmetric_job(topology, kw):
    """The symmetric replay's assumption holds here, so replaying every rank (and every
    TP and DP group's own collectives) changes nothing."""
    spec, parallel, topo = job(topology, **kw)
    one = simulate(spec, parallel, topo)
    every = simulate(spec, parallel, topo, replaying=Replaying("all"))
    assert every.iteration_time == pytest.approx(one.iteration_time, rel=1e-12)
    assert {s.rank for s in every.spans} == set(range(parallel.world_size))
    assert len({s.rank for s in one.spans}) == parallel.pp


@pytest.mark.parametrize("k", [1.5, 2.0])
def test_one_slow_gpu_stretches_a_compute_bound_data_parallel_job_k_times(k):
    """Bulk-synchronous data parallelism: every rank waits at the gradient all-reduce for
    the GPU whose compute takes k times as long, so an iteration that is a fraction c
    compute becomes k c + (1 - c): k times, within the non-compute share."""
    spec, parallel, topo = job(dp=8, pp=1, num_microbatches=8, micro_batch_size=4,
                               model_kw=dict(num_layers=4, seq_length=8192))
    base = simulate(spec, parallel, topo)
    compute = sum(s.end - s.start for s in base.spans
                  if s.rank == 0 and s.op.kind in (OpKind.F, OpKind.B))
    share = compute / base.iteration_time
    assert share > 0.99  # compute-bound, as the closed form needs
    slow = simulate(spec, parallel, topo, replaying=Replaying(slow_gpus=((3, k),)))
    ratio = slow.iteration_time / base.iteration_time
    assert abs(ratio - k) <= k * (1 - share)
    rows = waited_for(slow.spans)
    assert rows[0]["rank"] == 3 and rows[0]["waiting_ranks"] == 7
    assert any("every rank replayed because GPU 3 runs" in w for w in slow.meta["warnings"])


def test_drawn_gpu_speeds_stretch_a_compute_bound_job_to_its_slowest_draw():
    """Every GPU's factor drawn (GpuSpread): the bulk-synchronous job above waits for its
    slowest GPU, so its iteration is max(factor) times (within the non-compute share);
    the draws are numpy's default_rng(seed), one per rank in rank order; --slow-gpu
    overrides its rank's draw."""
    import numpy as np

    from clustersim.sim.world import GpuSpread
    spec, parallel, topo = job(dp=8, pp=1, num_microbatches=8, micro_batch_size=4,
                               model_kw=dict(num_layers=4, seq_length=8192))
    base = simulate(spec, parallel, topo)
    spread = GpuSpread("uniform", (1.0, 1.5), seed=7)
    draws = np.random.default_rng(7).uniform(1.0, 1.5, 8)
    drawn = simulate(spec, parallel, topo, replaying=Replaying(spread=spread))
    assert drawn.iteration_time / base.iteration_time == pytest.approx(draws.max(), rel=0.01)
    assert waited_for(drawn.spans)[0]["rank"] == int(draws.argmax())
    override = Replaying(slow_gpus=((int(draws.argmax()), 1.01),), spread=spread)
    second = np.sort(draws)[-2]
    assert simulate(spec, parallel, topo, replaying=override).iteration_time \
        / base.iteration_time == pytest.approx(second, rel=0.01)
    lognormal = GpuSpread("lognormal", (0.05,), seed=1).factors(10_000)
    assert np.median(lognormal) == pytest.approx(1.0, abs=0.005)
    assert np.std(np.log(lognormal)) == pytest.approx(0.05, rel=0.05)


@pytest.mark.parametrize("flags, says", [
    (["--gpu-spread", "lognormal:0"], "--gpu-spread 'lognormal:0': GPU spread lognormal: "
                                      "sigma 0.0 must be in (0, 1]"),
    (["--gpu-spread", "gamma:1"], "must be one of lognormal, uniform"),
    (["--gpu-spread", "uniform:2,1"], "needs 0 < low < high"),
    (["--gpu-spread", "uniform:x"], "expected DIST:PARAMS"),
    (["--gpu-spread-seed", "3"], "--gpu-spread-seed: only with --gpu-spread"),
])
def test_bad_gpu_spreads_are_one_line_errors(flags, says, capsys):
    from clustersim.sim.cli import main
    assert main(["simulate", "--pp", "2", "--dp", "2", "--no-html", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_half_speed_nic_halves_the_pipeline_transfers_through_it():
    """pp 2 over two DGX nodes: rank 0 (gpu0) sends to rank 8 (gpu8) through nic0, at the
    NIC's achievable rate; with nic0 at half its bandwidth, at half of it (the bottleneck)."""
    spec, parallel, topo = job("dgx-h100-x16-ndr", pp=2, dp=8, num_microbatches=4)
    assert parallel.rank(pp=1) == 8

    def send_rates(timeline):  # bytes over the span: the line rate less the hops' latency
        return [s.info["bandwidth_Bps"] for s in timeline.spans
                if s.rank == 0 and s.op.kind is OpKind.SEND_F]
    assert send_rates(simulate(spec, parallel, topo)) == [pytest.approx(NDR, rel=1e-2)] * 4
    slowed = simulate(spec, parallel, degrade(topo, "nic0", 0.5))
    assert send_rates(slowed) == [pytest.approx(NDR / 2, rel=1e-2)] * 4
    assert any("every rank replayed because the topology has faults (link nic0 at 0.5"
               in w for w in slowed.meta["warnings"])


def test_the_symmetric_replay_refuses_what_it_cannot_see():
    spec, parallel, topo = job(dp=8, pp=1, num_microbatches=2)
    with pytest.raises(ConfigError, match="replay='symmetric' replays one pipeline replica, "
                                          "but GPU 2 runs 1.5x slower"):
        simulate(spec, parallel, topo, replaying=Replaying("symmetric", ((2, 1.5),)))
    with pytest.raises(ConfigError, match="slow GPU 9: not a rank of the job"):
        simulate(spec, parallel, topo, replaying=Replaying(slow_gpus=((9, 1.5),)))
    with pytest.raises(ConfigError, match="replay='sometimes' must be one of"):
        Replaying("sometimes")
    with pytest.raises(ConfigError, match="slow GPU 2: factor 1 must be a number > 0 other "
                                          "than 1 .*1 would change nothing"):
        Replaying(slow_gpus=((2, 1),))


def test_the_command_line_names_who_waited(capsys):
    assert main(["simulate", "--pp", "1", "--dp", "8", "--microbatches", "2", "--no-html",
                 "--slow-gpu", "6=2"]) == 0
    out = capsys.readouterr().out
    assert "every rank replayed because GPU 6 runs 2x slower" in out
    assert "who waited for whom" in out and "rank 6 held up 7 ranks" in out
    assert main(["simulate", "--slow-gpu", "6", "--no-html"]) == 2
    assert "--slow-gpu '6': expected RANK=FACTOR" in capsys.readouterr().err
