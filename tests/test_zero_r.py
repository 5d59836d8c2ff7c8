"""ZeRO-R partitioned activation checkpoints (schedules.activation_partition) against
independent truths: a checkpoint is a layer's bf16 input, C = b*s*h*2 bytes (Korthikanti
et al. 2022's 2sbh); Pa keeps C/tp of it per TP rank and Pa+cpu none on the GPU and C/tp
in host memory (Rajbhandari et al., ZeRO, SC20 section 6.1); the backward all-gathers it
over tp, each rank receiving C (tp-1)/tp (nccl-tests' all-gather of size S = C), and on an
NVSwitch node a ring all-gather costs (tp-1) route latencies + C (tp-1)/tp / NVLink;
Pa+cpu copies C/tp per checkpoint each way over the GPU's PCIe link, blocking the stream
as DeepSpeed's synchronous copies do, so on one rank it adds (latency + C/tp / PCIe) per
copy (PCIe Gen5 x16: 64 GB/s per direction; 1 us per edge); and the rules' refusals
(DeepSpeed, Megatron-LM)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from clustersim.schedules.activation_partition import CHECKPOINT_COPIES
from clustersim.schedules.contract import local_waits
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.names import TP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.validate import dry_run
from clustersim.sim.collective_algorithms import ring
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

LAYERS, SEQ, HIDDEN = 8, 1024, 4096
C = 1 * SEQ * HIDDEN * 2  # one bf16 layer input, micro-batch size 1
NVLINK4 = 18 * 20.6e9  # an H100's achievable NVLink per direction (NCCL's SM90 figure)
PCIE5 = 64e9 * 0.75  # a PCIe Gen5 x16 link's achievable bytes/s per direction (NCCL: 0.75)
PCIE_LATENCY = 1e-6  # GPU -> host CPU, one edge


def model():
    return get_model("llama3-8b", num_layers=LAYERS, seq_length=SEQ)


def config(**kw):
    base = dict(tp=4, pp=2, recompute="full", num_microbatches=4)
    return ParallelConfig(**{**base, **kw})


def memory(**kw):
    plan = resolve(model(), config(**kw))
    return rank_memory(plan, in_flight=[1] * plan.num_stages)


@pytest.mark.parametrize("method, n, checkpoints", [
    ("uniform", 1, 4), ("uniform", 2, 2), ("uniform", 3, 2), ("block", 3, 3)])
def test_pa_keeps_one_tp_share_of_each_checkpoint(method, n, checkpoints):
    """4 layers per stage: ceil(4/N) checkpoints (uniform) or N (block), each C/tp."""
    opts = dict(recompute_method=method, recompute_num_layers=n)
    off, on = memory(**opts), memory(partition_activations=True, **opts)
    cpu = memory(partition_activations=True, cpu_checkpointing=True, **opts)
    for a, b, c in zip(off, on, cpu):
        assert a.activations - b.activations == pytest.approx(checkpoints * C * (1 - 1 / 4),
                                                              abs=2)
        assert a.activations - c.activations == pytest.approx(checkpoints * C, abs=2)
        assert (a.host, b.host) == (0, 0)
        assert c.host == pytest.approx(checkpoints * C / 4, abs=2)
        assert c.recompute_working == a.recompute_working  # the regenerated layers stay


def test_pa_memory_follows_in_flight_microbatches():
    """1F1B at pp=2, M=4: rank 0 holds 2 microbatches at its peak, rank 1 one."""
    plan_off = resolve(model(), config())
    plan_on = resolve(model(), config(partition_activations=True, cpu_checkpointing=True))
    for a, c in zip(rank_memory(plan_off), rank_memory(plan_on)):
        assert a.in_flight == c.in_flight == 2 - a.pp_rank
        assert c.host == pytest.approx(a.in_flight * 4 * C / 4, abs=4)


def lowered(**kw):
    plan = resolve(model(), config(**kw))
    return lower(plan.build_schedule(), plan)


def tp_gathers(**kw):
    """Each TP all-gather with the op right after it."""
    program = lowered(**kw).programs[0]
    return [(program[i + 1], op) for i, op in enumerate(program)
            if op.kind is OpKind.ALL_GATHER and op.group == TP]


def test_backward_all_gathers_each_recomputed_checkpoint_over_tp():
    assert tp_gathers() == []  # no sequence parallelism: no TP all-gather without Pa
    gathers = tp_gathers(partition_activations=True)
    assert len(gathers) == 4  # one aggregated op per backward, M = 4 microbatches
    for before, op in gathers:  # posted right before the backward that waits for it
        assert (before.kind, before.microbatch) == (OpKind.B, op.microbatch)
        assert (op.count, op.nbytes) == (4, 4 * C)  # 4 checkpoints of nccl-tests size C
    gathers = tp_gathers(partition_activations=True, recompute_num_layers=2)
    assert {(op.count, op.nbytes) for _, op in gathers} == {(2, 2 * C)}


def test_all_gather_moves_checkpoint_times_tp_minus_one_over_tp_per_rank():
    gpus = [f"gpu{i}" for i in range(4)]
    for phase in ring("all-gather", gpus, C):
        sent = sum(b for src, _, b in phase.flows if src == "gpu0")
        assert sent == pytest.approx(C * 3 / 4)


def test_simulated_tp_time_grows_by_the_ring_all_gathers():
    """pp=1, tp=8, M=2 on a DGX H100: 8 layers x 2 microbatches gathers, each as NCCL
    runs an 8 MiB all-gather on 8 H100s: a ring LL128 (NCCL's tuner: LL 10.8 + 52.1 us,
    LL128 27.3 + 21.5 us, Simple 32.2 + 19.8 us), i.e. its latency 14 + 7 x 1.9 us
    (NCCL 2.30.7's tables) + C 7/8 / (NVLink4 x 0.92, LL128's share)."""
    topology = load_topology("dgx-h100")
    times = []
    for pa in (False, True):
        parallel = ParallelConfig(tp=8, pp=1, recompute="full", num_microbatches=2,
                                  partition_activations=pa)
        timeline = simulate(model(), parallel, topology)
        times.append(timeline.time_breakdown()[0]["tp"])
    gathers = LAYERS * 2
    expected = gathers * ((14 + 7 * 1.9) * 1e-6 + C * 7 / 8 / (NVLINK4 * 0.92))
    assert times[1] - times[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("kw, words", [
    (dict(partition_activations=True, recompute="selective"), "recompute='full'"),
    (dict(partition_activations=True, recompute="none"), "recompute='full'"),
    (dict(partition_activations=True, tp=1), "tp > 1"),
    (dict(partition_activations=True, sequence_parallel=True), "sequence_parallel"),
    (dict(cpu_checkpointing=True), "partition_activations"),
    (dict(partition_activations=1), "must be a bool"),
])
def test_refusals_name_the_field_and_rule(kw, words):
    with pytest.raises(ConfigError, match=words) as err:
        config(**kw)
    assert "\n" not in str(err.value)


PA_CPU = dict(partition_activations=True, cpu_checkpointing=True)


@pytest.mark.parametrize("method, n, k", [("uniform", 1, 4), ("uniform", 2, 2), ("block", 3, 3)])
def test_cpu_checkpointing_copies_each_partition_to_the_host_and_back(method, n, k):
    """pp=2, 4 layers per stage: each F is followed by its k partitions to the host, each
    B preceded by them back to the GPU, then the gather; C/tp bytes per checkpoint."""
    schedule = lowered(recompute_method=method, recompute_num_layers=n, **PA_CPU)
    for program in schedule.programs:
        waits = local_waits(program)
        copies = [op for op in program if op.kind.is_copy]
        assert all(op.group == CHECKPOINT_COPIES for op in copies)
        assert len(copies) == 2 * 4  # one each way per microbatch
        for i, op in enumerate(program):
            if op.kind is OpKind.F:
                down = program[i + 1]
                assert (down.kind, down.key[1:]) == (OpKind.COPY_D2H, op.key[1:])
                assert (down.count, down.nbytes) == (k, round(k * C / 4))
            if op.kind is OpKind.B:
                up, gather = program[i - 2], program[i - 1]
                assert (up.kind, up.key[1:]) == (OpKind.COPY_H2D, op.key[1:])
                assert (up.count, up.nbytes) == (k, round(k * C / 4))
                assert gather.kind is OpKind.ALL_GATHER and i - 2 in waits[i - 1]
                assert {i - 2, i - 1} <= set(waits[i])  # the backward waits for both
    assert lower(schedule, resolve(model(), config(**PA_CPU))) == schedule  # lowered once


def simulated(pa, cpu, **kw):
    parallel = ParallelConfig(**{**dict(tp=8, pp=1, recompute="full", num_microbatches=2,
                                        partition_activations=pa, cpu_checkpointing=cpu),
                                 **kw})
    return simulate(model(), parallel, load_topology("dgx-h100"))


def test_cpu_checkpointing_adds_its_blocking_copies_to_one_rank():
    """pp=1 (one rank on its host), M=2, 8 layers: 2 x 8 copies each way of C/8 bytes,
    each one PCIe latency + C/8 / PCIe5 on the critical path (DeepSpeed copies
    synchronously)."""
    pa, cpu = simulated(True, False), simulated(True, True)
    copies = 2 * 2 * LAYERS
    expected = copies * (PCIE_LATENCY + C / 8 / PCIE5)
    assert cpu.iteration_time - pa.iteration_time == pytest.approx(expected, rel=1e-6)
    spans = [s for s in cpu.spans if s.op.kind.is_copy]
    assert sum(s.duration for s in spans) == pytest.approx(expected, rel=1e-6)
    assert sum(s.op.nbytes for s in spans) == pytest.approx(copies * C / 8, abs=copies)
    assert any("no host CPU nodes" in w for w in cpu.meta["warnings"])
    assert not pa.meta["warnings"]  # no copies: no host links assumed


def test_every_copy_runs_once_and_the_backward_waits_for_it():
    """pp=2 under 1F1B: each copy op of the program runs once; a B starts after its
    COPY_H2D and its gather end; the copy after an F starts after the F, and the next
    compute op and the F's SEND start after the copy."""
    plan = resolve(model(), config(**PA_CPU))
    timeline = simulate(model(), config(**PA_CPU), load_topology("dgx-h100"))
    copies = [s for s in timeline.spans if s.op.kind.is_copy]
    expected = [(r, op.key) for r, p in enumerate(lower(plan.build_schedule(), plan).programs)
                for op in p if op.kind.is_copy]
    assert sorted((s.rank, s.op.key) for s in copies) == sorted(expected)
    span = {(s.rank, s.op.kind, s.op.stage, s.op.microbatch): s for s in timeline.spans
            if s.lane in ("compute", "pcie", "send") or s.op.kind is OpKind.ALL_GATHER}
    for (rank, kind, stage, m), s in span.items():
        if kind is OpKind.B:
            up = span[(rank, OpKind.COPY_H2D, stage, m)]
            gather = span[(rank, OpKind.ALL_GATHER, stage, m)]
            assert up.end <= gather.start and gather.end <= s.start
        if kind is OpKind.COPY_D2H:
            assert span[(rank, OpKind.F, stage, m)].end <= s.start
            later = [c.start for c in timeline.spans if c.rank == rank
                     and c.lane == "compute" and c.start > s.start]
            assert min(later, default=s.end) >= s.end
            if (rank, OpKind.SEND_F, stage, m) in span:
                assert span[(rank, OpKind.SEND_F, stage, m)].start >= s.end
    dry_run(lower(plan.build_schedule(), plan))  # the unit-time dry run obeys it too


def test_cpu_checkpointing_beside_zero_offload():
    """Both kinds of host copy on one PCIe lane; the offload rules keep their copies."""
    kw = dict(tp=2, dp=2, zero_stage=1, offload=True, **PA_CPU)
    timeline = simulate(model(), config(**kw), load_topology("dgx-h100"))
    groups = {s.op.group for s in timeline.spans if s.op.kind.is_copy}
    assert groups == {CHECKPOINT_COPIES, "pcie"}
    steps = [s for s in timeline.spans if s.op.kind is OpKind.OPT_STEP]
    uploads = [s for s in timeline.spans if s.op.kind is OpKind.COPY_H2D
               and s.op.group == "pcie"]
    assert steps and uploads and min(u.start for u in uploads) >= min(s.end for s in steps)


def test_deepspeed_and_megatron_spellings():
    ds = ParallelConfig.from_kwargs(**{
        "activation_checkpointing.partition_activations": True,
        "activation_checkpointing.cpu_checkpointing": True,
        "tensor_model_parallel_size": 2, "recompute_granularity": "full"})
    assert (ds.partition_activations, ds.cpu_checkpointing) == (True, True)
    mg = ParallelConfig.from_kwargs(**{"--distribute-saved-activations": True, "tp": 2,
                                       "recompute": "full"})
    assert mg.partition_activations and not mg.cpu_checkpointing


def run(*args):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_memory_and_refusal(tmp_path):
    common = ["memory", "--model", "llama3-8b", "--seq-length", str(SEQ), "--tp", "4",
              "--pp", "1", "--microbatches", "1", "--recompute", "full", "--json"]
    off = json.loads(run(*common).stdout)["ranks"][0]
    done = run(*common, "--partition-activations", "--cpu-checkpointing")
    on = json.loads(done.stdout)["ranks"][0]
    checkpoints = 32  # Llama 3 8B's layers, one microbatch in flight
    assert on["host"] == pytest.approx(checkpoints * C / 4, abs=checkpoints)
    assert off["activations"] - on["activations"] == pytest.approx(checkpoints * C,
                                                                   abs=checkpoints)
    bad = run("simulate", "--tp", "2", "--pp", "1", "--recompute", "full",
              "--sequence-parallel", "--partition-activations")
    assert bad.returncode != 0
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: partition_activations")
    pa_cpu = run("simulate", "--model", "llama3-8b", "--num-layers", "4", "--tp", "2", "--pp",
                 "1", "--microbatches", "1", "--recompute", "full", "--partition-activations",
                 "--cpu-checkpointing", "-o", str(tmp_path / "gantt.html"))
    assert pa_cpu.returncode == 0, pa_cpu.stderr  # simulated now: no refusal
    assert math.isfinite(on["total_bytes"])
