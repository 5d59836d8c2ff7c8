"""ZeRO-Infinity's NVMe tier of the offloaded optimizer (issue 16 item 5): the settings and
their refusals (schedules.parallel, schedules.parallel_aliases), the step's NVMe swap time
(sim.optimizer_cost), the host and NVMe bytes (schedules.memory_model), the CLI."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import bare_rank_memory
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.optimizer_cost import (CPU_ADAM_SECONDS_PER_PARAM, NvmeTier,
                                           optimizer_step_time)
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology

ROOT = Path(__file__).resolve().parent.parent
MODEL = get_model("llama3-8b", num_layers=4)
K = 12  # ZeRO's optimizer bytes per parameter under mixed-precision Adam (SC20, 3.1)
GB = 1e9


def nvme(**kw):
    return ParallelConfig(zero_stage=3, offload=True, offload_device="nvme", **kw)


# --- settings and DeepSpeed spellings -------------------------------------------------
def test_deepspeed_nvme_offload_maps_to_the_nvme_tier():
    p = ParallelConfig.from_kwargs(dp=4, **{
        "zero_optimization.stage": 3,
        "zero_optimization.offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
                                                "pin_memory": True, "buffer_count": 4},
        "nvme_bandwidth_gbps": 6.5})
    assert (p.offload, p.offload_device, p.nvme_bandwidth) == (True, "nvme", 6.5e9)
    cpu = ParallelConfig.from_kwargs(dp=4, zero_stage=3, offload_optimizer_device="cpu")
    assert cpu.offload and cpu.offload_device is None  # None: the host, ZeRO-Offload
    assert ParallelConfig(dp=4, zero_stage=3, offload=True, offload_device="cpu").offload
    assert ParallelConfig.from_kwargs(offload_param={"device": "none"}) == ParallelConfig()


@pytest.mark.parametrize("kw,match", [
    (dict(zero_stage=2, offload=True, offload_device="nvme"),
     r"offload_device='nvme' with zero_stage=2: DeepSpeed swaps .* only in its ZeRO-3"),
    (dict(zero_stage=1, offload_optimizer={"device": "nvme"}), "zero_stage=1"),
    (dict(zero_stage=3, offload_device="nvme"), "it needs offload=True"),
    (dict(zero_stage=3, offload_device="cpu"), "offload_device='cpu' .*needs offload=True"),
    (dict(zero_stage=3, offload_device="disk"), "offload_device='disk' must be one of"),
    (dict(zero_stage=3, offload=True, nvme_bandwidth=6e9),
     r"nvme_bandwidth \(--nvme-bandwidth\) .* needs offload_device='nvme'"),
    (dict(zero_stage=3, nvme_bandwidth_gbps=6), "needs offload_device='nvme'"),
    (dict(zero_stage=3, offload=True, offload_device="nvme", nvme_bandwidth=0),
     "nvme_bandwidth must be a finite number of bytes/s >= 1e6"),
    (dict(zero_stage=3, offload=True, offload_device="nvme", **{"--nvme-bandwidth": 6.5}),
     r"bytes/s >= 1e6 .*take GB/s\), got 6.5"),  # the field is bytes/s, the CLI flag GB/s
    (dict(zero_stage=3, offload=True, offload_device="nvme", nvme_bandwidth_gbps=-1),
     "nvme_bandwidth_gbps must be a finite number > 0"),
    (dict(zero_stage=3, offload=True, offload_device="nvme", nvme_bandwidth=6e9,
          nvme_bandwidth_gbps=6), "nvme_bandwidth given twice"),
    (dict(zero_stage=3, offload_optimizer={"device": "nvme", "pipeline_read": True}),
     r"pipeline_read=True: the pipelined swapper .* not modelled"),
    (dict(zero_stage=3, offload_optimizer={"device": "nvme", "pipeline_write": True}),
     "pipeline_write=True"),
    (dict(zero_stage=3, offload_optimizer={"device": "cpu", "ratio": 0.5}),
     r"ratio=0.5: partial offload"),
    (dict(zero_stage=3, offload_optimizer={"device": "nvme", "buffer_count": 8}),
     "buffer_count=8: the pinned NVMe staging buffers"),
    (dict(zero_stage=3, offload_optimizer={"device": "nvme", "nvme_paht": "/x"}),
     "unknown key 'nvme_paht'"),
    (dict(zero_stage=3, offload_optimizer={"device": "gpu"}), "device must be 'cpu', 'nvme'"),
    (dict(zero_stage=3, offload_param={"device": "nvme", "nvme_path": "/x"}),
     r"offload_param: device 'nvme' is not modelled: ZeRO-Infinity's parameter offload"),
    (dict(zero_stage=3, **{"zero_optimization.offload_param.device": "cpu"}),
     "device 'cpu' is not modelled"),
])
def test_refusals_name_the_setting_and_the_rule(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig.from_kwargs(dp=4, **kw)


# --- time: the step's NVMe swap, closed form ------------------------------------------
def test_swap_time_is_two_k_bytes_per_parameter_at_the_shared_bandwidth():
    params, ranks, bandwidth = 10**9, 8, 25 * GB
    host = Op(OpKind.OPT_STEP, 0, None, "host", 28 * params)
    tier = NvmeTier(bandwidth, K)
    swap = 2 * K * params / (bandwidth / ranks)
    assert tier.swap_seconds(params, ranks) == pytest.approx(swap)
    device = get_device("h100-sxm")
    cpu = params * ranks * CPU_ADAM_SECONDS_PER_PARAM
    assert optimizer_step_time(host, device, 0.8, host_ranks=ranks, nvme=tier) == \
        pytest.approx(cpu + swap)
    gpu = Op(OpKind.OPT_STEP, 0, None, None, 28 * params)  # not offloaded: no swap
    assert optimizer_step_time(gpu, device, 0.8, nvme=tier) == \
        optimizer_step_time(gpu, device, 0.8)


@pytest.mark.parametrize("dp, topology, ranks_per_node", [
    (8, "dgx-h100-x16-ndr", 8),  # one node, all 8 GPUs swap at once
    (4, "dgx-h100-x16-ndr", 4),  # the job's 4 ranks of node 0 share its NVMe
    (16, "dgx-h100-x16-ndr", 8),  # two nodes: each node's NVMe serves its own 8
])
def test_simulated_step_adds_the_swap_to_cpu_adam(dp, topology, ranks_per_node):
    bandwidth = 12 * GB
    cluster = load_topology(topology)
    steps = {}
    for device in ("cpu", "nvme"):
        extra = {"nvme_bandwidth": bandwidth} if device == "nvme" else {}
        parallel = ParallelConfig(dp=dp, num_microbatches=1, zero_stage=3, offload=True,
                                  offload_device=device, **extra)
        timeline = simulate(MODEL, parallel, cluster)
        [steps[device]] = [s for s in timeline.spans
                           if s.rank == 0 and s.op.kind is OpKind.OPT_STEP]
    shard = -(-MODEL.param_count() // dp)  # ZeRO-3: the rank's 1/dp of the parameters
    assert steps["cpu"].duration == pytest.approx(
        shard * ranks_per_node * CPU_ADAM_SECONDS_PER_PARAM)
    assert steps["nvme"].duration - steps["cpu"].duration == pytest.approx(
        2 * K * shard / (bandwidth / ranks_per_node))
    assert steps["nvme"].lane == "host"


def test_simulating_nvme_without_its_bandwidth_is_refused():
    with pytest.raises(ConfigError, match="needs the node's NVMe bandwidth, --nvme-bandwidth"):
        simulate(MODEL, nvme(dp=8, num_microbatches=1), load_topology("dgx-h100"))


# --- memory: the states leave host memory for NVMe ------------------------------------
@pytest.mark.parametrize("params, dp", [(7.5e9, 4), (7e9, 8)])
def test_states_move_to_nvme_and_host_keeps_the_swap_buffers(params, dp):
    [cpu] = bare_rank_memory(params, ParallelConfig(dp=dp, zero_stage=3, offload=True))
    [disk] = bare_rank_memory(params, nvme(dp=dp))
    shard = params / dp
    assert cpu.host == pytest.approx(K * shard) and cpu.nvme == 0
    assert disk.nvme == pytest.approx(K * shard)
    # DeepSpeed's 4 pinned fp32 swap buffers of the largest sub-group (sub_group_size 1e9)
    assert disk.host == pytest.approx(4 * 4 * min(shard, 1e9))
    assert cpu.host - disk.host == pytest.approx(K * shard - 16 * min(shard, 1e9))
    assert disk.total_bytes == cpu.total_bytes and disk.optimizer_states == 0


# --- the command line ------------------------------------------------------------------
def clustersim(*args):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_cli_memory_and_simulate(tmp_path):
    out = clustersim("memory", "--params", "7.5e9", "--dp", "4", "--zero", "3", "--offload",
                     "--offload-device", "nvme", "--json")
    data = json.loads(out.stdout)
    assert data["nvme_bytes"] == [pytest.approx(K * 7.5e9 / 4)]
    assert data["host_bytes"] == [pytest.approx(16e9)]
    table = clustersim("memory", "--params", "7.5e9", "--dp", "4", "--zero", "3", "--offload",
                       "--offload-device", "nvme").stdout
    assert "offload (nvme)" in table and "nvme" in table.splitlines()[2]

    flags = ["simulate", "--model", "llama3-8b", "--num-layers", "4", "--pp", "1", "--dp", "8",
             "--zero", "3", "--offload", "--microbatches", "1", "-o", str(tmp_path / "g.html")]
    times = {}
    for device, extra in (("cpu", []), ("nvme", ["--nvme-bandwidth", "24"])):
        metrics = tmp_path / f"{device}.json"
        run = clustersim(*flags, "--offload-device", device, *extra,
                         "--metrics-json", str(metrics))
        assert run.returncode == 0, run.stderr
        times[device] = json.loads(metrics.read_text())["iteration_time"]
    shard = -(-MODEL.param_count() // 8)
    assert times["nvme"] - times["cpu"] == pytest.approx(2 * K * shard / (24e9 / 8))

    for argv, message in (
            (["--offload-device", "nvme"], "needs the node's NVMe bandwidth, --nvme-bandwidth"),
            (["--nvme-bandwidth", "24"], "it needs offload_device='nvme'")):
        run = clustersim(*flags, *argv)
        assert run.returncode != 0
        [line] = run.stderr.strip().splitlines()
        assert line.startswith("clustersim: error:") and message in line
