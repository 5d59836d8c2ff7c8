"""The one transfer seam: `Network.transfer(src, dst, nbytes)` returns a SimPy event that
fires when the bytes have arrived. Fidelity changes here and only here.

- `LinkNetwork`: route through the topology graph; time = sum of per-hop latencies +
  nbytes / bottleneck bandwidth (s, bytes, bytes/s). No contention yet (flows come next).
- `InstantNetwork`: every transfer takes zero time (used with `--uniform-costs`).
"""
from __future__ import annotations

from typing import Protocol

import networkx as nx
import simpy

from topologies import path_bandwidth, path_latency, route


class Network(Protocol):
    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event: ...


class InstantNetwork:
    def __init__(self, env: simpy.Environment):
        self.env = env

    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event:
        return self.env.timeout(0)


class LinkNetwork:
    """Latency + bytes / bandwidth along the shortest route; routes are cached."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph):
        self.env, self.graph = env, graph
        self._paths: dict[tuple[str, str], tuple[float, float]] = {}

    def transfer_time(self, src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        cached = self._paths.get((src, dst))
        if cached is None:
            path = route(self.graph, src, dst)
            cached = self._paths[(src, dst)] = (
                path_latency(self.graph, path), path_bandwidth(self.graph, path))
        latency, bandwidth = cached
        return latency + nbytes / bandwidth

    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event:
        return self.env.timeout(self.transfer_time(src, dst, nbytes))
