"""The planner's report page (sim.planner.html, `clustersim plan --html`): the Pareto front
against dominance by definition, the page's funnel against the `--json` funnel, what a
real browser draws (no script errors), and the Gantt's iteration times against the
candidates table."""
import argparse
import dataclasses
import itertools
import json
import re
from collections import Counter
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from browser import dump_dom
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.sim.cli import plan_command
from clustersim.sim.planner import SearchSpace, run_plan
from clustersim.sim.planner.figures import (FUNNEL_STAGES, bound_point, funnel_figure,
                                            gpus_front_figure, memory_front_figure)
from clustersim.sim.planner.html import plan_html, replay_leaders
from clustersim.sim.planner.pareto import pareto_front
from clustersim.sim.planner.search import SearchResult
from clustersim.sim.units import format_seconds
from clustersim.topologies import load_topology

TOPOLOGY = load_topology("dgx-a100")
MODEL = get_model("gpt3-1.3b", num_layers=8)
SMALL = SearchSpace(micro_batch_size=(2,), zero=(0, 3), recompute=("none", "full"),
                    schedules=("1f1b", "interleaved-1f1b"), sequence_parallel=(True,))


def dominated_by_definition(points, i):
    """Some other point costs no more (x) and gives no less (y), and differs."""
    x, y = points[i]
    return any(px <= x and py >= y and (px, py) != (x, y) for px, py in points)


def test_pareto_front_of_hand_made_points():
    points = [(10, 100),  # 0 front: least memory
              (20, 150),  # 1 front
              (20, 140),  # 2 same memory, less throughput: dominated by 1
              (30, 150),  # 3 same throughput, more memory: dominated by 1
              (40, 200),  # 4 front: most throughput
              (40, 200),  # 5 equal to 4: neither dominates the other, both on the front
              (50, 190),  # 6 dominated by 4
              (5, 50)]    # 7 front: the least memory of all
    assert pareto_front(points) == [7, 0, 1, 4, 5]
    assert pareto_front([]) == []


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=25))
def test_pareto_front_is_the_undominated_points(points):
    front = pareto_front(points)
    assert sorted(front) == [i for i in range(len(points))
                             if not dominated_by_definition(points, i)]
    assert [points[i][0] for i in front] == sorted(points[i][0] for i in front)


def _plan_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--topology",
                              "dgx-a100", "--global-batch-size", "16", "--micro-batch-sizes",
                              "2", "--schedules", "1f1b,interleaved-1f1b", "--top", "3",
                              *extra])


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """`clustersim plan ... --json --html` through the CLI handler: (JSON, page path)."""
    out = tmp_path_factory.mktemp("plan")
    args = _plan_args("--json", str(out / "plan.json"), "--html", str(out / "plan.html"))
    assert plan_command.cmd_plan(args) == 0
    return json.loads((out / "plan.json").read_text()), out / "plan.html"


class Tables(HTMLParser):
    """The text of each cell of the tables with an id: id -> rows of cells."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.cell = {}, None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self.current = self.tables.setdefault(attrs["id"], [])
        elif tag == "tr" and self.current is not None:
            self.current.append([])
        elif tag in ("td", "th") and self.current is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.current is not None:
            self.current[-1].append(self.cell.strip())
            self.cell = None
        elif tag == "table":
            self.current = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _tables(page: Path) -> dict:
    parser = Tables()
    parser.feed(page.read_text())
    return parser.tables


def test_page_funnel_is_the_json_funnel(cli_run):
    data, page = cli_run
    tables = _tables(page)
    shown = {field: int(count.replace(",", "")) for _, field, count in tables["funnel-counts"][1:]
             if field != "seconds.total"}
    assert shown == {"enumerated": data["enumerated"], "rejected": sum(data["rejected"].values()),
                     "fit_in_memory": data["fit_in_memory"],
                     "bounded_out": data["bounded_out"], "simulated": data["simulated"],
                     "path_bounds": data["path_bounds"],
                     "lowered_bounds": data["lowered_bounds"]}
    reasons = {why: int(n.replace(",", "")) for n, why in tables.get("rejected", [[]])[1:]}
    assert reasons == data["rejected"]
    bars = funnel_figure(data).data[0]
    assert list(bars.customdata) == [shown[k] for k in ("enumerated", "rejected",
                                                        "fit_in_memory", "bounded_out",
                                                        "simulated")]


def test_candidates_table_is_the_json_ranking(cli_run):
    data, page = cli_run
    rows = _tables(page)["candidates"][1:]
    assert len(rows) == len(data["candidates"])
    for row, candidate in zip(rows, data["candidates"]):
        assert row[3] == format_seconds(candidate["iteration_time"])
        assert row[-1] == candidate["command"]
    points = [(c["peak_memory"], c["tokens_per_s"]) for c in data["candidates"]]
    assert [i for i, row in enumerate(rows) if row[8] == "yes"] == sorted(pareto_front(points))


@pytest.fixture(scope="module")
def searched():
    result, commands = run_plan(MODEL, 8, TOPOLOGY, 16, top=2, space=SMALL, n_jobs=1)
    assert len(result.candidates) >= 2
    return result, commands


def test_winner_and_runner_up_replay_to_the_tables_times(searched):
    result, _ = searched
    leaders = replay_leaders(result, TOPOLOGY)
    assert [c for c, _ in leaders] == result.candidates[:2]
    for candidate, timeline in leaders:
        assert timeline.iteration_time == candidate.result["iteration_time"]
        assert max(timeline.peak_memory().values()) == candidate.result["peak_memory"]


def test_front_figure_hovers_name_layouts_and_bounds_are_apart(searched):
    result, _ = searched
    bounded = [dataclasses.replace(c, result=None) for c in result.candidates]
    fig = memory_front_figure(result.candidates, result.capacity_bytes, bounded)
    by_role = {t.meta["role"]: t for t in fig.data}
    drawn = [h for role in ("front", "dominated") for h in by_role[role].hovertext]
    assert sorted(h.split("<br>")[0] for h in drawn) == sorted(
        f"#{i} {c.layout.describe()}" for i, c in enumerate(result.candidates, start=1))
    bound = by_role["bound"]
    assert "upper bound, not a result" in bound.name
    tokens = 16 * MODEL.seq_length
    assert list(bound.y) == [tokens / c.bound for c in bounded]
    for c, y in zip(result.candidates, bound.y):
        assert y >= c.result["tokens_per_s"] * (1 - 1e-12)  # a bound is never below
        assert bound_point(c)[1] == y


def test_gpus_front_of_a_sweep_is_the_undominated_counts(searched):
    result, _ = searched
    four, _ = run_plan(MODEL, 4, TOPOLOGY, 16, top=1, space=SMALL, n_jobs=1)
    fig = gpus_front_figure({8: result.candidates, 4: four.candidates})
    points = [(g, c.result["tokens_per_s"]) for g, r in ((4, four), (8, result))
              for c in r.candidates]
    on = {(x, y) for (x, y) in points
          if not dominated_by_definition(points, points.index((x, y)))}
    front = next(t for t in fig.data if t.meta["role"] == "front")
    assert set(zip(front.x, front.y)) == on
    page = plan_html(result, [""] * len(result.candidates), TOPOLOGY,
                     sweep={8: result, 4: four})
    assert 'id="gpus-front"' in page and 'id="memory-front"' in page


def test_a_search_without_candidates_still_reports_its_funnel():
    result = SearchResult(enumerated=3, rejected=Counter({"peak memory above N GB": 3}))
    page = plan_html(result, [], TOPOLOGY)
    assert "No layout fits and runs" in page and 'id="funnel"' in page
    assert 'id="memory-front"' not in page and 'id="leaders"' not in page
    assert "<td>3</td><td>peak memory above N GB</td>" in page


def test_html_output_never_overwrites_an_input_or_another_output(tmp_path):
    topology = tmp_path / "cluster.json"
    topology.write_text("{}")  # refused before it is read
    args = _plan_args("--html", str(topology))
    args.topology = str(topology)
    with pytest.raises(ConfigError, match="--html .* is the run's input --topology"):
        plan_command.cmd_plan(args)
    same = str(tmp_path / "out")
    with pytest.raises(ConfigError, match="both write"):
        plan_command.cmd_plan(_plan_args("--json", same, "--html", same))


# Injected first in <head>: records script errors, rejected promises and console errors
# before plotly runs; after load, what each chart drew, read from the live DOM.
ERRORS = """<script>window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
window.addEventListener('unhandledrejection', e => window.__errors.push(String(e.reason)));
const consoleError = console.error;
console.error = (...a) => { window.__errors.push(a.join(' ')); consoleError(...a); };
</script>"""
FACTS = """<script>window.addEventListener('load', () => {
  const all = (sel) => [...document.querySelectorAll(sel)];
  const texts = (sel) => all(sel).map(e => e.textContent);
  document.body.setAttribute('data-facts', JSON.stringify({errors: window.__errors,
    plotted: all('.js-plotly-plot').map(e => e.id),
    front_points: all('#memory-front .scatterlayer .point').length,
    funnel_ticks: texts('#funnel .ytick text'),
    funnel_bars: all('#funnel .bars .point path').filter(
      e => e.getBoundingClientRect().width > 0).length,
    gantt_bars: all('#leaders .bars .point').length,
    gantt_titles: texts('#leaders .annotation-text'),
    table: all('#candidates tbody tr').map(r => [...r.cells].map(c => c.innerText))}));
});</script>"""


def browser_facts(page: Path, tmp_path: Path) -> dict:
    html = page.read_text()
    html = html.replace("<head>", "<head>" + ERRORS, 1).replace("</body>", FACTS + "</body>")
    copy = tmp_path / "page.html"
    copy.write_text(html)
    dom = dump_dom(copy, tmp_path)
    start = dom.index('data-facts="') + len('data-facts="')
    return json.loads(unescape(dom[start:dom.index('"', start)]))


@pytest.mark.browser
def test_chromium_draws_the_page_without_script_errors(cli_run, tmp_path):
    data, page = cli_run
    facts = browser_facts(page, tmp_path)
    assert facts["errors"] == []
    assert facts["plotted"] == ["memory-front", "funnel", "leaders"]
    # every simulated layout once, plus the winner's and runner-up's rings
    assert facts["front_points"] == len(data["candidates"]) + 2
    counts = {label: sum(data[key].values()) if key == "rejected" else data[key]
              for key, label in FUNNEL_STAGES}
    shown = {t.rsplit(":", 1)[0]: int(re.sub(r"\D", "", t.rsplit(":", 1)[1]))
             for t in facts["funnel_ticks"]}
    assert shown == counts
    assert facts["funnel_bars"] == sum(1 for n in counts.values() if n)  # 0: no bar (log)
    assert facts["gantt_bars"] > 0
    # the Gantt's titles give the winner's and runner-up's iteration times of the table
    for row, title in itertools.zip_longest(facts["table"][:2], facts["gantt_titles"][:2]):
        assert f"iteration {row[3]}," in title
        assert row[1].replace("\n", " ") in title
