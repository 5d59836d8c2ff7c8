"""TP / SP / CP / EP communication ops: volumes per layer against their closed forms,
measured from simulated spans with the nccl ring factors (what one device sends)."""
from dataclasses import replace

import pytest

from clustersim.schedules.annotate import annotate
from clustersim.schedules.contract import is_intra_layer
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.intra_layer import add_intra_layer
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.timeline import span_category
from clustersim.schedules.validate import check_structure, dry_run
from clustersim.sim.simulate import simulate
from clustersim.topologies import fat_tree

GPT = get_model("gpt3-1.3b")  # 24 layers, h 2048, s 2048, bf16
MIXTRAL = get_model("mixtral-8x7b", num_layers=8)


def sent_per_device(op, n: int) -> float:
    """Bytes one member of an n-rank ring / direct algorithm sends (nccl-tests factors)."""
    factor = {OpKind.ALL_REDUCE: 2 * (n - 1) / n, OpKind.ALL_GATHER: (n - 1) / n,
              OpKind.REDUCE_SCATTER: (n - 1) / n, OpKind.ALL_TO_ALL: (n - 1) / n}
    return op.nbytes * factor[op.kind]


def middle_stage_volume(model, parallel, group):
    """Per microbatch per layer, bytes rank 1 (a stage of layers only) sends on `group`,
    from the simulated spans; and the kinds it used."""
    timeline = simulate(model, parallel, fat_tree("dgx-h100", num_nodes=2))
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
    parallel = ParallelConfig(pp=1, cp=cp, num_microbatches=2, cp_comm="ulysses")
    timeline = simulate(GPT, parallel, fat_tree("dgx-h100", num_nodes=1))
    spans = [s for s in timeline.spans if s.lane == "cp"]
    assert {s.op.kind for s in spans} == {OpKind.ALL_TO_ALL}
    tokens = GPT.seq_length / cp
    expected = 2 * (cp - 1) / cp * tokens * (2 * GPT.hidden_size + 2 * GPT.kv_hidden_size) * 2
    per_layer = sum(sent_per_device(s.op, cp) for s in spans) / 2 / GPT.num_layers
    assert per_layer == pytest.approx(expected, rel=1e-9)


def test_ulysses_needs_heads_divisible_by_cp():
    """Refused before any work, when the plan is resolved (tests/test_parallel.py has the
    rule for KV groups too)."""
    model = get_model("gpt3-1.3b", num_attention_heads=8, hidden_size=2048)
    parallel = ParallelConfig(tp=2, cp=8, num_microbatches=1, cp_comm="ulysses")
    with pytest.raises(ConfigError, match="heads"):
        resolve(model, parallel)


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
    schedule = annotate(build_schedule("1f1b", 1, 1), resolve(MIXTRAL, parallel))
    skewed = add_intra_layer(schedule, resolve(MIXTRAL, replace(parallel, moe_imbalance=1.5)))
    f0, f1 = (next(op for op in p if op.kind is OpKind.F)
              for p in (schedule.programs[0], skewed.programs[0]))
    expert = 2 * MIXTRAL.seq_length * MIXTRAL.hidden_size * 2 * 14336 * 3
    assert f1.flops - f0.flops == pytest.approx(0.5 * 8 * expert)


def test_ops_are_positional_and_the_schedule_stays_valid():
    parallel = ParallelConfig(pp=2, tp=2, cp=2, num_microbatches=4, schedule="1f1b")
    plan = resolve(GPT, parallel)
    lowered = add_intra_layer(annotate(add_p2p(build_schedule("1f1b", 2, 4)), plan), plan)
    check_structure(lowered)
    assert dry_run(lowered).makespan > 0
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
    split = simulate(GPT, replace(parallel, scatter_gather=True), graph)
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


def lowered_ops(model, parallel):
    """The 1F1B programs of `parallel`, costed, with the intra-layer ops."""
    plan = resolve(model, parallel)
    schedule = build_schedule("1f1b", parallel.pp, parallel.num_microbatches)
    return add_intra_layer(annotate(add_p2p(schedule), plan), plan).programs


# --- the options as ParallelConfig fields ------------------------------------------------
@pytest.mark.parametrize("model,base,field", [
    (GPT, dict(pp=2, tp=2, sequence_parallel=True), dict(tp_comm_overlap=True)),
    (GPT, dict(pp=2, cp=2), dict(cp_comm="ulysses")),
    (MIXTRAL, dict(pp=2, dp=2, ep=2), dict(moe_imbalance=1.5)),
    (GPT, dict(pp=2, tp=2), dict(scatter_gather=True)),
])
def test_a_config_field_changes_the_ops_as_the_option_does(model, base, field):
    plain = ParallelConfig(num_microbatches=4, **base)
    configured = lowered_ops(model, ParallelConfig(num_microbatches=4, **base, **field))
    # the intra-layer options are ParallelConfig fields: given to the constructor or
    # replaced in later, they lower to the same ops
    assert configured == lowered_ops(model, replace(plain, **field))
    assert configured != lowered_ops(model, plain)


def test_simulate_reads_the_fields():
    """The intra-layer options are the config's fields (simulate's `intra=` keyword is
    gone): scatter_gather set in the config scatters the transfers and is recorded."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    base = dict(pp=2, tp=8, num_microbatches=4)
    field = simulate(GPT, ParallelConfig(scatter_gather=True, **base), graph)
    plain = simulate(GPT, ParallelConfig(**base), graph)
    assert field.meta["plan"]["parallel"]["scatter_gather"]
    assert not plain.meta["plan"]["parallel"]["scatter_gather"]
    assert plain.iteration_time > field.iteration_time


# --- expert tensor parallelism ('etp') -----------------------------------------------------
@pytest.mark.parametrize("tp,etp,ep,dp,sp", [
    (4, 2, 2, 1, True), (4, 4, 2, 2, True), (4, 1, 4, 1, True), (1, 2, 2, 4, False)])
def test_etp_gathers_and_scatters_the_dispatched_tokens(tp, etp, ep, dp, sp):
    """Per MoE layer and microbatch: forward one all-gather (before the experts) and one
    reduce-scatter (after them) on 'etp', backward one of each, each S = etp * D with
    D = (b*s/tp) * h * k * dtype a rank's dispatched tokens (sequence-sharded by tp), so a
    rank sends (etp-1)/etp * S = (etp-1) * D; the EP all-to-alls stay D each. On 'tp'
    only the attention's all-gather and reduce-scatter per layer and pass remain (plus the
    embedding's and the head's), not the MLP's."""
    m, layers = 2, MIXTRAL.num_layers
    parallel = ParallelConfig(pp=1, tp=tp, dp=dp, ep=ep, expert_tensor_parallel=etp,
                              sequence_parallel=sp, num_microbatches=m)
    timeline = simulate(MIXTRAL, parallel, fat_tree("dgx-h100", num_nodes=1))
    tokens = MIXTRAL.micro_batch_size * MIXTRAL.seq_length / tp
    d = tokens * MIXTRAL.hidden_size * MIXTRAL.moe_router_topk * MIXTRAL.dtype_bytes
    n = 2 * layers * m if etp > 1 else 0  # of each kind
    for kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        spans = [s for s in timeline.spans if s.lane == "etp" and s.op.kind is kind]
        assert sum(s.op.count for s in spans) == n
        assert sum(s.op.nbytes for s in spans) == pytest.approx(n * etp * d, rel=1e-9)
        assert sum(sent_per_device(s.op, etp) for s in spans) == pytest.approx(
            n * (etp - 1) * d, rel=1e-9)
    a2a = [s for s in timeline.spans if s.lane == "ep"]
    assert sum(s.op.count for s in a2a) == 4 * layers * m
    assert sum(s.op.nbytes for s in a2a) == pytest.approx(4 * layers * m * d, rel=1e-9)
    gathers = [s for s in timeline.spans if s.lane == "tp" and s.op.kind is OpKind.ALL_GATHER]
    assert sum(s.op.count for s in gathers) == ((2 * layers + 2) * m if tp > 1 else 0)
    # the time breakdown counts expert-TP traffic as MoE ('ep') communication
    assert {span_category(s) for s in timeline.spans if s.lane == "etp"} <= {"ep"}


def test_etp_equal_to_tp_without_sp_is_todays_dense_like_split():
    """No sequence parallelism: tokens are replicated over the TP ranks, each runs 1/t of
    every expert, and the MLP's all-reduce follows, as for a dense layer: two all-reduces
    per layer and pass (8 layers over pp=4: 2 per stage), no 'etp' ops."""
    base = dict(pp=4, tp=2, dp=2, ep=2, num_microbatches=4)
    unset = lowered_ops(MIXTRAL, ParallelConfig(**base))
    assert unset == lowered_ops(MIXTRAL, ParallelConfig(expert_tensor_parallel=2, **base))
    assert not [op for program in unset for op in program if op.group == "etp"]
    reduces = [op for op in unset[1] if op.group == "tp" and op.kind is OpKind.ALL_REDUCE]
    assert sum(op.count for op in reduces) == 4 * 2 * 4  # 4 per layer (F 2, B 2) x 2 x M


def test_shared_experts_keep_their_tp_gather_and_scatter_under_sp():
    """Megatron-Core's shared experts are a TP-split dense MLP: with them an MoE layer posts
    the MLP's all-gather and reduce-scatter on 'tp' again (2 + 2 per layer per pass)."""
    shared = replace(MIXTRAL, moe_shared_expert_intermediate_size=4096)
    parallel = ParallelConfig(pp=4, tp=2, dp=2, ep=2, sequence_parallel=True,
                              num_microbatches=1)
    for model, per_layer in ((MIXTRAL, 1), (shared, 2)):
        gathers = [op for op in lowered_ops(model, parallel)[1]
                   if op.group == "tp" and op.kind is OpKind.ALL_GATHER]
        assert sum(op.count for op in gathers) == 2 * per_layer * 2  # F and B, 2 layers
