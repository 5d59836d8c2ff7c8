"""`clustersim sweep` and the execution backends (sim.backends) against independent
truths: the list and range syntax against hand-written expansions; every row of a small
sweep against its own `clustersim.simulate` call through the Python API; a combination the
flags cannot make is a row with its reason while the others complete; the CSV and Parquet
tables read back with pandas; a real local Ray cluster (the CLI in a subprocess joining it
through RAY_ADDRESS) and a real dask.distributed LocalCluster (through
DASK_SCHEDULER_ADDRESS) give the local rows, and the planner's search returns the same
ranked winners on joblib, Ray and Dask."""
import os
import subprocess
import sys
from pathlib import Path

import pandas
import pytest

import clustersim
from clustersim.schedules.errors import ConfigError
from clustersim.sim.backends import open_backend
from clustersim.sim.cli import build_parser, config_files, main
from clustersim.sim.cli.sweep_runs import build_axes
from clustersim.sim.planner import SearchSpace, run_plan
from clustersim.sim.sweep_table import TableWriter
from clustersim.sim.sweep_values import expand, switch_values

BASE = ["--model", "gpt3-1.3b", "--num-layers", "4", "--topology", "dgx-a100", "--pp", "2"]
SWEPT = ["--tp", "1,2,3", "--microbatches", "4..8x2"]  # tp 3 does not divide 16 heads
PLAN_SPACE = SearchSpace(micro_batch_size=(1, 2), zero=(0, 3), recompute=("none", "full"),
                         schedules=("1f1b", "interleaved-1f1b"), sequence_parallel=(True,))


@pytest.mark.parametrize("text, values", [
    ("2,4,8", ["2", "4", "8"]),
    ("8..64x2", ["8", "16", "32", "64"]),
    ("8..63x2", ["8", "16", "32"]),
    ("1..4", ["1", "2", "3", "4"]),
    ("2..9+3", ["2", "5", "8"]),
    ("1..2+0.25", ["1", "1.25", "1.5", "1.75", "2"]),
    ("0.1..0.3+0.1", ["0.1", "0.2", "0.3"]),  # decimal steps: no float drift
    ("1,2..8x2,4", ["1", "2", "4", "8"]),  # lists of ranges, repeats dropped
    ("dgx-a100, dgx-h100", ["dgx-a100", "dgx-h100"]),
    ("../topology.json", ["../topology.json"]),  # a path, not a range
])
def test_list_and_range_syntax(text, values):
    assert expand(text, "--x") == values


def test_a_flag_whose_value_holds_commas_takes_semicolons():
    assert expand("1,2;1,3", "--uniform-costs", own_commas=True) == ["1,2", "1,3"]
    assert switch_values("on,off", "--swiglu") == [True, False]
    assert switch_values("TRUE", "--swiglu") == [True]


@pytest.mark.parametrize("text, rule", [
    ("8..4", "runs down"), ("0..8x2", "k > 1 and a > 0"), ("1..8x1", "k > 1"),
    ("1..4+0", "step"), ("8..64*2", "is not a range"), (",", "no value"),
    ("1..5000", "more than 1,000 values"),
])
def test_malformed_ranges_are_errors_naming_the_flag(text, rule):
    with pytest.raises(ConfigError, match=rule) as err:
        expand(text, "--tp", limit=1000)
    assert str(err.value).startswith("--tp")


def _axes(*argv: str):
    parser = build_parser()
    tokens, _ = config_files.expand(["sweep", *argv], parser)
    return build_axes(parser.parse_args(tokens).axes, 1000)


def test_each_value_becomes_plain_simulate_arguments():
    axes = _axes("--tp", "1,2", "--sequence-parallel=on,off", "--no-swiglu=on,off",
                 "--uniform-costs", "1,2;1,3", "--zero", "1", "--zero", "0..3")
    by_column = {axis.column: axis for axis in axes}
    assert by_column["tp"].tokens == (("--tp", "1"), ("--tp", "2"))
    assert by_column["sequence_parallel"].tokens == (("--sequence-parallel",), ())
    assert by_column["no_swiglu"].tokens == (("--no-swiglu",), ("--swiglu",))
    assert by_column["uniform_costs"].values == ("1,2", "1,3")
    assert by_column["zero"].values == (0, 1, 2, 3)  # a flag given twice: the last wins


def test_a_config_file_yields_to_the_command_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("tp: '1,2'\nmicrobatches: '4..8x2'\n")
    axes = _axes("--config", str(config), "--tp", "4")
    assert [(a.column, a.values) for a in axes] == [("microbatches", (4, 8)), ("tp", (4,))]


@pytest.mark.parametrize("argv, message", [
    (["--tp", "2,x"], "--tp: argument --tp/--tensor-model-parallel-size: invalid int"),
    (["--tp", "1..64", "--microbatches", "1..64", "--max-runs", "100"],
     "4,096 runs (--tp 64 x --microbatches 64), above --max-runs 100"),
    (["--tp", "2", "-o", "x.html"], "-o: a sweep writes one table"),
    (["--tp", "2", "--out", "table.txt"], "written as .csv or .parquet"),
    (["--tp", "2", "--backend", "ray", "--jobs", "0"], "--jobs must be -1"),
])
def test_bad_sweeps_are_one_line_errors_before_any_run(argv, message, capsys, tmp_path,
                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["sweep", *BASE, *argv])
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_the_table_never_overwrites_an_input(tmp_path, capsys):
    topology = tmp_path / "topology.csv"
    topology.write_text("{}")
    assert main(["sweep", "--topology", f"dgx-a100,{topology}", "--out", str(topology)]) == 2
    assert "is the run's input --topology" in capsys.readouterr().err
    assert topology.read_text() == "{}"


def _sweep(out: Path, *extra: str) -> pandas.DataFrame:
    assert main(["sweep", *BASE, *SWEPT, "--out", str(out), *extra]) == 0
    frame = (pandas.read_csv(out) if out.suffix == ".csv"
             else pandas.read_parquet(out))
    return frame.sort_values("run").reset_index(drop=True)


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("local") / "sweep.csv", "--jobs", "2")


def test_rows_equal_single_simulate_calls_and_a_broken_run_is_a_row(local_rows):
    frame = local_rows
    assert list(frame.columns) == ["run", "tp", "microbatches", "iteration_time_s",
                                   "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
                                   "bubble_fraction", "peak_memory_gb", "status", "error"]
    assert list(zip(frame["tp"], frame["microbatches"])) == [
        (1, 4), (1, 8), (2, 4), (2, 8), (3, 4), (3, 8)]
    broken = frame[frame["tp"] == 3]
    assert (broken["status"] == "error").all()
    assert (broken["error"] == "num_attention_heads=16 is not divisible by tp=3").all()
    assert broken["iteration_time_s"].isna().all()
    model = clustersim.get_model("gpt3-1.3b", num_layers=4)
    topology = clustersim.load_topology("dgx-a100")
    for row in frame[frame["tp"] < 3].itertuples():
        assert row.status == "ok" and pandas.isna(row.error)
        timeline = clustersim.simulate(model, clustersim.ParallelConfig(
            pp=2, tp=row.tp, num_microbatches=row.microbatches), topology)
        assert row.iteration_time_s == pytest.approx(timeline.iteration_time, rel=1e-12)
        assert row.bubble_fraction == pytest.approx(timeline.bubble_fraction, rel=1e-12)
        assert row.tokens_per_s == pytest.approx(
            timeline.meta["throughput"]["tokens_per_s"], rel=1e-12)
        assert row.tokens_per_s_per_gpu == pytest.approx(row.tokens_per_s / (2 * row.tp),
                                                         rel=1e-12)  # pp 2 x tp GPUs
        assert row.peak_memory_gb == pytest.approx(
            max(timeline.peak_memory().values()) / 1e9, rel=1e-12)


def test_parquet_holds_the_csv_rows_and_the_ranking_is_printed(local_rows, tmp_path,
                                                                  capsys):
    frame = _sweep(tmp_path / "sweep.parquet", "--jobs", "1")
    printed = capsys.readouterr().out
    _same_rows(frame, local_rows)
    assert str(frame["tp"].dtype) == "int64" and str(frame["mfu"].dtype) == "float64"
    assert "6 runs in" in printed and "4 ok, 2 error" in printed
    assert "2 x num_attention_heads=16 is not divisible by tp=3" in printed
    ranking = printed[printed.index("rank "):].splitlines()[1:5]
    fastest = local_rows.sort_values("tokens_per_s_per_gpu", ascending=False).iloc[0]
    assert ranking[0].split()[:3] == ["1", str(fastest.tp), str(fastest.microbatches)]


def test_csv_rows_are_readable_before_the_sweep_ends(tmp_path):
    path = tmp_path / "t.csv"
    writer = TableWriter(str(path), [("tp", "int")])
    writer.write({"run": 0, "tp": 2, "iteration_time_s": 0.5, "status": "ok"})
    early = pandas.read_csv(path)  # the writer is still open
    writer.write({"run": 1, "tp": 4, "status": "error", "error": "a reason"})
    writer.close()
    assert early.to_dict("records")[0]["tp"] == 2 and len(early) == 1
    assert list(pandas.read_csv(path)["error"].fillna("")) == ["", "a reason"]


def test_every_run_failing_is_an_error_after_the_table(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert main(["sweep", *BASE, "--tp", "3,5", "--out", str(out)]) == 2
    assert "every run failed; the first: num_attention_heads=16" in capsys.readouterr().err
    assert len(pandas.read_csv(out)) == 2


def _same_rows(frame: pandas.DataFrame, expected: pandas.DataFrame) -> None:
    assert list(frame.columns) == list(expected.columns)
    for column in frame.columns:
        if column in ("status", "error"):
            assert list(frame[column].fillna("")) == list(expected[column].fillna(""))
        else:
            assert frame[column].tolist() == pytest.approx(expected[column].tolist(),
                                                           rel=1e-12, nan_ok=True)


def _plan(backend: str, n_jobs: int = 2):
    result, _ = run_plan(clustersim.get_model("gpt3-1.3b", num_layers=8), 8, "dgx-a100", 32,
                         top=3, space=PLAN_SPACE, n_jobs=n_jobs, backend=backend)
    return [(c.layout, c.result["iteration_time"]) for c in result.candidates[:3]]


@pytest.fixture(scope="module")
def serial_plan():
    return _plan("local", n_jobs=1)


def test_a_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # what `import` finds uninstalled
    with pytest.raises(ConfigError, match=r"--backend dask needs the distributed package: "
                                          r"pip install 'clustersim\[sweep\]'"):
        with open_backend("dask", 1):
            pass


@pytest.fixture(scope="module")
def dask_scheduler():
    """A real dask.distributed LocalCluster of two worker processes, its address in
    DASK_SCHEDULER_ADDRESS."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
            yield cluster.scheduler_address


def test_dask_sweep_and_plan_equal_local(dask_scheduler, local_rows, serial_plan, tmp_path,
                                         capsys):
    frame = _sweep(tmp_path / "dask.csv", "--backend", "dask")
    err = capsys.readouterr().err
    assert f"dask: the scheduler at DASK_SCHEDULER_ADDRESS={dask_scheduler}" in err
    _same_rows(frame, local_rows)
    assert _plan("dask") == serial_plan == _plan("local")


@pytest.fixture(scope="module")
def ray_session():
    """A real local Ray cluster of two CPUs started by this process; its GCS address."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_ray_cli_joins_ray_address_and_plan_equals_local(ray_session, local_rows,
                                                         serial_plan, tmp_path):
    out = tmp_path / "ray.csv"
    env = {**os.environ, "RAY_ADDRESS": ray_session}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    run = subprocess.run([sys.executable, "-m", "clustersim", "sweep", *BASE, *SWEPT,
                          "--backend", "ray", "--out", str(out)], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"ray: the cluster at RAY_ADDRESS={ray_session}, 2 CPUs" in run.stderr
    frame = pandas.read_csv(out).sort_values("run")
    _same_rows(frame.reset_index(drop=True), local_rows)
    assert _plan("ray") == serial_plan  # this process's session (ray.is_initialized)


def test_the_plan_command_takes_the_backend_flags():
    args = build_parser().parse_args(["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--topology",
                              "dgx-a100", "--global-batch-size", "32", "--backend", "dask",
                              "--jobs", "3"])
    assert (args.backend, args.jobs) == ("dask", 3)
