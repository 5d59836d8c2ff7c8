"""Full recompute's method and layer count (issue 14, item 11) against Megatron-Core's
TransformerBlock and Korthikanti et al. 2022 (K22): 'uniform' N checkpoints every N
consecutive layers of a stage and reruns them all, 'block' N reruns only a stage's first N
layers and keeps every activation of the others. Closed forms, for a GPT layer (GeLU,
LayerNorm, 16-bit, no flash attention): forward 24bsh^2 + 4bs^2h FLOPs (SC21), activations
sbh(34 + 5as/h) bytes without recompute and 2sbh (the layer input) under a checkpoint
(K22 Table 2 and section 5)."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.throughput import iteration_flops

B, S, H, A, L = 1, 2048, 2048, 16, 8
GPT = ModelSpec(num_layers=L, hidden_size=H, num_attention_heads=A, seq_length=S,
                vocab_size=51200, micro_batch_size=B)
LAYER_FLOPS = 24 * B * S * H * H + 4 * B * S * S * H
KEPT = S * B * H * (34 + 5 * A * S / H)
INPUT = 2 * S * B * H


def stage(**recompute):
    return resolve(GPT, ParallelConfig(num_microbatches=2, **recompute)).stage_costs[0]


NONE = stage()


@pytest.mark.parametrize("recompute, rerun, inputs, kept", [
    (dict(recompute="full"), L, L, 0),  # uniform, 1 layer per checkpoint (K22's full)
    (dict(recompute="full", recompute_num_layers=4), L, 2, 0),
    (dict(recompute="full", recompute_num_layers=3), L, 3, 0),  # chunks of 3, 3, 2
    (dict(recompute="full", recompute_method="block", recompute_num_layers=3), 3, 3, L - 3),
    (dict(recompute="full", recompute_method="block", recompute_num_layers=L), L, L, 0),
], ids=["uniform-1", "uniform-4", "uniform-3", "block-3", "block-all"])
def test_the_method_sets_what_reruns_and_what_is_kept(recompute, rerun, inputs, kept):
    cost = stage(**recompute)
    assert cost.forward_flops == NONE.forward_flops
    assert cost.backward_flops - NONE.backward_flops == rerun * LAYER_FLOPS
    layers = NONE.activation_bytes - L * KEPT  # the embedding's and the head's
    assert cost.activation_bytes == pytest.approx(layers + inputs * INPUT + kept * KEPT,
                                                  abs=2)


@pytest.mark.parametrize("recompute, working", [
    (dict(), 0), (dict(recompute="selective"), 0), (dict(recompute="full"), 1),
    (dict(recompute="full", recompute_num_layers=4), 4),
    (dict(recompute="full", recompute_method="block", recompute_num_layers=4), 1)])
def test_the_peak_counts_the_layers_a_checkpoint_regenerates(recompute, working):
    """The backward of one checkpoint rebuilds its layers' activations before freeing
    them: N layers under uniform, one under block (one layer per checkpoint)."""
    (memory,) = rank_memory(resolve(GPT, ParallelConfig(num_microbatches=2, **recompute)))
    assert memory.recompute_working == pytest.approx(working * KEPT)
    assert memory.total_bytes == pytest.approx(
        memory.model_states_bytes + memory.activations + memory.communication_buffers
        + working * KEPT)


def test_block_reruns_the_first_layers_of_every_virtual_stage():
    """pp 2 x vpp 2: four model chunks of 2 layers; block 1 reruns one layer per chunk, so
    the job's hardware FLOPs add 4 layers' forward per sequence (SC21's 4x forward only
    for all 8)."""
    parallel = ParallelConfig(pp=2, vpp=2, schedule="interleaved-1f1b", num_microbatches=4,
                              recompute="full", recompute_method="block",
                              recompute_num_layers=1)
    plan = resolve(GPT, parallel)
    model_flops, hardware = iteration_flops(plan)
    assert hardware - model_flops == 4 * 4 * LAYER_FLOPS  # 4 sequences x 4 layers
    assert [c.backward_flops - 2 * c.forward_flops for c in plan.stage_costs] == \
        pytest.approx([LAYER_FLOPS] * 4)


def test_block_reruns_the_tensor_parallel_collectives_of_its_layers_only():
    """tp 2 (no SP): per layer a forward posts 2 all-reduces (attention, MLP) and a
    backward 2; a B op reruns the forward's of its recomputed layers only (Megatron)."""
    def reduces(**recompute):
        plan = resolve(GPT, ParallelConfig(tp=2, num_microbatches=1, **recompute))
        return sum(op.count for op in lower(plan.build_schedule(), plan).ops()
                   if op.kind is OpKind.ALL_REDUCE and op.group == "tp")
    base = reduces()
    assert reduces(recompute="full") - base == 2 * L
    assert reduces(recompute="full", recompute_method="block", recompute_num_layers=3) \
        - base == 2 * 3


@pytest.mark.parametrize("kw, rule", [
    (dict(recompute="full", recompute_num_layers=L + 1), "at most the layers of a"),
    (dict(recompute="selective", recompute_method="uniform"), "needs recompute='full'"),
    (dict(recompute_num_layers=2), "needs recompute='full'"),
])
def test_options_that_cannot_act_are_refused(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        resolve(GPT, ParallelConfig(num_microbatches=2, **kw))
