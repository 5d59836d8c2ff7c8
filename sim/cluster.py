"""The cluster facts a Plan needs (schedules.cluster_facts), read off a topology graph:
its GPUs in rank order, the host of each, and the device of its GPUs."""
from __future__ import annotations

import networkx as nx

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.topologies import device_of, gpu_nodes, host_of


def cluster_facts(topology: nx.DiGraph) -> ClusterFacts:
    gpus = tuple(gpu_nodes(topology))
    device = device_of(topology, gpus[0])
    return ClusterFacts(name=topology.graph.get("name", "custom"), gpus=gpus,
                        hosts=tuple(host_of(topology, g) for g in gpus), device=device.name,
                        memory_bytes=device.memory_bytes)
