"""`--schedule zb-auto` end to end (sim.auto_schedule): the schedule is built from the
run's own simulated costs and replayed. Checked against the closed-form lower bound
3M + P - 1 with uniform unit F, I, W and free communication, against the activation
memory cap it is built under, and for its one-line refusals."""
import pytest

from clustersim.schedules.activation_partition import stage_activation_bytes
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.cli import main
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

MODEL = ModelSpec(num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=256,
                  vocab_size=1024)
TOPOLOGY = load_topology("dgx-h100")


def auto(pp: int, microbatches: int, **kw):
    return ParallelConfig.from_kwargs(schedule="zb-auto", pp=pp, num_microbatches=microbatches,
                                      **kw)


@pytest.mark.parametrize("pp, microbatches", [(2, 4), (4, 8), (4, 12)])
def test_unit_costs_give_the_lower_bound(pp, microbatches):
    """F = 1, B = 2 (I = W = 1), free communication: no rank can finish before 3M + P - 1
    (the last stage's first input arrives after P - 1 forwards), and the schedule built
    from these costs does it, with a note saying what it was built from."""
    timeline = simulate(MODEL, auto(pp, microbatches), TOPOLOGY,
                        costs=UniformCostModel(1.0, 2.0))
    assert timeline.iteration_time == pytest.approx(3 * microbatches + pp - 1)
    assert any(w.startswith("zb-auto built from the simulated F/I/W")
               for w in timeline.meta["warnings"])


def test_the_activation_memory_limit_caps_what_each_rank_holds():
    pp, microbatches = 4, 8
    plan = resolve(MODEL, ParallelConfig(pp=pp, num_microbatches=microbatches))
    per_microbatch = max(stage_activation_bytes(plan)[0])
    limit_gb = 2 * per_microbatch / 1e9  # two microbatches of the largest stage
    timeline = simulate(MODEL, auto(pp, microbatches, activation_memory_limit_gb=limit_gb),
                        TOPOLOGY, costs=UniformCostModel(1.0, 2.0))
    assert max(timeline.peak_in_flight().values()) <= 2
    unlimited = simulate(MODEL, auto(pp, microbatches), TOPOLOGY,
                         costs=UniformCostModel(1.0, 2.0))
    assert unlimited.iteration_time < timeline.iteration_time  # the cap costs time


def test_refusals_are_one_line_errors():
    with pytest.raises(ConfigError, match="holds no microbatch of stage 0"):
        simulate(MODEL, auto(2, 4, activation_memory_limit_gb=1e-6), TOPOLOGY,
                 costs=UniformCostModel(1.0, 2.0))
    with pytest.raises(ConfigError, match="needs vpp == 1"):
        ParallelConfig.from_kwargs(schedule="zb-auto", pp=2, vpp=2, num_microbatches=4)
    with pytest.raises(ConfigError, match="has a fixed order it would not change"):
        ParallelConfig.from_kwargs(schedule="1f1b", pp=2, num_microbatches=4,
                                   activation_memory_limit_gb=10)


def test_the_cli_builds_it_and_show_says_why_it_cannot(capsys, tmp_path):
    assert main(["simulate", "--schedule", "zb-auto", "--pp", "2", "--microbatches", "4",
                 "--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
                 "--seq-length", "256", "--vocab-size", "1024", "--uniform-costs", "1,2",
                 "-o", str(tmp_path / "zb.html")]) == 0
    assert "zb-auto built from the simulated F/I/W" in capsys.readouterr().out
    assert main(["show", "zb-auto", "--pp", "2", "--microbatches", "4"]) == 2
    assert "is built from a run's simulated costs" in capsys.readouterr().err


def test_compare_applies_the_limit_to_the_schedule_built_from_costs_only(capsys):
    dims = ["--pp", "2", "--microbatches", "4", "--num-layers", "4", "--hidden-size", "512",
            "--num-attention-heads", "8", "--seq-length", "256", "--vocab-size", "1024",
            "--uniform-costs", "1,2"]
    assert main(["compare", "--schedules", "1f1b,zb-auto", "--activation-memory-limit",
                 "10", *dims]) == 0
    assert "zb-auto" in capsys.readouterr().out
    assert main(["compare", "--schedules", "1f1b,zb-h1", "--activation-memory-limit", "10",
                 *dims]) == 2
    assert "none of --schedules is one" in capsys.readouterr().err


def test_each_stage_time_counts_every_layer_group():
    """ZeRO-3 splits each op into layer groups (one span each): with F = 1 s and I = W =
    1 s per stage and microbatch, the search still reads 1 s (1e+03 ms) for each."""
    timeline = simulate(MODEL, auto(2, 4, dp=2, zero_stage=3), TOPOLOGY,
                        costs=UniformCostModel(1.0, 2.0))
    assert any("F/I/W ms per stage (1e+03/1e+03/1e+03, 1e+03/1e+03/1e+03)" in w
               for w in timeline.meta["warnings"])


@pytest.mark.parametrize("layout", [dict(tp=4), dict(tp=2, sequence_parallel=True)])
def test_the_search_times_the_pipeline_as_the_replay_does_with_tp_collectives(layout):
    """The blocking TP collectives after each op hold the rank until the next op: the
    search counts them, so the makespan it predicts is the replay's last F/I/W end within
    1% (the optimizer step after them is not part of the search)."""
    import re
    from clustersim.schedules.model_presets import get_model
    from clustersim.schedules.ops import WORK_KINDS
    timeline = simulate(get_model("llama3-8b", num_layers=8),
                        auto(2, 8, **layout), TOPOLOGY)
    note = next(w for w in timeline.meta["warnings"] if w.startswith("zb-auto built"))
    predicted = float(re.search(r"pipeline alone takes ([0-9.e+-]+) s", note).group(1))
    replayed = max(s.end for s in timeline.spans if s.op.kind in WORK_KINDS)
    assert predicted == pytest.approx(replayed, rel=0.01)


def test_the_full_replay_reads_each_stage_from_the_ranks_that_run_it():
    """Under --replay all the Timeline's ranks are global ranks, not pipeline ranks: with
    dp 2 the stage times the schedule is built from are the symmetric replay's (the last
    stage, holding the head, differs from the others), and a GPU slowed by k = 1.5 makes
    its stage read k times as long: the slowest of the ranks that run the stage."""
    import re
    from clustersim.sim.world import Replaying

    def stage_ms(timeline) -> list[list[float]]:
        note = next(w for w in timeline.meta["warnings"] if w.startswith("zb-auto built"))
        listed = re.search(r"F/I/W ms per stage \(([^)]*)\)", note).group(1)
        return [[float(x) for x in stage.split("/")] for stage in listed.split(", ")]

    parallel = auto(4, 8, dp=2)
    symmetric = stage_ms(simulate(MODEL, parallel, TOPOLOGY))
    assert symmetric[3] != symmetric[0]
    assert stage_ms(simulate(MODEL, parallel, TOPOLOGY, replaying=Replaying("all"))) \
        == symmetric
    uniform = UniformCostModel(1.0, 2.0)
    plan = resolve(MODEL, parallel, cluster_facts(TOPOLOGY))
    slow = plan.group("dp", plan.replayed_ranks[2])[1]  # stage 2's rank in replica 1
    slowed = stage_ms(simulate(MODEL, parallel, TOPOLOGY, costs=uniform,
                               replaying=Replaying(slow_gpus=((slow, 1.5),))))
    assert slowed == [[1e3] * 3, [1e3] * 3, [1.5e3] * 3, [1e3] * 3]
