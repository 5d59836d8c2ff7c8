"""sim.planner.bound against independent truths: the 1F1B and interleaved closed forms
under uniform costs, the replay itself where communication is free (then the bound is
the replay's time exactly), and the replay of a random sample of layouts (never below)."""
import dataclasses
import logging
import random

import pytest

from clustersim.schedules.model_presets import get_model
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.cost_model import RooflineCostModel, UniformCostModel
from clustersim.schedules.lowering import lower
from clustersim.schedules.plan import resolve
from clustersim.sim.planner.bound import (is_split, lane_bound, path_bound, quick_bound,
                                          stage_times)
from clustersim.sim.planner.inflight import compute_schedule
from clustersim.sim.planner.plans import PlanCache
from clustersim.sim.planner.walk import contract_bound
from clustersim.sim.planner.space import Layout, SearchSpace, enumerate_layouts
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

TOPOLOGY = load_topology("dgx-a100")
FACTS = cluster_facts(TOPOLOGY)
MODEL = get_model("gpt3-1.3b", num_layers=8)


def bounds(layout: Layout, global_batch: int, costs, model=MODEL):
    model = dataclasses.replace(model, micro_batch_size=layout.micro_batch_size)
    parallel = layout.parallel(global_batch)
    plan = PlanCache(model, FACTS).plan(layout, parallel)
    schedule = compute_schedule((plan.schedule, plan.pp, plan.stages_per_rank,
                                 plan.num_microbatches))
    split = is_split(schedule)
    times = stage_times(plan, TOPOLOGY, costs, split)
    return model, parallel, quick_bound(plan, times, split), path_bound(schedule, times)


@pytest.mark.parametrize("schedule,vpp,expected", [
    ("1f1b", 1, (8 + 4 - 1) * (1 + 2)),  # (M + P - 1)(f + b)
    ("gpipe", 1, (8 + 4 - 1) * (1 + 2)),
    ("interleaved-1f1b", 2, 8 * 2 * 3 + (4 - 1) * 3),  # M v (f + b) + (P - 1)(f + b)
])
def test_closed_forms_under_uniform_costs(schedule, vpp, expected):
    layout = Layout(1, 4, 1, 1, 1, vpp, 1, 0, "none", schedule, False)
    costs = UniformCostModel(forward=1.0, backward=2.0)
    model, parallel, quick, path = bounds(layout, 8, costs)
    assert quick == pytest.approx(expected)
    assert path == pytest.approx(expected)
    assert simulate(model, parallel, TOPOLOGY, costs=costs).iteration_time == \
        pytest.approx(expected)


def test_path_bound_is_the_replay_when_communication_is_free():
    costs = UniformCostModel(forward=1.0, backward=2.0)
    for schedule, vpp in (("zb-h1", 1), ("zbv-zero-bubble", 2), ("naive", 1),
                          ("looped-bfs", 2), ("interleaved-zero-bubble", 2)):
        layout = Layout(1, 4, 2, 1, 1, vpp, 1, 0, "none", schedule, False)
        model, parallel, quick, path = bounds(layout, 16, costs)
        replay = simulate(model, parallel, TOPOLOGY, costs=costs).iteration_time
        assert quick <= path + 1e-9
        assert path == pytest.approx(replay, rel=1e-9), schedule


def test_bound_never_exceeds_the_replay_on_a_sample():
    logging.getLogger("clustersim").setLevel(logging.ERROR)
    space = SearchSpace(micro_batch_size=(1, 2), zero=(0, 1, 2, 3))
    layouts = list(enumerate_layouts(MODEL, 8, 16, space))
    rng = random.Random(20)
    checked = 0
    for layout in rng.sample(layouts, 60):
        try:
            model, parallel, quick, path = bounds(layout, 16, RooflineCostModel())
        except Exception:  # refused layouts have no bound; the search counts them
            continue
        replay = simulate(model, parallel, TOPOLOGY).iteration_time
        full = resolve(model, parallel, FACTS)
        lowered = lower(full.build_schedule(), full)
        lane = lane_bound(lowered, full, TOPOLOGY)
        walk = contract_bound(lowered, full, TOPOLOGY,
                              RooflineCostModel().compute_time(full, TOPOLOGY))
        assert max(quick, path, lane, walk) <= replay * (1 + 1e-9), layout
        assert max(quick, path) >= 0.5 * replay  # and it says something
        assert walk >= 0.95 * replay  # the contract walk misses only transfers, slowdowns
        checked += 1
        if checked == 12:
            break
    assert checked == 12


def test_contract_bound_never_exceeds_the_replay_across_hosts():
    """Data-parallel and pipeline groups over InfiniBand (4 hosts of selene-a100), every
    ZeRO stage: the contract walk's uncontended collectives stay below the flows."""
    logging.getLogger("clustersim").setLevel(logging.ERROR)
    topology = load_topology("selene-a100")
    facts = cluster_facts(topology)
    space = SearchSpace(micro_batch_size=(1, 2), recompute=("none", "selective"))
    layouts = list(enumerate_layouts(MODEL, 32, 32, space))
    rng = random.Random(7)
    checked = 0
    for layout in rng.sample(layouts, 40):
        model = dataclasses.replace(MODEL, micro_batch_size=layout.micro_batch_size)
        try:
            parallel = layout.parallel(32)
            full = resolve(model, parallel, facts)
            replay = simulate(model, parallel, topology).iteration_time
        except Exception:  # refused layouts have no bound
            continue
        walk = contract_bound(lower(full.build_schedule(), full), full, topology,
                              RooflineCostModel().compute_time(full, topology))
        assert 0.8 * replay <= walk <= replay * (1 + 1e-9), layout
        checked += 1
        if checked == 8:
            break
    assert checked == 8
