"""The planner against independent truths: screening plans and memory equal resolve's and
the memory model's walk; branch and bound finds the layout an exhaustive replay of the
same space finds; the API and the CLI handler (called directly) report the funnel and a
ranked table whose command lines parse back to the same layouts."""
import argparse
import dataclasses
import json
import logging
import random

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.plan import resolve
from clustersim.sim.cli import build_parser
from clustersim.sim.cli import plan_command
from clustersim.sim.cli.flags import parallel_from_args
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.cost_model import RooflineCostModel, UniformCostModel
from clustersim.sim.planner import SearchSpace, plan, run_plan
from clustersim.sim.planner.inflight import peak_memory
from clustersim.sim.planner.plans import PlanCache
from clustersim.sim.planner.space import enumerate_layouts
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

logging.getLogger("clustersim").setLevel(logging.ERROR)
TOPOLOGY = load_topology("dgx-a100")
FACTS = cluster_facts(TOPOLOGY)
MODEL = get_model("gpt3-1.3b", num_layers=8)
SMALL = SearchSpace(micro_batch_size=(1, 2), zero=(0, 3), recompute=("none", "full"),
                    schedules=("1f1b", "interleaved-1f1b"), sequence_parallel=(True,))


def _valid_plans(n: int, seed: int):
    rng = random.Random(seed)
    layouts = list(enumerate_layouts(MODEL, 8, 32, SearchSpace()))
    out = []
    for layout in rng.sample(layouts, 4 * n):
        model = dataclasses.replace(MODEL, micro_batch_size=layout.micro_batch_size)
        try:
            parallel = layout.parallel(32)
            out.append((PlanCache(model, FACTS).plan(layout, parallel), parallel))
        except ConfigError:
            continue
    return out[:n]


def test_screening_plans_and_memory_equal_resolve_and_the_walk():
    plans = _valid_plans(25, seed=3)
    assert len(plans) == 25
    for screening, parallel in plans:
        full = resolve(screening.model, parallel, FACTS)
        same = dataclasses.replace(full, layer_groups=screening.layer_groups,
                                   group_costs=screening.group_costs)
        assert same == screening
        walked = [m.total_bytes for m in rank_memory(full)]
        assert peak_memory(screening) == pytest.approx(walked, rel=1e-12)


@pytest.mark.parametrize("costs", [None, UniformCostModel(0.01, 0.02)],
                         ids=["roofline", "uniform"])
def test_branch_and_bound_finds_the_exhaustive_best(costs):
    """Under the roofline model, and under uniform costs, whose communication is free (the
    bounds must then not charge the flow network's times)."""
    result, _ = run_plan(MODEL, 8, TOPOLOGY, 32, top=1, space=SMALL, costs=costs)
    assert result.simulated < result.fit_in_memory  # it did bound some out
    times = []
    for layout in enumerate_layouts(MODEL, 8, 32, SMALL):
        model = dataclasses.replace(MODEL, micro_batch_size=layout.micro_batch_size)
        try:
            times.append(simulate(model, layout.parallel(32), TOPOLOGY,
                                  costs=costs or RooflineCostModel()).iteration_time)
        except ConfigError:
            continue
    assert len(times) == result.fit_in_memory  # 80 GB holds every valid layout here
    assert result.candidates[0].result["iteration_time"] == pytest.approx(min(times))


def test_parallel_replays_return_the_serial_ranking():
    """Replays on two worker processes (joblib) rank the same top candidates, with the
    same times, as the serial search; the batches may replay a few more."""
    serial, _ = run_plan(MODEL, 8, TOPOLOGY, 32, top=3, space=SMALL, n_jobs=1)
    parallel, _ = run_plan(MODEL, 8, TOPOLOGY, 32, top=3, space=SMALL, n_jobs=2)
    ranked = [[(c.layout, c.result["iteration_time"]) for c in r.candidates[:3]]
              for r in (serial, parallel)]
    assert ranked[0] == ranked[1]
    assert serial.simulated <= parallel.simulated < parallel.fit_in_memory


def _assert_funnel_adds_up(funnel: dict) -> None:
    """enumerated = refusals before the memory check + fit; fit = bounded out + refused by
    the lowering + simulated (refusals after the fit are in `rejected` as well)."""
    late = sum(n for why, n in funnel["rejected"].items()
               if why.startswith(("lowering:", "replay:")))
    assert funnel["enumerated"] == sum(funnel["rejected"].values()) - late \
        + funnel["fit_in_memory"]
    assert funnel["fit_in_memory"] == (funnel["bounded_out"] + funnel["lowering_refused"]
                                       + funnel["simulated"])


def test_refusals_after_the_memory_check_are_counted_once(monkeypatch):
    """A layout the lowering refuses is neither bounded out nor simulated, one the replay
    refuses is simulated (a replay ran) and neither is ranked: faults injected into the
    two steps after the memory check (nothing in this space is refused there otherwise)."""
    import importlib

    from clustersim.sim.planner.report import funnel
    search_module = importlib.import_module("clustersim.sim.planner.search")  # the module

    refine = search_module._refined

    def refused_lowering(candidate, topology, costs):
        if candidate.layout.tp == 2:
            raise ConfigError("injected: the lowering refuses tp=2")
        return refine(candidate, topology, costs)

    refused = []

    def replay(model, parallel, topology):  # refuses the first layout it is asked for
        if not refused or refused[0] == parallel:
            refused.append(parallel)
            raise ConfigError("injected: the replay refuses its first layout")
        return simulate(model, parallel, topology)

    monkeypatch.setattr(search_module, "_refined", refused_lowering)
    result = search_module.search(MODEL, 8, TOPOLOGY, 32, top=3, space=SMALL, n_jobs=1,
                                  simulator=replay)
    counts = funnel(result)
    assert counts["lowering_refused"] > 0
    assert any(why.startswith("replay: injected") for why in counts["rejected"])
    _assert_funnel_adds_up(counts)
    assert all(c.layout.tp != 2 and c.plan.parallel != refused[0]
               for c in result.candidates)


def test_api_dataframe_is_ranked_with_the_funnel():
    frame = plan(MODEL, 8, "dgx-a100", 32, top=3, space=SMALL)
    assert list(frame["iteration_time"]) == sorted(frame["iteration_time"])
    for column in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "zero",
                   "recompute", "schedule", "iteration_time", "peak_memory", "command"):
        assert column in frame.columns
    _assert_funnel_adds_up(frame.attrs["funnel"])
    assert (frame["tp"] * frame["pp"] * frame["dp"] * frame["cp"] == 8).all()


def _plan_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--topology",
                              "dgx-a100", "--global-batch-size", "16", "--micro-batch-sizes",
                              "2", "--schedules", "1f1b,interleaved-1f1b", *extra])


def test_cli_handler_prints_and_writes_json_whose_commands_replay(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_command.cmd_plan(_plan_args("--top", "2", "--json", str(out))) == 0
    printed = capsys.readouterr().out
    assert "funnel:" in printed and "simulated event by event" in printed
    data = json.loads(out.read_text())
    assert {"enumerated", "rejected", "fit_in_memory", "bounded_out", "simulated",
            "candidates"} <= set(data)
    best = data["candidates"][0]
    args = build_parser().parse_args(best["command"].split()[1:])
    parallel = parallel_from_args(args, args.schedule, micro_batch_size=2)
    assert (parallel.tp, parallel.pp, parallel.dp, parallel.zero_stage, parallel.schedule,
            parallel.recompute, parallel.micro_batch_size) == (
        best["tp"], best["pp"], best["dp"], best["zero"], best["schedule"],
        best["recompute"], best["micro_batch_size"])
    timeline = simulate(get_model("gpt3-1.3b", micro_batch_size=2), parallel, TOPOLOGY)
    assert timeline.iteration_time == pytest.approx(best["iteration_time"])


def test_dtype_reaches_the_memory_model_and_the_command_lines(tmp_path):
    """--dtype fp16: each candidate's peak memory includes the optimizer's fp32 gradient
    copy (more than bf16's for the same layout, at any ZeRO stage; the bytes per parameter
    are tests/test_memory_model.py's), and its command line, with `--dtype fp16`, replays
    it."""
    found = {}
    for dtype in ("bf16", "fp16"):
        out = tmp_path / f"{dtype}.json"
        assert plan_command.cmd_plan(_plan_args("--top", "3", "--jobs", "1", "--dtype", dtype,
                                                "--json", str(out))) == 0
        found[dtype] = {(c["tp"], c["pp"], c["dp"], c["vpp"], c["zero"], c["schedule"],
                         c["recompute"]): c for c in json.loads(out.read_text())["candidates"]}
    both = [k for k in found["fp16"] if k in found["bf16"]]
    assert both
    for key in both:
        assert found["fp16"][key]["peak_memory"] > found["bf16"][key]["peak_memory"]
    best = next(iter(found["fp16"].values()))
    args = build_parser().parse_args(best["command"].split()[1:])
    assert args.dtype == "fp16"
    parallel = parallel_from_args(args, args.schedule, micro_batch_size=2)
    timeline = simulate(get_model("gpt3-1.3b", micro_batch_size=2, dtype="fp16"), parallel,
                        TOPOLOGY)
    assert timeline.iteration_time == pytest.approx(best["iteration_time"])
    assert max(timeline.peak_memory().values()) == best["peak_memory"]


def test_several_gpu_counts_search_each_and_the_page_plots_them(tmp_path, capsys):
    """--gpus 4,8: one search per count, each equal to that count alone (its JSON), and the
    report page adds throughput against GPUs."""
    both, html = tmp_path / "both.json", tmp_path / "both.html"
    parser = argparse.ArgumentParser()
    plan_command.add_parser(parser.add_subparsers(dest="command"))

    def args(gpus: str, *extra: str) -> argparse.Namespace:
        return parser.parse_args(["plan", "--model", "gpt3-1.3b", "--gpus", gpus,
                                  "--topology", "dgx-a100", "--global-batch-size", "16",
                                  "--micro-batch-sizes", "2", "--schedules", "1f1b",
                                  "--top", "2", "--jobs", "1", *extra])

    assert plan_command.cmd_plan(args("4,8", "--json", str(both), "--html", str(html))) == 0
    searches = json.loads(both.read_text())["searches"]
    assert [s["gpus"] for s in searches] == [4, 8]
    for search in searches:
        alone = tmp_path / f"{search['gpus']}.json"
        assert plan_command.cmd_plan(args(str(search["gpus"]), "--json", str(alone))) == 0
        single = json.loads(alone.read_text())
        assert [c["iteration_time"] for c in search["candidates"]] == \
            [c["iteration_time"] for c in single["candidates"]]
        assert search["enumerated"] == single["enumerated"]
    assert "throughput vs GPUs" in html.read_text()
    assert "== 4 GPUs ==" in capsys.readouterr().out


def test_memory_limit_rejects_with_its_reason(capsys):
    """Nothing fits: the reasons print and the exit status is 1 (a script can tell)."""
    assert plan_command.cmd_plan(_plan_args("--max-memory-gb", "0.5")) == 1
    printed = capsys.readouterr().out
    assert "peak memory above 0.5 GB per GPU" in printed and "no layout fits" in printed


def test_an_empty_search_space_is_an_error_naming_the_rule():
    """Micro-batches of 3 divide no share of a global batch of 32: nothing to enumerate,
    refused before any search, naming the divisibility rule."""
    with pytest.raises(ConfigError, match=r"no layout to search: .* micro-batch sizes \[3\]"
                                          r".* global batch of 32 a whole number"):
        run_plan(MODEL, 8, TOPOLOGY, 32, space=SearchSpace(micro_batch_size=(3,)))


def test_one_stage_layouts_carry_the_schedule_asked_for():
    """With pp 1 every schedule runs the same programs: the layouts are enumerated once,
    as 1f1b when it is asked for, else as the first asked that runs one stage per rank."""
    def one_stage(schedules):
        return {lay.schedule for lay in enumerate_layouts(MODEL, 8, 32, SearchSpace(
            schedules=schedules)) if lay.pp == 1}
    assert one_stage(("gpipe", "1f1b")) == {"1f1b"}
    assert one_stage(("gpipe",)) == {"gpipe"}
    assert one_stage(("interleaved-1f1b",)) == set()


def test_refusal_reasons_mask_numbers_but_not_names():
    from clustersim.sim.planner.search import reason
    assert reason(ConfigError("num_layers=24 is not divisible by num_stages=16 (pp*vpp)")) \
        == "num_layers=N is not divisible by num_stages=N (pp*vpp)"
    assert reason(ConfigError("lowering: 3B1.5: with ZeRO-3 / FSDP, 2.5 GB")) == \
        reason(ConfigError("lowering: 15B7: with ZeRO-3 / FSDP, 4 GB")) == \
        "lowering: (an op): with ZeRO-3 / FSDP, N GB"


@pytest.mark.parametrize("flag,value,words", [
    ("--gpus", "0", "gpus"), ("--max-memory-gb", "-1", "max-memory-gb"),
    ("--schedules", "pipedream", "is not searched"),
    ("--schedules", "bogus", "unknown schedule 'bogus': choose from gpipe, 1f1b"),
    ("--schedules", "1f1b,1f1b", "1f1b listed twice"),
    ("--micro-batch-sizes", "2,4,2", "2 listed twice"),
    ("--dtype", "fp8", "invalid choice: 'fp8' (choose from 'bf16', 'fp16', 'fp32')")])
def test_bad_flags_are_one_line_errors(flag, value, words, capsys):
    with pytest.raises(SystemExit):
        _plan_args(flag, value)
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_more_gpus_than_the_topology_is_refused():
    with pytest.raises(ConfigError, match="gpus"):
        run_plan(MODEL, 16, TOPOLOGY, 32)


def _replayed(seconds: float, bubble: float, exposed: float, recompute: float):
    from clustersim.sim.planner.search import Candidate
    return Candidate(None, None, 0.0, None, False, 2, {
        "iteration_time": seconds, "bubble_fraction": bubble,
        "exposed_comm_fraction": exposed, "recompute_overhead": recompute})


def test_why_names_the_part_of_the_iteration_that_grew_most():
    """The extra seconds against the fastest, split into bubble, exposed communication,
    recompute and the model's own compute (they sum to the iteration): the part that
    grew most is named, also when it is none of the three fractions printed beside it
    (a layout whose kernels run slower, as cp 2 with mbs 4 once read 'most from
    recompute' at +0% recompute)."""
    from clustersim.sim.planner.report import time_parts, why
    best = _replayed(10.0, 0.05, 0.05, 0.0)
    for seconds, bubble, exposed, recompute in ((11.0, 0.1, 0.02, 0.25), (7.0, 0.3, 0.1, 1 / 3)):
        parts = time_parts(_replayed(seconds, bubble, exposed, recompute).result)
        assert sum(parts.values()) == pytest.approx(seconds)
        assert parts["recompute"] == pytest.approx(
            seconds * (1 - bubble - exposed) * recompute / (1 + recompute))
    assert why(best, best).startswith("fastest: bubble 5.0%, exposed comm 5.0%")
    assert why(_replayed(10.11, 0.05, 0.05, 0.0), best).startswith(
        "+1.1% time, most from slower compute:")
    assert "most from bubble" in why(_replayed(11.0, 0.13, 0.05, 0.0), best)
    assert "most from exposed comm" in why(_replayed(11.0, 0.05, 0.13, 0.0), best)
    # full recompute: a third more FLOPs, run at the same rate
    assert "most from recompute" in why(_replayed(12.0, 0.05, 0.05, 1 / 3), best)
    assert why(_replayed(10.0, 0.05, 0.05, 0.0), best).startswith("as fast as the first")
