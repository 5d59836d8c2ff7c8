"""Search the serving layouts of a model on N GPUs (`clustersim serve --search-layouts N`):
every tensor x pipeline x sequence x data parallel split of the N GPUs is simulated on the
same workload, and the layouts are ranked by request goodput under the service-level
objectives when they are given, else by output throughput (ties: the lower mean
end-to-end latency). A layout the simulator refuses (it does not fit in memory, the
heads do not split) is kept with its reason.

Layouts: tp a power of two up to the GPUs of one host that divides the attention heads,
pp and sp powers of two (pp up to 8 and the layer count, sp up to 4), dp = N / (tp pp sp)
a whole number. Each is one simulate_serving run (sim.serving); no bound prunes them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.topologies import gpu_nodes, load_topology

from . import ServingResult, simulate_serving
from .workload import Request

MAX_PP, MAX_SP = 8, 4


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    sp: int
    dp: int

    def flags(self) -> str:
        return f"-tp {self.tp} -pp {self.pp} --sp {self.sp} --dp {self.dp}"


@dataclass
class Candidate:
    """A layout and its run (None when refused, with the reason)."""

    layout: Layout
    result: ServingResult | None = None
    refused: str | None = None


def _powers(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def layouts(model: ModelSpec, gpus: int, gpus_per_host: int) -> list[Layout]:
    """Every layout of `gpus` GPUs (module docstring)."""
    found = []
    for tp in _powers(gpus_per_host):
        if model.num_attention_heads % tp:
            continue
        for pp in _powers(min(MAX_PP, model.num_layers)):
            for sp in _powers(MAX_SP):
                if gpus % (tp * pp * sp) == 0:
                    found.append(Layout(tp, pp, sp, gpus // (tp * pp * sp)))
    return found


def search(model: ModelSpec, topology: str | nx.DiGraph, requests: Sequence[Request],
           gpus: int, slo: Mapping[str, float] | None = None, **options) -> list[Candidate]:
    """The candidates of every layout, best first (module docstring); `options` are
    simulate_serving's (batching, limits, dtype, ...)."""
    graph = load_topology(topology) if not isinstance(topology, nx.DiGraph) else topology
    nodes = gpu_nodes(graph)
    if not 1 <= gpus <= len(nodes):
        raise ConfigError(f"--search-layouts must be from 1 to the topology's {len(nodes)} "
                          f"GPUs, got {gpus}")
    per_host = sum(1 for g in nodes if graph.nodes[g]["host"] == graph.nodes[nodes[0]]["host"])
    candidates = []
    for layout in layouts(model, gpus, per_host):
        try:
            result = simulate_serving(model, graph, requests, tp=layout.tp, pp=layout.pp,
                                      sp=layout.sp, dp=layout.dp, slo=slo, **options)
            candidates.append(Candidate(layout, result))
        except ConfigError as err:
            candidates.append(Candidate(layout, refused=str(err)))
    return sorted(candidates, key=lambda c: rank_key(c, bool(slo)))


def rank_key(candidate: Candidate, by_goodput: bool) -> tuple:
    """Sort key: runs before refusals; more goodput (or throughput), then lower latency."""
    if candidate.result is None:
        return (1, 0.0, 0.0)
    m = candidate.result.metrics
    score = m["request_goodput"] if by_goodput else m["output_throughput"]
    return (0, -score, m["mean_e2el_ms"])
