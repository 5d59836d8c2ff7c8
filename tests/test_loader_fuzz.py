"""Property: every loader of a user file (torch CSV, profile, topology, Timeline) either
returns a valid object or raises a ClustersimError / TopologyError (one line), whatever
the bytes or JSON values (issue 15). Never another exception, a hang or runaway memory.

Inputs: random bytes; CSV-like text over the action alphabet; random JSON values; and
valid files with one field replaced by a random JSON value (reaches the deep checks).
"""
import json
import math

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ClustersimError
from clustersim.schedules.profile import Profile
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.torch_csv import read_torch_csv
from clustersim.topologies import TopologyError, load_topology, validate_topology

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
KEYS = ["builder", "params", "name", "nodes", "edges", "id", "type", "device", "index", "host",
        "src", "dst", "bandwidth", "latency", "kind", "num_gpus", "num_nodes", "num_spines",
        "nics", "spans", "rank", "lane", "op", "start", "end", "info", "memory", "compute",
        "p2p", "alpha", "beta", "points", "collectives", "all_reduce", "layer", "F", "2", "x"]
SCALARS = (st.none() | st.booleans()
           | st.integers(-3, 40) | st.sampled_from([10**5, 10**7, 2**63, 10**400, -10**400])
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from(["", "h100", "gpu", "gpu0", "switch", "nvlink", "0F0", "1B1",
                              "single_node", "fat_tree", "node", "rail_optimized", "compute",
                              "dgx-h100", "ndr", "\u00b2", "\x00"])
           | st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner,
                                      max_size=5), max_leaves=12)


def valid_docs() -> dict:
    """One valid JSON document per JSON loader, to mutate."""
    part = {"F": 1e-3, "B": 2e-3, "I": 1e-3, "W": 1e-3}
    profile = {"device": "cpu", "compute": {p: dict(part) for p in ("layer", "embedding", "head")},
               "p2p": {"alpha": 1e-5, "beta": 1e-10, "points": [[1024, 1.1e-5]]},
               "collectives": {"all_reduce": {"2": {"alpha": 2e-5, "beta": 2e-10}}}}
    topologies = [
        {"name": "t", "builder": "single_node", "params": {"device": "h100", "num_gpus": 2}},
        {"name": "t", "builder": "fat_tree", "params": {"node_kind": "dgx-h100", "num_nodes": 2,
                                                        "nodes_per_leaf": 1, "num_spines": 2}},
        {"name": "t", "builder": "node", "params": {"kind": "pcie-a100", "nics": True}},
        {"name": "t", "nodes": [{"id": f"gpu{i}", "type": "gpu", "device": "h100", "index": i,
                                 "host": 0} for i in range(2)] + [{"id": "s", "type": "switch"}],
         "edges": [{"src": a, "dst": b, "bandwidth": 1e9, "latency": 1e-6, "kind": "nvlink"}
                   for a, b in (("gpu0", "s"), ("s", "gpu0"), ("gpu1", "s"), ("s", "gpu1"))]},
    ]
    timeline = {"source": "sim", "meta": {"plan": {"pp": 2}},
                "spans": [{"rank": 0, "lane": "compute", "op": "0F0", "start": 0.0, "end": 1.0,
                           "nbytes": 0, "flops": 1.0},
                          {"rank": 1, "lane": "recv", "op": "1RECV_F0", "start": 0.5,
                           "end": 1.0, "nbytes": 64, "flops": 0.0, "group": "pp",
                           "info": {"peer": 0}}],
                "memory": [[0, 0.0, 10]]}
    return {"profile": [profile], "topology": topologies, "timeline": [timeline]}


DOCS = valid_docs()


def check_result(kind: str, result) -> None:
    """A loader's return value is a valid object of its kind."""
    if kind == "csv":
        assert isinstance(result, Schedule) and result.num_ranks >= 1
    elif kind == "profile":
        assert isinstance(result, Profile)
        assert all(math.isfinite(result.compute_time(p, k)) for p in result.compute
                   for k in ("F", "B", "I", "W"))
    elif kind == "topology":
        assert isinstance(result, nx.DiGraph)
        validate_topology(result)
    else:
        assert isinstance(result, Timeline) and result.spans
        assert math.isfinite(result.iteration_time) and result.iteration_time >= 0
        result.metrics()


LOADERS = {"csv": read_torch_csv, "profile": Profile.load, "topology": load_topology,
           "timeline": Timeline.load}


def load(kind: str, folder, data: bytes) -> None:
    """Write `data`, load it with loader `kind`: a valid result or one typed error line."""
    path = folder / ("input.csv" if kind == "csv" else "input.json")
    path.write_bytes(data)
    try:
        result = LOADERS[kind](str(path))
    except (ClustersimError, TopologyError) as exc:
        assert "\n" not in str(exc), str(exc)
        return
    check_result(kind, result)


def mutate(doc, path: list[int], value):
    """`doc` with the node reached by following `path` (indices into each level's keys or
    items, modulo their count) replaced by `value`."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    if isinstance(doc, dict):
        key = sorted(doc)[path[0] % len(doc)]
        return {**doc, key: mutate(doc[key], path[1:], value)}
    i = path[0] % len(doc)
    return doc[:i] + [mutate(doc[i], path[1:], value)] + doc[i + 1:]


KINDS = st.sampled_from(sorted(LOADERS))


@SETTINGS
@given(kind=KINDS, data=st.binary(max_size=300))
def test_random_bytes(tmp_path, kind, data):
    load(kind, tmp_path, data)


CSV_TEXT = st.text(alphabet="0123456789FBIWSEND_RECVUNSHARDOVERLAP(;),\r\n \t\"\u0663\u00b2",
                   max_size=120)


@SETTINGS
@given(text=CSV_TEXT)
def test_csv_like_text(tmp_path, text):
    load("csv", tmp_path, text.encode())


@SETTINGS
@given(actions=st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from("FBIW"),
                                           st.integers(0, 4)), max_size=10), min_size=1,
                        max_size=4))
def test_csv_of_actions(tmp_path, actions):
    rows = [",".join(f"{s}{k}{m}" for s, k, m in row) for row in actions]
    load("csv", tmp_path, "\n".join(rows).encode())


@SETTINGS
@given(kind=st.sampled_from(["profile", "topology", "timeline"]), value=JSON)
def test_random_json(tmp_path, kind, value):
    load(kind, tmp_path, json.dumps(value).encode())


@settings(SETTINGS, max_examples=150)
@given(kind=st.sampled_from(["profile", "topology", "timeline"]), which=st.integers(0, 3),
       path=st.lists(st.integers(0, 50), max_size=6), value=JSON)
def test_valid_file_with_one_field_replaced(tmp_path, kind, which, path, value):
    doc = DOCS[kind][which % len(DOCS[kind])]
    load(kind, tmp_path, json.dumps(mutate(doc, path, value)).encode())


def test_the_documents_mutated_are_valid(tmp_path):
    for kind, docs in DOCS.items():
        for doc in docs:
            path = tmp_path / "doc.json"
            path.write_text(json.dumps(doc))
            check_result(kind, LOADERS[kind](str(path)))
