"""A long simulation reports its progress where someone watches (sim/progress.py): inside
`reporting()` (the CLI), a status line of ops done on a non-terminal stderr; a library
call prints nothing. The thresholds are set to zero here so a small run reports."""
import re

from clustersim.schedules.lowering import lower
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim import progress
from clustersim.sim.simulate import simulate
from clustersim.schedules.model_presets import get_model
from clustersim.topologies import load_topology


MODEL, PARALLEL = get_model("llama3-8b"), ParallelConfig.from_kwargs(pp=4, num_microbatches=8)


def run():
    return simulate(MODEL, PARALLEL, load_topology("dgx-h100"))


def test_status_lines_count_ops_done_inside_reporting(monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER", 0.0)
    monkeypatch.setattr(progress, "STATUS_EVERY", 0.0)
    monkeypatch.setattr(progress, "CHECK_EVERY", 64)
    monkeypatch.setattr("clustersim.sim.engine.CHECK_EVERY", 64)
    with progress.reporting():
        timeline = run()
    lines = capsys.readouterr().err.splitlines()
    counts = [tuple(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) of ([\d,]+) ops",
                                                                 line)[0]) for line in lines]
    assert counts, lines
    done = [d for d, _ in counts]
    assert done == sorted(done) and all(d <= total for d, total in counts)
    plan = resolve(MODEL, PARALLEL)  # every op of the lowered programs
    assert {total for _, total in counts} == {
        sum(map(len, lower(plan.build_schedule(), plan).programs))}
    assert timeline.iteration_time > 0


def test_a_library_call_reports_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER", 0.0)
    monkeypatch.setattr(progress, "STATUS_EVERY", 0.0)
    run()
    assert capsys.readouterr().err == ""
