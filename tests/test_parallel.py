"""ParallelConfig: validation, aliases, micro-batch arithmetic and the Megatron rank grid."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ALIASES, ParallelConfig
from clustersim.schedules.plan import resolve

MODEL = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                  vocab_size=1000)


def test_defaults():
    p = ParallelConfig(pp=4)
    assert p.num_microbatches == 4 and p.global_batch_size == 4 and p.world_size == 4
    assert p.schedule == "1f1b" and p.rank_order == "tp-cp-ep-dp-pp"


def test_world_size_excludes_ep():
    assert ParallelConfig(tp=2, cp=2, dp=4, pp=3, ep=4).world_size == 48


def test_microbatches_from_global_batch():
    p = ParallelConfig(dp=4, micro_batch_size=2, global_batch_size=64)
    assert p.num_microbatches == 8
    assert ParallelConfig(dp=4, micro_batch_size=2, global_batch_size=64,
                          num_microbatches=8).num_microbatches == 8
    with pytest.raises(ConfigError, match=r"global_batch_size=60.*micro_batch_size\*dp"):
        ParallelConfig(dp=4, micro_batch_size=2, global_batch_size=60)
    with pytest.raises(ConfigError, match="num_microbatches=4 disagrees"):
        ParallelConfig(dp=4, micro_batch_size=2, global_batch_size=64, num_microbatches=4)
    assert ParallelConfig(dp=2, num_microbatches=3).global_batch_size == 6


@pytest.mark.parametrize("kw,match", [
    (dict(tp=0), "tp must be"), (dict(dp=1.5), "dp must be"), (dict(zero_stage=4), "zero_stage"),
    (dict(recompute="half"), "recompute"), (dict(rank_order="tp-dp-pp"), "rank_order"),
    (dict(rank_order="tp-tp-ep-dp-pp"), "rank_order"), (dict(schedule="nope"), "unknown schedule"),
    (dict(pp=2, vpp=2), "needs vpp == 1"), (dict(pp=2, schedule="gpipe", vpp=2), "vpp == 1"),
    (dict(pp=2, vpp=1, schedule="interleaved-1f1b"), "vpp >= 2"),
    (dict(pp=4, vpp=2, schedule="interleaved", num_microbatches=9), "multiple of 2, got 9"),
    (dict(dp=2, ep=4), "ep=4 must divide dp\\*cp"), (dict(sequence_parallel=1), "sequence_parallel"),
])
def test_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig(**kw)


def test_schedule_aliases_are_canonicalised():
    p = ParallelConfig(pp=2, vpp=2, schedule="ScheduleInterleaved1F1B", num_microbatches=4)
    assert p.schedule == "interleaved-1f1b"


def test_from_kwargs_spellings():
    p = ParallelConfig.from_kwargs(**{
        "--pipeline-model-parallel-size": 2, "tensor_parallel_degree": 2,
        "data_parallel_replicate_degree": 2, "context_parallel_size": 1,
        "expert_model_parallel_size": 2, "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": 8, "zero_optimization_stage": 1, "sequence_parallel": True,
        "virtual_pipeline_model_parallel_size": None})
    assert (p.pp, p.tp, p.dp, p.ep, p.zero_stage, p.num_microbatches) == (2, 2, 2, 2, 1, 4)
    assert p.sequence_parallel and p.vpp == 1
    assert ParallelConfig.from_kwargs(microbatches=6, pp=3).num_microbatches == 6
    assert set(ALIASES.values()) >= {"pp", "vpp", "tp", "dp", "cp", "ep", "num_microbatches"}


def test_from_kwargs_errors():
    with pytest.raises(ConfigError, match="tensor_paralel_size"):
        ParallelConfig.from_kwargs(tensor_paralel_size=2)
    with pytest.raises(ConfigError, match="tp given twice"):
        ParallelConfig.from_kwargs(tp=2, tensor_model_parallel_size=2)


def test_rank_grid_megatron_default_order():
    p = ParallelConfig(tp=2, dp=2, pp=2)
    assert p.coords(1) == dict(tp=1, cp=0, ep=0, dp=0, pp=0)
    assert p.coords(2)["dp"] == 1 and p.coords(4)["pp"] == 1
    assert p.rank(tp=1) == 1 and p.rank(dp=1) == 2 and p.rank(pp=1) == 4
    for r in range(p.world_size):
        assert p.rank(**p.coords(r)) == r
    assert p.group("tp", 5) == [4, 5] and p.group("dp", 5) == [5, 7] and p.group("pp", 5) == [1, 5]


def test_rank_grid_custom_order_round_trip():
    p = ParallelConfig(tp=2, cp=2, dp=3, pp=2, rank_order="pp-dp-cp-ep-tp")
    assert p.rank(pp=1) == 1 and p.rank(dp=1) == 2 and p.rank(tp=1) == 12
    assert sorted(p.rank(**p.coords(r)) for r in range(p.world_size)) == list(range(24))


def test_expert_grid_folds_into_dp():
    p = ParallelConfig(tp=2, dp=4, ep=2)
    # Megatron expert grid tp-ep-edp-pp: ep groups are neighbouring dp ranks
    assert [p.coords(r)["ep"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert p.group("ep", 0) == [0, 2] and p.group("ep", 5) == [5, 7]
    for r in range(p.world_size):
        assert p.rank(**p.coords(r)) == r
    with pytest.raises(ConfigError, match="ep=0 does not match"):
        p.rank(dp=1, ep=0)


def test_rank_errors():
    p = ParallelConfig(tp=2)
    with pytest.raises(ConfigError, match="tp=2 out of range"):
        p.rank(tp=2)
    with pytest.raises(ConfigError, match="unknown grid axis"):
        p.rank(xp=0)
    with pytest.raises(ConfigError, match="rank=2"):
        p.coords(2)


def test_check_model():
    ParallelConfig(pp=4, tp=8).check_model(MODEL)
    m30 = ModelSpec(num_layers=30, hidden_size=256, num_attention_heads=8, seq_length=128,
                    vocab_size=1000)
    # the pipeline split is checked where the plan computes it
    with pytest.raises(ConfigError, match=r"num_layers=30 is not divisible by num_stages=8 \(pp\*vpp\)"):
        resolve(m30, ParallelConfig(pp=4, vpp=2, schedule="interleaved-1f1b"))
    with pytest.raises(ConfigError, match="num_attention_heads=8 is not divisible by tp=3"):
        ParallelConfig(tp=3).check_model(MODEL)
    with pytest.raises(ConfigError, match="ep=2 needs num_experts"):
        ParallelConfig(dp=2, ep=2).check_model(MODEL)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        ParallelConfig(micro_batch_size=2).check_model(MODEL)
    with pytest.raises(ConfigError, match="seq_length"):
        ParallelConfig(cp=3).check_model(MODEL)


# --- data-parallel sharding: aliases with value mapping (schedules.parallel_aliases) -------
@pytest.mark.parametrize("kw,expected", [
    ({"zero_optimization.stage": 2}, dict(zero_stage=2, fsdp="none")),
    ({"zero_optimization_stage": 3}, dict(zero_stage=3, fsdp="full")),
    ({"--use-distributed-optimizer": True}, dict(zero_stage=1)),
    ({"--use-distributed-optimizer": False}, dict(zero_stage=0)),
    ({"--data-parallel-sharding-strategy": "no_shard"}, dict(zero_stage=0, fsdp="none")),
    ({"--data-parallel-sharding-strategy": "optim"}, dict(zero_stage=1)),
    ({"--data-parallel-sharding-strategy": "optim_grads"}, dict(zero_stage=2, fsdp="none")),
    ({"--data-parallel-sharding-strategy": "optim_grads_params"}, dict(zero_stage=3, fsdp="full")),
    ({"sharding_strategy": "NO_SHARD"}, dict(zero_stage=0, fsdp="none")),
    ({"sharding_strategy": "SHARD_GRAD_OP"}, dict(zero_stage=2, fsdp="none")),
    ({"sharding_strategy": "ShardingStrategy.FULL_SHARD"}, dict(zero_stage=3, fsdp="full")),
    ({"sharding_strategy": "HYBRID_SHARD", "shard_size": 2}, dict(zero_stage=3, fsdp="hybrid")),
    ({"sharding_strategy": "_HYBRID_SHARD_ZERO2"}, dict(zero_stage=2, fsdp="hybrid")),
    ({"zero_stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
     dict(offload=True)),
    ({"zero_stage": 1, "zero_optimization.offload_optimizer.device": "cpu"}, dict(offload=True)),
    ({"zero_stage": 1, "offload_optimizer": {"device": "none"}}, dict(offload=False)),
    ({"zero_stage": 2, "--optimizer-cpu-offload": True}, dict(offload=True)),
    ({"zero_stage": 3, "zero_optimization.zero_quantized_weights": True},
     dict(quantized_weights=True)),
    ({"zero_stage": 3, "zero_quantized_gradients": True}, dict(quantized_gradients=True)),
    ({"zero_stage": 3, "zero_hpz_partition_size": 2}, dict(hpz=True, hpz_partition_size=2)),
    ({"zero_stage": 3, "zero_hpz_partition_size": 1}, dict(hpz=False, hpz_partition_size=None)),
    ({"bucket_cap_mb": 25}, dict(bucket_bytes=25 * 2**20)),
    ({"reduce_bucket_size": 5e8}, dict(bucket_bytes=10**9)),  # elements x 2 B (16-bit grads)
    ({"overlap_comm": False}, dict(overlap_grad_reduce=False)),
    ({"--recompute-granularity": "selective"}, dict(recompute="selective")),
    ({"--recompute-granularity": "full", "--recompute-method": "uniform"},
     dict(recompute="full", recompute_method="uniform", recompute_num_layers=1)),
    ({"--recompute": "full", "--recompute-method": "block", "--recompute-num-layers": 2},
     dict(recompute="full", recompute_method="block", recompute_num_layers=2)),
    ({"--recompute-granularity": "full"},  # clustersim's default method (module schedules.recompute)
     dict(recompute="full", recompute_method="uniform", recompute_num_layers=1)),
    ({"--recompute-activations": True}, dict(recompute="selective")),
])
def test_sharding_aliases_map_values(kw, expected):
    p = ParallelConfig.from_kwargs(dp=4, **kw)
    assert {k: getattr(p, k) for k in expected} == expected


def test_fsdp_and_zero3_are_one_configuration():
    assert ParallelConfig(dp=4, fsdp="full") == ParallelConfig(dp=4, zero_stage=3)
    assert ParallelConfig(dp=4, fsdp="hybrid", shard_size=2).zero_stage == 3
    assert ParallelConfig(dp=4, fsdp="hybrid", zero_stage=2).zero_stage == 2
    assert ParallelConfig(dp=1, zero_stage=1).zero_stage == 1  # trivial shard, allowed
    assert ParallelConfig(pp=2, dp=2, zero_stage=1).zero_stage == 1  # distributed optimizer
    assert ParallelConfig().grad_bucket_bytes == 25 * 2**20
    assert ParallelConfig(dp=2, bucket_bytes=1000).grad_bucket_bytes == 1000


@pytest.mark.parametrize("kw,match", [
    ({"sharding_strategy": "SHARD_EVERYTHING"}, "sharding_strategy='SHARD_EVERYTHING' must be one of"),
    ({"--data-parallel-sharding-strategy": "params"}, "data-parallel-sharding-strategy='params'"),
    ({"zero_stage": 2, "offload_optimizer": {"device": "nvme"}},
     "'nvme' with zero_stage=2: .*only in its ZeRO-3"),  # tests/test_zero_infinity.py
    ({"offload_optimizer": "gpu"}, "device must be 'cpu', 'nvme' or 'none'"),
    ({"zero_hpz_partition_size": 0}, "zero_hpz_partition_size must be an integer >= 1"),
    ({"bucket_cap_mb": -1}, "bucket_cap_mb must be a finite number > 0"),
    ({"--use-distributed-optimizer": "yes"}, "use-distributed-optimizer must be a bool"),
    ({"--recompute-granularity": "full", "--recompute-method": "some"},
     "recompute_method='some' must be one of uniform, block"),
    ({"--recompute-method": "block"}, r"recompute_method='block' needs recompute='full'"),
    ({"--recompute-num-layers": 2}, r"recompute_num_layers=2 needs recompute='full'"),
    ({"--recompute-granularity": "full", "--recompute-num-layers": 0},
     "recompute_num_layers must be an integer >= 1"),
    ({"zero_stage": 2, "--use-distributed-optimizer": True},
     r"zero_stage given twice, as zero_stage=2 and --use-distributed-optimizer=True"),
    ({"--recompute-granularity": "selective", "--recompute-method": "uniform"},
     r"recompute_method='uniform' needs recompute='full'.*got recompute='selective'"),
    ({"--recompute": "full", "--recompute-granularity": "full"}, "recompute given twice"),
    ({"bucket_cap_mb": 25, "reduce_bucket_size": 5e8}, "bucket_bytes given twice"),
    ({"zero_stage": 2, "sharding_strategy": "FULL_SHARD"}, "zero_stage given twice"),
])
def test_sharding_alias_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig.from_kwargs(dp=4, **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(dp=4, fsdp="full", zero_stage=1), r"fsdp='full' shards parameters \(ZeRO-3\) but zero_stage=1"),
    (dict(dp=4, fsdp="full", zero_stage=2), r"fsdp='full'.*zero_stage=2.*SHARD_GRAD_OP"),
    (dict(dp=4, fsdp="hybrid", zero_stage=1), r"fsdp='hybrid'.*but zero_stage=1"),
    (dict(dp=2, pp=2, zero_stage=3, quantized_weights=True),
     r"quantized_weights \(ZeRO\+\+\) with zero_stage=3 and pp=2.*incompatible with pipeline "
     r"parallelism"),
    (dict(dp=2, pp=2, zero_stage=2, offload=True), r"offload with zero_stage=2 and pp=2"),
    (dict(dp=2, pp=2, zero_stage=2, overlap_grad_reduce=False),
     r"overlap_grad_reduce=False with zero_stage=2 \(fsdp='none'\) and pp=2.*optim_grads"),
    (dict(dp=4, zero_stage=2, quantized_weights=True), "quantized_weights .*needs zero_stage=3"),
    (dict(dp=4, zero_stage=2, hpz=True), r"hpz \(ZeRO\+\+ hpZ\).*needs zero_stage=3, got zero_stage=2"),
    (dict(dp=4, zero_stage=1, quantized_gradients=True), "quantized_gradients .*zero_stage >= 2"),
    (dict(dp=4, fsdp="hybrid", hpz=True), "hpz with fsdp='hybrid'"),
    (dict(dp=4, offload=True), r"offload \(ZeRO-Offload\).*needs zero_stage >= 1"),
    (dict(dp=4, shard_size=2), "shard_size=2 needs fsdp='hybrid', got fsdp='none'"),
    (dict(dp=4, zero_stage=3, shard_size=2), "shard_size=2 needs fsdp='hybrid', got fsdp='full'"),
    (dict(dp=6, fsdp="hybrid", shard_size=4), "shard_size=4 must divide dp=6"),
    (dict(dp=4, zero_stage=3, hpz_partition_size=2), "hpz_partition_size=2 needs hpz=True"),
    (dict(dp=6, zero_stage=3, hpz=True, hpz_partition_size=4), "hpz_partition_size=4 must divide dp=6"),
    (dict(dp=4, fsdp="sharded"), "fsdp='sharded' must be one of none, full, hybrid"),
    (dict(dp=4, shard_size=0, fsdp="hybrid"), "shard_size must be an integer >= 1"),
    (dict(dp=4, offload="yes"), "offload must be a bool"),
])
def test_sharding_rules(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig(**kw)


# --- intra-layer options as fields (schedules.intra_layer) ------------------------------------
def test_intra_layer_fields_default_as_before():
    p = ParallelConfig()
    assert (p.tp_comm_overlap, p.cp_comm, p.moe_imbalance, p.scatter_gather) == (
        False, "ring", 1.0, False)
    assert ParallelConfig(moe_imbalance=2).moe_imbalance == 2.0


@pytest.mark.parametrize("kw,match", [
    (dict(cp_comm="allgather"), "cp_comm='allgather' must be one of ring, ulysses"),
    (dict(moe_imbalance=0.5), "moe_imbalance must be a finite number >= 1"),
    (dict(moe_imbalance=True), "moe_imbalance must be a finite number >= 1"),
    (dict(tp_comm_overlap=1), "tp_comm_overlap must be a bool"),
    (dict(scatter_gather="yes"), "scatter_gather must be a bool"),
])
def test_intra_layer_field_errors_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig(**kw)


@pytest.mark.parametrize("kw,expected", [
    ({"--tp-comm-overlap": True, "sequence_parallel": True}, dict(tp_comm_overlap=True)),
    ({"--cp-comm-type": "p2p"}, dict(cp_comm="ring")),
    ({"--cp-comm-type": "a2a"}, dict(cp_comm="ulysses")),
    ({"cp_comm_type": ["a2a", "a2a"]}, dict(cp_comm="ulysses")),  # one per layer, all equal
    ({"--scatter-gather-tensors-in-pipeline": True}, dict(scatter_gather=True)),
    ({"--no-scatter-gather-tensors-in-pipeline": True}, dict(scatter_gather=False)),
    ({"--no-scatter-gather-tensors-in-pipeline": False}, dict(scatter_gather=True)),
    ({"moe_imbalance": 1.5}, dict(moe_imbalance=1.5)),
])
def test_intra_layer_aliases_map_values(kw, expected):
    p = ParallelConfig.from_kwargs(tp=2, cp=2, **kw)
    assert {k: getattr(p, k) for k in expected} == expected


@pytest.mark.parametrize("kw,match", [
    ({"--cp-comm-type": "allgather"}, "cp-comm-type='allgather'.*not modelled"),
    ({"--cp-comm-type": "a2a+p2p", "cp": 4}, "cp_comm='usp' needs cp_a2a"),  # no sizes
    ({"--cp-comm-type": "ring"}, "cp-comm-type='ring' must be one of p2p, a2a, a2a\\+p2p"),
    ({"cp_comm_type": ["p2p", "a2a"]}, "one communication type for every layer"),
    ({"cp_comm": "ring", "cp_comm_type": "p2p"}, "cp_comm given twice"),
    ({"scatter_gather": True, "scatter_gather_tensors_in_pipeline": True},
     "scatter_gather given twice"),
])
def test_intra_layer_alias_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig.from_kwargs(**kw)


# --- expert tensor parallelism: the expert grid etp x ep x edp ------------------------------
def test_etp_defaults_to_tp_and_its_aliases():
    assert ParallelConfig(tp=4).expert_tensor_parallel is None
    assert ParallelConfig(tp=4).etp == 4 and ParallelConfig(tp=4, dp=2, ep=2).edp == 1
    for key in ("--expert-tensor-parallel-size", "expert_tensor_parallel_degree", "etp"):
        p = ParallelConfig.from_kwargs(tp=4, dp=2, ep=2, **{key: 2})
        assert (p.expert_tensor_parallel, p.etp, p.edp) == (2, 2, 2)


def test_expert_grid_groups_partition_the_ranks():
    """tp=4 x dp=2 re-split as etp=2 x ep=2 x edp=2 (Megatron-Core's expert RankGenerator:
    same order string, etp in tp's place, edp in dp's): rank = etp_i + 2 ep_i + 4 edp_i
    within a stage, the stage stride 8."""
    p = ParallelConfig(tp=4, dp=2, pp=2, ep=2, expert_tensor_parallel=2)
    assert (p.etp, p.ep, p.edp, p.world_size) == (2, 2, 2, 16)
    assert p.group("etp", 0) == [0, 1] and p.group("ep", 0) == [0, 2]
    assert p.group("edp", 0) == [0, 4] and p.group("tp", 0) == [0, 1, 2, 3]
    assert p.group("ep", 13) == [13, 15] and p.group("edp", 13) == [9, 13]
    sizes = {"etp": 2, "ep": 2, "edp": 2, "pp": 2}
    for axis, size in sizes.items():
        groups = {tuple(p.group(axis, r)) for r in range(p.world_size)}
        assert sorted(r for g in groups for r in g) == list(range(16))  # a partition
        assert {len(g) for g in groups} == {size}
    for r in range(p.world_size):  # the axes form a grid: two groups through r meet in r
        for a in sizes:
            for b in sizes:
                if a != b:
                    assert set(p.group(a, r)) & set(p.group(b, r)) == {r}


def test_expert_grid_with_etp_equal_to_tp_is_the_old_one():
    old, new = ParallelConfig(tp=2, dp=4, ep=2), ParallelConfig(tp=2, dp=4, ep=2,
                                                                expert_tensor_parallel=2)
    for r in range(8):
        assert old.group("ep", r) == new.group("ep", r)
        assert old.group("etp", r) == old.group("tp", r) == new.group("etp", r)


@pytest.mark.parametrize("kw,match", [
    (dict(tp=2, dp=2, ep=2, expert_tensor_parallel=3),
     r"expert_tensor_parallel\*ep=3\*2 must divide tp\*cp\*dp=2\*1\*2"),
    (dict(tp=2, dp=2, ep=4, expert_tensor_parallel=2), r"expert_tensor_parallel\*ep=2\*4"),
    (dict(tp=2, expert_tensor_parallel=0), "expert_tensor_parallel must be an integer >= 1"),
    (dict(tp=2, expert_tensor_parallel=1.5), "expert_tensor_parallel must be an integer >= 1"),
])
def test_etp_errors_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        ParallelConfig(**kw)


def test_etp_rules_against_the_model():
    moe = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                    vocab_size=1000, num_experts=4)
    with pytest.raises(ConfigError, match="expert_tensor_parallel=1 differs from tp=2: needs "
                                          "sequence_parallel"):
        ParallelConfig(tp=2, dp=2, ep=2, expert_tensor_parallel=1).check_model(moe)
    ParallelConfig(tp=2, dp=2, ep=2, expert_tensor_parallel=1,
                   sequence_parallel=True).check_model(moe)
    ParallelConfig(tp=1, dp=4, ep=2, expert_tensor_parallel=2).check_model(moe)
    with pytest.raises(ConfigError, match="expert_tensor_parallel: the model has no experts"
                                          ".*would change nothing"):
        ParallelConfig(tp=2, expert_tensor_parallel=1).check_model(MODEL)  # dense
    with pytest.raises(ConfigError, match="unknown grid axis 'xp': axes are .*etp, edp"):
        ParallelConfig().group("xp", 0)


@pytest.mark.parametrize("tp, cp, what", [(1, 16, "KV groups"), (2, 8, "KV groups"),
                                          (1, 64, "attention heads")])
def test_ulysses_needs_heads_and_kv_groups_divisible_by_cp(tp, cp, what):
    """Ulysses' all-to-all splits Q, K and V by heads into cp parts (Transformer Engine's
    a2a context parallelism), so Llama-3 8B's 32 heads and 8 KV groups per TP rank must
    divide by cp (issue 14, item 12: 8 KV groups over cp 16 used to be accepted)."""
    from clustersim.schedules.model_presets import get_model

    parallel = ParallelConfig(tp=tp, cp=cp, cp_comm="ulysses", num_microbatches=1)
    with pytest.raises(ConfigError, match=f"ulysses.*{what}.*divisible by cp"):
        parallel.check_model(get_model("llama3-8b"))
    ParallelConfig(tp=tp, cp=cp, num_microbatches=1).check_model(get_model("llama3-8b"))  # ring


@pytest.mark.parametrize("kw, match", [
    (dict(sequence_parallel=True), "sequence_parallel=True.*needs tp > 1"),
    (dict(tp_comm_overlap=True), "tp_comm_overlap=True.*needs tp > 1"),
    (dict(scatter_gather=True), "scatter_gather=True.*needs tp > 1"),
    (dict(tp=2, scatter_gather=True, sequence_parallel=True), "scatter_gather.*sequence shard"),
    (dict(cp_comm="ulysses"), "cp_comm='ulysses'.*needs cp > 1"),
    (dict(dp=2, reshard_after_forward=False), "reshard_after_forward=False.*zero_stage=3"),
    (dict(dp=2, zero_stage=2, reshard_after_forward=False), "zero_stage=3, got zero_stage=2"),
    (dict(dp=2, zero_stage=3, overlap_grad_reduce=False), "overlap_grad_reduce=False.*ZeRO-3"),
    (dict(dp=2, zero_stage=3, bucket_bytes=1 << 20), "bucket_bytes.*one layer unit"),
    (dict(overlap_grad_reduce=False), r"dp\*cp=1 and no offload"),
    (dict(bucket_bytes=1 << 20), r"dp\*cp=1 and no offload"),
])
def test_an_option_that_cannot_act_is_refused_with_the_reason(kw, match):
    """Issue 14, item 15: each of these used to be accepted and change nothing."""
    with pytest.raises(ConfigError, match=match):
        ParallelConfig(num_microbatches=1, **kw)


def test_the_same_options_act_where_they_apply():
    ParallelConfig(tp=2, sequence_parallel=True, tp_comm_overlap=True, num_microbatches=1)
    ParallelConfig(tp=2, scatter_gather=True, cp=2, cp_comm="ulysses", num_microbatches=1)
    ParallelConfig(dp=2, zero_stage=3, reshard_after_forward=False, num_microbatches=1)
    ParallelConfig(dp=2, overlap_grad_reduce=False, bucket_bytes=1 << 20, num_microbatches=1)
    ParallelConfig(zero_stage=1, offload=True, overlap_grad_reduce=False, num_microbatches=1)
