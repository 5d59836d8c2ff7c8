"""DualPipe, bidirectional (schedules/pipelines/dualpipe.py, schedules/chains.py) against
DeepSeek's code and closed forms: the per-rank orders of deepseek-ai/DualPipe's
`DualPipe.step`, as read op by op from its source (docs/research/dualpipe_bidirectional.md
section 6.3, checked there against a line-by-line emulation of `step` and the README
figure); the op counts per rank of that note's section 3; DeepSeek's README table: the most
idle rank idles (PP/2-1)(F&B+B-3W) (at F = I = W, F&B = F + B here), every rank holds PP+1
microbatches' activations and two stages' parameters; the two copies of each stage sum
their gradients with one all-reduce between pipeline ranks r and P-1-r."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import PP_COPIES
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.torch_csv import to_torch_csv
from clustersim.schedules.validate import validate
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

# deepseek-ai/DualPipe `DualPipe.step`, P = 4 and M = 8, 10; P = 8, M = 20 (the README's
# figure): F3d0 = the forward of direction 0's microbatch 3, (F..;B..) an overlapped pair.
DEEPSEEK = {
    (2, 4): ["F0d0 F0d1 F1d0 B0d1 (F1d1;B0d0) B1d1 I1d0 W1d0",
             "F0d1 F0d0 F1d1 B0d0 (F1d0;B0d1) B1d0 I1d1 W1d1"],
    (4, 8): ["F0d0 F1d0 F2d0 F0d1 I0d1 W0d1 F1d1 (F3d0;B1d1) (F2d1;B0d0) B2d1 (F3d1;B1d0) "
             "B3d1 I2d0 W2d0 I3d0 W3d0",
             "F0d0 F0d1 F1d0 F1d1 F2d0 B0d1 (F2d1;B0d0) (F3d0;B1d1) (F3d1;B1d0) B2d1 B2d0 "
             "I3d1 I3d0 W3d1 W3d0",
             "F0d1 F0d0 F1d1 F1d0 F2d1 B0d0 (F2d0;B0d1) (F3d1;B1d0) (F3d0;B1d1) B2d0 B2d1 "
             "I3d0 I3d1 W3d0 W3d1",
             "F0d1 F1d1 F2d1 F0d0 I0d0 W0d0 F1d0 (F3d1;B1d0) (F2d0;B0d1) B2d0 (F3d0;B1d1) "
             "B3d0 I2d1 W2d1 I3d1 W3d1"],
    (4, 10): ["F0d0 F1d0 F2d0 F0d1 I0d1 W0d1 F1d1 (F3d0;B1d1) (F2d1;B0d0) (F4d0;B2d1) "
              "(F3d1;B1d0) B3d1 (F4d1;B2d0) B4d1 I3d0 W3d0 I4d0 W4d0",
              "F0d0 F0d1 F1d0 F1d1 F2d0 B0d1 (F2d1;B0d0) (F3d0;B1d1) (F3d1;B1d0) (F4d0;B2d1) "
              "(F4d1;B2d0) B3d1 B3d0 I4d1 I4d0 W4d1 W4d0",
              "F0d1 F0d0 F1d1 F1d0 F2d1 B0d0 (F2d0;B0d1) (F3d1;B1d0) (F3d0;B1d1) (F4d1;B2d0) "
              "(F4d0;B2d1) B3d0 B3d1 I4d0 I4d1 W4d0 W4d1",
              "F0d1 F1d1 F2d1 F0d0 I0d0 W0d0 F1d0 (F3d1;B1d0) (F2d0;B0d1) (F4d1;B2d0) "
              "(F3d0;B1d1) B3d0 (F4d0;B2d1) B4d0 I3d1 W3d1 I4d1 W4d1"],
    (8, 20): [
        "F0d0 F1d0 F2d0 F3d0 F4d0 F5d0 F6d0 F0d1 I0d1 W0d1 F1d1 I1d1 W1d1 F2d1 I2d1 W2d1 F3d1 "
        "(F7d0;B3d1) (F4d1;B0d0) (F8d0;B4d1) (F5d1;B1d0) (F9d0;B5d1) (F6d1;B2d0) B6d1 "
        "(F7d1;B3d0) B7d1 (F8d1;B4d0) B8d1 (F9d1;B5d0) B9d1 I6d0 W6d0 I7d0 W7d0 I8d0 W8d0 "
        "I9d0 W9d0",
        "F0d0 F1d0 F2d0 F3d0 F4d0 F0d1 F5d0 F1d1 I0d1 W0d1 F2d1 I1d1 W1d1 F3d1 (F6d0;B2d1) "
        "(F4d1;B0d0) (F7d0;B3d1) (F5d1;B1d0) (F8d0;B4d1) (F6d1;B2d0) (F9d0;B5d1) (F7d1;B3d0) "
        "B6d1 (F8d1;B4d0) B7d1 (F9d1;B5d0) B8d1 B6d0 I9d1 I7d0 W9d1 I8d0 W7d0 I9d0 W8d0 W9d0",
        "F0d0 F1d0 F2d0 F0d1 F3d0 F1d1 F4d0 F2d1 I0d1 W0d1 F3d1 (F5d0;B1d1) (F4d1;B0d0) "
        "(F6d0;B2d1) (F5d1;B1d0) (F7d0;B3d1) (F6d1;B2d0) (F8d0;B4d1) (F7d1;B3d0) (F9d0;B5d1) "
        "(F8d1;B4d0) B6d1 (F9d1;B5d0) B7d1 B6d0 B8d1 I7d0 I9d1 I8d0 W7d0 I9d0 W9d1 W8d0 W9d0",
        "F0d0 F0d1 F1d0 F1d1 F2d0 F2d1 F3d0 F3d1 F4d0 B0d1 (F4d1;B0d0) (F5d0;B1d1) "
        "(F5d1;B1d0) (F6d0;B2d1) (F6d1;B2d0) (F7d0;B3d1) (F7d1;B3d0) (F8d0;B4d1) (F8d1;B4d0) "
        "(F9d0;B5d1) (F9d1;B5d0) B6d1 B6d0 B7d1 B7d0 I8d1 I8d0 I9d1 I9d0 W8d1 W8d0 W9d1 W9d0",
        "F0d1 F0d0 F1d1 F1d0 F2d1 F2d0 F3d1 F3d0 F4d1 B0d0 (F4d0;B0d1) (F5d1;B1d0) "
        "(F5d0;B1d1) (F6d1;B2d0) (F6d0;B2d1) (F7d1;B3d0) (F7d0;B3d1) (F8d1;B4d0) (F8d0;B4d1) "
        "(F9d1;B5d0) (F9d0;B5d1) B6d0 B6d1 B7d0 B7d1 I8d0 I8d1 I9d0 I9d1 W8d0 W8d1 W9d0 W9d1",
        "F0d1 F1d1 F2d1 F0d0 F3d1 F1d0 F4d1 F2d0 I0d0 W0d0 F3d0 (F5d1;B1d0) (F4d0;B0d1) "
        "(F6d1;B2d0) (F5d0;B1d1) (F7d1;B3d0) (F6d0;B2d1) (F8d1;B4d0) (F7d0;B3d1) (F9d1;B5d0) "
        "(F8d0;B4d1) B6d0 (F9d0;B5d1) B7d0 B6d1 B8d0 I7d1 I9d0 I8d1 W7d1 I9d1 W9d0 W8d1 W9d1",
        "F0d1 F1d1 F2d1 F3d1 F4d1 F0d0 F5d1 F1d0 I0d0 W0d0 F2d0 I1d0 W1d0 F3d0 (F6d1;B2d0) "
        "(F4d0;B0d1) (F7d1;B3d0) (F5d0;B1d1) (F8d1;B4d0) (F6d0;B2d1) (F9d1;B5d0) (F7d0;B3d1) "
        "B6d0 (F8d0;B4d1) B7d0 (F9d0;B5d1) B8d0 B6d1 I9d0 I7d1 W9d0 I8d1 W7d1 I9d1 W8d1 W9d1",
        "F0d1 F1d1 F2d1 F3d1 F4d1 F5d1 F6d1 F0d0 I0d0 W0d0 F1d0 I1d0 W1d0 F2d0 I2d0 W2d0 F3d0 "
        "(F7d1;B3d0) (F4d0;B0d1) (F8d1;B4d0) (F5d0;B1d1) (F9d1;B5d0) (F6d0;B2d1) B6d0 "
        "(F7d0;B3d1) B7d0 (F8d0;B4d1) B8d0 (F9d0;B5d1) B9d0 I6d1 W6d1 I7d1 W7d1 I8d1 W8d1 "
        "I9d1 W9d1"],
}


def deepseek_ops(text, pp, microbatches, rank):
    """DeepSeek's notation as (kind, stage, microbatch, overlapped): direction d's stage on
    rank r is r (d = 0) or 2P-1-r (d = 1, model stage P-1-r), its microbatch k is d*M/2 + k."""
    out = []
    for token in text.split():
        pair = token.startswith("(")
        for part in token.strip("()").split(";"):
            k, d = part[1:].split("d")
            stage = rank if d == "0" else 2 * pp - 1 - rank
            out.append((part[0], stage, int(d) * microbatches // 2 + int(k), pair))
    return out


@pytest.mark.parametrize("pp, microbatches", list(DEEPSEEK))
def test_every_rank_runs_deepseeks_order(pp, microbatches):
    ours = build_schedule("dualpipe", pp, microbatches)
    for rank, text in enumerate(DEEPSEEK[(pp, microbatches)]):
        assert [(op.kind.value, op.stage, op.microbatch, op.overlapped)
                for op in ours.programs[rank]] == deepseek_ops(text, pp, microbatches, rank)


@pytest.mark.parametrize("pp", [2, 4, 6, 8, 10])
@pytest.mark.parametrize("extra", [0, 2, 6])
def test_op_counts_per_rank_follow_the_phases(pp, extra):
    """docs/research/dualpipe_bidirectional.md section 3: pairs M - 2P + h + 1 + P/2 - mid,
    standalone F P + P/2 - h - 1 + mid, full B P/2 + mid, I = W = P - h - 1."""
    m = 2 * pp + extra
    schedule = build_schedule("dualpipe", pp, m)
    validate(schedule)
    for r, program in enumerate(schedule.programs):
        h, half = min(r, pp - 1 - r), pp // 2
        mid = int(h == half - 1)
        count = {kind: sum(op.kind is kind and not op.overlapped for op in program)
                 for kind in OpKind}
        assert sum(op.overlapped for op in program) == 2 * (m - 2 * pp + h + 1 + half - mid)
        assert count[OpKind.F] == pp + half - h - 1 + mid
        assert count[OpKind.B] == half + mid
        assert count[OpKind.I] == count[OpKind.W] == pp - h - 1


MODEL = ModelSpec(num_layers=840, hidden_size=256, num_attention_heads=4, seq_length=128,
                  vocab_size=512)
TOPOLOGY = load_topology("dgx-h100")


def config(pp, m, **kw):
    return ParallelConfig.from_kwargs(schedule="dualpipe", pp=pp, num_microbatches=m, **kw)


@pytest.mark.parametrize("pp, microbatches", [(2, 4), (2, 8), (4, 8), (4, 14), (6, 12),
                                              (8, 16), (8, 22)])
def test_the_most_idle_rank_idles_deepseeks_bubble_and_holds_pp_plus_1(pp, microbatches):
    forward, backward = 1.0, 2.0  # F = I = W; a pair runs F then B: F&B = F + B
    timeline = simulate(MODEL, config(pp, microbatches), TOPOLOGY,
                        costs=UniformCostModel(forward, backward))
    idle = timeline.idle_time()
    w = backward / 2
    assert max(idle.values()) == pytest.approx((pp / 2 - 1) * (forward + backward + backward
                                                                - 3 * w))
    assert set(timeline.peak_in_flight().values()) == {pp + 1}


def test_every_rank_holds_two_stages_parameters():
    plan = resolve(MODEL, config(4, 8))
    flushed = resolve(MODEL, ParallelConfig.from_kwargs(schedule="1f1b", pp=4,
                                                        num_microbatches=8))
    one = [m.params for m in rank_memory(flushed)]
    for r, memory in enumerate(rank_memory(plan)):
        assert memory.params == one[r] + one[3 - r]  # stage r and the copy of stage 3 - r


def test_the_copies_sum_their_gradients_between_ranks_r_and_p_minus_1_minus_r():
    plan = resolve(MODEL, config(4, 8, dp=2))
    assert [plan.group(PP_COPIES, plan.replayed_ranks[r]) for r in range(4)] == [
        sorted({plan.replayed_ranks[r], plan.replayed_ranks[3 - r]}) for r in range(4)]
    lowered = lower(plan.build_schedule(), plan)
    chains = lowered.stage_chains
    for program in lowered.programs:
        copies = [op for op in program if op.group == PP_COPIES]
        assert [chains.model_stage(op.stage) for op in copies] == sorted(
            chains.model_stage(s) for s in {op.stage for op in program if op.kind is OpKind.F})
        step = next(i for i, op in enumerate(program) if op.kind is OpKind.OPT_STEP)
        assert all(program.index(op) < step for op in copies)
    timeline = simulate(MODEL, config(4, 8, dp=2), TOPOLOGY)
    spans = {}
    for span in timeline.spans:
        if span.op.group == PP_COPIES:
            spans[(span.rank, span.op.stage)] = (span.start, span.end)
    assert len(spans) == 8  # two per rank, each run once for both of its ranks
    for (rank, stage), times in spans.items():
        assert spans[(3 - rank, chains.copy_of(stage))] == times


@pytest.mark.parametrize("pp, m, rule", [(3, 6, "even pp"), (4, 7, "M must be even"),
                                         (4, 6, "at least 2 \\* pp = 8")])
def test_shapes_outside_deepseeks_asserts_are_refused(pp, m, rule):
    with pytest.raises(ConfigError, match=rule):
        build_schedule("dualpipe", pp, m)


def test_no_torch_csv_and_no_fsdp():
    with pytest.raises(ConfigError, match="2 chains"):
        to_torch_csv(build_schedule("dualpipe", 2, 4))
    with pytest.raises(ConfigError, match="zero_stage 3 / FSDP or offload"):
        config(2, 4, dp=2, zero_stage=3)


def test_a_copy_all_reduce_whose_other_copy_never_posts_is_a_deadlock():
    from clustersim.schedules.errors import DeadlockError
    from clustersim.schedules.validate import dry_run
    plan = resolve(MODEL, config(2, 4, dp=2))
    lowered = lower(plan.build_schedule(), plan)
    dry_run(lowered)
    broken = lowered.with_programs([lowered.programs[0], [
        op for op in lowered.programs[1] if op.group != PP_COPIES]])
    with pytest.raises(DeadlockError, match="on 'pp_copies' .* is never posted"):
        dry_run(broken)


def test_profile_costs_give_both_copies_of_a_stage_its_embedding_or_head():
    """A profile's per-part times (schedules.profile): the first stage of each direction
    pays the embedding, the last the head (the profile model holds both)."""
    from test_profile import make_profile
    from clustersim.sim.profile_cost import ProfileCost
    cost = ProfileCost(make_profile(), [2] * 8, chains=2)
    for kind in (OpKind.F, OpKind.B):
        times = [cost.table[(s, kind, None)] for s in range(8)]
        assert times[:4] == times[4:]  # stage j and its copy P + j
        assert times[0] > times[1] == times[2] < times[3]


def test_recomputed_flops_count_the_model_once():
    """Hardware FLOPs = model FLOPs + one more forward of the recomputed layers (SC21), of
    the model, not of each of its two copies."""
    from clustersim.sim.throughput import iteration_flops
    for name in ("dualpipe", "1f1b"):
        plan = resolve(MODEL, ParallelConfig.from_kwargs(
            schedule=name, pp=4, num_microbatches=8, recompute="full"))
        model_flops, hardware = iteration_flops(plan)
        if name == "dualpipe":
            ratio = hardware / model_flops
        else:
            assert hardware / model_flops == pytest.approx(ratio)
