"""Bad files handed to the loaders (issue 15): each case ends in one error line naming the
file, the row/cell/field and the rule, never a traceback, a hang or runaway memory.

Loaders: the torch CSV (`--schedule-csv`), the calibration profile (`--profile`), topology
JSON (`--topology`) and Timeline JSON (`compare A B`).
"""
import json
import os
import time

import pytest

from clustersim.schedules.errors import ConfigError, ScheduleFormatError
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.profile import MAX_PROFILE_BYTES, Profile
from clustersim.schedules.timeline import MemorySample, Span, Timeline
from clustersim.schedules.torch_csv import MAX_CSV_BYTES, MAX_RANKS, from_torch_csv, read_torch_csv
from clustersim.topologies import (TopologyError, fat_tree, load_topology, rail_optimized,
                                   single_node)
from clustersim.topologies.clusters import MAX_LEAF_SPINE_LINKS
from clustersim.topologies.graph import MAX_GPUS
from clustersim.topologies.presets import MAX_TOPOLOGY_BYTES
from clustersim.user_files import MAX_FILE_BYTES

# (name, loader of a path, error class, size limit in bytes, what a message calls the file)
LOADERS = {
    "csv": (read_torch_csv, ScheduleFormatError, MAX_CSV_BYTES, "torch CSV"),
    "profile": (Profile.load, ConfigError, MAX_PROFILE_BYTES, "profile"),
    "topology": (load_topology, TopologyError, MAX_TOPOLOGY_BYTES, "topology file"),
    "timeline": (Timeline.load, ConfigError, MAX_FILE_BYTES, "timeline"),
}
JSON_LOADERS = ["profile", "topology", "timeline"]
SUFFIX = {"csv": ".csv", "profile": ".json", "topology": ".json", "timeline": ".json"}


def error_line(error, call, *args, **kwargs) -> str:
    """The message `call(*args)` raises as `error`, checked to be one line."""
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600, message
    return message


def load_error(kind: str, path) -> str:
    """The one-line error of loader `kind` on `path`; it names the file."""
    loader, error, _, what = LOADERS[kind]
    message = error_line(error, loader, str(path))
    assert what in message and os.path.basename(str(path)) in message, message
    return message


def write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# ------------------------------------------------------------------ every loader, any file

@pytest.mark.parametrize("kind", LOADERS)
def test_non_utf8_or_binary_file(kind, tmp_path):
    path = write(tmp_path, f"binary{SUFFIX[kind]}", b"0F0,\xff\xfe\x00\x89PNG")
    assert "not UTF-8 text (byte 0xff at offset 4)" in load_error(kind, path)
    path = write(tmp_path, f"nul{SUFFIX[kind]}", b"0F0\x00")
    assert "NUL character at offset 3" in load_error(kind, path)


@pytest.mark.parametrize("kind", LOADERS)
def test_empty_file(kind, tmp_path):
    message = load_error(kind, write(tmp_path, f"empty{SUFFIX[kind]}", ""))
    assert "empty" in message and "rule" in message


@pytest.mark.parametrize("kind", LOADERS)
def test_directory_as_the_path(kind, tmp_path):
    folder = tmp_path / f"folder{SUFFIX[kind]}"
    folder.mkdir()
    assert "is a directory; rule: give the path of a file" in load_error(kind, folder)


@pytest.mark.parametrize("kind", LOADERS)
def test_missing_file(kind, tmp_path):
    message = load_error(kind, tmp_path / f"missing{SUFFIX[kind]}")
    assert message.startswith("cannot read") and "No such file or directory" in message


@pytest.mark.parametrize("kind", LOADERS)
def test_file_over_the_size_limit_is_not_read(kind, tmp_path):
    limit = LOADERS[kind][2]
    path = tmp_path / f"huge{SUFFIX[kind]}"
    with open(path, "wb") as f:  # sparse: costs no disk, and must not be read
        f.truncate(limit + 1)
    message = load_error(kind, path)
    assert f"larger than {limit // 2**20} MiB" in message and "rule" in message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("kind", LOADERS)
def test_named_pipe_is_refused_without_blocking(kind, tmp_path):
    path = tmp_path / f"pipe{SUFFIX[kind]}"
    os.mkfifo(path)  # opening it for reading would block until a writer comes
    assert "not a regular file" in load_error(kind, path)


@pytest.mark.parametrize("kind", JSON_LOADERS)
@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,  # RecursionError in json
                                  '{"a": ' * 65 + "1" + "}" * 65])  # parses; too deep
def test_deeply_nested_json(kind, text, tmp_path):
    message = load_error(kind, write(tmp_path, f"deep{SUFFIX[kind]}", text))
    assert "JSON nested deeper than 64 levels; rule: at most 64" in message


@pytest.mark.parametrize("kind", JSON_LOADERS)
def test_invalid_json_names_line_and_column(kind, tmp_path):
    message = load_error(kind, write(tmp_path, f"bad{SUFFIX[kind]}", '{\n  "a": [1,]}'))
    assert "not valid JSON (invalid JSON at line 2 column 11: Expecting value)" in message


@pytest.mark.parametrize("kind", JSON_LOADERS)
def test_number_over_the_digit_limit(kind, tmp_path):
    message = load_error(kind, write(tmp_path, f"digits{SUFFIX[kind]}", "[" + "9" * 5000 + "]"))
    assert "not valid JSON (Exceeds the limit (4300 digits)" in message and "rule" in message


# ------------------------------------------------------------------ torch CSV

def test_csv_huge_stage_index_is_refused_at_its_cell_without_building(tmp_path):
    path = write(tmp_path, "huge.csv", "1000000000F0\n")
    message = load_error("csv", path)
    assert "row 1 (rank 0), column 1, cell '1000000000F0': stage index of 10 digits out of " \
           "range; rule: at most 9 digits" in message
    start = time.perf_counter()
    message = error_line(ScheduleFormatError, from_torch_csv, "999999999F0,999999999B0\n")
    assert "stage 0 appears in no row, yet stage 999999999 does" in message
    message = error_line(ScheduleFormatError, from_torch_csv, "0F999999999,0B999999999\n")
    assert "microbatch 0 appears in no cell, yet microbatch 999999999 does (row 1 (rank 0), " \
           "column 1, cell '0F999999999')" in message
    assert time.perf_counter() - start < 1.0  # nothing was built over range(1e9)


def test_csv_extra_microbatch_on_one_rank_names_the_rank_and_cell(tmp_path):
    rank0 = ",".join(f"0F{m},0B{m}" for m in range(8))
    rank1 = ",".join(f"1F{m},1B{m}" for m in range(9))  # 1F8, 1B8: microbatch 8 too many
    message = load_error("csv", write(tmp_path, "extra.csv", f"{rank0}\n{rank1}\n"))
    assert "row 2 (rank 1), column 17, cell '1F8': microbatch 8, but stage 0 (row 1, rank 0) " \
           "has no action for microbatch 8; rule: every stage runs every microbatch 0..8" in message


def test_csv_indices_are_ascii_digits():
    message = error_line(ScheduleFormatError, from_torch_csv, "\u0663F0\n")  # Arabic-Indic 3
    assert "row 1 (rank 0), column 1" in message and "not a torch action" in message


def test_csv_rows_are_bounded():
    message = error_line(ScheduleFormatError, from_torch_csv, "\n" * (MAX_RANKS + 5))
    assert f"row {MAX_RANKS + 1}: more than {MAX_RANKS} rows" in message


def test_csv_nested_overlap_is_refused_not_recursed():
    cell = "(" * 5000 + "0F0" + ")OVERLAP_F_B" * 5000
    message = error_line(ScheduleFormatError, from_torch_csv, cell + "\n")
    assert "row 1 (rank 0), column 1" in message and "rule" in message


def test_csv_field_over_the_csv_limit_names_the_line():
    message = error_line(ScheduleFormatError, from_torch_csv, "0F0\n" + '"' + "x" * 200_000)
    assert "not valid CSV (line 2)" in message


# ------------------------------------------------------------------ profile

def valid_profile() -> dict:
    part = {"F": 1e-3, "B": 2e-3, "I": 1e-3, "W": 1e-3}
    return {"device": "cpu", "compute": {p: dict(part) for p in ("layer", "embedding", "head")},
            "p2p": {"alpha": 1e-5, "beta": 1e-10, "points": [[1024, 1.1e-5]]},
            "collectives": {"all_reduce": {"2": {"alpha": 2e-5, "beta": 2e-10}}}}


def test_valid_profile_loads(tmp_path):
    profile = Profile.load(write(tmp_path, "ok.json", valid_profile()))
    assert profile.collective("all_reduce", 2).alpha == 2e-5


@pytest.mark.parametrize("size", ["\u00b2", "\u0663", "0", "-2", "2.0", " 2", "1" * 5000,
                                  str(2**20 + 1)])
def test_profile_group_size_is_strict_ascii_digits(size, tmp_path):
    data = valid_profile()
    data["collectives"]["all_reduce"] = {size: {"alpha": 1e-5, "beta": 1e-10}}
    message = load_error("profile", write(tmp_path, "p.json", data))
    assert "profile field collectives.all_reduce: group size" in message
    assert "must be an integer 1..1048576 in ASCII digits" in message


@pytest.mark.parametrize("field,value,rule", [
    ("compute.layer.F", 1e308, "<= 1e+06"),
    ("compute.head.W", float("inf"), "finite"),
    ("compute.embedding.B", float("nan"), "finite"),
    ("compute.layer.I", -1.0, ">= 0"),
    ("compute.layer.F", 10**400, "finite"),
    ("compute.layer.F", True, "finite number of seconds"),
    ("p2p.alpha", 2e6, "<= 1e+06"),
    ("p2p.beta", float("inf"), "s/byte"),
    ("collectives.all_reduce.2.alpha", float("-inf"), "finite"),
])
def test_profile_times_are_finite_non_negative_and_bounded(field, value, rule, tmp_path):
    data = valid_profile()
    *parents, last = field.split(".")
    table = data
    for key in parents:
        table = table[key]
    table[last] = value
    message = load_error("profile", write(tmp_path, "p.json", data))
    assert f"profile field {field} must be a finite number" in message and rule in message


@pytest.mark.parametrize("point,field", [([1e16, 1e-3], "points[0] bytes"),
                                         ([1024, 1e300], "points[0] seconds")])
def test_profile_points_are_bounded(point, field, tmp_path):
    data = valid_profile()
    data["p2p"]["points"] = [point]
    assert f"profile field p2p.{field} must be a finite number" in \
        load_error("profile", write(tmp_path, "p.json", data))


# ------------------------------------------------------------------ topology

def topology_error(tmp_path, spec) -> str:
    return load_error("topology", write(tmp_path, "topo.json", spec))


@pytest.mark.parametrize("builder", [["single_node"], {"a": 1}, 5, None])
def test_topology_builder_must_be_a_string(builder, tmp_path):
    message = topology_error(tmp_path, {"builder": builder})
    assert ("builder must be one of fat_tree, fat_tree_3tier, node, rail_optimized, "
            "single_node, got") in message


@pytest.mark.parametrize("builder,param,value,expected", [
    ("node", "nics", "yes", "a boolean (true or false)"),
    ("node", "kind", 5, "a string"),
    ("single_node", "num_gpus", 8.0, "an integer"),
    ("single_node", "num_gpus", True, "an integer"),
    ("single_node", "bandwidth", "fast", "a finite number or null"),
    ("single_node", "latency", float("nan"), "a finite number"),
    ("fat_tree", "oversubscription", 10**400, "a finite number"),
    ("fat_tree", "num_spines", [4], "an integer or null"),
    ("rail_optimized", "name", {"x": 1}, "a string or null"),
])
def test_topology_param_types(builder, param, value, expected, tmp_path):
    params = {"device": "h100"} if builder == "single_node" else {}
    message = topology_error(tmp_path, {"builder": builder, "params": {**params, param: value}})
    assert f"builder {builder!r}: param {param!r} must be {expected}, got" in message


@pytest.mark.parametrize("builder,params,rule", [
    ("single_node", {"device": "h100", "num_gpus": 10**5}, "single_node: num_gpus: 100000 GPUs"),
    ("single_node", {"device": "h100", "num_gpus": 10**7}, "single_node: num_gpus: 10000000 GPUs"),
    ("fat_tree", {"num_nodes": 10**5}, "fat_tree: num_nodes=100000 x 8 GPUs of 'dgx-h100'"),
    ("rail_optimized", {"num_nodes": 10**5}, "rail_optimized: num_nodes=100000 x 8 GPUs"),
])
def test_topology_gpu_count_is_bounded_before_building(builder, params, rule, tmp_path):
    start = time.perf_counter()
    message = topology_error(tmp_path, {"builder": builder, "params": params})
    assert rule in message and f"over the limit of {MAX_GPUS} GPUs per topology" in message
    assert "MAX_GPUS" in message and time.perf_counter() - start < 1.0


@pytest.mark.parametrize("params,most", [
    ({"num_nodes": 16, "num_spines": 10**6}, MAX_LEAF_SPINE_LINKS // 4),
    ({"num_spines": 10**6}, MAX_LEAF_SPINE_LINKS // 2),  # one leaf: spines unused, still absurd
    ({"num_nodes": 8192, "nodes_per_leaf": 1, "num_spines": 17}, MAX_LEAF_SPINE_LINKS // 8192),
])
def test_topology_spine_count_is_bounded_before_building(params, most, tmp_path):
    start = time.perf_counter()
    message = topology_error(tmp_path, {"builder": "fat_tree", "params": params})
    assert f"fat_tree: num_spines must be at most {most}" in message
    assert "MAX_LEAF_SPINE_LINKS" in message and time.perf_counter() - start < 1.0


def test_builders_called_directly_check_sizes_first():
    with pytest.raises(TopologyError, match="over the limit of 65536 GPUs"):
        single_node("h100", MAX_GPUS + 1)
    with pytest.raises(TopologyError, match="num_spines must be at most"):
        rail_optimized("dgx-h100", 4, nodes_per_group=1, num_spines=MAX_LEAF_SPINE_LINKS)
    assert fat_tree("dgx-h100", 2, nodes_per_leaf=1, num_spines=12).number_of_nodes() > 0


@pytest.mark.parametrize("spec,rule", [
    ({"name": 5, "builder": "node"}, "name must be a string, got 5"),
    ({"description": ["x"], "builder": "node"}, "description must be a string"),
    ({"builder": "node", "params": ["kind"]}, "params must be a JSON object, got list"),
    ({"name": "x", "num_nodes": 10**9, "nodes": [], "edges": []},
     "num_nodes must be an integer 1..65536"),
    ({"name": "x", "edges": [], "nodes": [
        {"id": "gpu0", "type": "gpu", "device": "h100", "index": 0, "host": [1]}]},
     "node 'gpu0': host must be an integer"),
    ({"name": "x", "nodes": [{"id": "gpu0", "type": "gpu", "device": "h100", "index": 0,
                               "host": 0}, {"id": "s", "type": "switch"}],
      "edges": [{"src": "gpu0", "dst": "s", "bandwidth": 10**400, "latency": 0, "kind": "x"}]},
     "edge gpu0->s: bandwidth must be a positive number"),
    ([], "top level must be a JSON object, got list"),
])
def test_topology_fields_are_type_checked(spec, rule, tmp_path):
    assert rule in topology_error(tmp_path, spec)


# ------------------------------------------------------------------ timeline (compare)

def valid_timeline() -> dict:
    spans = [Span(0, "compute", Op(OpKind.F, 0, 0), 0.0, 1.0),
             Span(1, "p2p", Op(OpKind.RECV_F, 1, 0, group="pp", nbytes=64), 0.5, 1.0, {"peer": 0})]
    return Timeline(spans, [MemorySample(0, 0.0, 10)]).to_dict()


def timeline_error(tmp_path, data) -> str:
    return load_error("timeline", write(tmp_path, "tl.json", data))


def test_valid_timeline_loads(tmp_path):
    assert len(Timeline.load(write(tmp_path, "tl.json", valid_timeline())).spans) == 2


@pytest.mark.parametrize("field,value,rule", [
    ("op", 5, "spans[1].op: must be an action string such as '0F1'"),
    ("op", "0Z0", "spans[1].op: bad action '0Z0'"),
    ("op", "9" * 5000 + "F0", "spans[1].op: must be an action string"),
    ("info", [1], "spans[1].info: must be null or an object, got [1]"),
    ("group", 3, "spans[1].group: must be null or a group name"),
    ("lane", "", "spans[1].lane: must be a non-empty string"),
    ("rank", -1, "spans[1].rank: must be an integer >= 0, got -1"),
    ("rank", 1.5, "spans[1].rank: must be an integer >= 0"),
    ("start", float("nan"),
     "spans[1].start: must be a finite number of seconds, at most 1e+09 in size, got nan"),
    ("start", -1e300, "spans[1].start: must be a finite number of seconds"),
    ("end", float("inf"),
     "spans[1].end: must be a finite number of seconds, at most 1e+09 in size, got inf"),
    ("end", 0.25, "spans[1]: end 0.25 is before start 0.5; rule: a span's duration is >= 0 s"),
    ("nbytes", -1, "spans[1].nbytes: must be an integer >= 0"),
    ("nbytes", 1e400, "spans[1].nbytes: must be an integer >= 0, got inf"),
    ("flops", "many", "spans[1].flops: must be a finite number >= 0"),
    ("count", 0, "spans[1].count: must be an integer >= 1"),
])
def test_timeline_span_fields(field, value, rule, tmp_path):
    data = valid_timeline()
    data["spans"][1][field] = value
    assert rule in timeline_error(tmp_path, data)


@pytest.mark.parametrize("change,rule", [
    (lambda d: d["spans"].clear(),
     "spans: empty; rule: a Timeline to compare holds at least one span"),
    (lambda d: d.pop("spans"), "spans: must be a JSON list, got None"),
    (lambda d: d["spans"][0].pop("end"), "spans[0].end: missing"),
    (lambda d: d["spans"].append(7), "spans[2]: must be an object, got int"),
    (lambda d: d.update(memory=[[0, 1.0]]), "memory[0]: must be a [rank, seconds, bytes] list"),
    (lambda d: d.update(memory=[[-1, 1.0, 5]]), "memory[0].rank: must be an integer >= 0"),
    (lambda d: d.update(meta=[1]), "meta: must be a JSON object"),
    (lambda d: d.update(source=None), "source: must be a JSON string"),
])
def test_timeline_structure(change, rule, tmp_path):
    data = valid_timeline()
    change(data)
    assert rule in timeline_error(tmp_path, data)


def test_timeline_top_level_must_be_an_object(tmp_path):
    assert "top level: must be an object, got list" in timeline_error(tmp_path, [1, 2])


# ------------------------------------------------------------------ the command line

@pytest.mark.parametrize("argv,content", [
    (["compare", "{bad}", "{bad}"], {"spans": [{"rank": 0, "lane": "compute", "op": 5,
                                                 "start": 0, "end": 1}]}),
    (["simulate", "--topology", "{bad}"], {"builder": ["single_node"]}),
    (["simulate", "--schedule-csv", "{bad}"], b"\xff\xfe"),
    (["simulate", "--profile", "{bad}"], "[" * 100_000),
])
def test_cli_prints_one_error_line(argv, content, tmp_path, capsys):
    from clustersim.sim.cli import main

    path = write(tmp_path, "bad.json", content)
    assert main([a.replace("{bad}", path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1 and "bad.json" in err
