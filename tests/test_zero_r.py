"""ZeRO-R partitioned activation checkpoints (schedules.activation_partition) against
independent truths: a checkpoint is a layer's bf16 input, C = b*s*h*2 bytes (Korthikanti
et al. 2022's 2sbh); Pa keeps C/tp of it per TP rank and Pa+cpu none on the GPU and C/tp
in host memory (Rajbhandari et al., ZeRO, SC20 section 6.1); the backward all-gathers it
over tp, each rank receiving C (tp-1)/tp (nccl-tests' all-gather of size S = C), and on an
NVSwitch node a ring all-gather costs (tp-1) route latencies + C (tp-1)/tp / NVLink; and
the rules' refusals (DeepSpeed, Megatron-LM)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.names import TP
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.collective_algorithms import ring
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

LAYERS, SEQ, HIDDEN = 8, 1024, 4096
C = 1 * SEQ * HIDDEN * 2  # one bf16 layer input, micro-batch size 1
NVLINK4 = 450e9  # bytes/s per direction per H100 (DGX H100 datasheet: 900 GB/s bidirectional)
ROUTE_LATENCY = 2e-6  # GPU -> NVSwitch -> GPU, 1 us per edge (topologies.nodes)


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


def tp_gathers(**kw):
    plan = resolve(model(), config(**kw))
    found, compute = [], None  # each gather with the compute op it follows
    for op in lower(plan.build_schedule(), plan).programs[0]:
        compute = op.kind if op.kind.is_compute else compute
        if op.kind is OpKind.ALL_GATHER and op.group == TP:
            found.append((compute, op))
    return found


def test_backward_all_gathers_each_recomputed_checkpoint_over_tp():
    assert tp_gathers() == []  # no sequence parallelism: no TP all-gather without Pa
    gathers = tp_gathers(partition_activations=True)
    assert len(gathers) == 4  # one aggregated op per backward, M = 4 microbatches
    for after, op in gathers:
        assert after is OpKind.B
        assert (op.count, op.nbytes) == (4, 4 * C)  # 4 checkpoints of nccl-tests size C
    gathers = tp_gathers(partition_activations=True, recompute_num_layers=2)
    assert {(op.count, op.nbytes) for _, op in gathers} == {(2, 2 * C)}


def test_all_gather_moves_checkpoint_times_tp_minus_one_over_tp_per_rank():
    gpus = [f"gpu{i}" for i in range(4)]
    for phase in ring("all-gather", gpus, C):
        sent = sum(b for src, _, b in phase.flows if src == "gpu0")
        assert sent == pytest.approx(C * 3 / 4)


def test_simulated_tp_time_grows_by_the_ring_all_gathers():
    """pp=1, tp=8, M=2 on a DGX H100: 8 layers x 2 microbatches gathers, each
    7 latencies + C 7/8 / NVLink4 (alpha-beta of a ring all-gather, uncontended)."""
    topology = load_topology("dgx-h100")
    times = []
    for pa in (False, True):
        parallel = ParallelConfig(tp=8, pp=1, recompute="full", num_microbatches=2,
                                  partition_activations=pa)
        timeline = simulate(model(), parallel, topology)
        times.append(timeline.time_breakdown()[0]["tp"])
    gathers = LAYERS * 2
    expected = gathers * (7 * ROUTE_LATENCY + C * 7 / 8 / NVLINK4)
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


def test_cpu_checkpointing_is_not_replayed():
    """Its PCIe copies are not simulated: lowering refuses it instead of ignoring them."""
    plan = resolve(model(), config(partition_activations=True, cpu_checkpointing=True))
    with pytest.raises(ConfigError, match="cpu_checkpointing"):
        lower(plan.build_schedule(), plan)


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


def test_cli_memory_and_refusal():
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
    assert math.isfinite(on["total_bytes"])
