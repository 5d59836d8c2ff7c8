"""The op IR: one action of one pipeline rank, and its text form.

The text form is torch.distributed.pipelining's `_Action` string `{stage}{KIND}{microbatch}`
(`2F0`, `1SEND_F3`, `0I1`), so programs export to the CSV that PyTorch's pipeline runtime
loads. `stage` is the *virtual* stage (model chunk) index, not the rank.

`chunk` (issue 5) names a *layer group* of the stage: 0..G-1 in layer order, G =
`Schedule.layer_groups`, None = the whole stage (schedules.layer_groups maps groups to
layers). Data-parallel passes split compute ops into groups (DDP buckets, FSDP units) so
that communication can interleave with them. Its text form appends `.{chunk}`
(`0F3.1`, `0ALL_GATHER2.1`); torch has no such action, so schedules.torch_csv refuses
chunked ops. Not to be confused with Megatron's "model chunk" (a virtual stage).

`count` (issue 6): how many back-to-back collectives of equal size one op stands for
(the intra-layer collectives of tensor/context/expert parallelism are aggregated per
compute op: a forward of L layers posts its 2L TP all-reduces as ONE op with count 2L).
`nbytes` is then the total over the `count` collectives, nbytes/count each; a run costs
count latency terms (k sequential collectives pay k alphas). Not part of the text form.

Units: `nbytes` in bytes (payload for communication, memory traffic for compute),
`flops` in floating-point operations.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .errors import ConfigError, ScheduleFormatError
from .frozen import fast_init
from .names import PP


class OpKind(str, Enum):
    F = "F"  # forward
    B = "B"  # full backward (input grad and weight grad fused)
    I = "I"  # backward w.r.t. inputs only (zero-bubble split)  # noqa: E741
    W = "W"  # backward w.r.t. weights only (zero-bubble split)
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    ALL_REDUCE = "ALL_REDUCE"
    ALL_GATHER = "ALL_GATHER"
    REDUCE_SCATTER = "REDUCE_SCATTER"
    ALL_TO_ALL = "ALL_TO_ALL"
    BROADCAST = "BROADCAST"
    REDUCE = "REDUCE"  # to the group's first rank (torch.nn.DataParallel's gradients)
    OPT_STEP = "OPT_STEP"  # optimizer step of a stage (group 'host': on the host CPU)
    COPY_D2H = "COPY_D2H"  # device -> host copy over PCIe (offloaded gradients)
    COPY_H2D = "COPY_H2D"  # host -> device copy over PCIe (updated parameters)

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS

    @property
    def is_p2p(self) -> bool:
        return self in P2P_KINDS

    @property
    def is_collective(self) -> bool:
        return self in COLLECTIVE_KINDS

    @property
    def is_copy(self) -> bool:
        return self in COPY_KINDS


WORK_KINDS = frozenset({OpKind.F, OpKind.B, OpKind.I, OpKind.W})
"""The model's own work: a forward, a backward, or a piece of a split backward."""
COMPUTE_KINDS = WORK_KINDS | {OpKind.OPT_STEP}
BACKWARD_KINDS = frozenset({OpKind.B, OpKind.I, OpKind.W})
INPUT_GRAD_KINDS = frozenset({OpKind.B, OpKind.I})
"""Ops that produce a stage's input gradient (B fuses I and W)."""
WEIGHT_GRAD_KINDS = frozenset({OpKind.B, OpKind.W})
"""Ops that produce a stage's weight gradients."""
P2P_KINDS = frozenset({OpKind.SEND_F, OpKind.RECV_F, OpKind.SEND_B, OpKind.RECV_B})
COLLECTIVE_KINDS = frozenset(
    {OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL,
     OpKind.BROADCAST, OpKind.REDUCE}
)
COPY_KINDS = frozenset({OpKind.COPY_D2H, OpKind.COPY_H2D})

# Longest names first so that `SEND_F` is not read as `S` + ...
_KIND_ALTERNATION = "|".join(sorted((k.value for k in OpKind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"^(\d+)({_KIND_ALTERNATION})(\d*)(?:\.(\d+))?$")


@fast_init  # schedules.frozen: made by the million in a replay
@dataclass(frozen=True, slots=True)
class Op:
    """One action of one rank.

    `group` is the group axis the op talks over (schedules.names: tp, cp, ep, etp, dp,
    dp_shard, dp_replicate, pp; host and pcie for host steps and copies), never a list of
    ranks: ranks that differ only along other axes share one program. `alongside`: an
    intra-layer collective that runs beside the compute op posted after it instead of
    blocking after the one before it (schedules.contract; schedules.intra_layer sets it).
    `overlapped`: the F and the B right after it form an overlapped pair, DualPipe's
    forward-backward chunk (torch's OVERLAP_F_B, written `(0F3;3B1)OVERLAP_F_B`; both ops
    carry the flag). Both backends run the pair F then B, as torch's default runtime does;
    both ops' expert all-to-alls run beside the whole pair (schedules.intra_layer).
    """

    kind: OpKind
    stage: int
    microbatch: int | None = None
    group: str | None = None
    nbytes: int = 0
    flops: float = 0.0
    chunk: int | None = None
    count: int = 1
    alongside: bool = False
    overlapped: bool = False

    @property
    def key(self) -> tuple:
        """Identity of the op within one pipeline replica: (kind, stage, microbatch), and
        the chunk appended for a chunked op, (kind, stage, microbatch, chunk), so that an
        unchunked op keeps the key it always had."""
        if self.chunk is None:
            return (self.kind, self.stage, self.microbatch)
        return (self.kind, self.stage, self.microbatch, self.chunk)

    def with_costs(self, *, nbytes: int | None = None, flops: float | None = None) -> Op:
        # Direct construction: dataclasses.replace is ~3x slower on this hot path.
        return Op(self.kind, self.stage, self.microbatch, self.group,
                  self.nbytes if nbytes is None else nbytes,
                  self.flops if flops is None else flops, self.chunk, self.count,
                  self.alongside, self.overlapped)

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        chunk = "" if self.chunk is None else f".{self.chunk}"
        return f"{self.stage}{self.kind.value}{mb}{chunk}"


def overlapped_pairs(program: Sequence[Op]) -> list[tuple[int, int]]:
    """(F index, B index) of each overlapped pair of `program` (Op.overlapped): an
    overlapped F and the next compute op, which must be an overlapped B (ops between them
    that do not compute, such as P2P or collectives, are allowed). ConfigError for an
    overlapped op outside such a pair, or one split into layer groups (Op.chunk)."""
    if not any(op.overlapped for op in program):
        return []  # what the scan below finds without one (the common case; it is slower)
    pairs: list[tuple[int, int]] = []
    forward: int | None = None
    for index, op in enumerate(program):
        if not op.kind.is_compute:
            continue
        if op.overlapped and op.chunk is not None:
            raise ConfigError(
                f"{op}: overlapped F&B pairs (dualpipev) with their ops split into layer "
                f"groups are not modelled: drop ZeRO-3 / FSDP, or use gradient buckets of at "
                f"least a stage")
        if forward is not None:
            if not (op.overlapped and op.kind is OpKind.B):
                raise ConfigError(f"{program[forward]} is marked overlapped but the "
                                          f"next compute op, {op}, is not its overlapped B")
            pairs.append((forward, index))
            forward = None
        elif op.overlapped and op.kind is OpKind.F:
            forward = index
        elif op.overlapped:
            raise ConfigError(f"{op} is marked overlapped without the overlapped F "
                                      f"right before it (an F&B pair is an F, then a B)")
    if forward is not None:
        raise ConfigError(f"{program[forward]} is marked overlapped but no B follows it")
    return pairs


def action_texts(program: Sequence[Op]) -> list[str]:
    """The torch action text of each op, an overlapped pair (an `overlapped` F and the
    `overlapped` B right after it) as one action `(0F3;3B1)OVERLAP_F_B`, as torch writes
    it."""
    partner = dict(overlapped_pairs(program))
    texts: list[str] = []
    for index, op in enumerate(program):
        if op.overlapped and op.kind is OpKind.B:
            continue  # written with its F
        texts.append(f"({op};{program[partner[index]]})OVERLAP_F_B" if index in partner
                     else str(op))
    return texts


def parse_op(text: str) -> Op:
    """Parse one action string such as `2F0`, `1SEND_F3`, `0W1` or `0F3.1` (chunk 1)."""
    match = _ACTION_RE.match(text.strip())
    if not match:
        raise ScheduleFormatError(
            f"bad action {text!r}: expected STAGE KIND MICROBATCH[.CHUNK] such as '2F0', "
            f"'1SEND_F3' or '0F3.1' with KIND one of {', '.join(k.value for k in OpKind)}"
        )
    stage, kind, mb, chunk = match.groups()
    kind = OpKind(kind)
    group = PP if kind.is_p2p else None
    return Op(kind, int(stage), int(mb) if mb else None, group=group,
              chunk=int(chunk) if chunk is not None else None)


def compute_op(kind: OpKind, stage: int, microbatch: int) -> Op:
    return Op(kind, stage, microbatch)


def p2p_op(kind: OpKind, stage: int, microbatch: int, nbytes: int = 0) -> Op:
    return Op(kind, stage, microbatch, group=PP, nbytes=nbytes)
