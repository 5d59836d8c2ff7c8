"""read_kineto: a PyTorch profiler trace as a measured Timeline. A real trace recorded here
(torch.profiler on CPU: two gloo ranks, a linear layer's forward, backward, gradient
all-reduces and an SGD step), and a GPU trace written here with the fields Kineto writes
(pytorch/kineto libkineto/src/output_json.cpp: `ts`/`dur` in µs after
`baseTimeNanoseconds`, `args` with `External id`, `stream`, and on NCCL kernels
`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`; categories from
libkineto/src/ActivityType.cpp)."""
import json
import socket
import subprocess
import sys
import textwrap

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.timeline import Timeline
from clustersim.sim.kineto import is_kineto_trace, read_kineto
from clustersim.sim.simulate import simulate
from clustersim.sim.timeline_compare import compare_timelines
from clustersim.topologies import load_topology

RECORD = textwrap.dedent('''
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.profiler import profile, ProfilerActivity

    def work(rank, folder, port):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
        dist.init_process_group("gloo", rank=rank, world_size=2)
        layer = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            layer(torch.randn(32, 64)).square().mean().backward()
            for p in layer.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        prof.export_chrome_trace(os.path.join(folder, f"rank{rank}.json"))
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=(sys.argv[1], sys.argv[2]), nprocs=2)
''')


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("kineto")
    (folder / "record.py").write_text(RECORD)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    subprocess.run([sys.executable, str(folder / "record.py"), str(folder), port],
                   check=True, capture_output=True, timeout=300)
    paths = [folder / "rank0.json", folder / "rank1.json"]
    return paths, [json.loads(p.read_text()) for p in paths]


def complete(raw, name):
    return [e for e in raw["traceEvents"] if e.get("ph") == "X" and e["name"] == name]


def test_a_real_cpu_trace_keeps_its_times_in_seconds(recorded):
    paths, raws = recorded
    timeline = read_kineto(paths)
    assert timeline.source == "kineto:cpu" and timeline.ranks == [0, 1]
    reduces = {r: sorted(complete(raw, "gloo:all_reduce"), key=lambda e: e["ts"])
               for r, raw in enumerate(raws)}
    spans = {r: [s for s in timeline.spans if s.rank == r and s.op.kind is OpKind.ALL_REDUCE]
             for r in (0, 1)}
    assert [len(spans[r]) for r in (0, 1)] == [len(reduces[r]) for r in (0, 1)] == [2, 2]
    anchor, anchor_span = reduces[0][0], spans[0][0]
    base = {r: raw["baseTimeNanoseconds"] for r, raw in enumerate(raws)}
    for r in (0, 1):
        for event, span in zip(reduces[r], spans[r]):
            assert span.duration == pytest.approx(event["dur"] * 1e-6, abs=1e-9)
            shift_us = (base[r] - base[0]) / 1000 + event["ts"] - anchor["ts"]
            assert span.start - anchor_span.start == pytest.approx(shift_us * 1e-6, abs=1e-9)
    linear = complete(raws[1], "aten::linear")[0]  # the forward: outermost, an F span
    forward = [s for s in timeline.spans if s.rank == 1 and s.op.kind is OpKind.F]
    assert any(s.duration == pytest.approx(linear["dur"] * 1e-6, abs=1e-9) for s in forward)


def test_a_real_cpu_trace_maps_backward_optimizer_and_launches(recorded):
    paths, raws = recorded
    timeline = read_kineto(paths)
    kinds = {(s.rank, s.op.kind) for s in timeline.spans}
    for rank in (0, 1):
        assert {(rank, k) for k in (OpKind.F, OpKind.B, OpKind.OPT_STEP,
                                    OpKind.ALL_REDUCE)} <= kinds
        backward = [e for e in raws[rank]["traceEvents"]
                    if e["name"].startswith("autograd::engine::evaluate_function")]
        b_spans = [s for s in timeline.spans if s.rank == rank and s.op.kind is OpKind.B]
        assert len(b_spans) >= len(backward) > 0
        first_step = min(e["ts"] for e in raws[rank]["traceEvents"]
                         if e["name"].startswith("Optimizer.step"))
        steps = [s for s in timeline.spans if s.rank == rank and s.op.kind is OpKind.OPT_STEP]
        assert min(s.start for s in steps) > max(s.start for s in b_spans)
        assert first_step > max(e["ts"] for e in backward)
    kineto = timeline.meta["kineto"]
    assert kineto["dropped"]["cpu_op c10d:: (posts a collective)"] >= 4  # 2 all-reduces x 2
    assert kineto["mapped"]["gloo:all_reduce -> ALL_REDUCE"] == 4


def test_compare_holds_a_measured_timeline_against_a_simulation(recorded, tmp_path):
    measured = read_kineto(recorded[0])
    measured.save(tmp_path / "measured.json")
    loaded = Timeline.load(tmp_path / "measured.json")  # what `clustersim compare` reads
    assert len(loaded.spans) == len(measured.spans)
    simulated = simulate(get_model("gpt3-1.3b", num_layers=4), ParallelConfig(
        pp=2, num_microbatches=2), load_topology("dgx-h100"))
    rows = {row["kind"]: row for row in compare_timelines(simulated, loaded)["op_kinds"]}
    assert rows["F"]["count_a"] > 0 and rows["F"]["count_b"] > 0
    assert rows["ALL_REDUCE"]["count_b"] == 4


BASE_NS = 1_790_000_000_000_000_000


def gpu_trace(rank=3, base=BASE_NS):
    """A GPU rank's trace as Kineto writes it: kernels on stream 7, NCCL on stream 20."""
    def x(cat, name, ts, dur, pid=0, tid=7, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": args}
    nccl = {"In msg nelems": 1048576, "Out msg nelems": 1048576, "Group size": 8,
            "dtype": "BFloat16"}
    return {"schemaVersion": 1, "baseTimeNanoseconds": base, "distributedInfo": {
        "backend": "nccl", "rank": rank, "world_size": 8}, "traceEvents": [
        x("cpu_op", "aten::mm", 100.0, 5.0, pid=4242, tid=4242, **{"External id": 1}),
        x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 300.0, 20.0,
          pid=4242, tid=4243, **{"External id": 2}),
        x("cpu_op", "aten::mm", 301.0, 5.0, pid=4242, tid=4243, **{"External id": 3}),
        x("cuda_runtime", "cudaLaunchKernel", 101.0, 3.0, pid=4242, tid=4242),
        x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 110.0,
          40.5, stream=7, **{"External id": 1}),
        x("kernel", "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", 310.25,
          80.0, stream=7, **{"External id": 3}),
        x("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
          150.5, 30.0, tid=20, stream=20, **{"Collective name": "allreduce"}, **nccl),
        x("kernel", "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", 200.0, 12.0,
          tid=20, stream=20, **{**nccl, "Out msg nelems": 8 * 1048576}),
        x("kernel", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage)",
          400.0, 9.0, tid=20, stream=20, **{**nccl, "dtype": "Float"}),
        x("kernel", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 420.0, 4.0,
          tid=21, stream=21, **{**nccl, "Collective name": "send", "Dst Rank": 4}),
        x("kernel", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 430.0, 4.0,
          tid=21, stream=21, **{**nccl, "Collective name": "recv", "Src Rank": 4}),
        x("kernel", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 440.0, 4.0,
          tid=21, stream=21),
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 450.0, 2.0, stream=7),
        x("gpu_memset", "Memset (Device)", 455.0, 1.0, stream=7),
        {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 110.0, "cat": "ac2g", "name": "ac2g"},
    ]}


def write(tmp_path, name, trace):
    path = tmp_path / name
    path.write_text(json.dumps(trace))
    return path


def test_gpu_kernels_map_to_lanes_and_kinds_in_seconds(tmp_path):
    timeline = read_kineto(write(tmp_path, "gpu.json", gpu_trace()))
    assert timeline.source == "kineto:cuda" and timeline.ranks == [3]
    got = [(s.lane, s.op.kind, s.start, s.duration, s.op.nbytes) for s in timeline.spans]
    us = 1e-6  # the first kept event (the forward GEMM at 110 us) is time 0
    expected = [("compute", OpKind.F, 0.0, 40.5 * us, 0),
                ("comm:20", OpKind.ALL_REDUCE, 40.5 * us, 30 * us, 1048576 * 2),
                ("comm:20", OpKind.ALL_GATHER, 90 * us, 12 * us, 8 * 1048576 * 2),
                ("compute", OpKind.B, 200.25 * us, 80 * us, 0),
                ("comm:20", OpKind.REDUCE_SCATTER, 290 * us, 9 * us, 1048576 * 4),
                ("comm:21", OpKind.SEND_F, 310 * us, 4 * us, 1048576 * 2),
                ("comm:21", OpKind.RECV_F, 320 * us, 4 * us, 1048576 * 2),
                ("pcie", OpKind.COPY_D2H, 340 * us, 2 * us, 0)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g[:2] == e[:2] and g[4] == e[4]
        assert g[2:4] == pytest.approx(e[2:4], abs=1e-12)
    assert all(s.op.stage == 3 and s.op.microbatch is None for s in timeline.spans)
    dropped = timeline.meta["kineto"]["dropped"]
    assert dropped == {"cpu_op": 3, "cuda_runtime": 1, "gpu_memset": 1,
                       "kernel ncclDevKernel_SendRecv (collective not named)": 1}
    assert timeline.meta["kineto"]["mapped"]["nccl AllReduce -> ALL_REDUCE"] == 1


def test_ranks_line_up_on_the_clock_kineto_writes(tmp_path):
    """Two ranks whose bases differ by 1 ms: the same ts is 1 ms later on the second."""
    first = write(tmp_path, "a.json", gpu_trace(rank=0))
    second = write(tmp_path, "b.json", gpu_trace(rank=1, base=BASE_NS + 1_000_000))
    timeline = read_kineto([second, first])
    starts = {r: min(s.start for s in timeline.spans if s.rank == r) for r in (0, 1)}
    assert starts[1] - starts[0] == pytest.approx(1e-3, abs=1e-12)
    with pytest.raises(ConfigError, match="rank 0 appears twice"):
        read_kineto([first, first])


@pytest.mark.parametrize("trace, message", [
    ("not json", "not valid JSON"),
    ({"events": []}, "traceEvents: missing; rule"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -2}]},
     r"traceEvents\[0\].dur: must be a finite number of microseconds >= 0, got -2"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1", "dur": 2}]},
     r"traceEvents\[0\].ts: must be a finite number"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": 5, "ts": 1, "dur": 2}]},
     r"traceEvents\[0\].name: must be a string"),
    ({"traceEvents": [{"ph": "M", "name": "process_name"}]}, "no GPU kernels and no CPU"),
])
def test_a_bad_trace_is_one_line_naming_the_file_and_the_rule(tmp_path, trace, message):
    path = tmp_path / "bad.json"
    path.write_text(trace if isinstance(trace, str) else json.dumps(trace))
    with pytest.raises(ConfigError, match=message) as err:
        read_kineto(path)
    assert str(err.value).startswith(f"Kineto trace {path}") and "\n" not in str(err.value)


def test_a_kineto_trace_is_told_from_a_timeline_json(tmp_path, recorded):
    timeline = read_kineto(write(tmp_path, "gpu.json", gpu_trace()))
    timeline.save(tmp_path / "timeline.json")
    assert is_kineto_trace(recorded[0][0]) and is_kineto_trace(tmp_path / "gpu.json")
    assert not is_kineto_trace(tmp_path / "timeline.json")
    assert not is_kineto_trace(tmp_path / "missing.json")
