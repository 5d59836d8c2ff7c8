"""Read and write the CSV schedules of torch.distributed.pipelining.

What torch does (pytorch/pytorch, `torch/distributed/pipelining/schedules.py`, read at
commit 00722e648b740f91d0e71494baa17891749fd291):

- `PipelineScheduleMulti._dump_csv(filename)` and `_PipelineScheduleRuntime._dump_csv(
  filename, format="compute_comms"|"compute_only")` open the file with `newline=""` and
  call `csv.writer(csvfile).writerow(pipeline_order[rank])` once per rank, in the dict's
  (rank) order. So: no header, one row per rank, the default `excel` dialect (`,`
  separators, `\\r\\n` line ends, minimal quoting), rows of unequal length (no padding).
- Each cell is `str(_Action)`, i.e. `_Action.__repr__`: `{stage}{type}{microbatch}` with the
  microbatch left out when None (`2F0`, `1SEND_F3`, `0UNSHARD`). Types: `F`, `B` (full
  backward), `I`, `W`, `SEND_F`, `RECV_F`, `SEND_B`, `RECV_B`, `UNSHARD`, `RESHARD`,
  `REDUCE_GRAD`, and `OVERLAP_F_B` written `(0F1;1B0)OVERLAP_F_B` around its sub-actions.
  `stage` is the virtual stage, not the rank; a `RECV_F`/`RECV_B` names the *receiving*
  stage (`_add_send_recv`: SEND_F(s) pairs with RECV_F(s+1)).
- A `None` action (an idle time step in the compute-only `pipeline_order` that
  Schedule1F1B / ScheduleInterleaved1F1B generate) is written as an empty cell.
- `_load_csv(filename, format="compute_only")` reads with `csv.reader` and maps every cell
  through `_Action.from_str`, which strips whitespace, turns an empty cell into `None`, and
  matches `_action_regex` with `re.match` (a prefix match: torch silently ignores trailing
  text). `_validate_schedule` then infers `stage -> rank` from the rows (a stage on two
  ranks is an error: "Stage s is assigned to both rank a and rank b") and checks that each
  stage has M forwards and M backwards. `format="compute_comms"` rows may not hold `None`.
- `_format_pipeline_order` is a different, human-readable step x rank grid for error logs,
  not the CSV.

This module writes exactly that CSV (via `csv.writer`, so the bytes match torch's) and reads
it more strictly than torch: a cell must be empty or exactly one action (leading/trailing
whitespace is stripped as torch does; anything else, e.g. `0F0 x` or `0F0junk`, is an
error naming the row, the rank and the 1-based column). `UNSHARD`, `RESHARD` and
`REDUCE_GRAD` (FSDP and gradient-reduction steps that torch's runtime inserts itself) have no
op in our IR and are skipped on reading; `OVERLAP_F_B` is expanded into its sub-actions
(plain actions only, not nested; an F and a B become an `overlapped` F and B,
schedules.ops.Op, written back as the pair in compute-only rows). Stage and microbatch
numbers are ASCII digits.
On writing, ops torch has no action for (collectives, `OPT_STEP`) are left out.

Limits on reading: a file of at most MAX_CSV_BYTES (32 MiB; a 1F1B CSV of 64 ranks and
1,024 microbatches is under 2 MiB), at most MAX_RANKS (65,536) rows, indices of at most 9
digits. Nothing is built from an index before the file shows it means something: stages
0..max must all appear, and, when the microbatch count is inferred, microbatches 0..max
must all appear, each on every stage; the checks look only at what the file holds, so
`1000000000F0` is refused ("stage 0 appears in no row, yet stage 1000000000 does"), not
built into a billion empty stages, and an extra microbatch on one rank is refused naming
its cell and the stage (rank) that lacks it.
"""
from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from clustersim.user_files import read_text, short_repr

from .errors import ConfigError, ScheduleFormatError
from .ops import Op, OpKind, action_texts, compute_op, p2p_op
from .p2p import add_p2p
from .schedule import Schedule

logger = logging.getLogger(__name__)

TORCH_COMPUTE_KINDS = (OpKind.F, OpKind.B, OpKind.I, OpKind.W)
TORCH_P2P_KINDS = (OpKind.SEND_F, OpKind.RECV_F, OpKind.SEND_B, OpKind.RECV_B)
# Actions torch knows that have no op here; its runtime re-inserts them when lowering.
TORCH_SKIPPED_ACTIONS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")

_TYPES = sorted([k.value for k in TORCH_COMPUTE_KINDS + TORCH_P2P_KINDS]
                + list(TORCH_SKIPPED_ACTIONS), key=len, reverse=True)
_ACTION_RE = re.compile(rf"([0-9]+)({'|'.join(_TYPES)})([0-9]*)")
_OVERLAP_RE = re.compile(r"\((.*)\)OVERLAP_F_B")
_ACTION_RULE = ("a cell is empty or one torch action STAGE TYPE MICROBATCH such as '0F0' or "
                "'1SEND_F3', TYPE one of " + ", ".join(_TYPES) + " or (A;B)OVERLAP_F_B")
MAX_CSV_BYTES = 32 * 1024 * 1024  # bytes read at most (module docstring)
MAX_RANKS = 65_536  # rows, one per pipeline rank
_MAX_INDEX_DIGITS = 9  # a MAX_CSV_BYTES file holds far fewer actions than 10**9


# ---------------------------------------------------------------- writing

def _no_torch_csv(name: str, asynchronous: bool, chains: int) -> str | None:
    """Why a schedule has no torch CSV, or None: torch's runtime flushes, steps once per
    iteration and runs one stage chain."""
    if chains > 1:
        return (f"schedule {name!r} has no torch CSV: its stages form {chains} chains "
                f"(DualPipe's two directions, schedules.chains), while "
                f"torch.distributed.pipelining runs one (its DualPipeV is `dualpipev` here)")
    if asynchronous:
        return (f"schedule {name!r} has no torch CSV: it runs several batches with no flush "
                f"and steps after every update, while torch.distributed.pipelining flushes "
                f"and steps once per iteration")
    return None


def check_exportable(entry, flag: str) -> None:
    """Refuse, before any work, a registered schedule (a ScheduleEntry) that `to_torch_csv`
    would refuse."""
    why = _no_torch_csv(entry.name, entry.stashing is not None, entry.chains)
    if why:
        raise ConfigError(f"{flag}: {why}")


def to_torch_csv(schedule: Schedule, compute_only: bool = True,
                 align_steps: bool = False) -> str:
    """The schedule as torch's CSV: one row per rank, one action per cell.

    `compute_only=True` writes F/B/I/W only (torch's `format="compute_only"`, which its
    runtime lowers itself); `False` writes the lowered program with SEND/RECV ops (torch's
    `format="compute_comms"`), lowering with `add_p2p` first if needed. `align_steps`
    places each compute op at its unit-time dry-run step with empty cells for idle steps,
    as torch's own generated compute-only orders look (compute-only form only).
    Layer-group ops (`Op.chunk`, made by the data-parallel passes) have no torch action
    and are refused: export the pipeline schedule before those passes. So is an
    asynchronous schedule (PipeDream, 2BW): torch's runtime flushes and steps once per
    iteration, so its no-flush order would run as another schedule; and so is bidirectional
    DualPipe (two stage chains), which torch's runtime does not run.
    """
    why = _no_torch_csv(schedule.name, schedule.asynchronous is not None, schedule.chains)
    if why:
        raise ConfigError(f"{why}; use --format grid or text")
    chunked = next((op for op in schedule.ops() if op.chunk is not None), None)
    if chunked is not None:
        raise ConfigError(f"torch CSV: op {chunked} is a layer group (chunk "
                          f"{chunked.chunk}), which torch.distributed.pipelining has no "
                          "action for; export the schedule before the data-parallel passes")
    if compute_only:
        kinds = TORCH_COMPUTE_KINDS
        if align_steps:
            rows = _aligned_rows(schedule, kinds)
        else:
            rows = [action_texts([op for op in p if op.kind in kinds])
                    for p in schedule.programs]
    else:
        if align_steps:
            raise ConfigError("align_steps needs compute_only=True: torch's compute_comms "
                              "format allows no empty cells")
        kinds = TORCH_COMPUTE_KINDS + TORCH_P2P_KINDS
        rows = [[str(op) for op in p if op.kind in kinds] for p in add_p2p(schedule).programs]
    dropped = sum(1 for op in schedule.ops()
                  if op.kind not in kinds and not (compute_only and op.kind.is_p2p))
    if dropped:
        logger.info("torch CSV: left out %d op(s) that torch has no action for", dropped)
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # torch's dialect: excel, "\r\n" line ends
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def _aligned_rows(schedule: Schedule, kinds: Sequence[OpKind]) -> list[list[str | None]]:
    from .validate import dry_run  # validate imports p2p; keep this module light

    rows = []
    for steps in dry_run(schedule.compute_only()).steps:
        kept = [(op, t) for op, t in steps if op.kind in kinds]
        row: list[str | None] = [None] * (kept[-1][1] + 1 if kept else 0)
        previous = None  # an overlapped pair takes its F's step, as one action
        for op, t in kept:
            if op.overlapped and op.kind is OpKind.B and previous is not None:
                row[previous[1]] = f"({previous[0]};{op})OVERLAP_F_B"
                previous = None
                continue
            row[t] = str(op)
            previous = (op, t) if op.overlapped and op.kind is OpKind.F else None
        rows.append(row)
    return rows


def write_torch_csv(schedule: Schedule, path: str | Path, compute_only: bool = True,
                    align_steps: bool = False) -> None:
    """Write `to_torch_csv(...)` to `path` byte for byte (no newline translation)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(to_torch_csv(schedule, compute_only, align_steps))


# ---------------------------------------------------------------- reading

def _where(row: int, col: int, cell: str) -> str:
    return f"row {row + 1} (rank {row}), column {col + 1}, cell {short_repr(cell)}"


def _parse_cell(cell: str, row: int, col: int, overlapped: bool = False) -> list[Op]:
    """The ops of one cell: none for an empty cell or a skipped torch action."""
    text = cell.strip()
    if not text:
        return []
    overlap = _OVERLAP_RE.fullmatch(text)
    if overlap:
        if overlapped:
            raise ScheduleFormatError(f"{_where(row, col, cell)}: OVERLAP_F_B inside "
                                      f"OVERLAP_F_B; rule: {_ACTION_RULE} of plain actions")
        parts = overlap.group(1).split(";")
        ops = [op for part in parts for op in _parse_cell(part, row, col, True)]
        if len(ops) == 2 and ops[0].kind is OpKind.F and ops[1].kind is OpKind.B:
            ops = [replace(op, overlapped=True) for op in ops]  # DualPipe's pair (Op)
        return ops
    match = _ACTION_RE.fullmatch(text)
    if not match:
        problem = ("whitespace inside the action" if any(c.isspace() for c in text)
                   else "not a torch action")
        raise ScheduleFormatError(f"{_where(row, col, cell)}: {problem}; rule: {_ACTION_RULE}")
    stage, kind, microbatch = match.groups()
    if kind in TORCH_SKIPPED_ACTIONS:
        return []
    if not microbatch:
        raise ScheduleFormatError(f"{_where(row, col, cell)}: {kind} needs a microbatch "
                                  f"index; rule: {_ACTION_RULE}")
    for what, digits in (("stage", stage), ("microbatch", microbatch)):
        if len(digits) > _MAX_INDEX_DIGITS:
            raise ScheduleFormatError(
                f"{_where(row, col, cell)}: {what} index of {len(digits)} digits out of "
                f"range; rule: at most {_MAX_INDEX_DIGITS} digits (every stage and "
                "microbatch needs actions of its own, and a file holds far fewer)")
    kind = OpKind(kind)
    make = p2p_op if kind.is_p2p else compute_op
    return [make(kind, int(stage), int(microbatch))]


def _read_rows(text: str) -> list[list[str]]:
    reader = csv.reader(io.StringIO(text))
    rows = []
    try:
        for row in reader:
            if len(rows) == MAX_RANKS:
                raise ScheduleFormatError(
                    f"row {MAX_RANKS + 1}: more than {MAX_RANKS} rows; rule: one row per "
                    f"pipeline rank, at most {MAX_RANKS} ranks")
            rows.append(row)
    except csv.Error as exc:
        raise ScheduleFormatError(f"torch CSV is not valid CSV (line {reader.line_num}): "
                                  f"{exc}") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()  # trailing blank lines are not ranks
    return rows


def from_torch_csv(text: str, num_microbatches: int | None = None,
                   stage_ranks: Sequence[int] | None = None, name: str = "custom") -> Schedule:
    """Parse torch's CSV (compute-only or lowered) into a Schedule.

    Row r is rank r. Without `stage_ranks`, stage s lives on the rank whose row holds its
    ops, and `num_stages` is the largest stage + 1; without `num_microbatches` it is the
    largest microbatch + 1. Raises ScheduleFormatError naming the row, rank, 1-based column
    and the rule broken (limits: module docstring).
    """
    rows = _read_rows(text)
    if not any(c.strip() for row in rows for c in row):
        raise ScheduleFormatError("row 1 (rank 0), column 1: empty torch CSV; rule: one row "
                                  "per rank, each holding that rank's actions such as '0F0'")
    programs: list[list[Op]] = []
    cells: dict[int, tuple[int, int, str]] = {}  # stage -> first (row, col, cell) naming it
    owner: dict[int, int] = {}
    fixed = tuple(stage_ranks) if stage_ranks is not None else None
    if fixed is not None:
        bad = [r for r in fixed if not 0 <= r < len(rows)]
        if bad:
            raise ScheduleFormatError(f"stage_ranks names rank {bad[0]}, but the CSV has "
                                      f"rows for ranks 0..{len(rows) - 1}")
        owner = dict(enumerate(fixed))
    mb_cell: dict[int, tuple[int, int, str]] = {}  # microbatch -> first (row, col, cell)
    stage_mbs: dict[int, set[int]] = {}  # stage -> its microbatches
    for r, row in enumerate(rows):
        program: list[Op] = []
        for c, cell in enumerate(row):
            for op in _parse_cell(cell, r, c):
                _check_stage(op, r, c, cell, owner, cells, fixed)
                if num_microbatches is not None and op.microbatch >= num_microbatches:
                    raise ScheduleFormatError(
                        f"{_where(r, c, cell)}: microbatch {op.microbatch} out of range; rule: "
                        f"microbatches are 0..{num_microbatches - 1} (num_microbatches="
                        f"{num_microbatches})")
                mb_cell.setdefault(op.microbatch, (r, c, cell))
                stage_mbs.setdefault(op.stage, set()).add(op.microbatch)
                program.append(op)
        programs.append(program)
    if not mb_cell:
        raise ScheduleFormatError("torch CSV holds no F/B/I/W or SEND/RECV action; rule: one "
                                  "row per rank, each holding that rank's actions such as '0F0'")
    num_stages = len(fixed) if fixed is not None else max(owner) + 1
    missing = next((s for s in range(num_stages) if s not in owner), None)
    if missing is not None:
        raise ScheduleFormatError(
            f"stage {missing} appears in no row, yet stage {num_stages - 1} does; rule: "
            f"stages are 0..max and each must appear on its rank's row (or pass stage_ranks)")
    ranks = tuple(owner[s] for s in range(num_stages))
    if num_microbatches is None:  # given, the programs may be partial (checked on lowering)
        num_microbatches = max(mb_cell) + 1
        _check_microbatches(num_microbatches, num_stages, ranks, mb_cell, stage_mbs)
    return Schedule(name, num_microbatches, programs, num_stages, ranks)


def _check_microbatches(num_microbatches: int, num_stages: int, ranks: tuple[int, ...],
                        mb_cell: dict[int, tuple[int, int, str]],
                        stage_mbs: dict[int, set[int]]) -> None:
    """Every microbatch 0..M-1 appears, and on every stage that has actions (names the
    cell and the rank; looks only at the microbatches the file holds)."""
    rule = (f"rule: every stage runs every microbatch 0..{num_microbatches - 1} "
            f"(num_microbatches={num_microbatches})")
    if len(mb_cell) < num_microbatches:  # then the first gap is at most len(mb_cell)
        gap = next(m for m in range(len(mb_cell) + 1) if m not in mb_cell)
        top = max(mb_cell)
        later = f", yet microbatch {top} does ({_where(*mb_cell[top])})" if top > gap else ""
        raise ScheduleFormatError(f"microbatch {gap} appears in no cell{later}; {rule}")
    for s in range(num_stages):
        mbs = stage_mbs.get(s)
        if mbs is not None and len(mbs) < len(mb_cell):
            m = min(set(mb_cell) - mbs)
            raise ScheduleFormatError(
                f"{_where(*mb_cell[m])}: microbatch {m}, but stage {s} (row {ranks[s] + 1}, "
                f"rank {ranks[s]}) has no action for microbatch {m}; {rule}")


def _check_stage(op: Op, r: int, c: int, cell: str, owner: dict[int, int],
                 cells: dict[int, tuple[int, int, str]], fixed: tuple[int, ...] | None) -> None:
    """Stage `op.stage` must live on rank `r` (the row holding the op)."""
    s = op.stage
    if fixed is not None:
        if s >= len(fixed):
            raise ScheduleFormatError(
                f"{_where(r, c, cell)}: stage {s} out of range; rule: stage_ranks gives "
                f"stages 0..{len(fixed) - 1}")
        if fixed[s] != r:
            raise ScheduleFormatError(
                f"{_where(r, c, cell)}: stage {s} is on rank {fixed[s]} by stage_ranks; "
                f"rule: an op sits on the row of the rank holding its stage")
        return
    if s not in owner:
        owner[s], cells[s] = r, (r, c, cell)
    elif owner[s] != r:
        first = cells[s]
        raise ScheduleFormatError(
            f"{_where(r, c, cell)}: stage {s} is on two ranks, {r} and {owner[s]} "
            f"({_where(*first)}); rule: each stage lives on exactly one rank")


def read_torch_csv(path: str | Path, num_microbatches: int | None = None,
                   stage_ranks: Sequence[int] | None = None,
                   name: str | None = None) -> Schedule:
    """`from_torch_csv` of a file; the schedule is named after the file unless `name`.

    Every error, also an unreadable, non-UTF-8 or oversized file, is one
    ScheduleFormatError naming the file.
    """
    path = Path(path)
    text = read_text(path, f"torch CSV {path}", ScheduleFormatError, MAX_CSV_BYTES)
    try:
        return from_torch_csv(text, num_microbatches, stage_ranks, name or path.stem)
    except (ScheduleFormatError, ConfigError) as exc:
        raise type(exc)(f"torch CSV {path}: {exc}") from None
