"""Simulated bus bandwidth against published nccl-tests measurements (issue 22).

Every row of benchmarks/nccl_tests_data.py that is not excluded there is simulated with
`simulate_collective` on the topology the row names (a preset node kind; several nodes on
a non-blocking two-level fat tree of the named network, `topologies.fat_tree`, with
in-network reduction where the run used SHARP), with NCCL's
own choice of algorithm and protocol unless the run forced one (NCCL_ALGO). Sendrecv is a
P2P transfer between two GPUs of the node (nccl-tests' sendrecv moves each rank's buffer
to the next; on an NVSwitch the pairs do not share a link). Nothing is fitted to these
rows: the constants are NCCL's (sim.nccl_tuning, sim.link_capacity) and the maintainers'.

Error = simulated busbw / published busbw - 1, the published busbw taken from the printed
time where the row has one (busbw = size x nccl-tests' factor / time: the time has more
significant digits than a small size's busbw), else the printed busbw; a simulated busbw
inside the printed value's rounding interval (+-0.005 GB/s) counts as 0.

    python benchmarks/nccl_tests.py
Writes benchmarks/results/nccl_tests.md and .json.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from environment import environment_markdown
from nccl_tests_data import POINTS

from clustersim.sim.collectives import Collective, parse_collective, simulate_collective
from clustersim.sim.nccl_collectives import as_configured, comm_shape
from clustersim.sim.nccl_tuning import time_us
from clustersim.topologies import fat_tree, gpu_nodes, load_topology

RESULTS = Path(__file__).parent / "results"
WITHIN = 0.10


def topology(point: dict, cache: dict):
    sharp = point.get("sharp", False)
    key = (point["node_kind"], point["nodes"], point["network"], sharp)
    if key not in cache:
        cache[key] = (load_topology(point["node_kind"]) if point["nodes"] == 1 else
                      fat_tree(point["node_kind"], point["nodes"], point["network"],
                               in_network_reduction=sharp))
    return cache[key]


def published_busbw(point: dict, coll: Collective, ranks: int) -> float:
    """GB/s: from the printed time where there is one (module docstring), else as printed."""
    if point["time_us"]:
        return point["size_bytes"] * coll.busbw_factor(ranks) / (point["time_us"] * 1e-6) / 1e9
    return point["busbw_GBps"]


def simulate_point(point: dict, cache: dict) -> dict:
    coll = parse_collective("p2p" if point["collective"] == "sendrecv" else point["collective"])
    ranks = 2 if coll is Collective.P2P else point["nodes"] * point["gpus_per_node"]
    result = simulate_collective(coll, point["size_bytes"], ranks, topology(point, cache),
                                 point["algorithm"])
    simulated = result.busbw / 1e9
    reference = published_busbw(point, coll, ranks if coll is not Collective.P2P else 2)
    nccl_model = nccl_model_busbw(point, coll, ranks, result.algorithm, cache)
    error = simulated / reference - 1
    if not point["time_us"] and abs(simulated - point["busbw_GBps"]) <= 0.005:
        error = 0.0  # inside the printed value's rounding
    return {"id": point["id"], "collective": point["collective"], "size": point["size_bytes"],
            "ranks": point["nodes"] * point["gpus_per_node"], "node_kind": point["node_kind"],
            "network": point["network"], "forced": point["algorithm"],
            "published_busbw": point["busbw_GBps"], "published_time_us": point["time_us"],
            "simulated_busbw": simulated, "simulated_time_us": result.time_s * 1e6,
            "algorithm": result.algorithm, "error": error, "url": point["url"],
            "kind": point.get("kind", "row"),
            "nccl_model_busbw": nccl_model,
            "nccl_model_error": None if nccl_model is None else nccl_model / reference - 1}


def nccl_model_busbw(point: dict, coll: Collective, ranks: int, chosen: str,
                     cache: dict) -> float | None:
    """GB/s by NCCL's own cost model (sim.nccl_tuning.time_us) for the pair the simulation
    ran, on the same communicator: what NCCL itself predicts, beside the flows' answer
    (None for send/recv, all-to-all (direct) and the alpha-beta algorithms, which NCCL's
    tuner does not cost)."""
    if "/" not in chosen or chosen.startswith("direct/"):
        return None  # direct: send/recv, which NCCL's tuner does not cost
    graph = topology(point, cache)
    algorithm, protocol = chosen.split("/")
    shape = as_configured(comm_shape(graph, gpu_nodes(graph)[:ranks]), algorithm)
    seconds = time_us(coll.value, algorithm, protocol, point["size_bytes"], shape) * 1e-6
    return point["size_bytes"] * coll.busbw_factor(ranks) / seconds / 1e9


def human(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def model(row: dict) -> str:
    """The NCCL-model columns of a row ('' | '' where NCCL's tuner has no cost)."""
    if row["nccl_model_busbw"] is None:
        return " | "
    return f"{row['nccl_model_busbw']:.2f} | {row['nccl_model_error']:+.1%}"


def summary(label: str, rows: list[dict]) -> list[str]:
    """The summary lines of `rows`: within 10%, mean and max |error|, NCCL's model beside."""
    errors = [abs(r["error"]) for r in rows]
    costed = [abs(r["nccl_model_error"]) for r in rows if r["nccl_model_error"] is not None]
    within = sum(e <= WITHIN for e in errors)
    mean = sum(errors) / len(errors)
    return [
        f"- {label}: {len(rows)} simulated; within 10%: {within}; mean |error| {mean:.1%}; "
        f"max |error| {max(errors):.1%}; goal (every point within 10%, mean within 5%): "
        f"{'met' if within == len(rows) and mean <= 0.05 else 'NOT met'}",
        f"  - NCCL's own cost model (its tuner's time for the same algorithm and protocol on "
        f"the same communicator, no flows), for comparison: {len(costed)} costed, "
        f"{sum(e <= WITHIN for e in costed)} within 10%, mean |error| "
        f"{sum(costed) / len(costed):.1%}"]


def markdown(rows: list[dict], excluded: list[dict], seconds: float) -> str:
    printed = [r for r in rows if r["kind"] == "row"]
    stated = [r for r in rows if r["kind"] == "stated"]
    lines = [
        "# nccl-tests: simulated bus bandwidth against published runs (issue 22)", "",
        environment_markdown(), f"- whole benchmark: {seconds:.0f} s", "",
        "Produced by `python benchmarks/nccl_tests.py` (method: its docstring); the rows and "
        "their sources: `benchmarks/nccl_tests_data.py`. GB/s = 1e9 B/s; sizes binary.", "",
        "## Summary", "",
        f"- collected: {len(rows) + len(excluded)}; simulated: {len(rows)}; excluded: "
        f"{len(excluded)} (reasons below). Ops simulated: "
        + ", ".join(f"{op} {sum(r['collective'] == op for r in rows)}"
                    for op in dict.fromkeys(r["collective"] for r in rows)) + ".",
        *summary("printed nccl-tests rows (the issue's goal)", printed),
        *summary("figures stated in a sentence (kind 'stated': a looser reference)", stated),
        *summary("all", rows), "",
        "## Points", "",
        "| id | kind | op | size | GPUs | topology | forced | published busbw | published "
        "time us | simulated busbw | simulated time us | algorithm | error | NCCL's model "
        "busbw | its error |",
        "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in printed + stated:
        topo = r["node_kind"] + (f" x{r['ranks'] // 8} {r['network']}" if r["network"] else "")
        flag = " **" if abs(r["error"]) > WITHIN else " "
        lines.append(
            f"| [{r['id']}]({r['url']}) | {r['kind']} | {r['collective']} | {human(r['size'])} | "
            f"{r['ranks']} | {topo} | {r['forced'] or ''} | {r['published_busbw']:.2f} | "
            f"{r['published_time_us'] or ''} | {r['simulated_busbw']:.2f} | "
            f"{r['simulated_time_us']:.1f} | {r['algorithm']} |{flag}{r['error']:+.1%}"
            f"{'**' if flag == ' **' else ''} | {model(r)} |")
    lines += ["", "## Excluded (decided from the source, before simulating)", "",
              "| id | reason | source |", "|---|---|---|"]
    lines += [f"| {p['id']} | {p['excluded']} | {p['url']} |" for p in excluded]
    return "\n".join(lines) + "\n"


def main() -> None:
    start = time.perf_counter()
    cache: dict = {}
    rows = [simulate_point(p, cache) for p in POINTS if not p["excluded"]]
    excluded = [p for p in POINTS if p["excluded"]]
    seconds = time.perf_counter() - start
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "nccl_tests.md").write_text(markdown(rows, excluded, seconds))
    (RESULTS / "nccl_tests.json").write_text(json.dumps(
        {"rows": rows, "excluded": [p["id"] for p in excluded]}, indent=1) + "\n")
    print((RESULTS / "nccl_tests.md").read_text().split("## Points")[0])


if __name__ == "__main__":
    main()
