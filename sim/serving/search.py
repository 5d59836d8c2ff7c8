"""Serving layouts side by side: `search` (`clustersim serve --search-layouts N`) simulates
every tensor x pipeline x sequence x data parallel split of N GPUs on the same workload
and ranks them by request goodput under the service-level objectives when they are
given, else by output throughput (ties: the lower mean end-to-end latency); `compare`
(`clustersim serve --compare`) simulates the layouts it is given, in their order
(`parse_layout` reads one: 'tp=4,pp=2'). A layout the simulator refuses (it does not fit
in memory, the heads do not split) is kept with its reason.

Layouts: tp a power of two up to the GPUs of one host that divides the attention heads,
pp and sp powers of two (pp up to 8 and the layer count, sp up to 4), dp = N / (tp pp sp)
a whole number; for an MoE model, each layout without pp or sp also with its experts over
all N GPUs (ep = tp x dp, vLLM's --enable-expert-parallel) where N divides the experts;
with disaggregated batching, each layout of dp >= 2 replicas (no EP) with every split
of them into 1 to dp - 1 prefill replicas and the rest decoding.
Each is one simulate_serving run (sim.serving); no bound prunes them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.topologies import gpu_nodes, load_topology

from . import ServingResult, simulate_serving
from .workload import Request, check_context

MAX_PP, MAX_SP = 8, 4


@dataclass(frozen=True)
class Layout:
    """A replica's tp x pp x sp GPUs, dp replicas; `ep`: expert-parallel GPUs (1: none);
    `prefill`: of the replicas, the prefill ones of disaggregated serving (0: none)."""

    tp: int = 1
    pp: int = 1
    sp: int = 1
    dp: int = 1
    ep: int = 1
    prefill: int = 0

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.sp * self.dp

    def name(self) -> str:
        text = f"tp {self.tp} pp {self.pp} sp {self.sp} dp {self.dp}"
        text += f" ep {self.ep}" if self.ep > 1 else ""
        return text + (f" ({self.prefill} prefill)" if self.prefill else "")

    def flags(self) -> str:
        text = f"-tp {self.tp} -pp {self.pp} --sp {self.sp} --dp {self.dp}"
        text += f" --ep {self.ep}" if self.ep > 1 else ""
        return text + (f" --num-prefill-replicas {self.prefill}" if self.prefill else "")


LAYOUT_KEYS = ("tp", "pp", "sp", "dp", "ep", "prefill")


def parse_layout(text: str) -> Layout:
    """'tp=4,pp=2' (keys tp, pp, sp, dp, ep, prefill; each at most once; unnamed: 1, prefill
    0) -> Layout; ConfigError naming the rule."""
    values = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if key not in LAYOUT_KEYS or not eq:
            raise ConfigError(f"layout {text!r}: each part is KEY=N with KEY one of "
                              f"{', '.join(LAYOUT_KEYS)}, got {part.strip()!r}")
        if key in values:
            raise ConfigError(f"layout {text!r} gives {key} twice")
        if not value.strip().isdigit() or int(value) < (key != "prefill"):
            raise ConfigError(f"layout {text!r}: {key} must be an integer >= "
                              f"{int(key != 'prefill')}, got {value.strip()!r}")
        values[key] = int(value)
    return Layout(**values)


@dataclass
class Candidate:
    """A layout and its run (None when refused, with the reason)."""

    layout: Layout
    result: ServingResult | None = None
    refused: str | None = None


def _powers(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def layouts(model: ModelSpec, gpus: int, gpus_per_host: int,
            disaggregated: bool = False) -> list[Layout]:
    """Every layout of `gpus` GPUs (module docstring); `disaggregated`: each layout of dp
    >= 2 replicas once per number of prefill replicas, 1 to dp - 1."""
    if disaggregated:
        return [replace(x, prefill=k) for x in layouts(model, gpus, gpus_per_host)
                if x.ep == 1 for k in range(1, x.dp)]
    found = []
    for tp in _powers(gpus_per_host):
        if model.num_attention_heads % tp:
            continue
        for pp in _powers(min(MAX_PP, model.num_layers)):
            for sp in _powers(MAX_SP):
                if gpus % (tp * pp * sp) == 0:
                    found.append(Layout(tp, pp, sp, gpus // (tp * pp * sp)))
                    if model.is_moe and pp == sp == 1 and 1 < gpus <= model.num_experts \
                            and model.num_experts % gpus == 0:
                        found.append(Layout(tp, 1, 1, gpus // tp, ep=gpus))
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
    found = layouts(model, gpus, per_host, options.get("batching") == "disaggregated")
    if not found:
        raise ConfigError(f"no layout of {gpus} GPUs to search (disaggregated serving needs "
                          f"at least 2 replicas)")
    candidates = compare(model, graph, requests, found, slo, **options)
    return sorted(candidates, key=lambda c: rank_key(c, bool(slo)))


def compare(model: ModelSpec, topology: str | nx.DiGraph, requests: Sequence[Request],
            given: Sequence[Layout], slo: Mapping[str, float] | None = None,
            **options) -> list[Candidate]:
    """The candidate of each layout, in the given order (options: as `search`'s); requests
    longer than the model's context are refused once, not per layout."""
    check_context(requests, model.seq_length)
    graph = load_topology(topology) if not isinstance(topology, nx.DiGraph) else topology
    candidates = []
    for layout in given:
        try:
            result = simulate_serving(model, graph, requests, tp=layout.tp, pp=layout.pp,
                                      sp=layout.sp, dp=layout.dp, ep=layout.ep,
                                      prefill_replicas=layout.prefill, slo=slo, **options)
            candidates.append(Candidate(layout, result))
        except ConfigError as err:
            candidates.append(Candidate(layout, refused=str(err)))
    return candidates


def rank_key(candidate: Candidate, by_goodput: bool) -> tuple:
    """Sort key: runs before refusals; more goodput (or throughput), then lower latency."""
    if candidate.result is None:
        return (1, 0.0, 0.0)
    m = candidate.result.metrics
    score = m["request_goodput"] if by_goodput else m["output_throughput"]
    return (0, -score, m["mean_e2el_ms"])
