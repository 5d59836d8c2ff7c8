"""torch.distributed.pipelining CSV compatibility: round trips, torch's format, errors."""
import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError, ScheduleFormatError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.torch_csv import from_torch_csv, read_torch_csv, to_torch_csv, write_torch_csv
from clustersim.schedules.validate import dry_run, validate

CONFIGS = (
    [("gpipe", p, m, 1) for p in (1, 2, 4, 5) for m in (1, 3, 8)]
    + [("1f1b", p, m, 1) for p in (1, 2, 4, 5) for m in (1, 3, 8)]
    + [("interleaved-1f1b", p, m, v) for p in (1, 2, 4) for m in (p, 2 * p) for v in (2, 3)]
)


def _same(a: Schedule, b: Schedule) -> None:
    assert a.programs == b.programs
    assert a.stage_ranks == b.stage_ranks
    assert a.num_stages == b.num_stages
    assert a.num_microbatches == b.num_microbatches


@pytest.mark.parametrize("name,pp,mb,vpp", CONFIGS)
def test_compute_only_round_trip(name, pp, mb, vpp):
    s = build_schedule(name, pp, mb, vpp)
    _same(from_torch_csv(to_torch_csv(s)), s)


@pytest.mark.parametrize("name,pp,mb,vpp", CONFIGS)
def test_lowered_round_trip(name, pp, mb, vpp):
    lowered = add_p2p(build_schedule(name, pp, mb, vpp))
    back = from_torch_csv(to_torch_csv(lowered, compute_only=False))
    _same(back, lowered)
    # the unlowered schedule exports to the same lowered CSV
    assert to_torch_csv(lowered.compute_only(), compute_only=False) == to_torch_csv(
        lowered, compute_only=False)
    validate(back)


@pytest.mark.parametrize("name,pp,mb,vpp", CONFIGS)
def test_aligned_round_trip_places_ops_at_dry_run_steps(name, pp, mb, vpp):
    s = build_schedule(name, pp, mb, vpp)
    text = to_torch_csv(s, align_steps=True)
    _same(from_torch_csv(text), s)
    rows = list(csv.reader(io.StringIO(text)))
    for row, steps in zip(rows, dry_run(s).steps):
        assert {t: str(op) for op, t in steps} == {t: c for t, c in enumerate(row) if c}


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), st.integers(1, 6),
       st.integers(1, 4), st.integers(2, 4), st.booleans())
def test_round_trip_property(name, pp, groups, vpp, lowered):
    s = build_schedule(name, pp, pp * groups, vpp if name == "interleaved-1f1b" else 1)
    expected = add_p2p(s) if lowered else s
    _same(from_torch_csv(to_torch_csv(s, compute_only=not lowered)), expected)


def test_format_is_torchs_csv_writer_output():
    """torch: csv.writer(f).writerow(pipeline_order[rank]) per rank; None -> empty cell."""
    s = build_schedule("1f1b", 2, 2)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["0F0", "0F1", None, "0B0", None, "0B1"])  # what torch would dump
    writer.writerow([None, "1F0", "1B0", "1F1", "1B1"])
    assert buffer.getvalue() == "0F0,0F1,,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n"
    assert to_torch_csv(s) == "0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n"
    _same(from_torch_csv(buffer.getvalue()), s)


def test_lowered_cells_use_torch_action_names():
    text = to_torch_csv(build_schedule("gpipe", 2, 1), compute_only=False)
    assert text == "0F0,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n"


def test_compute_only_export_drops_p2p_and_non_torch_ops():
    s = add_p2p(build_schedule("1f1b", 2, 2))
    programs = [p + [Op(OpKind.ALL_REDUCE, r, None, group="dp"), Op(OpKind.OPT_STEP, r)]
                for r, p in enumerate(s.programs)]
    with_extras = s.with_programs(programs)
    assert to_torch_csv(with_extras) == to_torch_csv(build_schedule("1f1b", 2, 2))
    assert "ALL_REDUCE" not in to_torch_csv(with_extras, compute_only=False)


def test_align_steps_needs_compute_only():
    with pytest.raises(ConfigError, match="compute_only"):
        to_torch_csv(build_schedule("1f1b", 2, 2), compute_only=False, align_steps=True)


def test_file_round_trip(tmp_path):
    s = build_schedule("interleaved-1f1b", 2, 4, 2)
    path = tmp_path / "my_sched.csv"
    write_torch_csv(s, path)
    assert path.read_bytes() == to_torch_csv(s).encode()
    assert b"\r\n" in path.read_bytes()
    back = read_torch_csv(path)
    assert back.name == "my_sched"
    _same(back, s)
    assert read_torch_csv(path, name="x").name == "x"


def test_reads_torch_extras():
    """Whitespace around cells and empty cells (torch: None); UNSHARD/RESHARD/REDUCE_GRAD
    skipped; OVERLAP_F_B expanded into its sub-actions."""
    text = ("0UNSHARD, 0F0 ,0F1,,(0F2;0B0)OVERLAP_F_B,0B1,0B2,0REDUCE_GRAD,0RESHARD\n"
            "1F0,1B0,\"  \",1F1,1B1,1F2,1B2\n")
    s = from_torch_csv(text)
    assert [str(op) for op in s.programs[0]] == ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"]
    assert s.num_stages == 2 and s.num_microbatches == 3 and s.stage_ranks == (0, 1)
    validate(s)


def test_explicit_stage_ranks_and_microbatches():
    # V-shape: rank 0 holds stages 0 and 3, rank 1 holds 1 and 2 (stages 1, 2 share a rank)
    text = "0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n"
    s = from_torch_csv(text, stage_ranks=(0, 1, 1, 0), num_microbatches=1, name="v")
    assert s.stage_ranks == (0, 1, 1, 0) and s.name == "v"
    assert from_torch_csv(text).stage_ranks == (0, 1, 1, 0)
    assert validate(s).makespan == 8
    partial = from_torch_csv("0F0,0B0\n", num_microbatches=4)
    assert partial.num_microbatches == 4


ERRORS = [
    ("", None, None, "empty"),
    ("\r\n\n", None, None, "empty"),
    ("0UNSHARD,0RESHARD\n", None, None, "no F/B/I/W"),
    ("0F0,0X1\n", 1, 2, "not a torch action"),
    ("0F0\n1F0,0F1\n", 2, 2, "stage 0 is on two ranks"),
    ("0F0,0F 1\n", 1, 2, "whitespace inside"),
    ("0F0\n1F0,\t1F1 1B1\n", 2, 2, "whitespace inside"),
    ("0F0junk\n", 1, 1, "not a torch action"),
    ("0F\n", 1, 1, "needs a microbatch"),
    ("0ALL_REDUCE0\n", 1, 1, "not a torch action"),
    ("1F0\n", None, None, "stage 0 appears in no row"),
]


@pytest.mark.parametrize("text,row,col,rule", ERRORS)
def test_bad_input_names_row_column_and_rule(text, row, col, rule):
    with pytest.raises(ScheduleFormatError, match=rule) as info:
        from_torch_csv(text)
    message = str(info.value)
    assert "rule" in message
    if row is not None:
        assert f"row {row} (rank {row - 1}), column {col}" in message


@pytest.mark.parametrize("kwargs,row,col,rule", [
    ({"num_microbatches": 1}, 1, 2, "microbatch 1 out of range"),
    ({"stage_ranks": (1, 0)}, 1, 1, "stage 0 is on rank 1 by stage_ranks"),
    ({"stage_ranks": (0,)}, 2, 1, "stage 1 out of range"),
])
def test_inconsistent_arguments_name_the_cell(kwargs, row, col, rule):
    with pytest.raises(ScheduleFormatError, match=rule) as info:
        from_torch_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", **kwargs)
    assert f"row {row} (rank {row - 1}), column {col}" in str(info.value)


def test_stage_ranks_naming_missing_row():
    with pytest.raises(ScheduleFormatError, match="rank 2"):
        from_torch_csv("0F0,0B0\n1F0,1B0\n", stage_ranks=(0, 2))


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0Z0\n")
    with pytest.raises(ScheduleFormatError, match=r"bad\.csv.*row 1 \(rank 0\), column 2"):
        read_torch_csv(path)
