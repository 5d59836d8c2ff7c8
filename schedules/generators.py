"""Pipeline schedule generators: compute-only programs in Megatron/PyTorch order.

Each generator returns a Schedule whose programs hold only F and B ops; `add_p2p`
(schedules.p2p) lowers it to one with SEND/RECV ops. Orders follow Megatron-LM's
`schedules.py` and torch.distributed.pipelining's `Schedule1F1B` /
`ScheduleInterleaved1F1B`:

- gpipe: all forwards, then all backwards in microbatch order (Huang et al. 2019).
- 1f1b: rank r runs min(P-r-1, M) warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards (Narayanan et al., PipeDream-Flush).
- interleaved-1f1b: rank r holds V chunks (stages r, r+P, ..., r+(V-1)P); microbatches go
  through the chunks in groups of P; warm-up is 2(P-r-1) + (V-1)P forwards
  (Narayanan et al. SC21, Megatron-LM `forward_backward_pipelining_with_interleaving`).
"""
from __future__ import annotations

from collections.abc import Callable

from .errors import ConfigError
from .ops import Op, OpKind
from .schedule import Schedule


def _check_common(pp: int, microbatches: int) -> None:
    if pp < 1:
        raise ConfigError(f"pp (pipeline-model-parallel-size) must be >= 1, got {pp}")
    if microbatches < 1:
        raise ConfigError(f"microbatches must be >= 1, got {microbatches}")


def _require_single_chunk(name: str, vpp: int) -> None:
    if vpp != 1:
        raise ConfigError(
            f"schedule {name!r} runs one model chunk per rank: vpp must be 1, got {vpp} "
            f"(use 'interleaved-1f1b' for vpp >= 2)"
        )


def gpipe(pp: int, microbatches: int, vpp: int = 1) -> Schedule:
    """GPipe: F(0..M-1) then B(0..M-1) on every rank."""
    _check_common(pp, microbatches)
    _require_single_chunk("gpipe", vpp)
    programs = [
        [Op(OpKind.F, r, m) for m in range(microbatches)]
        + [Op(OpKind.B, r, m) for m in range(microbatches)]
        for r in range(pp)
    ]
    return Schedule("gpipe", microbatches, programs, num_stages=pp)


def one_f_one_b(pp: int, microbatches: int, vpp: int = 1) -> Schedule:
    """1F1B (PipeDream-Flush): warm-up, steady 1F1B, cool-down."""
    _check_common(pp, microbatches)
    _require_single_chunk("1f1b", vpp)
    programs = []
    for r in range(pp):
        warmup = min(pp - r - 1, microbatches)
        program = [Op(OpKind.F, r, m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            program += [Op(OpKind.F, r, warmup + i), Op(OpKind.B, r, i)]
        program += [Op(OpKind.B, r, m) for m in range(microbatches - warmup, microbatches)]
        programs.append(program)
    return Schedule("1f1b", microbatches, programs, num_stages=pp)


def interleaved_chunk_and_microbatch(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Chunk and microbatch of a rank's k-th forward (or backward) op.

    Microbatches advance through the chunks in groups of `pp`: ops 0..P-1 are microbatches
    0..P-1 on chunk 0, the next P on chunk 1, ..., then the next group of microbatches.
    Backwards visit the chunks in reverse.
    """
    chunk = (k // pp) % vpp
    if not forward:
        chunk = vpp - 1 - chunk
    microbatch = (k // (pp * vpp)) * pp + k % pp
    return chunk, microbatch


def interleaved_1f1b(pp: int, microbatches: int, vpp: int = 2) -> Schedule:
    """Interleaved 1F1B with `vpp` model chunks per rank (Megatron-LM SC21)."""
    _check_common(pp, microbatches)
    if vpp < 2:
        raise ConfigError(
            f"interleaved-1f1b needs vpp (virtual-pipeline-model-parallel-size) >= 2, got {vpp}"
        )
    if microbatches % pp:
        raise ConfigError(
            f"interleaved-1f1b runs microbatches in groups of pp={pp}: microbatches must be a "
            f"multiple of pp, got {microbatches}"
        )
    total = microbatches * vpp
    programs = []
    for r in range(pp):
        def op(kind: OpKind, k: int) -> Op:
            chunk, m = interleaved_chunk_and_microbatch(k, pp, vpp, kind is OpKind.F)
            return Op(kind, chunk * pp + r, m)

        warmup = min(2 * (pp - r - 1) + (vpp - 1) * pp, total)
        program = [op(OpKind.F, k) for k in range(warmup)]
        for i in range(total - warmup):
            program += [op(OpKind.F, warmup + i), op(OpKind.B, i)]
        program += [op(OpKind.B, k) for k in range(total - warmup, total)]
        programs.append(program)
    return Schedule("interleaved-1f1b", microbatches, programs, num_stages=pp * vpp)


GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
}

# Spellings from Megatron-LM, torch.distributed.pipelining and papers.
ALIASES = {
    "schedulegpipe": "gpipe",
    "schedule1f1b": "1f1b",
    "pipedream-flush": "1f1b",
    "interleaved": "interleaved-1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "scheduleinterleaved1f1b": "interleaved-1f1b",
}


def canonical_schedule_name(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key.replace("-", ""), ALIASES.get(key, key))
    if key not in GENERATORS:
        raise ConfigError(
            f"unknown schedule {name!r}: choose one of {', '.join(GENERATORS)}"
        )
    return key


def build_schedule(name: str, pp: int, microbatches: int, vpp: int = 1) -> Schedule:
    """Compute-only schedule by name (aliases accepted)."""
    return GENERATORS[canonical_schedule_name(name)](pp, microbatches, vpp)
