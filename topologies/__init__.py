"""WHERE it runs: GPU device specs, the topology graph schema and builders (networkx
DiGraph; bandwidth in bytes/s per direction, latency in s), and named cluster presets.

Imports networkx and the standard library only; knows nothing of schedules or sim.
"""
from .devices import DEVICES, DeviceSpec, canonical_device_name, get_device
from .errors import TopologyError
from .graph import (
    BUILDERS,
    NODE_TYPES,
    device_of,
    gpu_nodes,
    path_bandwidth,
    path_latency,
    route,
    single_node,
    validate_topology,
)
from .presets import list_presets, load_topology, topology_from_dict, topology_to_dict

__all__ = [
    "BUILDERS", "DEVICES", "NODE_TYPES", "DeviceSpec", "TopologyError",
    "canonical_device_name", "device_of", "get_device", "gpu_nodes", "list_presets",
    "load_topology", "path_bandwidth", "path_latency", "route", "single_node",
    "topology_from_dict", "topology_to_dict", "validate_topology",
]
