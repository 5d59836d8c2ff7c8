"""ZB-H1 and ZB-H2, the handcrafted zero-bubble schedules (Qi, Wan, Huang, Lin, "Zero
Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241: section 2, Figure 3, Table 2).

The backward is split in two: the paper's B (gradient w.r.t. the stage's input, which the
previous stage waits for) is clustersim's I; W (gradient w.r.t. the weights, which nothing
in the pipeline waits for) is W. One stage per rank (loop placement: rank r holds stage
r); P ranks, M microbatches, k = 1 for ZB-H1 and 2 for ZB-H2. Rank r runs
- warm-up: the forwards of the first w = min(k(P-1-r), M-1) microbatches;
- steady state: for i = 0..M-1, the next forward while any remain, then I(i), then
  W(i - d) once i >= d, d = min(kr, M-1-w) (rank r's W's trail its I's by d microbatches);
- cool-down: the d remaining W's.
F, I and W each run in microbatch order. This is the authors' `get_hand_schedule(p, n,
f, b, w, c, warmup_c)` (warmup_c = k) in megatron/core/pipeline_parallel/efficiency.py of
github.com/sail-sg/zero-bubble-pipeline-parallelism (branch `arxiv`), with which they
computed the ZB-H1 / ZB-H2 columns of Table 5. For P = 4, M = 8 the first rank of ZB-H1
runs F0-F3, then I0 W0 F4 I1 W1 ..., the last F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 ... (its
W's fill 1F1B's cool-down bubble); the first rank of ZB-H2 runs F0-F6 before I0, so that
its warm-up leaves no bubble before the first I (Figure 3).

Closed forms (Table 2; T_B there is the I here; unit of memory: one microbatch's
activations of one stage, M_B), with communication free:
- ZB-H1: iteration M(T_F+T_B+T_W) + (P-1)(T_F+T_B-T_W), 1F1B's bubble (P-1)(T_F+T_B+T_W)
  less 2(P-1)T_W, a third of it when T_F = T_B = T_W. It holds for M >= P and T_W <=
  min(T_F, T_B) (the paper's T_W < T_F < T_B, section 2.3). Every rank holds P microbatches
  at its peak (worker i: (P-i+1)M_B + (i-1)M_W, section 2.3), 1F1B's peak (its first rank's).
- ZB-H2: every rank's span (its first op's start to its last op's end: the "largest
  execution time of all stages" of section 5.3, the authors' cost for ZB-H2) is
  M(T_F+T_B+T_W) + (P-1)(T_F+T_B-2T_W), no bubble when T_F + T_B = 2T_W, for M >= 2P-1,
  T_W <= T_F and 2T_W <= T_F+T_B. The spans form a parallelogram: rank r starts r*T_F
  late, so ONE iteration, first start to last end (clustersim's iteration time), takes
  M(T_F+T_B+T_W) + (P-1)max(T_F, T_F+T_B-2T_W); the zero bubble is the steady state of
  back-to-back iterations once the optimizer step's synchronisation is removed (section
  4). Every rank holds 2P-1 microbatches at its peak ((2P-2i+1)M_B + (2i-2)M_W).
Microbatches: any M >= 1. For M >= k(P-1)+1 (M >= P for ZB-H1, M >= 2P-1 for ZB-H2) w
and d are the paper's k(P-1-r) and kr and the closed forms hold. The paper leaves fewer
microbatches out (the authors' generator asserts M >= 2P); clustersim then cuts the
pattern to fit M: rank r holds w + d + 1 = min(k(P-1)+1, M) microbatches at its peak,
spent on warm-up forwards first, then on delaying W's. Cutting only the warm-up (w =
min(k(P-1-r), M), d = kr) would make ZB-H2 slower than ZB-H1 for P <= M < 2P-1; cut this
way it is never slower (tests/test_zero_bubble_handcrafted.py, T_W <= min(T_F, T_B)).
"""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry

SOURCE = "Qi et al., ICLR 2024 (Zero Bubble Pipeline Parallelism, Fig. 3, Table 2)"


def zero_bubble_programs(rank_stages: list[list[int]], microbatches: int,
                         warmup_factor: int) -> list[list[Op]]:
    """The programs of ZB-H1 (`warmup_factor` 1) or ZB-H2 (2): the module's rules."""
    pp, out = len(rank_stages), []
    for r, (stage,) in enumerate(rank_stages):
        warmup = min(warmup_factor * (pp - 1 - r), microbatches - 1)
        lag = min(warmup_factor * r, microbatches - 1 - warmup)  # W(i - lag) after I(i)
        program = [Op(OpKind.F, stage, m) for m in range(warmup)]
        for i in range(microbatches):
            if warmup + i < microbatches:
                program.append(Op(OpKind.F, stage, warmup + i))
            program.append(Op(OpKind.I, stage, i))
            if i >= lag:
                program.append(Op(OpKind.W, stage, i - lag))
        program += [Op(OpKind.W, stage, m) for m in range(microbatches - lag, microbatches)]
        out.append(program)
    return out


def zb_h1(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    return zero_bubble_programs(rank_stages, microbatches, 1)


def zb_h2(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    return zero_bubble_programs(rank_stages, microbatches, 2)


SCHEDULES = [
    ScheduleEntry(
        "zb-h1", zb_h1, source=SOURCE,
        summary="1F1B's order with split backwards (I, W); rank r delays its W's by r "
                "microbatches to fill the cool-down: a third of 1F1B's bubble at F = I = W "
                "(closed form for M >= pp); every rank holds up to pp microbatches, 1F1B's "
                "most (rank 0's), so later ranks hold more than under 1F1B",
        aliases=("zbh1", "zero-bubble-h1")),
    ScheduleEntry(
        "zb-h2", zb_h2, source=SOURCE,
        summary="2(pp-1-r) warm-up forwards on rank r and its W's 2r microbatches late: "
                "2pp-1 microbatches held, no bubble within each rank's span at F = I = W "
                "(closed form for M >= 2pp-1)",
        aliases=("zbh2", "zero-bubble-h2")),
]
