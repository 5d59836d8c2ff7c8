"""Chakra execution traces of a simulated run: the MLCommons Chakra ET format that
ASTRA-sim replays, one `<prefix>.<rank>.et` file per global rank plus `comm_group.json`.

Schema: chakra/schema/protobuf/et_def.proto of PyPI `mlc-chakra` (imported lazily; install
with `pip install -e '.[chakra]'`); a file is a GlobalMetadata message then Node messages,
each prefixed with its varint length (chakra/src/third_party/utils/protolib.py). Node
attributes are named and typed as Chakra's feeder reads them (mlcommons/chakra
src/feeder/et_feeder_node.cpp; astra-sim astra-sim/workload/Workload.cc):
- F, B, I, W, OPT_STEP: COMP_NODE; `num_ops` (int64) = FLOPs, `tensor_size` (uint64) =
  bytes of memory traffic, `is_cpu_op` (bool) true for a host step;
- collectives: COMM_COLL_NODE; `comm_type` (int64, CollectiveCommType), `comm_size`
  (int64) = the op's bytes (the total of its `count` back-to-back collectives, also in
  `count`), `pg_name` (string) = the id of the rank's group in comm_group.json (ids from
  1: ASTRA-sim reads them with std::stoi and takes "" and "0" as the world), `group` = the
  axis ('tp', 'dp', ...);
- SEND_F/SEND_B and RECV_F/RECV_B: COMM_SEND_NODE / COMM_RECV_NODE; `comm_src`,
  `comm_dst`, `comm_tag` (int32; a send and its receive share the tag) and `comm_size`;
- COPY_D2H / COPY_H2D: MEM_STORE_NODE / MEM_LOAD_NODE with `tensor_size`.
Times: `start_time_micros` and `duration_micros` are whole microseconds (rounded).

Program order and dependencies: a rank's nodes are its Timeline spans ordered by start
(then end, lane, op text); node ids count up in that order. `data_deps` (what ASTRA-sim
waits on) of a node are, for each lane of the rank, the last earlier node on that lane that
ended by the node's start: what the simulated run had finished when the node began (the
Timeline does not say which of them it consumed), so a replay never starts a node before
its rank's work that preceded it in the simulation. Every dependency is an earlier node.

World: the simulator replays the pipeline ranks of replica 0; every other global rank
runs the program of its pipeline coordinate (docs/architecture.md, "The Plan"), so its
file holds that rank's nodes with its own peers and groups, from the run's Plan (given,
or resolved again from `timeline.meta['plan']`).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from clustersim.schedules.errors import ClustersimError, ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import HOST, PP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan, resolve
from clustersim.schedules.timeline import Span, Timeline

INSTALL_HINT = "Chakra export needs mlc-chakra: pip install -e '.[chakra]'"
COMM_GROUPS_FILE = "comm_group.json"
_COPY_NODES = {OpKind.COPY_D2H: "MEM_STORE_NODE", OpKind.COPY_H2D: "MEM_LOAD_NODE"}
_SENDS = {OpKind.SEND_F, OpKind.SEND_B}
# the stage a transfer's tag is keyed by (the sender's) and its direction, per kind
_TAG_KEY = {OpKind.SEND_F: (0, 0), OpKind.RECV_F: (0, -1), OpKind.SEND_B: (1, 0),
            OpKind.RECV_B: (1, +1)}


def chakra_schema() -> Any:
    """Chakra's protobuf schema module et_def_pb2; ClustersimError with the install line
    when mlc-chakra is missing."""
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError:
        raise ClustersimError(INSTALL_HINT) from None
    return et_def_pb2


def program_order(spans: list[Span]) -> tuple[list[Span], list[list[int]]]:
    """One rank's spans in program order and each one's dependencies (indices into that
    order; module docstring)."""
    lanes = {lane: i for i, lane in enumerate(sorted({s.lane for s in spans}))}
    ordered = sorted(spans, key=lambda s: (s.start, s.end, lanes[s.lane], str(s.op)))
    by_lane: dict[str, list[int]] = {lane: [] for lane in lanes}
    deps = []
    for i, span in enumerate(ordered):
        mine = []
        for earlier in by_lane.values():
            last = next((j for j in reversed(earlier) if ordered[j].end <= span.start), None)
            if last is not None:
                mine.append(last)
        deps.append(sorted(mine))
        by_lane[span.lane].append(i)
    return ordered, deps


def plan_from_meta(timeline: Timeline) -> Plan:
    """The run's Plan resolved again from `timeline.meta['plan']` (Plan.describe of a
    registered schedule); ConfigError naming the rule otherwise."""
    described = timeline.meta.get("plan")
    hint = "rule: export a Timeline that clustersim simulate wrote, or pass the run's plan"
    if not isinstance(described, dict):
        raise ConfigError(f"timeline meta.plan: missing; {hint}")
    try:
        parallel = ParallelConfig(**described["parallel"])
        shard = described.get("groups", {}).get("dp_shard")
        if shard and parallel.fsdp == "hybrid" and parallel.shard_size is None:
            parallel = replace(parallel, shard_size=shard)
        elif shard and parallel.hpz and parallel.hpz_partition_size is None:
            parallel = replace(parallel, hpz_partition_size=shard)
        return resolve(ModelSpec(**described["model_spec"]), parallel)
    except (KeyError, TypeError, ClustersimError) as err:
        raise ConfigError(f"timeline meta.plan: cannot resolve the run's plan ({err}); "
                          f"{hint}") from None


class _Exporter:
    """The serialised nodes of every global rank of one run (module docstring). A node's
    rank-independent part is serialised once per pipeline rank; the attributes that name
    ranks (`pg_name`, `comm_src`, `comm_dst`) are appended per global rank, as protobuf
    merges concatenated messages (repeated fields append)."""

    def __init__(self, timeline: Timeline, plan: Plan, schema: Any):
        self.plan, self.pb = plan, schema
        self.programs = {r: program_order([s for s in timeline.spans if s.rank == r])
                         for r in timeline.ranks}
        self.microbatches = 1 + max((s.op.microbatch or 0 for s in timeline.spans), default=0)
        self.groups: dict[tuple[int, ...], int] = {}  # members -> comm group id (from 1)
        self.group_ids: dict[tuple[str, int], int] = {}  # (axis, rank) -> comm group id
        self.templates: dict[tuple[int, int], bytes] = {}  # (pipeline rank, index) -> node
        self.tails: dict[tuple, bytes] = {}  # rank-naming attributes -> serialised

    def group_id(self, axis: str, rank: int) -> int:
        """The comm group id of `rank`'s `axis` group (cached: every op of a rank asks)."""
        key = (axis, rank)
        if key not in self.group_ids:
            members = tuple(sorted(self.plan.group(axis, rank)))
            self.group_ids[key] = self.groups.setdefault(members, len(self.groups) + 1)
        return self.group_ids[key]

    def nodes(self, rank: int) -> list[bytes]:
        """The serialised Node messages of global rank `rank`, in program order."""
        pipeline = self.plan.parallel.group(PP, rank)  # global rank of each pipeline rank
        p = pipeline.index(rank)
        ordered, deps = self.programs.get(p, ([], []))
        out = []
        for i, (span, dep) in enumerate(zip(ordered, deps)):
            if (p, i) not in self.templates:
                self.templates[(p, i)] = self.template(i, span, dep).SerializeToString()
            out.append(self.templates[(p, i)] + self.tail(span, rank, pipeline))
        return out

    def template(self, index: int, span: Span, deps: list[int]) -> Any:
        """Node `index` of `span`'s pipeline rank, without the attributes naming ranks."""
        pb, op = self.pb, span.op
        node = pb.Node(id=index, name=str(op), data_deps=deps,
                       start_time_micros=round(span.start * 1e6),
                       duration_micros=round(span.duration * 1e6))
        attr = node.attr.add
        attr(name="is_cpu_op", bool_val=op.group == HOST)
        if op.kind.is_compute:
            node.type = pb.COMP_NODE
            attr(name="num_ops", int64_val=round(op.flops))
            attr(name="tensor_size", uint64_val=op.nbytes)
        elif op.kind.is_collective:
            node.type = pb.COMM_COLL_NODE
            attr(name="comm_type", int64_val=pb.CollectiveCommType.Value(op.kind.value))
            attr(name="comm_size", int64_val=op.nbytes)
            attr(name="group", string_val=op.group)
            attr(name="count", int64_val=op.count)
        elif op.kind.is_p2p:
            node.type = pb.COMM_SEND_NODE if op.kind in _SENDS else pb.COMM_RECV_NODE
            attr(name="comm_tag", int32_val=self.tag(span))
            attr(name="comm_size", int64_val=op.nbytes)
        elif op.kind.is_copy:
            node.type = pb.NodeType.Value(_COPY_NODES[op.kind])
            attr(name="tensor_size", uint64_val=op.nbytes)
        return node

    def tail(self, span: Span, rank: int, pipeline: list[int]) -> bytes:
        """The serialised attributes of `span`'s node on global rank `rank` that name ranks:
        a collective's group, a transfer's source and destination."""
        kind = span.op.kind
        if kind.is_collective:
            key: tuple = ("pg_name", self.group_id(span.op.group, rank))
            attrs = [("pg_name", "string_val", str(key[1]))]
        elif kind.is_p2p:
            peer = pipeline[_peer(span, len(pipeline))]
            key = (rank, peer) if kind in _SENDS else (peer, rank)
            attrs = [("comm_src", "int32_val", key[0]), ("comm_dst", "int32_val", key[1])]
        else:
            return b""
        if key not in self.tails:
            node = self.pb.Node()
            for name, field, value in attrs:
                node.attr.add(name=name, **{field: value})
            self.tails[key] = node.SerializeToString()
        return self.tails[key]

    def tag(self, span: Span) -> int:
        """The same number on a send and its receive: SEND_F(s, m) pairs with RECV_F(s+1, m),
        SEND_B(s, m) with RECV_B(s-1, m) (sim.trace.p2p_pairs)."""
        direction, shift = _TAG_KEY[span.op.kind]
        sender_stage = span.op.stage + shift
        return (sender_stage * self.microbatches + (span.op.microbatch or 0)) * 2 + direction


def _peer(span: Span, pipeline_ranks: int) -> int:
    """The pipeline rank a send or receive talks to (Span.info['peer'], as both backends
    record it); ConfigError naming the span and the rule otherwise."""
    peer = (span.info or {}).get("peer")
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < pipeline_ranks:
        raise ConfigError(f"span {span.op} of rank {span.rank}: info.peer is {peer!r}; rule: "
                          f"a send or receive names its peer pipeline rank, 0.."
                          f"{pipeline_ranks - 1}")
    return peer


def write_chakra(timeline: Timeline, directory: str | Path, plan: Plan | None = None,
                 prefix: str = "clustersim") -> list[Path]:
    """Write `<directory>/<prefix>.<rank>.et` for every global rank of the run and
    `<directory>/comm_group.json` (ASTRA-sim's --workload-configuration is
    `<directory>/<prefix>`, its --comm-group-configuration the JSON file); returns the
    paths written. `plan`: the run's Plan (default: resolved from timeline.meta['plan'])."""
    pb = chakra_schema()
    if not prefix or Path(prefix).name != prefix:
        raise ConfigError(f"Chakra file prefix {prefix!r}: must be a file name such as "
                          "'clustersim' (the files are <prefix>.<rank>.et in the directory)")
    if not timeline.spans:
        raise ConfigError("timeline: no spans; rule: a Chakra trace exports at least one op")
    exporter = _Exporter(timeline, plan or plan_from_meta(timeline), pb)
    folder = _directory(directory)
    header = _framed(pb.GlobalMetadata(version="0.0.4").SerializeToString())
    paths = []
    for rank in range(exporter.plan.world_size):
        data = header + b"".join(_framed(node) for node in exporter.nodes(rank))
        paths.append(_write_atomic(folder / f"{prefix}.{rank}.et", data))
    groups = {str(i): list(members) for members, i in exporter.groups.items()}
    paths.append(_write_atomic(folder / COMM_GROUPS_FILE, json.dumps(groups).encode()))
    return paths


def _framed(message: bytes) -> bytes:
    """`message` after its length as a varint, Chakra's framing (protolib.encodeMessage,
    which writes to a file one message object at a time; the nodes here are bytes)."""
    size, prefix = len(message), bytearray()
    while size > 0x7F:
        prefix.append(0x80 | (size & 0x7F))
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + message


def _directory(directory: str | Path) -> Path:
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Chakra output directory {folder}: cannot create it "
                          f"({exc.strerror or exc}); rule: give a writable directory") from None
    return folder


def _write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
