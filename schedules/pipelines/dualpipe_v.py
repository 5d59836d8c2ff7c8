"""DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, section
3.2.1: DualPipe; its cut-in-half V variant in github.com/deepseek-ai/DualPipe
`dualpipev.py`; torch.distributed.pipelining's ScheduleDualPipeV, whose order this is,
op for op: tests/test_dualpipe_v.py).

2P stages on P ranks in the V placement: rank r holds the down stage a = r and the up
stage b = 2P-1-r, so the first and the last stage share rank 0. Microbatches take the
next index per (stage, pass); a full backward B counts for both I and W of its stage;
deferred weight gradients wait in one queue per rank, oldest first. Rank r runs
1. 2(P-r-1) forwards of a;
2. r+1 times F(a), F(b);
3. P-r-1 times I(b), the oldest pending W, F(b) (zero-bubble warm-up);
4. M-2P+r+1 times the overlapped pairs (F(a); B(b)) and (F(b); B(a)), but for the first
   pair of the last rank, whose F(a) and B(b) run apart;
5. P-r-1 times B(b), then the pair (F(b); B(a));
6. r+1 times a backward of b, then one of a: full B's for the first half, I's after (on
   odd r the switch comes before b's backward, on even r between b's and a's);
7. P-r-1 times the oldest pending W, then I(a);
8. r+1 times the oldest pending W.
It needs M >= 2P (torch and DeepSeek refuse fewer).

An overlapped pair is an F and the B after it, both marked `overlapped` (schedules.ops.Op;
torch's OVERLAP_F_B). DeepSeek-V3 runs the two at once, with 20 of the GPU's 132 SMs for the
expert-parallel all-to-alls, which then hide behind the other chunk's compute (sections
3.2.1 and 3.5.1). Here both backends run a pair's computations as torch's default runtime
runs OVERLAP_F_B, F then B; in the simulator both ops' EP all-to-alls run beside the
whole pair on 20 SMs (schedules.intra_layer, sim.cost), which the run notes. The closed forms
of DeepSeek's README table (PP = 2P stages; F&B = the pair's time, here F + B): bubble
(PP/2-1)(F&B+B-3W) on the most idle rank, and PP+1 chunks whose forward has run and
backward not yet begun on every rank (docs/research/dualpipe.md).
"""
from __future__ import annotations

from collections import deque

from ..ops import Op, OpKind
from ..placement import V_SHAPE
from ..schedule_entry import ScheduleEntry


class _Rank:
    """One rank's program under construction: the next microbatch per (stage, pass), and
    the weight gradients waiting to run."""

    def __init__(self) -> None:
        self.program: list[Op] = []
        self.next: dict[tuple[int, str], int] = {}
        self.pending_w: deque[tuple[int, int]] = deque()

    def _take(self, stage: int, counter: str) -> int:
        m = self.next.get((stage, counter), 0)
        self.next[(stage, counter)] = m + 1
        return m

    def forward(self, stage: int, overlapped: bool = False) -> None:
        self.program.append(Op(OpKind.F, stage, self._take(stage, "F"), overlapped=overlapped))

    def backward(self, stage: int, split: bool = False, overlapped: bool = False) -> None:
        m = self._take(stage, "I")
        if split:
            self.program.append(Op(OpKind.I, stage, m))
            self.pending_w.append((stage, m))
        else:
            self.program.append(Op(OpKind.B, stage, m, overlapped=overlapped))

    def pair(self, forward: int, backward: int) -> None:
        self.forward(forward, overlapped=True)
        self.backward(backward, overlapped=True)

    def weight(self) -> None:
        if self.pending_w:
            self.program.append(Op(OpKind.W, *self.pending_w.popleft()))


def rank_program(pp: int, microbatches: int, r: int, a: int, b: int) -> list[Op]:
    """Rank r's program (module docstring, steps 1-8); a and b its down and up stages."""
    rank = _Rank()
    for _ in range(2 * (pp - r - 1)):
        rank.forward(a)
    for _ in range(r + 1):
        rank.forward(a)
        rank.forward(b)
    for _ in range(pp - r - 1):
        rank.backward(b, split=True)
        rank.weight()
        rank.forward(b)
    for i in range(microbatches - 2 * pp + r + 1):
        if i == 0 and r == pp - 1:
            rank.forward(a)
            rank.backward(b)
        else:
            rank.pair(a, b)
        rank.pair(b, a)
    for _ in range(pp - r - 1):
        rank.backward(b)
        rank.pair(b, a)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        rank.backward(b, split=split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        rank.backward(a, split=split)
    for _ in range(pp - r - 1):
        rank.weight()
        rank.backward(a, split=split)
    for _ in range(r + 1):
        rank.weight()
    return rank.program


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp = len(rank_stages)
    return [rank_program(pp, microbatches, r, a, b) for r, (a, b) in enumerate(rank_stages)]


def microbatch_rule(pp: int, microbatches: int) -> str | None:
    if microbatches >= 2 * pp:
        return None
    return (f"it needs at least as many microbatches as stages, 2 * pp = {2 * pp} "
            f"(torch's ScheduleDualPipeV and DeepSeek's DualPipeV), got {microbatches}")


SCHEDULES = [ScheduleEntry(
    "dualpipev", programs, source="DeepSeek-V3 report, section 3.2.1 (DualPipe), cut in half",
    summary="V placement, bidirectional chunks: a forward and a backward of two microbatches "
            "paired (run F then B here); M >= 2pp",
    aliases=("ScheduleDualPipeV", "dual-pipe-v"), default_vpp=2, min_vpp=2,
    max_vpp=2, placement=V_SHAPE, microbatch_rule=microbatch_rule)]
