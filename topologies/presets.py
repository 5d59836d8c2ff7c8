"""Named cluster presets (JSON data files in `topologies/presets/`) and user topology files.

A topology file is one JSON object in either of two forms.

Builder form (all presets use it): the graph comes from a builder in `graph.BUILDERS`
called with `params` as keyword arguments; `name` names the graph. Builders and params:
- "single_node": device, num_gpus=8, bandwidth=None, latency=1e-6, kind="nvlink"
  (GPUs on one NVSwitch only; `graph.single_node`);
- "node": kind="dgx-h100", nics=false, nvlink_latency, pcie_latency (one host with its
  host CPU and PCIe links; kinds in `nodes.NODE_KINDS`, e.g. "hgx-h100", "pcie-a100");
- "fat_tree": node_kind, num_nodes, network="ndr", nodes_per_leaf=4, num_spines=null,
  oversubscription=1, nvlink_latency, pcie_latency, network_latency,
  in_network_reduction=false (InfiniBand SHARP, which NCCL's CollNet uses);
- "rail_optimized": as fat_tree but nodes_per_group=null instead of nodes_per_leaf
  (networks in `clusters.NETWORKS`: "hdr", "ndr", "roce-400g", ...);
- "fat_tree_3tier": node_kind, num_nodes, network="ndr", nodes_per_pod=8,
  nodes_per_leaf=4, rails=false, num_spines=null (per pod), cores_per_plane=null,
  leaf_oversubscription=1, pod_oversubscription=1, nvlink_latency, pcie_latency,
  network_latency: leaves, pods of spines and a core tier joining the pods, with rail
  leaves inside a pod when rails=true (`clusters.fat_tree_3tier`; presets
  "llama3-24k-roce", "dgx-superpod-h100-4su", "dgx-superpod-h100-16su")::

    {"name": "dgx-h100", "description": "...", "builder": "single_node",
     "params": {"device": "h100-sxm", "num_gpus": 8, "latency": 1e-06}}
    {"name": "dgx-h100-x16-ndr", "description": "...", "builder": "rail_optimized",
     "params": {"node_kind": "dgx-h100", "num_nodes": 16, "network": "ndr"}}

Explicit form: every node and directed edge listed (one edge per direction of a link).
Node fields other than `id` become node attributes; edge fields other than `src`/`dst`
become edge attributes. `num_nodes` and `gpus_per_node` are optional (derived from the
gpus' `host` fields), so is `fabric`; device names may be aliases ('h100') and are stored
canonical::

    {"name": "my-box", "description": "...",
     "nodes": [{"id": "gpu0", "type": "gpu", "device": "h100-sxm", "index": 0, "host": 0},
               {"id": "nvswitch0", "type": "switch"}, ...],
     "edges": [{"src": "gpu0", "dst": "nvswitch0", "bandwidth": 4.5e11,
                "latency": 1e-06, "kind": "nvlink"}, ...]}

Units as in the graph schema (`topologies.graph`): bandwidth bytes/s per direction,
latency seconds. Every loaded graph is checked with `validate_topology`.

Checks on reading, each failure one TopologyError naming the file, the field and the
rule: a UTF-8 JSON file of at most MAX_TOPOLOGY_BYTES (128 MiB; the explicit form of the
largest graph a builder makes, 65,536 GPUs, is 73 MiB, 103 MiB indented) nested at most
64 deep (`clustersim.user_files`); `name` and `description` strings; `builder` a string
naming a builder; `params` an object whose values have the types of the builder's
signature (int; float: finite; bool; str; null where the default is None), checked before
the builder runs; the builders' and the schema's size limits (MAX_GPUS GPUs,
`topologies.clusters.MAX_LEAF_SPINE_LINKS` leaf-spine and spine-core links).
"""
from __future__ import annotations

import inspect
import json
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import networkx as nx

from clustersim.user_files import is_finite_number, parse_json, read_text, short_repr

from .devices import canonical_device_name
from .errors import TopologyError
from .graph import BUILDERS, node_text, validate_topology

_TOP_LEVEL_KEYS = {"name", "description", "builder", "params", "nodes", "edges",
                   "num_nodes", "gpus_per_node", "fabric"}
MAX_TOPOLOGY_BYTES = 128 * 1024 * 1024  # bytes read at most (module docstring)
# What a builder's parameter annotation accepts from JSON, and how messages name it.
_PARAM_TYPES: dict[Any, tuple[str, Any]] = {
    bool: ("a boolean (true or false)", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a finite number", is_finite_number),
    str: ("a string", lambda v: isinstance(v, str)),
    type(None): ("null", lambda v: v is None),
}


def _preset_dir():
    return resources.files(__package__).joinpath("presets")


def list_presets() -> list[str]:
    """Names of the bundled presets, sorted (e.g. 'dgx-a100', 'dgx-h100-x16-ndr', 'selene-a100')."""
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".json"))


def _preset_text(name: str) -> tuple[str, str] | None:
    """(canonical name, JSON text) of the bundled preset `name` (case-insensitive), or
    None when there is no such preset."""
    key = str(name).strip().lower()
    if key not in list_presets():
        return None
    return key, _preset_dir().joinpath(f"{key}.json").read_text(encoding="utf-8")


def preset_description(name: str) -> str:
    """A bundled preset's `description`, read without building its graph (the largest,
    24,576 GPUs, takes seconds to build)."""
    preset = _preset_text(name)
    if preset is None:
        raise TopologyError(f"unknown topology preset {short_repr(name)}; known presets: "
                            f"{', '.join(list_presets())}")
    return str(json.loads(preset[1]).get("description", ""))


def load_topology(name_or_path: str) -> nx.DiGraph:
    """Load a bundled preset by name (case-insensitive) or a user topology JSON file by path."""
    preset = _preset_text(name_or_path)
    if preset is not None:
        key, text = preset
        return _load_text(text, f"preset {key!r}", default_name=key)
    path = Path(name_or_path)
    looks_like_path = path.suffix == ".json" or len(path.parts) > 1
    if not path.exists() and not looks_like_path:
        raise TopologyError(
            f"unknown topology preset {short_repr(name_or_path)}; known presets: "
            f"{', '.join(list_presets())} (or give the path of a topology .json file)"
        )
    source = f"topology file {str(path)!r}"
    text = read_text(path, source, TopologyError, MAX_TOPOLOGY_BYTES)
    return _load_text(text, source, default_name=path.stem)


def _load_text(text: str, source: str, default_name: str) -> nx.DiGraph:
    spec = parse_json(text, source, TopologyError)
    try:
        return topology_from_dict(spec, default_name=default_name)
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from exc


def topology_from_dict(spec: Any, default_name: str = "topology") -> nx.DiGraph:
    """Build and validate a graph from a parsed topology file (either form, see module doc)."""
    if not isinstance(spec, dict):
        raise TopologyError(f"top level must be a JSON object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - _TOP_LEVEL_KEYS)
    if unknown:
        raise TopologyError(f"unknown field(s) {unknown}; allowed: {', '.join(sorted(_TOP_LEVEL_KEYS))}")
    has_builder, has_lists = "builder" in spec, "nodes" in spec or "edges" in spec
    if has_builder == has_lists:
        raise TopologyError("give either 'builder' (+ 'params') or 'nodes' + 'edges', not both or neither")
    for field in ("name", "description"):
        if field in spec and not isinstance(spec[field], str):
            raise TopologyError(f"{field} must be a string, got {short_repr(spec[field])}")
    name = spec.get("name", default_name)
    graph = _from_builder(spec, name) if has_builder else _from_lists(spec, name)
    if "description" in spec:
        graph.graph["description"] = spec["description"]
    if not has_builder:  # a builder returns a validated graph (topologies.graph)
        validate_topology(graph)
    return graph


def _from_builder(spec: dict, name: str) -> nx.DiGraph:
    key = spec["builder"]
    builder = BUILDERS.get(key) if isinstance(key, str) else None
    if builder is None:
        raise TopologyError(
            f"builder must be one of {', '.join(sorted(BUILDERS))}, got {short_repr(key)}"
        )
    params = spec.get("params", {})
    if not isinstance(params, dict):
        raise TopologyError(f"params must be a JSON object, got {type(params).__name__}")
    accepted = inspect.signature(builder).parameters
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise TopologyError(
            f"params {short_repr(unknown)} not accepted by builder {key!r}; "
            f"it takes: {', '.join(accepted)}"
        )
    _check_param_types(key, builder, params)
    if "name" in accepted and "name" not in params:
        params = {**params, "name": name}
    try:
        return builder(**params)
    except TypeError as exc:  # e.g. a required parameter left out
        raise TopologyError(f"builder {key!r}: {exc}") from exc


def _check_param_types(key: str, builder: Any, params: dict) -> None:
    """Each param has a type its annotation allows (`_PARAM_TYPES`; others unchecked)."""
    hints = typing.get_type_hints(builder)
    for param, value in params.items():
        hint = hints.get(param)
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if not all(t in _PARAM_TYPES for t in allowed):
            continue  # a type this check does not know: the builder checks it
        if not any(_PARAM_TYPES[t][1](value) for t in allowed):
            expected = " or ".join(_PARAM_TYPES[t][0] for t in allowed)
            raise TopologyError(f"builder {key!r}: param {param!r} must be {expected}, got "
                                f"{short_repr(value)}")


def _from_lists(spec: dict, name: str) -> nx.DiGraph:
    nodes, edges = spec.get("nodes"), spec.get("edges")
    for field, value in (("nodes", nodes), ("edges", edges)):
        if not isinstance(value, list):
            raise TopologyError(f"{field} must be a JSON list, got {type(value).__name__}")
    graph = nx.DiGraph(name=name)
    for i, entry in enumerate(nodes):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise TopologyError(f"nodes[{i}]: must be an object with a string 'id', got {short_repr(entry)}")
        node, attrs = entry["id"], {k: v for k, v in entry.items() if k != "id"}
        if node in graph:
            raise TopologyError(f"nodes[{i}]: duplicate node id {short_repr(node)}")
        if attrs.get("type") == "gpu" and isinstance(attrs.get("device"), str):
            try:
                attrs["device"] = canonical_device_name(attrs["device"])
            except TopologyError as exc:
                raise TopologyError(f"node {short_repr(node)}: device: {exc}") from exc
        graph.add_node(node, **attrs)
    for i, entry in enumerate(edges):
        if not isinstance(entry, dict):
            raise TopologyError(f"edges[{i}]: must be an object, got {short_repr(entry)}")
        src, dst = entry.get("src"), entry.get("dst")
        for end, node in (("src", src), ("dst", dst)):
            if not isinstance(node, str) or node not in graph:
                raise TopologyError(f"edge {node_text(src)}->{node_text(dst)}: {end} {short_repr(node)} is not a declared node")
        if graph.has_edge(src, dst):
            raise TopologyError(f"edge {node_text(src)}->{node_text(dst)}: declared twice")
        graph.add_edge(src, dst, **{k: v for k, v in entry.items() if k not in ("src", "dst")})
    hosts: dict[int, int] = {}  # GPUs per host; a host that is not an int fails validation
    for _, attrs in graph.nodes(data=True):
        host = attrs.get("host")
        if attrs.get("type") == "gpu" and isinstance(host, int) and not isinstance(host, bool):
            hosts[host] = hosts.get(host, 0) + 1
    graph.graph["num_nodes"] = spec.get("num_nodes", max(hosts, default=0) + 1)
    graph.graph["gpus_per_node"] = spec.get("gpus_per_node", max(hosts.values(), default=1))
    if "fabric" in spec:
        graph.graph["fabric"] = spec["fabric"]
    return graph


def topology_to_dict(graph: nx.DiGraph) -> dict:
    """The explicit-form file dict of `graph` (JSON-serialisable; loads back equal)."""
    out = {k: graph.graph[k] for k in ("name", "description", "num_nodes", "gpus_per_node", "fabric")
           if k in graph.graph}
    out["nodes"] = [{"id": n, **a} for n, a in graph.nodes(data=True)]
    out["edges"] = [{"src": u, "dst": v, **a} for u, v, a in graph.edges(data=True)]
    return out
