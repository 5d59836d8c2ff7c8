"""The cluster facts a Plan needs (schedules.cluster_facts), read off a topology graph:
its GPUs in rank order, the host of each, and the device of its GPUs. A job placed on some
of the topology's GPUs (sim.shared_fabric) gets those GPUs, in the order given, as its
cluster: its rank g runs on the g-th of them."""
from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.topologies import device_of, gpu_nodes, host_of


def cluster_facts(topology: nx.DiGraph, gpus: Sequence[str] | None = None) -> ClusterFacts:
    """The facts of `topology`, or of its GPU nodes `gpus` (default: all, in index order)."""
    gpus = tuple(gpu_nodes(topology) if gpus is None else gpus)
    device = device_of(topology, gpus[0])
    return ClusterFacts(name=topology.graph.get("name", "custom"), gpus=gpus,
                        hosts=tuple(host_of(topology, g) for g in gpus), device=device.name,
                        memory_bytes=device.memory_bytes)
