"""TP / SP / CP / EP communication ops: volumes per layer against their closed forms,
measured from simulated spans with the nccl ring factors (what one device sends)."""
import pytest

from schedules.annotate import annotate
from schedules.contract import is_intra_layer
from schedules.costs import stage_costs
from schedules.errors import ConfigError
from schedules.generators import build_schedule
from schedules.intra_layer import IntraLayerOptions, add_intra_layer
from schedules.model_presets import get_model
from schedules.ops import OpKind
from schedules.parallel import ParallelConfig
from schedules.validate import check_structure, dry_run
from sim.simulate import simulate
from topologies import fat_tree

GPT = get_model("gpt3-1.3b")  # 24 layers, h 2048, s 2048, bf16
MIXTRAL = get_model("mixtral-8x7b", num_layers=8)


def sent_per_device(op, n: int) -> float:
    """Bytes one member of an n-rank ring / direct algorithm sends (nccl-tests factors)."""
    factor = {OpKind.ALL_REDUCE: 2 * (n - 1) / n, OpKind.ALL_GATHER: (n - 1) / n,
              OpKind.REDUCE_SCATTER: (n - 1) / n, OpKind.ALL_TO_ALL: (n - 1) / n}
    return op.nbytes * factor[op.kind]


def middle_stage_volume(model, parallel, group, intra=IntraLayerOptions()):
    """Per microbatch per layer, bytes rank 1 (a stage of layers only) sends on `group`,
    from the simulated spans; and the kinds it used."""
    timeline = simulate(model, parallel, fat_tree("dgx-h100", num_nodes=2), intra=intra)
    spans = [s for s in timeline.spans if s.rank == 1 and s.lane == group]
    n = getattr(parallel, group)
    layers = model.num_layers // parallel.pp
    total = sum(sent_per_device(s.op, n) for s in spans)
    return total / parallel.num_microbatches / layers, {s.op.kind for s in spans}


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_volume_per_layer_is_8bsh_t_minus_1_over_t(tp):
    parallel = ParallelConfig(pp=4, tp=tp, num_microbatches=2)
    volume, kinds = middle_stage_volume(GPT, parallel, "tp")
    bsh = GPT.micro_batch_size * GPT.seq_length * GPT.hidden_size * GPT.dtype_bytes
    assert volume == pytest.approx(8 * bsh * (tp - 1) / tp, rel=1e-9)
    assert kinds == {OpKind.ALL_REDUCE}


def test_sp_keeps_the_volume_with_all_gather_and_reduce_scatter():
    parallel = ParallelConfig(pp=4, tp=2, num_microbatches=2, sequence_parallel=True)
    volume, kinds = middle_stage_volume(GPT, parallel, "tp")
    bsh = GPT.micro_batch_size * GPT.seq_length * GPT.hidden_size * GPT.dtype_bytes
    assert volume == pytest.approx(8 * bsh / 2, rel=1e-9)
    assert kinds == {OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER}


def test_cp_ring_volume_is_kv_blocks_around_the_ring():
    """Forward cp-1 KV blocks, backward cp-1 KV + cp-1 dKV blocks, a block being
    2 * b * (s/cp) * h_kv * dtype / t."""
    cp, tp = 4, 2
    parallel = ParallelConfig(pp=1, cp=cp, tp=tp, num_microbatches=2)
    timeline = simulate(GPT, parallel, fat_tree("dgx-h100", num_nodes=1))
    spans = [s for s in timeline.spans if s.lane == "cp"]
    block = 2 * GPT.seq_length / cp * GPT.kv_hidden_size * GPT.dtype_bytes / tp
    per_layer = sum(sent_per_device(s.op, cp) for s in spans) / 2 / GPT.num_layers
    assert per_layer == pytest.approx(3 * (cp - 1) * block, rel=1e-9)


def test_cp_ulysses_volume_is_qkv_and_output_all_to_alls():
    """DeepSpeed-Ulysses: per layer, forward and backward each send (cp-1)/cp of Q,K,V
    and of the output: 2 (cp-1)/cp * b s/cp (2h + 2h_kv) dtype / t."""
    cp = 4
    parallel = ParallelConfig(pp=1, cp=cp, num_microbatches=2)
    timeline = simulate(GPT, parallel, fat_tree("dgx-h100", num_nodes=1),
                        intra=IntraLayerOptions(cp_comm="ulysses"))
    spans = [s for s in timeline.spans if s.lane == "cp"]
    assert {s.op.kind for s in spans} == {OpKind.ALL_TO_ALL}
    tokens = GPT.seq_length / cp
    expected = 2 * (cp - 1) / cp * tokens * (2 * GPT.hidden_size + 2 * GPT.kv_hidden_size) * 2
    per_layer = sum(sent_per_device(s.op, cp) for s in spans) / 2 / GPT.num_layers
    assert per_layer == pytest.approx(expected, rel=1e-9)


def test_ulysses_needs_heads_divisible_by_cp():
    model = get_model("gpt3-1.3b", num_attention_heads=8, hidden_size=2048)
    parallel = ParallelConfig(tp=2, cp=8, num_microbatches=1)
    with pytest.raises(ConfigError, match="heads"):
        add_intra_layer(build_schedule("1f1b", 1, 1), model, parallel,
                        IntraLayerOptions(cp_comm="ulysses"))


def test_ep_all_to_all_bytes_are_tokens_hidden_topk_e_minus_1_over_e():
    ep = 4
    parallel = ParallelConfig(pp=1, dp=4, ep=ep, num_microbatches=1)
    timeline = simulate(MIXTRAL, parallel, fat_tree("dgx-h100", num_nodes=1))
    spans = [s for s in timeline.spans if s.lane == "ep"]
    tokens = MIXTRAL.seq_length * MIXTRAL.micro_batch_size
    per_all_to_all = tokens * MIXTRAL.hidden_size * MIXTRAL.moe_router_topk * (ep - 1) / ep * 2
    count = sum(s.op.count for s in spans)
    assert count == 4 * MIXTRAL.num_layers  # dispatch + combine, forward and backward
    assert sum(sent_per_device(s.op, ep) for s in spans) == pytest.approx(
        count * per_all_to_all, rel=1e-9)


def test_moe_imbalance_scales_expert_flops_only():
    parallel = ParallelConfig(pp=1, num_microbatches=1)
    schedule = annotate(build_schedule("1f1b", 1, 1), stage_costs(MIXTRAL, parallel, 1))
    skewed = add_intra_layer(schedule, MIXTRAL, parallel, IntraLayerOptions(moe_imbalance=1.5))
    f0, f1 = (next(op for op in p if op.kind is OpKind.F)
              for p in (schedule.programs[0], skewed.programs[0]))
    expert = 2 * MIXTRAL.seq_length * MIXTRAL.hidden_size * 2 * 14336 * 3
    assert f1.flops - f0.flops == pytest.approx(0.5 * 8 * expert)


def test_ops_are_positional_and_the_schedule_stays_valid():
    parallel = ParallelConfig(pp=2, tp=2, cp=2, num_microbatches=4, schedule="1f1b")
    costs = stage_costs(GPT, parallel, 2)
    lowered = add_intra_layer(annotate(build_schedule("1f1b", 2, 4), costs), GPT, parallel)
    check_structure(lowered)
    assert dry_run(lowered, IntraLayerOptions().overlapped_groups()).makespan > 0
    ops = [op for op in lowered.ops() if is_intra_layer(op)]
    assert {op.group for op in ops} == {"tp", "cp"}
    assert not [op for op in ops if op.kind is OpKind.W]


def test_full_recompute_repeats_forward_tp_communication():
    base = ParallelConfig(pp=4, tp=2, num_microbatches=1)
    full = ParallelConfig(pp=4, tp=2, num_microbatches=1, recompute="full")
    plain, _ = middle_stage_volume(GPT, base, "tp")
    again, _ = middle_stage_volume(GPT, full, "tp")
    assert again == pytest.approx(plain * 6 / 4)


def test_scatter_gather_sends_a_tp_slice_and_all_gathers_it_after_the_recv():
    """SC21 4.1: pp=2 across two nodes, tp=8: each SEND carries boundary/8 over the NIC,
    and an ALL_GATHER of the whole boundary on 'tp' starts when its RECV has arrived."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    parallel = ParallelConfig(pp=2, tp=8, num_microbatches=4)
    plain = simulate(GPT, parallel, graph)
    split = simulate(GPT, parallel, graph, intra=IntraLayerOptions(scatter_gather=True))
    boundary = GPT.seq_length * GPT.hidden_size * GPT.dtype_bytes
    sends = [s for s in split.spans if s.op.kind in (OpKind.SEND_F, OpKind.SEND_B)]
    assert {s.op.nbytes for s in sends} == {boundary // 8}
    recvs = {(s.rank, s.op.stage, s.op.microbatch, s.op.kind): s for s in split.spans
             if s.op.kind in (OpKind.RECV_F, OpKind.RECV_B)}
    gathers = [s for s in split.spans if s.op.kind is OpKind.ALL_GATHER and s.lane == "tp"]
    assert len(gathers) == len(recvs) == 2 * 4
    for g in gathers:
        assert g.op.nbytes == boundary
        assert any(r.end <= g.start + 1e-15 for (rank, stage, mb, _), r in recvs.items()
                   if (rank, stage, mb) == (g.rank, g.op.stage, g.op.microbatch))
    exposed = [sum(row["pp"] for row in t.time_breakdown().values()) for t in (plain, split)]
    assert exposed[1] < exposed[0] / 4
