"""Size and load time of the HTML page of the GPT-3 175B job on 1024 GPUs, before and
after the report page (issue 18: "a page of at most a few MB beyond plotly.js").

The job is the README's (`JOB`: TP 8 in a node, PP 16 interleaved with 2 virtual stages,
DP 8, on the 1024 H100s of `dgx-h100-x128-ndr-ft`; 62,528 spans). This checkout's CLI
simulates it once (`--timeline-json`); then, in one run, side by side from that Timeline:
- before: the page of the commit before the report, `sim.gantt.write_gantt` of a
  checkout of it (`--old-tree`): every span drawn (WebGL segments above 5,000);
- after: this checkout's `sim.html_report.write_report`: plan, headline numbers, per-rank
  table, spans merged where thinner than a few pixels (sim.span_groups), memory panel.
Each page is written in its own Python process (the seconds to build and write it), then
measured: bytes, and bytes beyond the inlined plotly.js; in headless Chromium (software
rendering, --disable-gpu), the seconds from navigation start to the load event
(`performance.now()`; plotly draws inside the page's own scripts, so this counts parsing,
plotly.js and drawing) and the wall time of the Chromium process less that of an empty
page; medians of `--repeat` loads, before and after alternating. The SVG bars in the DOM
Chromium dumps show what was drawn.

Writes benchmarks/results/html_report_size.md and .json.

    git worktree add /tmp/oldtree 4e153a9   # the commit before the report
    python benchmarks/html_report_size.py --old-tree /tmp/oldtree [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import plotly.offline

from environment import environment, tree_version
from run_cli import ROOT, clustersim, command

sys.path.insert(0, str(ROOT / "tests"))
from browser import FLAGS, find_chromium  # noqa: E402  (the tests' headless Chromium)

RESULTS = ROOT / "benchmarks" / "results"
JOB = ("simulate", "--model", "gpt3-175b", "--topology", "dgx-h100-x128-ndr-ft", "--tp", "8",
       "--pp", "16", "--vpp", "2", "--schedule", "interleaved-1f1b", "--dp", "8",
       "--global-batch-size", "1536", "--recompute", "selective", "--sequence-parallel")
WRITERS = {  # page -> the Python that writes it from a Timeline JSON, timed
    "before": "from clustersim.sim.gantt import write_gantt as write\nkw = {}",
    "after": "from clustersim.sim.html_report import write_report as write\n"
             "kw = {'trace_path': 'gpt3.trace.json'}",
}
WRITE = """
import sys, time
from clustersim.schedules.timeline import Timeline
{writer}
timeline = Timeline.load(sys.argv[1])
began = time.perf_counter()
write(timeline, sys.argv[2], **kw)
print(time.perf_counter() - began)
"""
TIMER = ("<script>window.addEventListener('load', () => document.body.setAttribute("
         "'data-load-ms', performance.now().toFixed(1)));</script>")


def write_page(name: str, tree: Path, timeline: Path, page: Path, work: Path) -> float:
    """Write `page` with `tree`'s code (imported as clustersim through a link); seconds."""
    root = work / f"import-{name}"
    root.mkdir(exist_ok=True)
    if not (root / "clustersim").exists():
        (root / "clustersim").symlink_to(tree.resolve(), target_is_directory=True)
    script = WRITE.format(writer=WRITERS[name])
    out = subprocess.run([sys.executable, "-c", script, str(timeline), str(page)], cwd=work,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    return float(out.stdout.strip().splitlines()[-1])


def load_page(page: Path, work: Path) -> dict:
    """One load in headless Chromium: seconds to the load event, process wall seconds, the
    SVG bars in the dumped DOM and whether plotly drew on a WebGL canvas."""
    head, _, tail = page.read_text().rpartition("</body>")
    timed = work / f"timed-{page.name}"
    timed.write_text(head + TIMER + "</body>" + tail)
    began = time.perf_counter()
    dom = subprocess.run([find_chromium(), *FLAGS, f"--user-data-dir={work / 'profile'}",
                          "--dump-dom", timed.resolve().as_uri()], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    wall = time.perf_counter() - began
    found = re.search(r'data-load-ms="([0-9.]+)"', dom)
    if not found:
        raise SystemExit(f"{page.name}: Chromium dumped the DOM before the load event")
    return {"load_s": float(found.group(1)) / 1e3, "wall_s": wall,
            "svg_bars": dom.count('class="point"'), "webgl": '<canvas class="gl-canvas' in dom}


def measure(work: Path, old_tree: Path, repeat: int) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    clustersim(*JOB, "--no-html", "--timeline-json", "gpt3.json", cwd=work)
    simulate_s = time.perf_counter() - started
    timeline = work / "gpt3.json"
    spans = len(json.loads(timeline.read_text())["spans"])
    trees = {"before": old_tree, "after": ROOT}
    pages = {name: work / f"{name}.html" for name in trees}
    write_s = {name: write_page(name, trees[name], timeline, pages[name], work)
               for name in trees}
    empty = work / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body>empty</body></html>")
    loads: dict[str, list[dict]] = {name: [] for name in (*trees, "empty")}
    for _ in range(repeat):  # alternate, so a busy moment of the machine hits both
        for name, page in (*pages.items(), ("empty", empty)):
            loads[name].append(load_page(page, work))
    plotly_js = len(plotly.offline.get_plotlyjs().encode())
    base = statistics.median(r["wall_s"] for r in loads["empty"])
    result = {"job": command(*JOB), "spans": spans, "simulate_s": simulate_s,
              "plotly_js_bytes": plotly_js, "empty_page_wall_s": base, "repeat": repeat,
              "pages": {}}
    for name, page in pages.items():
        runs = loads[name]
        result["pages"][name] = {
            "code": tree_version(trees[name]), "bytes": page.stat().st_size,
            "bytes_beyond_plotly_js": page.stat().st_size - plotly_js,
            "write_s": write_s[name],
            "load_s": statistics.median(r["load_s"] for r in runs),
            "wall_less_empty_s": statistics.median(r["wall_s"] for r in runs) - base,
            "svg_bars": runs[0]["svg_bars"],
            "webgl": runs[0]["webgl"],
            "runs": runs}
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]  # others' work too
    result["chromium"] = subprocess.run([find_chromium(), "--version"], capture_output=True,
                                        text=True).stdout.strip()
    return result


def render(data: dict) -> str:
    before, after = data["pages"]["before"], data["pages"]["after"]
    rows = ["| page | code | size (MB) | beyond plotly.js (MB) | write (s) | load event (s) "
            "| Chromium wall less empty page (s) | drawn as |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, p in data["pages"].items():
        drawn = " and ".join([*([f"{p['svg_bars']:,} SVG bars"] if p["svg_bars"] else []),
                              *(["WebGL segments"] if p["webgl"] else [])])
        rows.append(f"| {name} | {p['code']} | {p['bytes'] / 1e6:.2f} | "
                    f"{p['bytes_beyond_plotly_js'] / 1e6:.2f} | {p['write_s']:.2f} | "
                    f"{p['load_s']:.2f} | {p['wall_less_empty_s']:.2f} | {drawn} |")
    rows.append(f"| after / before | | {after['bytes'] / before['bytes']:.3f} | "
                f"{after['bytes_beyond_plotly_js'] / before['bytes_beyond_plotly_js']:.3f} | "
                f"{after['write_s'] / before['write_s']:.2f} | "
                f"{after['load_s'] / before['load_s']:.2f} | "
                f"{after['wall_less_empty_s'] / before['wall_less_empty_s']:.2f} | |")
    env = {**data["environment"], "chromium": data["chromium"]}
    return "\n".join([
        "# HTML page of GPT-3 175B on 1024 GPUs: size and load time, before and after the "
        "report", "",
        f"`{data['job']}` ({data['spans']:,} spans; simulated once in "
        f"{data['simulate_s']:.1f} s, both pages written from that Timeline in one run). "
        f"plotly.js inlined in each page: {data['plotly_js_bytes'] / 1e6:.2f} MB. Load times "
        f"are medians of {data['repeat']} loads in headless Chromium with software rendering "
        f"(`--disable-gpu`), before and after alternating; an empty page takes "
        f"{data['empty_page_wall_s']:.2f} s of Chromium wall time. The machine is shared: "
        f"1-minute load average {data['load_average_1min'][0]:.1f} at the start, "
        f"{data['load_average_1min'][1]:.1f} at the end, so absolute times vary between "
        f"runs and the ratios are the result. MB = 1e6 bytes.", "",
        "\n".join(f"- {k}: {v}" for k, v in env.items()), "", *rows, "",
        "Before: every span drawn (WebGL segments, hover text per span). After: the report "
        "page (plan, headline numbers, a table per rank, OOM banner when a rank does not "
        "fit), its Gantt drawing thin consecutive spans of a row merged "
        "(sim.span_groups; the page says so and names the Perfetto trace for every op). "
        "How to run: benchmarks/html_report_size.py's docstring.", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, required=True,
                        help="a checkout of the commit before the report (git worktree add)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if find_chromium() is None:
        raise SystemExit("headless Chromium not found (install the `chromium` package)")
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(Path(tmp), args.old_tree, args.repeat)
    data["environment"] = environment()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "html_report_size.json").write_text(json.dumps(data, indent=1) + "\n")
    text = render(data)
    (RESULTS / "html_report_size.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
