"""kernels: refused before any rank process starts or any measurement runs (issue 15):
more rank processes than kernels.preflight allows, and output paths that cannot be
written. The CLI paths run in-process through sim.cli.main (the code a user's command
runs), so each refusal is timed without paying torch's import again."""
import multiprocessing
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import run_schedule  # noqa: E402
from clustersim.kernels.calibrate import calibrate  # noqa: E402
from clustersim.kernels.preflight import LIMIT_ENV, MAX_LOCAL_RANKS  # noqa: E402
from clustersim.schedules.errors import ConfigError  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.sim.cli import main  # noqa: E402

GPT = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, micro_batch_size=2, dtype="fp32")
TINY = ("--model", "gpt3-1.3b", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
        "--micro-batch-size", "2", "--dtype", "fp32")
QUICK_S = 5  # a refusal takes milliseconds; the calibration it replaces took 14 s


@pytest.fixture
def no_new_processes():
    """The test starts no child process."""
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    assert {p.pid for p in multiprocessing.active_children()} <= before


def cli(capsys, *args):
    """(exit code, stderr lines, seconds) of `clustersim ARGS`, run in this process."""
    start = time.monotonic()
    code = main(list(args))
    elapsed = time.monotonic() - start
    return code, capsys.readouterr().err.strip().splitlines(), elapsed


# --- rank-process limit ---------------------------------------------------------------------
def test_calibrate_refuses_more_ranks_than_the_limit_before_spawning(no_new_processes):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"group_sizes \(largest 100000\) would start 100000 "
                                          rf"rank processes on this host; the limit is "
                                          rf"{MAX_LOCAL_RANKS} .*MAX_LOCAL_RANKS.*{LIMIT_ENV}"):
        calibrate(GPT, group_sizes=(100000,))
    assert time.monotonic() - start < QUICK_S


def test_run_schedule_refuses_a_world_above_the_limit_before_lowering(no_new_processes):
    par = ParallelConfig(micro_batch_size=2, dp=100000, num_microbatches=1)
    schedule = build_schedule("1f1b", 1, 1)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"world size tp\*cp\*dp\*pp = 1\*1\*100000\*1 = "
                                          r"100000 would start 100000 rank processes"):
        run_schedule(schedule, resolve(GPT, par, schedule=schedule))
    assert time.monotonic() - start < QUICK_S


def test_the_limit_follows_the_environment(monkeypatch, no_new_processes):
    schedule = build_schedule("1f1b", 2, 2)
    plan = resolve(GPT, ParallelConfig(micro_batch_size=2, pp=2, num_microbatches=2),
                   schedule=schedule)
    monkeypatch.setenv(LIMIT_ENV, "1")
    with pytest.raises(ConfigError, match=rf"the limit is 1 \(\${LIMIT_ENV};"):
        run_schedule(schedule, plan)
    monkeypatch.setenv(LIMIT_ENV, "many")
    with pytest.raises(ConfigError, match=rf"{LIMIT_ENV}='many' must be a positive integer"):
        run_schedule(schedule, plan)


def test_cli_calibrate_ranks_above_the_limit_is_one_line(capsys, no_new_processes):
    code, err, elapsed = cli(capsys, "calibrate", *TINY, "--ranks", "100000")
    assert code == 2 and len(err) == 1 and elapsed < QUICK_S
    assert err[0].startswith("clustersim: error: --ranks=100000 would start 100000 rank "
                             f"processes on this host; the limit is {MAX_LOCAL_RANKS}")


def test_cli_run_world_above_the_limit_is_one_line(capsys, tmp_path, monkeypatch,
                                                   no_new_processes):
    monkeypatch.chdir(tmp_path)
    code, err, elapsed = cli(capsys, "run", "--pp", "1", "--dp", "100000",
                             "--microbatches", "1", *TINY)
    assert code == 2 and len(err) == 1 and elapsed < QUICK_S
    assert "--tp*--cp*--dp*--pp = 1*1*100000*1 = 100000 would start 100000 rank" in err[0]
    assert os.listdir(tmp_path) == []


# --- output paths ---------------------------------------------------------------------------
def test_cli_calibrate_unwritable_output_fails_before_measuring(capsys, no_new_processes):
    code, err, elapsed = cli(capsys, "calibrate", *TINY, "-o", "/proc/nope/p.json")
    assert code == 2 and elapsed < QUICK_S
    assert err == ["clustersim: error: --output /proc/nope/p.json: directory /proc/nope "
                   "cannot be created (No such file or directory)"]


def test_cli_run_checks_every_output_before_running(capsys, tmp_path, monkeypatch,
                                                    no_new_processes):
    monkeypatch.chdir(tmp_path)
    flags = ("run", "--pp", "2", "--microbatches", "2", *TINY)
    code, err, elapsed = cli(capsys, *flags, "--metrics-json", "/proc/nope/m.json")
    assert code == 2 and elapsed < QUICK_S
    assert err == ["clustersim: error: --metrics-json /proc/nope/m.json: directory "
                   "/proc/nope cannot be created (No such file or directory)"]
    code, err, _ = cli(capsys, *flags, "--timeline-json", str(tmp_path))
    assert code == 2 and err[-1].endswith(f"--timeline-json {tmp_path}: is a directory, "
                                          f"give a file path")
    assert os.listdir(tmp_path) == []  # the probes left nothing behind
