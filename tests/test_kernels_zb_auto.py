"""zb-auto's order, built for a run's simulated costs, runs for real: `simulate_schedule`
returns the order it replayed, `--schedule-out` writes it as torch's CSV, and the kernels
backend (gloo, CPU) runs that CSV with gradients and Adam-stepped parameters equal to the
single-process reference. Schedules with no torch CSV are refused before simulating."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import run_schedule  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.ops import OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.torch_csv import read_torch_csv  # noqa: E402
from clustersim.sim.simulate import simulate_schedule  # noqa: E402
from clustersim.topologies import load_topology  # noqa: E402
from test_cli import clustersim  # noqa: E402
from test_kernels_zero import assert_matches_reference  # noqa: E402

MODEL = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                  vocab_size=128, micro_batch_size=2, dtype="fp32",
                  untie_embeddings_and_output_weights=True)
FLAGS = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32", "--vocab-size", "128", "--micro-batch-size", "2",
         "--pp", "2", "--microbatches", "4"]


def test_the_order_zb_auto_built_runs_with_the_reference_gradients(tmp_path):
    parallel = ParallelConfig(schedule="zb-auto", pp=2, num_microbatches=4,
                              micro_batch_size=2)
    schedule, timeline = simulate_schedule(MODEL, parallel, load_topology("dgx-h100"))
    assert {op.kind for op in schedule.ops()} == {OpKind.F, OpKind.I, OpKind.W}
    path = tmp_path / "zb.csv"
    clustersim("simulate", "--schedule", "zb-auto", *FLAGS, "--dtype", "fp32",
               "--untie-embeddings-and-output-weights", "-o", str(tmp_path / "g.html"),
               "--schedule-out", str(path))
    written = read_torch_csv(path, 4)
    assert written.programs == schedule.programs  # the CLI wrote the order it replayed
    custom = ParallelConfig(schedule="custom", pp=2, num_microbatches=4, micro_batch_size=2)
    _, grads, params = run_schedule(written, resolve(MODEL, custom, schedule=written),
                                    timeout=90, warmup_iterations=0, return_grads=True,
                                    return_params=True)
    assert_matches_reference(grads, params, custom, MODEL)


def test_schedules_without_a_torch_csv_are_refused_before_simulating(tmp_path):
    result = clustersim("simulate", "--schedule", "pipedream", "--model", "llama3-8b",
                        "--pp", "2", "--microbatches", "2", "--schedule-out",
                        str(tmp_path / "x.csv"), "-o", str(tmp_path / "g.html"), check=False)
    assert result.returncode != 0 and "--schedule-out: schedule 'pipedream' has no torch CSV" \
        in result.stderr
    assert not (tmp_path / "g.html").exists()
