"""WHERE it runs: GPU device specs, the topology graph schema and builders (networkx
DiGraph; bandwidth in bytes/s per direction, latency in s): single hosts, fat-tree and
rail-optimized clusters, equal-cost routes, and named cluster presets.

Imports networkx and the standard library only; knows nothing of schedules or sim. To
add a builder: docs/architecture.md, "Add a topology builder".
"""
from .devices import DEVICES, DeviceSpec, canonical_device_name, get_device
from .errors import TopologyError
from .graph import BUILDERS, FABRICS, NODE_TYPES, device_of, gpu_nodes, single_node, validate_topology
from .routing import host_of, path_bandwidth, path_latency, route, routes, same_host
from .nodes import NODE_KINDS, NodeKind, add_host, get_node_kind, node
from .clusters import NETWORKS, NetworkSpec, fat_tree, get_network, rail_optimized
from .presets import (list_presets, load_topology, preset_description, topology_from_dict,
                      topology_to_dict)

__all__ = [
    "BUILDERS", "DEVICES", "FABRICS", "NETWORKS", "NODE_KINDS", "NODE_TYPES", "DeviceSpec",
    "NetworkSpec", "NodeKind", "TopologyError", "add_host", "canonical_device_name",
    "device_of", "fat_tree", "get_device", "get_network", "get_node_kind", "gpu_nodes",
    "host_of", "list_presets", "load_topology", "node", "path_bandwidth", "path_latency",
    "preset_description",
    "rail_optimized", "route", "routes", "same_host", "single_node", "topology_from_dict",
    "topology_to_dict", "validate_topology",
]
