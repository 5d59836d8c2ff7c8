"""Where host copies go: each GPU's host CPU node and the PCIe path to it.

COPY_D2H / COPY_H2D ops (ZeRO-Offload's gradients and parameters, ZeRO-R Pa+cpu's
checkpoint partitions) are transfers between a rank's GPU and its host CPU (`host{h}`,
topologies.graph) through the network seam, so they share the GPU's PCIe link with
anything else on it; sim.simulate adds host links whenever the lowered schedule has a
copy. Topologies built from node kinds (topologies.nodes) carry the host CPU and its PCIe
links; a graph without them (e.g. the single-switch preset 'dgx-h100') gets, in a copy, a
host CPU per host linked to each of its GPUs by one x16 PCIe link of the node kind whose
GPU matches (Gen5 for H100/H200, Gen4 for A100; Gen4 if none matches), 1 us latency, and
a warning saying so.
Units: bytes/s per direction, seconds.
"""
from __future__ import annotations

import networkx as nx

from clustersim.topologies import NODE_KINDS, canonical_device_name, gpu_nodes
from clustersim.topologies.nodes import PCIE_GEN4_X16, add_link

from .link_capacity import PCIE_EFFICIENCY

PCIE_LATENCY = 1e-6


def host_cpus(devices: list[str], topology: nx.DiGraph) -> list[str] | None:
    """The host CPU node (`host{h}`) of each GPU, or None when the topology has none."""
    hosts = []
    for gpu in devices:
        cpu = f"host{topology.nodes[gpu]['host']}"
        if cpu not in topology or topology.nodes[cpu].get("type") != "host":
            return None
        hosts.append(cpu)
    return hosts


def pcie_rate(device: str) -> float:
    """PCIe x16 bytes/s per direction of the node kind carrying `device` GPUs."""
    name = canonical_device_name(device)
    rates = [kind.pcie_bandwidth for kind in NODE_KINDS.values()
             if canonical_device_name(kind.device) == name]
    return rates[0] if rates else PCIE_GEN4_X16


def with_host_links(topology: nx.DiGraph) -> tuple[nx.DiGraph, str | None]:
    """(`topology`, None) when every GPU's host CPU is there, else a copy with host CPUs
    and PCIe links added (module docstring) and a warning naming the assumption."""
    gpus = gpu_nodes(topology)
    if host_cpus(gpus, topology) is not None:
        return topology, None
    graph = topology.copy()
    rates = set()
    for gpu in gpus:
        host = graph.nodes[gpu]["host"]
        cpu = f"host{host}"
        if cpu not in graph:
            graph.add_node(cpu, type="host", host=host)
        rate = pcie_rate(graph.nodes[gpu]["device"])
        rates.add(rate)
        add_link(graph, gpu, cpu, rate, PCIE_LATENCY, "pcie")
    warning = (f"topology {topology.graph.get('name', '?')!r} has no host CPU nodes: host "
               f"copies use an assumed x16 PCIe link per GPU to its host CPU "
               f"({', '.join(f'{r / 1e9:.0f} GB/s' for r in sorted(rates))} per direction, "
               f"{PCIE_EFFICIENCY:.0%} of it achievable: sim.link_capacity)")
    return graph, warning
