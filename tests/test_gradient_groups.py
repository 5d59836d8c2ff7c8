"""Which ranks a gradient is reduced over (issue 14, item 6), against Megatron-Core's rules
(megatron/core/parallel_state.py): dense gradients over the data-parallel group "with
context parallel" (dp x cp ranks: CP ranks hold the same weights), the routed experts'
over the expert data-parallel group (edp = tp*cp*dp / (etp*ep) ranks), and the
distributed optimizer sharding each part over that part's group. Parameter counts are
worked out here by hand from Mixtral 8x7B's published shape (h 4096, 32 heads, 8 KV
groups, 8 experts of ffn 14336, SwiGLU, vocabulary 32000, untied, RMSNorm)."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve

LLAMA = get_model("llama3-8b", num_layers=4, seq_length=1024)
H, F_E, E, V, L = 4096, 14336, 8, 32000, 32
EXPERT_PARAMS = L * E * 3 * H * F_E  # SwiGLU: gate, up, down of every expert, no biases
DENSE_PARAMS = (L * (H * (H + 2 * 1024) + H * H  # QKV (8 KV groups of 128) and out proj
                     + 2 * H + H * E)  # two RMSNorms, the router
                + 2 * V * H + H)  # untied embedding and output layer, final norm
GRADIENT_KINDS = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER)


def lowered_ops(model, parallel):
    plan = resolve(model, parallel)
    return plan, [op for op in lower(plan.build_schedule(), plan).ops()]


def gradient_bytes(ops, group):
    return sum(op.nbytes for op in ops if op.kind in GRADIENT_KINDS and op.group == group)


def test_the_published_mixtral_shape_gives_its_parameter_count():
    """The hand count above is Mixtral 8x7B's 46.7 B parameters (Mistral AI, 2024)."""
    assert get_model("mixtral-8x7b").param_count() == EXPERT_PARAMS + DENSE_PARAMS
    assert (EXPERT_PARAMS + DENSE_PARAMS) / 1e9 == pytest.approx(46.7, abs=0.05)


@pytest.mark.parametrize("dp", [1, 2])
def test_context_parallel_ranks_reduce_their_gradients_together(dp):
    """cp 2: the two CP ranks compute gradients of different sequence chunks of the same
    weights; they are all-reduced over dp x cp ranks (with dp 1 too, where nothing was)."""
    plan, ops = lowered_ops(LLAMA, ParallelConfig(cp=2, dp=dp, num_microbatches=2))
    params = LLAMA.param_count()
    assert gradient_bytes(ops, "dp_cp") == 2 * params  # bf16: 2 bytes per gradient
    assert gradient_bytes(ops, "dp") == 0
    assert plan.group("dp_cp", 0) == sorted(r for d in range(dp)
                                            for r in (plan.parallel.rank(cp=0, dp=d),
                                                      plan.parallel.rank(cp=1, dp=d)))
    assert len(plan.group("dp_cp", 0)) == 2 * dp


def test_zero_shards_over_dp_times_cp():
    """ZeRO-1 with cp 2, dp 2: reduce-scatter over 4 ranks, each stepping 1/4 (ZeRO's K
    Psi / N with N = dp * cp, as the memory model already says)."""
    plan, ops = lowered_ops(LLAMA, ParallelConfig(cp=2, dp=2, zero_stage=1,
                                                  num_microbatches=2))
    (step,) = [op for op in ops if op.kind is OpKind.OPT_STEP]
    assert step.nbytes == 28 * -(-LLAMA.param_count() // 4)  # ADAM_BYTES_PER_PARAM
    gathers = [op for op in ops if op.kind is OpKind.ALL_GATHER and op.group != "cp"]
    assert {op.group for op in gathers} == {"dp_cp"}
    assert sum(op.nbytes for op in gathers) == 2 * LLAMA.param_count()
    assert gradient_bytes(ops, "dp_cp") == 2 * LLAMA.param_count()
    assert {op.kind for op in ops if op.group == "dp_cp"} == {OpKind.REDUCE_SCATTER,
                                                             OpKind.ALL_GATHER}


def test_mixtral_experts_reduce_over_their_own_group():
    """Mixtral at dp 8, ep 8: edp = 8 / 8 = 1, so only the dense 3.2 GB move over dp;
    the experts' 11.3 GB (a rank's one expert per layer) stay on the rank."""
    mixtral = get_model("mixtral-8x7b")
    plan, ops = lowered_ops(mixtral, ParallelConfig(dp=8, ep=8, zero_stage=1,
                                                    num_microbatches=2, recompute="full"))
    assert plan.parallel.edp == 1 and plan.expert_grad_group == "edp"
    assert gradient_bytes(ops, "dp") == pytest.approx(2 * DENSE_PARAMS, abs=16)
    assert 2 * DENSE_PARAMS / 1e9 == pytest.approx(3.2, abs=0.05)
    assert 2 * EXPERT_PARAMS / 8 / 1e9 == pytest.approx(11.3, abs=0.05)
    assert not [op for op in ops if op.group == "edp"]
    (step,) = [op for op in ops if op.kind is OpKind.OPT_STEP]
    assert step.nbytes == pytest.approx(28 * (DENSE_PARAMS / 8 + EXPERT_PARAMS / 8), abs=56)


def test_experts_with_an_expert_data_parallel_group_reduce_over_it():
    """dp 8, ep 4: edp = 2. The experts' gradients (E/ep = 2 experts per layer) are
    reduce-scattered over the 2 edp ranks, whose ranks share the expert's index."""
    mixtral = get_model("mixtral-8x7b", num_layers=4)
    plan, ops = lowered_ops(mixtral, ParallelConfig(dp=8, ep=4, zero_stage=1,
                                                    num_microbatches=2))
    experts = 4 * E // 4 * 3 * H * F_E
    assert gradient_bytes(ops, "edp") == 2 * experts
    assert gradient_bytes(ops, "dp") == 2 * (mixtral.param_count() - 4 * E * 3 * H * F_E)
    assert plan.group("edp", 0) == [0, 4]  # Megatron's expert grid: ep innermost after etp
    (step,) = [op for op in ops if op.kind is OpKind.OPT_STEP]
    dense = mixtral.param_count() - 4 * E * 3 * H * F_E
    assert step.nbytes == 28 * (-(-dense // 8) + experts // 2)


def test_the_distributed_optimizer_keeps_unsharded_expert_state():
    """Memory of Mixtral, ZeRO-1, dp 8, ep 8 (edp 1): optimizer states are 12 bytes x
    (dense / 8 + experts on the rank / 1) (ZeRO's K Psi / N per part)."""
    mixtral = get_model("mixtral-8x7b")
    plan = resolve(mixtral, ParallelConfig(dp=8, ep=8, zero_stage=1, num_microbatches=2))
    (memory,) = rank_memory(plan)
    assert memory.optimizer_states == pytest.approx(
        12 * (DENSE_PARAMS / 8 + EXPERT_PARAMS / 8), rel=1e-9)


def test_without_expert_parallelism_experts_ride_with_the_dense_gradients():
    """ep 1, etp = tp: the expert data-parallel group is the dp group: one reduction."""
    mixtral = get_model("mixtral-8x7b", num_layers=4)
    plan, ops = lowered_ops(mixtral, ParallelConfig(dp=2, num_microbatches=2))
    assert plan.expert_grad_group is None
    assert gradient_bytes(ops, "dp") == 2 * mixtral.param_count()


@pytest.mark.parametrize("kw, rule", [
    (dict(dp=4, ep=4, zero_stage=3), "sharded over their expert data-parallel group"),
    (dict(dp=4, cp=2, fsdp="hybrid", shard_size=2), "shard groups inside that group"),
])
def test_sharding_that_is_not_modelled_is_refused(kw, rule):
    model = get_model("mixtral-8x7b", num_layers=4) if "ep" in kw else LLAMA
    with pytest.raises(ConfigError, match=rule):
        resolve(model, ParallelConfig(num_microbatches=2, **kw))
