"""The planner (issue 20): which layout of a model on N GPUs trains fastest.

It enumerates layouts (sim.planner.space), drops what the checks or the memory model
refuse (sim.planner.plans, .inflight), bounds the rest from below (sim.planner.bound)
and replays event by event only those whose bound can still beat the best found
(sim.planner.search); sim.planner.report prints and writes the result. `plan(...)` is
the Python API (`clustersim.plan`): a pandas DataFrame of the replayed candidates,
fastest first, the funnel counts in `DataFrame.attrs['funnel']`. Units: seconds, bytes.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.topologies import load_topology

from ..backends import check_backend
from ..cluster import cluster_facts
from ..cost_model import CostModel, RooflineCostModel
from .report import candidate_row, funnel, simulate_command
from .search import SearchResult, search
from .space import SearchSpace

if TYPE_CHECKING:
    import pandas

__all__ = ["SearchSpace", "plan", "run_plan"]


def run_plan(model: str | ModelSpec, gpus: int, topology: str | nx.DiGraph,
             global_batch_size: int, seq_length: int | None = None,
             max_memory_gb: float | None = None, top: int = 5,
             space: SearchSpace | None = None, costs: CostModel | None = None,
             n_jobs: int = -1, backend: str = "local", dtype: str | None = None
             ) -> tuple[SearchResult, list[str]]:
    """The search and each replayed candidate's `clustersim simulate` command; arguments
    as `plan`."""
    for name, value in (("gpus", gpus), ("global_batch_size", global_batch_size),
                        ("top", top)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    check_backend(backend, n_jobs)  # before the search, which may take minutes
    if max_memory_gb is not None and not (isinstance(max_memory_gb, (int, float))
                                          and 0 < max_memory_gb < 1e6):
        raise ConfigError(f"max_memory_gb must be a number of GB > 0, got {max_memory_gb!r}")
    spec = get_model(model) if isinstance(model, str) else model
    if seq_length is not None:
        spec = dataclasses.replace(spec, seq_length=seq_length)
    if dtype is not None:  # ModelSpec checks it
        spec = dataclasses.replace(spec, dtype=dtype)
    graph = load_topology(topology) if isinstance(topology, str) else topology
    available = len(cluster_facts(graph).gpus)
    if gpus > available:
        raise ConfigError(f"gpus={gpus}: the topology has {available} GPUs")
    result = search(spec, gpus, graph, global_batch_size,
                    None if max_memory_gb is None else max_memory_gb * 1e9, top,
                    space or SearchSpace(), costs or RooflineCostModel(), n_jobs=n_jobs,
                    backend=backend)
    model_name = model if isinstance(model, str) else spec.name
    topology_name = topology if isinstance(topology, str) else graph.graph.get("name", "?")
    commands = [simulate_command(c, model_name, topology_name, global_batch_size, seq_length,
                                 dtype) for c in result.candidates]
    return result, commands


def plan(model: str | ModelSpec, gpus: int, topology: str | nx.DiGraph,
         global_batch_size: int, seq_length: int | None = None,
         max_memory_gb: float | None = None, top: int = 5,
         space: SearchSpace | None = None, costs: CostModel | None = None,
         n_jobs: int = -1, backend: str = "local", dtype: str | None = None
         ) -> "pandas.DataFrame":
    """Search the layouts of `model` (a preset name or ModelSpec; `dtype`: its training
    precision, default the model's) on `gpus` GPUs of
    `topology` (a preset, a topology JSON path or a graph) at `global_batch_size`
    sequences of `seq_length` tokens (default: the model's) under `max_memory_gb` GB per
    GPU (default: the device's memory); the replayed candidates, fastest first (the top
    `top` are exact), one row each: layout fields, iteration_time (s), peak_memory
    (bytes), tokens_per_s, mfu, bound (s), bubble and exposed-communication fractions,
    recompute_overhead, command. `attrs['funnel']`: the funnel counts. `n_jobs`: replays
    at once (-1: every core or cluster CPU, 1 serial) on `backend`: 'local' (joblib),
    'ray' or 'dask' (sim.backends; the same ranked top on each)."""
    import pandas  # the table library notebooks expect; only the API needs it

    result, commands = run_plan(model, gpus, topology, global_batch_size, seq_length,
                                max_memory_gb, top, space, costs, n_jobs, backend, dtype)
    frame = pandas.DataFrame([{**candidate_row(c), "command": cmd}
                              for c, cmd in zip(result.candidates, commands)])
    frame.attrs["funnel"] = funnel(result)
    return frame
