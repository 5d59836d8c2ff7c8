"""schedules.memory_model against closed forms: the ZeRO paper's model-state formulas
(Rajbhandari et al. SC20, section 5.1 and Table 1), Korthikanti et al. 2022 activations
per in-flight microbatch, and the in-flight counts of GPipe / 1F1B / interleaved 1F1B."""
from dataclasses import replace

import pytest

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.schedules.costs import costs_for_layers
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import (RankMemory, activation_peaks, bare_rank_memory,
                                               model_states, rank_memory)
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.sharding import shard_group_size

GPT = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                vocab_size=1000, micro_batch_size=2)


def states(params, **kw):
    parallel = ParallelConfig(**kw)  # shard group as given (no cluster to take it from)
    return bare_rank_memory(params, parallel, shard_group_size(parallel))[0]


def memory(model, parallel, **kw):
    return rank_memory(resolve(model, parallel), **kw)


def nodes(gpus, per_node):
    """Cluster facts of `gpus` GPUs, `per_node` on each host."""
    return ClusterFacts("test", tuple(f"gpu{g}" for g in range(gpus)),
                        tuple(g // per_node for g in range(gpus)), "h100", 80e9)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 4, 64])
def test_zero_formulas(stage, n):
    psi, k = 1e9, 12
    expected = [(2 + 2 + k) * psi, 2 * psi + 2 * psi + k * psi / n,
                2 * psi + (2 + k) * psi / n, (2 + 2 + k) * psi / n][stage]
    m = states(psi, dp=n, zero_stage=stage)
    assert m.model_states_bytes == pytest.approx(expected)
    assert m.total_bytes == m.model_states_bytes and m.host == 0  # bare count: states only


@pytest.mark.parametrize("dtype, plain, sharded", [
    ("fp16", 20, lambda d: 4 + 16 / d),  # 'fp16 param, fp16 grads'
    ("fp32", 16, lambda d: 8 + 8 / d),  # 'fp32 param, fp32 grads'
])
@pytest.mark.parametrize("d", [2, 8, 64])
def test_bytes_per_param_follow_megatrons_distributed_optimizer_table(dtype, plain, sharded,
                                                                      d):
    """Megatron-LM docs/distrib_optimizer.md: bytes per parameter without and with the
    distributed optimizer (ZeRO-1 over the d data-parallel ranks)."""
    for stage, expected in ((0, plain), (1, sharded(d))):
        states = model_states(1e9, ParallelConfig(dp=d, zero_stage=stage), dtype)
        assert sum(states.values()) == pytest.approx(expected * 1e9)


def test_fp32_model_keeps_16_bytes_per_param_unsharded():
    assert model_states(10, ParallelConfig(), "fp32") == dict(
        parameters=40, gradients=40, optimizer_states=80, host=0, hpz_secondary=0)


def test_offload_moves_the_optimizer_partition_to_the_host():
    m = states(1e9, dp=4, zero_stage=2, offload=True)
    assert m.optimizer_states == 0 and m.host == pytest.approx(12e9 / 4)
    assert m.model_states_bytes == pytest.approx(2e9 + 2e9 / 4)


def test_hybrid_shards_over_the_shard_group_and_hpz_adds_a_secondary_shard():
    hybrid = states(1e9, dp=16, fsdp="hybrid", shard_size=8)
    assert hybrid.model_states_bytes == pytest.approx(16e9 / 8)
    hpz = states(1e9, dp=16, zero_stage=3, hpz=True, hpz_partition_size=8)
    assert hpz.hpz_secondary == pytest.approx(2e9 / 8)
    assert hpz.model_states_bytes == pytest.approx(16e9 / 16 + 2e9 / 8)
    # no shard_size: the shard group is the dp ranks on one node (4 GPUs per node, tp=1)
    parallel = ParallelConfig(dp=16, fsdp="hybrid")
    node = bare_rank_memory(1e9, parallel, shard_group_size(parallel, nodes(16, 4)))[0]
    assert node.model_states_bytes == pytest.approx(16e9 / 4)
    # intended change (issue 13): with tp=2 a 4-GPU node holds 4 / 2 = 2 dp ranks, and the
    # default group is those 2 dp ranks (it used to be the 4 GPUs per node)
    parallel = ParallelConfig(dp=16, tp=2, fsdp="hybrid")
    node = bare_rank_memory(1e9, parallel, shard_group_size(parallel, nodes(32, 4)))[0]
    assert node.model_states_bytes == pytest.approx(16 * 1e9 / 2 / 2)
    with pytest.raises(ConfigError, match="fsdp='hybrid' needs shard_size, or a topology"):
        states(1e9, dp=16, fsdp="hybrid")
    with pytest.raises(ConfigError, match="hpz needs hpz_partition_size"):
        states(1e9, dp=16, zero_stage=3, hpz=True)


def test_bare_count_splits_over_pipeline_and_tensor_ranks():
    ranks = bare_rank_memory(8e9, ParallelConfig(pp=2, tp=2, dp=4, zero_stage=1))
    assert len(ranks) == 2 and ranks[1].params == 2e9
    assert ranks[0].model_states_bytes == pytest.approx(4 * 2e9 + 12 * 2e9 / 4)
    with pytest.raises(ConfigError, match="params must be a parameter count > 0"):
        bare_rank_memory(0, ParallelConfig())


def test_model_params_per_rank_are_the_stages_params_over_tp():
    p = ParallelConfig(pp=2, tp=2, micro_batch_size=2)
    costs = costs_for_layers(GPT, p, [4, 4])
    ranks = memory(GPT, p)
    for r in (0, 1):
        assert ranks[r].params == costs[r].param_count + costs[r].tied_param_count
        assert ranks[r].parameters == 2 * ranks[r].params
    assert ranks[0].params > ranks[1].params - costs[1].tied_param_count  # embedding on 0


def test_expert_weights_per_rank_follow_etp():
    """Mixed-precision Adam, ZeRO-0: 16 bytes per parameter; the routed experts of a rank
    are E/ep * (2hf + f) / etp sharded parameters per layer (4 layers per pipeline rank)."""
    moe = replace(GPT, num_experts=4)
    h, f = 256, 1024

    def rank0(etp):
        return memory(moe, ParallelConfig(pp=2, tp=2, dp=4, ep=2, sequence_parallel=True,
                                          expert_tensor_parallel=etp, micro_batch_size=2))[0]

    extra = 4 * 4 / 2 * (2 * h * f + f) * (1 - 1 / 2)
    assert rank0(1).params - rank0(2).params == extra
    assert rank0(1).model_states_bytes - rank0(2).model_states_bytes == 16 * extra


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_activations_are_korthikanti_bytes_per_layer_times_in_flight(recompute, tp, sp):
    p = ParallelConfig(pp=2, tp=tp, sequence_parallel=sp, recompute=recompute,
                       micro_batch_size=2, num_microbatches=4)
    layer = GPT.layer_activation_bytes(tp, sp, recompute)  # K22 Table 2 (tests/test_model.py)
    middle = [0, 3]  # hold 3 microbatches of stage 1 only
    got = memory(GPT, p, in_flight=middle)[1]
    extra = costs_for_layers(GPT, p, [4, 4])[1].activation_bytes - 4 * layer  # output layer, logits
    assert got.activations == pytest.approx(3 * (4 * layer + extra), abs=3)
    assert got.in_flight == 3


def test_1f1b_holds_about_p_over_m_of_gpipe():
    pp, m = 4, 16
    model = replace(GPT, num_layers=8)
    runs = {s: memory(model, ParallelConfig(pp=pp, num_microbatches=m, schedule=s,
                                            micro_batch_size=2)) for s in ("gpipe", "1f1b")}
    assert [r.in_flight for r in runs["gpipe"]] == [m] * pp
    assert [r.in_flight for r in runs["1f1b"]] == [min(pp - r, m) for r in range(pp)]
    for g, o in zip(runs["gpipe"], runs["1f1b"]):
        assert o.activations / g.activations == pytest.approx(o.in_flight / m)
    # the busiest rank: 1F1B's rank 0 holds P microbatches where GPipe's ranks hold M; the
    # last stage (logits) weighs more, so the ratio of peaks is P/M up to stage imbalance
    peak = lambda run: max(r.activations for r in run)
    assert runs["1f1b"][0].activations / runs["gpipe"][0].activations == pytest.approx(pp / m)
    ratio = peak(runs["1f1b"]) / peak(runs["gpipe"])
    assert 1 / m < ratio <= pp / m


def test_interleaved_in_flight_follows_megatron_warmup():
    pp, vpp, m = 4, 2, 8
    schedule = build_schedule("interleaved-1f1b", pp, m, vpp)
    bytes_, counts = activation_peaks(schedule, [1.0] * pp * vpp)
    # warm-up 2(P-r-1) + (V-1)P forwards, plus the first steady forward
    assert [counts[r] for r in range(pp)] == [2 * (pp - r - 1) + (vpp - 1) * pp + 1
                                              for r in range(pp)]
    assert bytes_ == counts


def test_zero3_buffers_hold_two_gathered_layers_unless_not_resharded():
    p = ParallelConfig(dp=4, zero_stage=3, micro_batch_size=2)
    layer_bytes = 2 * GPT.layer_param_count()
    m = memory(GPT, p)[0]
    # two (torch DDP default, 25 MiB) gradient buckets in flight, at most all 16-bit grads
    buckets = min(2 * 25 * 2**20, 2 * m.params)
    assert m.communication_buffers == buckets
    assert m.gathered_parameters == pytest.approx(2 * layer_bytes)
    assert m.total_bytes == pytest.approx(m.model_states_bytes + m.activations + buckets
                                          + 2 * layer_bytes)
    kept = memory(GPT, replace(p, reshard_after_forward=False))[0]
    assert kept.gathered_parameters == pytest.approx(8 * layer_bytes)
    single = memory(GPT, ParallelConfig(micro_batch_size=2))[0]
    assert single.communication_buffers == single.gathered_parameters == 0  # dp = 1


def test_rank_memory_to_dict_and_errors():
    d = memory(GPT, ParallelConfig(micro_batch_size=2))[0].to_dict()
    assert d["model_states_bytes"] == d["parameters"] + d["gradients"] + d["optimizer_states"]
    assert d["total_bytes"] == d["model_states_bytes"] + d["activations"]
    assert set(RankMemory.__dataclass_fields__) <= set(d)
    with pytest.raises(ConfigError, match="in_flight has 1 entries"):
        memory(GPT, ParallelConfig(pp=2, micro_batch_size=2), in_flight=[1])
    with pytest.raises(ConfigError, match="has 4 ranks, pp is 2"):  # the plan checks its shape
        resolve(GPT, ParallelConfig(pp=2, micro_batch_size=2),
                schedule=build_schedule("1f1b", 4, 4))
