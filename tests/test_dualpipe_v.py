"""DualPipeV (schedules/pipelines/dualpipe_v.py) against torch.distributed.pipelining's own
generator (ScheduleDualPipeV, overlapped pairs included) and against DeepSeek's closed forms
(DualPipe README table; DeepSeek-V3 report, Table 2): with PP = 2P stages, F&B the time of
an overlapped pair (here F + B: the pair runs F then B), the most idle rank idles
(PP/2 - 1)(F&B + B - 3W), and every rank holds PP + 1 chunks whose forward has run and
whose backward has not (the bubble form checked where F = I = W, see its test)."""
from dataclasses import replace

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import OpKind, action_texts
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.torch_csv import from_torch_csv, to_torch_csv
from clustersim.schedules.validate import validate
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

GRID = [(pp, m) for pp in range(1, 7) for m in range(2 * pp, 2 * pp + 9)]
WORK = (OpKind.F, OpKind.B, OpKind.I, OpKind.W)


@pytest.mark.parametrize("pp, microbatches", GRID)
def test_every_rank_runs_torchs_order(pp, microbatches):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = build_schedule("ScheduleDualPipeV", pp, microbatches)
    validate(ours)
    for rank in range(pp):
        # torch's generator reads only these attributes of its schedule object
        fake = type("DualPipeV", (), {"pp_group_size": pp, "_n_microbatches": microbatches})()
        theirs = schedules.ScheduleDualPipeV._calculate_single_rank_operations(fake, rank)
        assert action_texts(ours.programs[rank]) == [str(a) for a in theirs if a is not None]


def test_fewer_microbatches_than_stages_and_other_chunk_counts_are_refused():
    with pytest.raises(ConfigError, match=r"at least as many microbatches as stages, "
                                          r"2 \* pp = 8 .* got 7"):
        build_schedule("dualpipev", 4, 7)
    with pytest.raises(ConfigError, match="vpp"):
        build_schedule("dualpipev", 4, 8, 3)


def idle_per_rank(pp, microbatches, forward, backward):
    """Per rank, its compute span less its compute, simulated with uniform costs (I = W =
    B / 2) and free communication."""
    model = ModelSpec(num_layers=4 * pp, hidden_size=256, num_attention_heads=4,
                      seq_length=128, vocab_size=512)
    timeline = simulate(model, ParallelConfig.from_kwargs(
        schedule="dualpipev", pp=pp, num_microbatches=microbatches), load_topology("dgx-h100"),
        costs=UniformCostModel(forward, backward))
    idle = []
    for rank in range(pp):
        spans = [s for s in timeline.spans if s.rank == rank and s.op.kind in WORK]
        busy = sum(s.end - s.start for s in spans)
        idle.append(max(s.end for s in spans) - min(s.start for s in spans) - busy)
    return idle, timeline


@pytest.mark.parametrize("pp, microbatches", [(2, 4), (2, 9), (3, 6), (4, 8), (4, 13)])
@pytest.mark.parametrize("forward, backward", [(1.0, 2.0), (2.0, 4.0)])
def test_the_most_idle_rank_idles_deepseeks_bubble(pp, microbatches, forward, backward):
    """F = I = W (B = 2F), the unit-time case. The table states no condition on the
    ratios; at others the replay differs from the formula in both directions (F = 1,
    B = 3: less idle; F = 2, B = 3: more), as ZB-H1's form needs W <= min(F, I)."""
    idle, timeline = idle_per_rank(pp, microbatches, forward, backward)
    stages, w = 2 * pp, backward / 2
    pair = forward + backward  # F&B: run one after the other here
    assert max(idle) == pytest.approx((stages / 2 - 1) * (pair + backward - 3 * w))
    assert any("overlapped forward-backward pairs" in n for n in timeline.meta["warnings"])


@pytest.mark.parametrize("pp, microbatches", [(2, 4), (3, 7), (4, 8), (5, 14)])
def test_every_rank_holds_pp_plus_one_chunks_between_forward_and_backward(pp, microbatches):
    for program in build_schedule("dualpipev", pp, microbatches).programs:
        level = peak = 0
        for op in program:
            level += {OpKind.F: 1, OpKind.B: -1, OpKind.I: -1}.get(op.kind, 0)
            peak = max(peak, level)
        assert peak == 2 * pp + 1


def test_the_torch_csv_keeps_the_overlapped_pairs():
    schedule = build_schedule("dualpipev", 3, 8)
    text = to_torch_csv(schedule)
    assert "(0F5;5B2)OVERLAP_F_B" in text.splitlines()[0]
    back = from_torch_csv(text)
    assert back.programs == schedule.programs
    assert sum(op.overlapped for op in back.ops()) == sum(op.overlapped for op in schedule.ops())
    grid = validate(schedule).grid()  # `show`'s grid marks the pairs' ops
    assert " 0F5& " in grid and " 5B2& " in grid and "0F0&" not in grid


def test_the_gantt_draws_the_paired_backwards_apart():
    from clustersim.sim.gantt import PAIRED, gantt_figure
    _, timeline = idle_per_rank(2, 4, 1.0, 2.0)
    names = {trace.name for trace in gantt_figure(timeline).data}
    assert {"F", "B", *PAIRED.values()} <= names
    paired = sum(op.overlapped for op in build_schedule("dualpipev", 2, 4).ops())
    drawn = [t for t in gantt_figure(timeline).data if t.name in PAIRED.values()]
    assert sum(len(t.x) for t in drawn) == paired


MOE = ModelSpec(num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=256,
                vocab_size=1024, num_experts=4, moe_router_topk=2)


def test_a_pair_of_an_moe_model_runs_its_expert_all_to_alls_alongside_on_20_sms():
    """DeepSeek-V3 (sections 3.2.1, 3.5.1): the pair hides its all-to-alls, which hold 20
    SMs, and computes on the rest. Both ops' EP collectives are posted before the pair's F
    and run beside the whole pair (its B does not wait for them); other ops' block; a
    pair op's compute is at most 132/112 times the plain op's on an H100."""
    from clustersim.schedules.contract import local_waits
    from clustersim.schedules.lowering import lower
    from clustersim.schedules.plan import resolve
    from clustersim.sim.cost import RooflineCost, StageKernelCost
    from clustersim.sim.cluster import cluster_facts
    from clustersim.topologies import get_device
    layout = ParallelConfig.from_kwargs(schedule="dualpipev", pp=2, dp=2, ep=2,
                                        num_microbatches=4)
    topology = load_topology("dgx-h100")
    plan = resolve(MOE, layout, cluster_facts(topology))
    lowered = lower(plan.build_schedule(), plan)
    pairs = 0
    for program in lowered.programs:
        waits = local_waits(program)
        work = [i for i, op in enumerate(program) if op.kind in WORK]
        for before, f, b in zip([-1, *work], work, work[1:]):
            if not (program[f].overlapped and program[f].kind is OpKind.F):
                continue
            pairs += 1  # both ops' all-to-alls beside the pair: posted before F, B not waiting
            hidden = [i for i in range(before + 1, f)
                      if program[i].group == "ep" and program[i].alongside]
            assert {(program[i].stage, program[i].microbatch) for i in hidden} == {
                (program[f].stage, program[f].microbatch),
                (program[b].stage, program[b].microbatch)}
            assert not any(program[i].group == "ep" for i in range(f + 1, b))
            assert not set(hidden) & set(waits[b])
        for i, op in enumerate(program):  # every other op's all-to-alls block
            if op.group == "ep" and not op.alongside:
                owner = next(o for o in reversed(program[:i]) if o.kind in WORK)
                assert not owner.overlapped
    assert pairs > 0
    cost = StageKernelCost([RooflineCost(get_device("h100-sxm"))] * plan.num_stages, plan)
    forward = next(op for op in lowered.ops() if op.kind is OpKind.F and op.stage == 1)
    plain, paired = cost(forward), cost(replace(forward, overlapped=True))
    assert plain < paired <= plain * 132 / 112 * (1 + 1e-12)
    timeline = simulate(MOE, layout, topology)
    assert any("expert all-to-alls beside the pair on 20 SMs" in n
               for n in timeline.meta["warnings"])


def test_pairs_that_cannot_be_modelled_are_refused_in_one_line():
    from clustersim.schedules.ops import Op, overlapped_pairs
    with pytest.raises(ConfigError, match="split into layer groups are not modelled"):
        simulate(MOE, ParallelConfig.from_kwargs(schedule="dualpipev", pp=2, dp=2,
                                                 zero_stage=3, num_microbatches=4),
                 load_topology("dgx-h100"))
    lone = [Op(OpKind.F, 0, 0, overlapped=True), Op(OpKind.W, 0, 0)]
    with pytest.raises(ConfigError, match="is not its overlapped B"):
        overlapped_pairs(lone)
    with pytest.raises(ConfigError, match="no B follows it"):
        overlapped_pairs(lone[:1])


def test_a_stuck_pair_names_the_input_its_partner_waits_for():
    stuck = from_torch_csv("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n")
    with pytest.raises(Exception, match=r"rank 0 stuck at 0F1 waiting for 0RECV_B0"):
        validate(stuck)


def test_only_the_expert_collectives_run_beside_the_whole_pair():
    """Before a pair's F: its TP-overlap gather (alongside the F alone, which its B then
    waits for) and the pair's expert all-to-all (beside the whole pair: the B does not
    wait for it, the op after the pair does)."""
    from clustersim.schedules.contract import local_waits
    from clustersim.schedules.ops import Op
    program = [Op(OpKind.ALL_GATHER, 0, 1, "tp", 8, alongside=True),
               Op(OpKind.ALL_TO_ALL, 0, 1, "ep", 8, alongside=True),
               Op(OpKind.F, 0, 1, overlapped=True), Op(OpKind.B, 1, 0, overlapped=True),
               Op(OpKind.F, 0, 2)]
    waits = local_waits(program)
    assert 0 in waits[3] and 1 not in waits[3]
    assert 1 in waits[4]


def test_the_step_aligned_torch_csv_keeps_the_pairs_too():
    schedule = build_schedule("dualpipev", 2, 4)
    text = to_torch_csv(schedule, align_steps=True)
    assert "(0F3;3B1)OVERLAP_F_B" in text
    assert from_torch_csv(text).programs == schedule.programs
