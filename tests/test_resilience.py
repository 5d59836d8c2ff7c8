"""sim.resilience: checkpoint cost, the optimum checkpoint interval and the goodput of a
long run under failures, against closed forms (Young 1974, Daly 2006) and an event-by-
event replay of runs with exponential failures (SimPy), which shares no code with them."""
import math
import statistics

import numpy as np
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.sim.resilience import (GPU_MTBF_HOURS, Resilience, daly_interval,
                                       expected_goodput, plan_checkpoints, simulate_long_run,
                                       young_interval)


def best_interval(save_s, restart_s, mtbf_s):
    """The interval maximising Daly's exact expected goodput, by a fine grid search."""
    grid = np.geomspace(save_s / 10, 10 * mtbf_s, 200_001)
    goodput = [expected_goodput(t, save_s, restart_s, mtbf_s) for t in grid[::50]]
    coarse = grid[::50][int(np.argmax(goodput))]
    fine = np.linspace(coarse * 0.99, coarse * 1.01, 20_001)
    return fine[int(np.argmax([expected_goodput(t, save_s, restart_s, mtbf_s)
                               for t in fine]))]


@pytest.mark.parametrize("save_s,mtbf_s", [(2.84, 11_135.0), (20.0, 178_000.0)])
def test_goodput_optimum_is_youngs_sqrt_2_delta_m(save_s, mtbf_s):
    """With delta << M the optimum is sqrt(2 delta M) to first order in sqrt(delta/M)
    (Young), and Daly's higher-order estimate is closer still. The pairs: Llama 3's 405B
    checkpoint on 16k GPUs (5.7 TB at 2 TB/s, MTBF 3.1 h) and GPT-3 175B on 1k GPUs."""
    best = best_interval(save_s, 0.0, mtbf_s)
    young, daly = young_interval(save_s, mtbf_s), daly_interval(save_s, mtbf_s)
    assert young == pytest.approx(math.sqrt(2 * save_s * mtbf_s))
    assert abs(young - best) / best < math.sqrt(save_s / mtbf_s)
    assert abs(daly - best) < abs(young - best)
    assert abs(daly - best) / best < 1e-3


def test_replayed_runs_match_dalys_expected_wall_time():
    """The mean goodput of replayed runs (failures at exponential intervals interrupting
    work, saves and restarts) equals Daly's closed form within 4 standard errors, at an
    interval with many failures per run (delta/M = 0.02, R/M = 0.05)."""
    mtbf, save, restart, interval = 1000.0, 20.0, 50.0, 200.0
    runs = [simulate_long_run(4000, interval, save, restart, mtbf, seed=s) for s in range(8)]
    assert all(r.failures > 500 for r in runs)
    walls = [r.wall_s / 4000 for r in runs]  # per segment
    expected = interval / expected_goodput(interval, save, restart, mtbf)
    standard_error = statistics.stdev(walls) / math.sqrt(len(walls))
    assert abs(statistics.mean(walls) - expected) < 4 * standard_error
    assert all(r.lost_s < r.failures * (interval + save) for r in runs)


def test_a_run_without_failures_costs_work_plus_saves():
    run = simulate_long_run(10, 100.0, 5.0, 30.0, mtbf_s=1e15)
    assert run.failures == 0 and run.wall_s == pytest.approx(10 * 105.0)
    assert run.goodput == pytest.approx(100 / 105)


def test_checkpoint_plan_of_gpt3_on_1024_gpus():
    """GPT-3 175B: 14 bytes per parameter (16-bit weights + fp32 master weights and Adam
    moments: ZeRO's 2 + 12), about 2.45 TB for 175e9 parameters; at Llama 3's 2 TB/s
    over 16,384 GPUs, 1,024 GPUs write 125 GB/s; the job MTBF is the per-GPU one / 1,024."""
    plan = plan_checkpoints(Resilience(), get_model("gpt3-175b"), 1024, iteration_s=8.0)
    assert plan.checkpoint_bytes == pytest.approx(175e9 * 14, rel=0.01)
    assert plan.save_s == pytest.approx(plan.checkpoint_bytes / (1024 * 2e12 / 16384))
    assert plan.mtbf_s == pytest.approx(54 * 24 * 3600 * 16384 / 419 / 1024)
    assert GPU_MTBF_HOURS == pytest.approx(50_677, abs=1)
    assert plan.every == round(daly_interval(plan.save_s, plan.mtbf_s) / 8.0)
    assert 0.9 < plan.goodput < 1
    given = plan_checkpoints(Resilience(checkpoint_every=10), get_model("gpt3-175b"), 1024, 8.0)
    assert given.every == 10 and given.goodput < plan.goodput  # saving too often costs


@pytest.mark.parametrize("kw,match", [
    (dict(gpu_mtbf_hours=0), "gpu_mtbf_hours=0 must be > 0"),
    (dict(checkpoint_gbps=-1), "checkpoint_gbps=-1 must be > 0"),
    (dict(restart_overhead_s=-5), "restart_overhead_s=-5 must be >= 0"),
    (dict(checkpoint_every=0), "checkpoint_every=0 must be a whole number")])
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        Resilience(**kw)


def test_simulate_reports_the_goodput_only_when_asked(capsys):
    """`simulate --goodput` (or any resilience flag) adds the checkpoint plan to the
    summary and the metrics JSON, at the simulated iteration time; without one, nothing."""
    import json

    from clustersim.sim.cli import main
    base = ["simulate", "--pp", "2", "--microbatches", "4", "--no-html", "--metrics-json", "-"]
    assert main(base) == 0
    assert "resilience" not in json.loads(capsys.readouterr().out)["meta"]
    assert main(base + ["--checkpoint-every", "5", "--restart-overhead-s", "60"]) == 0
    out = capsys.readouterr()
    metrics = json.loads(out.out)
    got = metrics["meta"]["resilience"]
    assert got["checkpoint_every_iterations"] == 5
    assert got["checkpoint_interval_s"] == pytest.approx(5 * metrics["iteration_time"])
    assert got["restart_s"] == pytest.approx(got["save_s"] + 60)
    assert "expected goodput" in out.err and "relaunch 60 s" in out.err
