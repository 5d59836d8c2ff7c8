"""PipeDream and PipeDream-2BW (schedules/weight_stashing.py, schedules/pipelines/pipedream.py)
against their papers' closed forms: with equal stages (uniform F and B, free communication)
the steady state has no bubble, one batch of M microbatches taking M (F + B) against 1F1B's
(M + P - 1)(F + B) (Narayanan et al. SOSP 2019, section 3; ICML 2021, section 3); the
weight version each forward uses, the versions a rank holds and the staleness are derived
here from the lowered program itself (the optimizer steps before each forward, the
microbatches in flight) and compared with the rules; the memory model adds (v - 1) copies
of the 16-bit weights."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import build_schedule, schedule_entry
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.torch_csv import to_torch_csv
from clustersim.schedules.weight_stashing import simulated_batches
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology
from test_cli import clustersim

MODEL = ModelSpec(num_layers=840, hidden_size=256, num_attention_heads=4, seq_length=128,
                  vocab_size=512)
TOPOLOGY = load_topology("dgx-h100")
ASYNC = ("pipedream", "pipedream-2bw")


def config(name, pp, m, **kw):
    return ParallelConfig.from_kwargs(schedule=name, pp=pp, num_microbatches=m, **kw)


def run(name, pp, m, forward=1.0, backward=2.0, **kw):
    return simulate(MODEL, config(name, pp, m, **kw), TOPOLOGY,
                    costs=UniformCostModel(forward, backward))


@pytest.mark.parametrize("name", ASYNC)
@pytest.mark.parametrize("pp, m", [(1, 3), (2, 2), (3, 5), (4, 4), (4, 9), (6, 6), (8, 8)])
def test_the_steady_state_has_no_bubble_and_one_batch_takes_m_times_f_plus_b(name, pp, m):
    for forward, backward in ((1.0, 2.0), (1.0, 3.0)):
        timeline = run(name, pp, m, forward, backward)
        assert timeline.iteration_time == pytest.approx(m * (forward + backward))
        assert timeline.bubble_fraction == pytest.approx(0.0, abs=1e-12)
        flushed = run("1f1b", pp, m, forward, backward)
        assert flushed.iteration_time == pytest.approx((m + pp - 1) * (forward + backward))
        steady = timeline.meta["steady_state"]
        assert steady["simulated_batches"] == simulated_batches(pp, m)
        assert timeline.meta["throughput"]["tokens_per_s"] == pytest.approx(
            config(name, pp, m).global_batch_size * MODEL.seq_length / (m * (forward + backward)))


def lowered(name, pp, m, **kw):
    par = config(name, pp, m, **kw)
    plan = resolve(MODEL, par)
    return plan, lower(plan.build_schedule(), plan)


def program_facts(program, version_of):
    """From one rank's lowered program: for each forward, the optimizer steps of its stage
    before it (the newest version then), and the most distinct versions held at once
    (those of the microbatches between their F and B, `version_of(microbatch)`, and the
    live one)."""
    steps, newest, held, most = 0, {}, set(), 0
    for op in program:
        if op.kind is OpKind.OPT_STEP:
            steps += 1
        elif op.kind is OpKind.F:
            newest[op.microbatch] = steps
            held.add(op.microbatch)
        elif op.kind is OpKind.B and op.chunk in (None, 0):
            held.discard(op.microbatch)
        most = max(most, len({version_of(mb) for mb in held} | {steps}))
    return newest, most


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ASYNC), st.integers(1, 7), st.integers(1, 12))
def test_versions_and_staleness_follow_from_the_program(name, pp, m):
    entry = schedule_entry(name)
    if entry.microbatch_rule and entry.microbatch_rule(pp, m):
        return
    _, schedule = lowered(name, pp, m)
    stashing, total = entry.stashing, schedule.num_microbatches
    for rank, program in enumerate(schedule.programs):
        newest, most = program_facts(program,
                                     lambda i: stashing.version_used(pp, rank, i, m))
        for i, steps in newest.items():
            used = stashing.version_used(pp, rank, i, m)
            if name == "pipedream":  # the newest version at the forward, w_r updates stale
                assert used == steps and steps == max(0, i - (pp - 1 - rank))
            else:  # 2BW: batch b on version b - 1, the newest or the one before it
                assert used in (steps, steps - 1) and used == max(0, i // m - 1)
        # the steady state's count, reached once w_r microbatches of distinct versions
        # can be in flight (PipeDream: a run of at least 2 w_r microbatches)
        long_enough = name == "pipedream-2bw" or total >= 2 * (pp - 1 - rank)
        assert most == stashing.versions_held(pp, rank) if long_enough else \
            most < stashing.versions_held(pp, rank)
        assert stashing.staleness(pp, rank) == (pp - 1 - rank if name == "pipedream" else 1)
    steps = [sum(op.kind is OpKind.OPT_STEP for op in p) for p in schedule.programs]
    assert steps == [total if name == "pipedream" else total // m] * pp


@pytest.mark.parametrize("name, pp, versions", [
    ("pipedream", 4, [4, 3, 2, 1]), ("pipedream", 2, [2, 1]),
    ("pipedream-2bw", 4, [2, 2, 2, 2]), ("1f1b", 4, [1, 1, 1, 1])])
def test_the_memory_model_adds_the_stashed_16_bit_weights(name, pp, versions):
    plan = resolve(MODEL, config(name, pp, max(pp, 4)))
    for rank, memory in zip(range(pp), rank_memory(plan)):
        assert memory.stashed_weights == (versions[rank] - 1) * 2 * memory.params
        assert memory.model_states_bytes == pytest.approx(
            memory.parameters + memory.gradients + memory.optimizer_states
            + memory.stashed_weights)


def test_with_data_parallelism_each_update_reduces_then_steps():
    _, schedule = lowered("pipedream-2bw", 2, 4, dp=2)
    for program in schedule.programs:
        kinds = [op.kind for op in program]
        reduces = [i for i, k in enumerate(kinds) if k is OpKind.ALL_REDUCE]
        steps = [i for i, k in enumerate(kinds) if k is OpKind.OPT_STEP]
        assert len(steps) == simulated_batches(2, 4) and reduces
        for step in steps:  # each step follows its update's reductions, before the next F
            assert any(r < step for r in reduces)
    timeline = simulate(MODEL, config("pipedream-2bw", 2, 4, dp=2), TOPOLOGY)
    assert timeline.bubble_fraction < simulate(MODEL, config("1f1b", 2, 4, dp=2),
                                               TOPOLOGY).bubble_fraction


@pytest.mark.parametrize("kw, field", [
    (dict(zero_stage=1, dp=2), "zero_stage"), (dict(fsdp="full", dp=2), "zero_stage"),
    (dict(vpp=2), "vpp")])
def test_layouts_the_model_does_not_cover_are_refused(kw, field):
    with pytest.raises(ConfigError, match=field):
        config("pipedream", 2, 4, **kw)


def test_2bw_needs_a_batch_of_at_least_pp_microbatches():
    with pytest.raises(ConfigError, match="M must be >= pp=4, got 3"):
        build_schedule("pipedream-2bw", 4, 3)


def test_no_torch_csv_for_a_schedule_torch_would_run_with_a_flush():
    with pytest.raises(ConfigError, match="no torch CSV"):
        to_torch_csv(build_schedule("pipedream", 2, 2))


def test_a_timeline_file_with_a_bad_window_is_refused():
    timeline = run("pipedream", 2, 2)
    data = timeline.to_dict()
    assert Timeline.from_dict(data).iteration_time == timeline.iteration_time
    data["meta"]["steady_state"]["end"] = data["meta"]["steady_state"]["start"]
    with pytest.raises(ConfigError, match="meta.steady_state: end .* is not after start"):
        Timeline.from_dict(data)


def test_the_cli_states_the_steady_state_and_the_staleness(tmp_path):
    metrics = tmp_path / "m.json"
    out = clustersim("simulate", "--schedule", "PipeDream", "--pp", "4", "--microbatches",
                     "4", "--uniform-costs", "1,2", "-o", str(tmp_path / "g.html"),
                     "--metrics-json", str(metrics)).stdout
    assert ("weight versions held per rank [4, 3, 2, 1], staleness per rank [3, 2, 1, 0]"
            in out)
    data = json.loads(metrics.read_text())
    assert data["iteration_time"] == 12 and data["bubble_fraction"] == 0
    assert data["meta"]["steady_state"]["updates_per_iteration"] == 4


def test_comparing_a_steady_state_with_a_flushed_iteration_says_so(tmp_path):
    paths = []
    for name in ("pipedream", "1f1b"):
        paths.append(tmp_path / f"{name}.json")
        clustersim("simulate", "--schedule", name, "--pp", "2", "--microbatches", "2",
                   "--uniform-costs", "1,2", "-o", str(tmp_path / f"{name}.html"),
                   "--timeline-json", str(paths[-1]))
    out = clustersim("compare", str(paths[0]), str(paths[1])).stdout
    assert "note: A is the steady-state batch of an asynchronous schedule" in out
