"""kernels.calibrate and the hardware commands (calibrate, run, compare measured vs
simulated), for real on CPU with gloo and a tiny fp32 model."""
import json
import statistics
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels.calibrate import calibrate  # noqa: E402
from clustersim.kernels.microbench import OPTIMIZER_PARAMS  # noqa: E402
from clustersim.kernels.optimizer import FlatAdam  # noqa: E402
from clustersim.schedules.errors import ClustersimError, ConfigError  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.profile import Profile  # noqa: E402
from clustersim.schedules.timeline import Timeline  # noqa: E402
from test_cli import clustersim  # noqa: E402
from test_profile import TINY_FLAGS  # noqa: E402

MODEL = ModelSpec(num_layers=4, hidden_size=128, num_attention_heads=4, seq_length=64,
                  vocab_size=256, micro_batch_size=2, dtype="fp32")


def test_calibrate_on_cpu_gives_a_valid_profile():
    steps = []
    data = calibrate(MODEL, repeats=3, warmup=1, p2p_sizes=(1024, 65536),
                     collective_sizes=(1024, 65536), progress=lambda *a: steps.append(a))
    profile = Profile.from_dict(json.loads(json.dumps(data)))  # JSON-clean and valid
    assert profile.device == "cpu" and profile.threads == 1
    assert profile.model["hidden_size"] == 128 and profile.versions["torch"] == torch.__version__
    layer = profile.compute["layer"]
    assert all(layer[k] > 0 for k in "FBIW")
    assert layer["B"] > layer["F"]
    assert profile.compute["head"]["F"] > 0 and profile.compute["embedding"]["W"] > 0
    assert [b for b, _ in profile.p2p.points] == [1024, 65536]
    assert all(t > 0 for _, t in profile.p2p.points) and profile.p2p.time(65536) > 0
    assert sorted(profile.collectives["all_reduce"]) == [2]
    assert any("CPU timings calibrate only" in n for n in profile.notes)
    # FlatAdam.step per parameter: ~10 ns on a 2-core CPU; a sane range, then the same
    # step timed here (one thread, as the rank processes) within a factor of 3
    per_param = profile.optimizer_seconds_per_param
    assert 1e-11 < per_param < 1e-6
    assert 1 / 3 < per_param / _flat_adam_seconds_per_param() < 3
    done, total, _ = steps[-1]
    # compute 3 x 4, optimizer, GEMM table, attention 4 each, P2P 2, all-reduce 2
    assert done == total == len(steps) == 3 * 4 + 4 + 4 + 4 + 2 + 2


def _flat_adam_seconds_per_param(repeats: int = 3) -> float:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        adam = FlatAdam(torch.randn(OPTIMIZER_PARAMS))
        grad = torch.randn(OPTIMIZER_PARAMS) * 1e-3
        adam.step(grad)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            adam.step(grad)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) / OPTIMIZER_PARAMS
    finally:
        torch.set_num_threads(threads)


def test_calibrate_rejects_bad_arguments():
    with pytest.raises(ConfigError, match="device"):
        calibrate(MODEL, device="tpu")
    with pytest.raises(ConfigError, match="repeats"):
        calibrate(MODEL, repeats=0)
    with pytest.raises(ConfigError, match="all_sum"):
        calibrate(MODEL, collectives=("all_sum",))


def test_cli_run_simulate_with_calibrated_profile_and_compare(tmp_path):
    """calibrate -> run -> simulate --profile -> compare, as a user does it."""
    cal = clustersim("calibrate", *TINY_FLAGS, "--repeats", "3", "--warmup", "1",
                     "-o", str(tmp_path / "profile.json"), cwd=tmp_path)
    assert "wrote" in cal.stdout and "calibrate cpu: 1/" in cal.stderr
    assert "CPU timings calibrate only this CPU" in cal.stderr
    assert Profile.load(tmp_path / "profile.json").optimizer_seconds_per_param > 0

    schedule = ("--schedule", "1f1b", "--pp", "2", "--microbatches", "4")
    run = clustersim("run", *schedule, *TINY_FLAGS, "--iterations", "2", "--nproc", "2",
                     "--metrics-json", "metrics.json", cwd=tmp_path)
    assert "iteration time" in run.stdout and "iteration times:" in run.stdout
    measured = Timeline.load(tmp_path / "measured.json")
    assert measured.source == "kernels:cpu" and measured.ranks == [0, 1]
    assert (tmp_path / "gantt.html").exists()
    assert json.loads((tmp_path / "metrics.json").read_text())["source"] == "kernels:cpu"

    clustersim("simulate", *schedule, *TINY_FLAGS, "--profile", "profile.json",
               "--timeline-json", "sim.json", "-o", "sim.html", cwd=tmp_path)
    out = clustersim("compare", "sim.json", "measured.json", "-o", "cmp.html", cwd=tmp_path)
    assert "iteration time" in out.stdout and "error (A-B)/B" in out.stdout
    assert (tmp_path / "cmp.html").exists()


def test_cli_run_with_tensor_parallelism_records_the_tp_ops_it_simulates(tmp_path):
    flags = ("--schedule", "gpipe", "--pp", "1", "--tp", "2", "--microbatches", "2",
             *TINY_FLAGS)
    clustersim("run", *flags, "--iterations", "1", "--warmup-iterations", "0", cwd=tmp_path)
    clustersim("simulate", *flags, "--timeline-json", "sim.json", "-o", "sim.html",
               cwd=tmp_path)
    measured, simulated = (Timeline.load(tmp_path / f) for f in ("measured.json", "sim.json"))
    tp_ops = {str(s.op) for s in simulated.spans if s.lane == "tp"}
    assert tp_ops and {str(s.op) for s in measured.spans
                       if s.lane == "tp" and s.rank == 0} == tp_ops


def test_cli_run_nproc_must_equal_world_size(tmp_path):
    out = clustersim("run", "--pp", "2", "--microbatches", "2", *TINY_FLAGS, "--nproc", "3",
                     cwd=tmp_path, check=False)
    assert out.returncode == 2
    assert "--nproc=3 must equal the world size" in out.stderr


def test_missing_torch_is_one_clear_error(monkeypatch):
    from clustersim.sim.cli import hardware as hardware_cli
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(ClustersimError, match=r"pip install -e '\.\[kernels\]'"):
        hardware_cli._kernels("calibrate")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_calibrate_on_one_gpu_measures_compute_and_says_what_it_could_not():
    data = calibrate(MODEL, device="cuda", repeats=3, warmup=1)
    profile = Profile.from_dict(data)
    assert profile.device.startswith("cuda:") and profile.versions["cuda"]
    assert all(profile.compute["layer"][k] > 0 for k in "FBIW")
    if torch.cuda.device_count() == 1:
        assert any("one GPU cannot run NCCL" in n for n in profile.notes)
