"""write_chakra: a simulated run as Chakra execution traces, decoded with mlc-chakra's own
decoder (chakra/src/third_party/utils/protolib.py decodeMessage, et_def_pb2) and held
against the Timeline and the closed-form rank grid of Megatron's order tp-cp-ep-dp-pp."""
import json
import sys
from collections import Counter

import pytest

from clustersim.schedules.errors import ClustersimError, ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.timeline import Timeline
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

pb = pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
protolib = pytest.importorskip("chakra.src.third_party.utils.protolib")
from clustersim.sim.chakra import INSTALL_HINT, write_chakra  # noqa: E402

MODEL = get_model("llama3-8b", num_layers=8, seq_length=2048)
TP, DP, PP = 2, 2, 2
STAGE_STRIDE = TP * DP  # global rank = tp + TP * dp + TP * DP * pp (cp = ep = 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    timeline = simulate(MODEL, ParallelConfig(tp=TP, dp=DP, pp=PP, num_microbatches=4,
                                              zero_stage=1), load_topology("dgx-h100"))
    folder = tmp_path_factory.mktemp("chakra")
    paths = write_chakra(timeline, folder)
    return timeline, folder, paths


def decode(path):
    with open(path, "rb") as f:
        metadata = pb.GlobalMetadata()
        assert protolib.decodeMessage(f, metadata)
        nodes = []
        node = pb.Node()
        while protolib.decodeMessage(f, node):
            nodes.append(node)
            node = pb.Node()
    return metadata, nodes


def attrs(node):
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def spans_in_start_order(timeline, pipeline_rank):
    return sorted((s for s in timeline.spans if s.rank == pipeline_rank),
                  key=lambda s: (s.start, s.end))


def test_one_file_per_global_rank_with_one_node_per_op(run):
    timeline, folder, paths = run
    world = TP * DP * PP
    assert sorted(p.name for p in paths) == sorted(
        [f"clustersim.{g}.et" for g in range(world)] + ["comm_group.json"])
    for g in range(world):
        metadata, nodes = decode(folder / f"clustersim.{g}.et")
        assert metadata.version
        spans = spans_in_start_order(timeline, g // STAGE_STRIDE)
        assert len(nodes) == len(spans) > 0
        assert [n.id for n in nodes] == list(range(len(nodes)))
        assert Counter(n.name for n in nodes) == Counter(str(s.op) for s in spans)


def test_nodes_follow_the_ops_start_times_and_durations_in_microseconds(run):
    timeline, folder, _ = run
    for g in (0, 7):
        _, nodes = decode(folder / f"clustersim.{g}.et")
        spans = spans_in_start_order(timeline, g // STAGE_STRIDE)
        assert [n.start_time_micros for n in nodes] == sorted(n.start_time_micros
                                                             for n in nodes)
        for node, span in zip(nodes, spans):
            assert node.start_time_micros == round(span.start * 1e6)
            assert abs(node.duration_micros - span.duration * 1e6) <= 1


def test_compute_and_collective_nodes_carry_the_ops_numbers(run):
    timeline, folder, _ = run
    _, nodes = decode(folder / "clustersim.0.et")
    spans = {(str(s.op), round(s.start * 1e6)): s for s in timeline.spans if s.rank == 0}
    kinds = Counter()
    for node in nodes:
        span, a = spans[(node.name, node.start_time_micros)], attrs(node)
        op = span.op
        if op.kind.is_compute:
            assert node.type == pb.COMP_NODE
            assert a["num_ops"] == round(op.flops) and a["tensor_size"] == op.nbytes
        elif op.kind.is_collective:
            assert node.type == pb.COMM_COLL_NODE
            assert pb.CollectiveCommType.Name(a["comm_type"]) == op.kind.value
            assert a["comm_size"] == op.nbytes and a["group"] == op.group
        kinds[pb.NodeType.Name(node.type)] += 1
    assert kinds["COMP_NODE"] and kinds["COMM_COLL_NODE"] and kinds["COMM_SEND_NODE"]


def test_collective_groups_are_the_ranks_of_the_grid(run):
    _, folder, _ = run
    groups = json.loads((folder / "comm_group.json").read_text())
    assert all(int(name) >= 1 for name in groups)  # "" and "0" mean the world to ASTRA-sim
    for g in range(TP * DP * PP):
        tp_line = [g - g % TP + t for t in range(TP)]
        dp_line = [g % TP + TP * d + STAGE_STRIDE * (g // STAGE_STRIDE) for d in range(DP)]
        _, nodes = decode(folder / f"clustersim.{g}.et")
        collectives = [attrs(n) for n in nodes if n.type == pb.COMM_COLL_NODE]
        assert {a["group"] for a in collectives} == {"tp", "dp"}
        for a in collectives:
            assert groups[a["pg_name"]] == (tp_line if a["group"] == "tp" else dp_line)


def test_every_send_meets_its_receive_on_the_next_or_previous_stage(run):
    _, folder, _ = run
    sends, recvs = Counter(), Counter()
    for g in range(TP * DP * PP):
        _, nodes = decode(folder / f"clustersim.{g}.et")
        for node in nodes:
            a = attrs(node)
            key = (a.get("comm_src"), a.get("comm_dst"), a.get("comm_tag"), a.get("comm_size"))
            if node.type == pb.COMM_SEND_NODE:
                assert a["comm_src"] == g and abs(a["comm_dst"] - g) == STAGE_STRIDE
                sends[key] += 1
            elif node.type == pb.COMM_RECV_NODE:
                assert a["comm_dst"] == g and abs(a["comm_src"] - g) == STAGE_STRIDE
                recvs[key] += 1
    assert sends == recvs and sum(sends.values()) == TP * DP * 2 * 4  # F and B, 4 microbatches
    assert max(sends.values()) == 1  # a tag names one transfer


def test_dependencies_point_back_to_ops_that_had_ended(run):
    """Each dependency is an earlier node whose op ended (in the Timeline) by the time this
    one started; each compute op depends on the compute op before it (one stream)."""
    timeline, folder, _ = run
    for g in range(0, TP * DP * PP, STAGE_STRIDE):
        _, nodes = decode(folder / f"clustersim.{g}.et")
        by_key = {(str(s.op), round(s.start * 1e6)): s for s in timeline.spans
                  if s.rank == g // STAGE_STRIDE}
        span_of = [by_key[(n.name, n.start_time_micros)] for n in nodes]
        previous_compute = None
        for i, node in enumerate(nodes):
            assert all(d < i for d in node.data_deps)
            assert all(span_of[d].end <= span_of[i].start for d in node.data_deps)
            if span_of[i].op.kind.is_compute:
                if previous_compute is not None:
                    assert previous_compute in node.data_deps
                previous_compute = i
        assert any(node.data_deps for node in nodes)


def test_a_missing_mlc_chakra_is_one_line_naming_the_extra(monkeypatch, tmp_path, run):
    monkeypatch.setitem(sys.modules, "chakra.schema.protobuf", None)
    with pytest.raises(ClustersimError) as err:
        write_chakra(run[0], tmp_path)
    assert str(err.value) == INSTALL_HINT and "mlc-chakra" in INSTALL_HINT


def test_a_timeline_without_its_plan_is_refused_naming_the_rule(tmp_path, run):
    bare = Timeline(run[0].spans)
    with pytest.raises(ConfigError, match="meta.plan: missing; rule"):
        write_chakra(bare, tmp_path)
    with pytest.raises(ConfigError, match="no spans"):
        write_chakra(Timeline([]), tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"{blocker}/out: cannot create it"):
        write_chakra(run[0], blocker / "out")


def test_a_saved_timeline_exports_the_same_nodes(tmp_path, run):
    timeline, folder, _ = run
    timeline.save(tmp_path / "t.json")
    write_chakra(Timeline.load(tmp_path / "t.json"), tmp_path / "again")
    for g in (0, 5):
        assert (tmp_path / "again" / f"clustersim.{g}.et").read_bytes() == \
            (folder / f"clustersim.{g}.et").read_bytes()


def test_host_steps_and_copies_of_zero_offload(tmp_path):
    """ZeRO-Offload: the optimizer step on the host CPU is a CPU compute node; the PCIe
    copies are memory nodes of the copied bytes (store: to the host, load: back)."""
    timeline = simulate(MODEL, ParallelConfig(dp=2, zero_stage=2, offload=True,
                                              num_microbatches=2), load_topology("dgx-h100"))
    write_chakra(timeline, tmp_path)
    _, nodes = decode(tmp_path / "clustersim.1.et")
    ops = {(str(s.op), round(s.start * 1e6)): s.op for s in timeline.spans}
    seen = Counter()
    for node in nodes:
        op, a = ops[(node.name, node.start_time_micros)], attrs(node)
        assert a["is_cpu_op"] == (op.group == "host")
        if op.kind.is_copy:
            expected = "MEM_STORE_NODE" if op.kind is OpKind.COPY_D2H else "MEM_LOAD_NODE"
            assert pb.NodeType.Name(node.type) == expected and a["tensor_size"] == op.nbytes
        seen[op.kind] += 1
    assert seen[OpKind.OPT_STEP] and seen[OpKind.COPY_D2H] and seen[OpKind.COPY_H2D]


@pytest.mark.parametrize("names", [1, 200, 20000])  # < 128, < 16384, more bytes
def test_framing_is_byte_for_byte_chakras_encoder(names):
    import io

    from clustersim.sim.chakra import _framed
    node = pb.Node(id=3, name="x" * names, data_deps=[1, 2])
    expected = io.BytesIO()
    protolib.encodeMessage(expected, node)
    assert _framed(node.SerializeToString()) == expected.getvalue()
