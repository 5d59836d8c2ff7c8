"""The schedule registry: properties every registered schedule must have, drawn over its
allowed degrees (each family's closed forms are in its own test file)."""
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ops import OpKind
from clustersim.schedules.placement import stage_ranks
from clustersim.schedules.registry import (SCHEDULES, build_schedule, canonical_schedule_name,
                                           schedule_entry)
from clustersim.schedules.validate import validate

SETTINGS = settings(max_examples=60, deadline=None)
FIXED = {name: e for name, e in SCHEDULES.items() if not e.built_from_costs}
"""Schedules with an order of their own; the others are built per run from its simulated
costs (sim.auto_schedule, tests/test_auto_schedule_sim.py)."""


@st.composite
def configs(draw):
    """(entry, P, M, V) over P in 1..8, M in 1..24, V within the entry's rule (<= 4)."""
    entry = draw(st.sampled_from(list(FIXED.values())))
    pp = draw(st.integers(1, 8))
    vpp = draw(st.integers(entry.min_vpp, min(entry.max_vpp or 4, 4)))
    mb = draw(st.integers(1, 24).filter(lambda m: accepts(entry, pp, m, vpp)))
    return entry, pp, mb, vpp


def accepts(entry, pp, mb, vpp) -> bool:
    """Whether the entry's own rules (ScheduleEntry.check) take these degrees."""
    try:
        entry.check(pp, mb, vpp)
    except ConfigError:
        return False
    return True


@SETTINGS
@given(configs())
def test_every_forward_and_backward_once_on_its_rank_after_its_forward(config):
    entry, pp, mb, vpp = config
    s = entry.build(pp, mb, vpp)
    assert (s.name, s.num_ranks, s.num_stages, s.iteration_microbatches) == (
        entry.name, pp, pp * vpp, mb)
    mb = s.num_microbatches  # K * M for an asynchronous schedule (schedules.weight_stashing)
    assert mb == entry.simulated_microbatches(pp, s.iteration_microbatches)
    assert s.stage_ranks == stage_ranks(entry.placement, pp, pp * vpp)
    counts = Counter(op.key for op in s.ops())
    assert set(counts.values()) == {1}
    for stage in range(pp * vpp):  # the microbatches of its chain (DualPipe: its direction)
        assert set(s.stage_chains.microbatches_of(stage)) == {
            key[2] for key in counts if key[1] == stage}
        for m in s.stage_chains.microbatches_of(stage):
            assert (OpKind.F, stage, m) in counts
            split = {(OpKind.I, stage, m), (OpKind.W, stage, m)}
            assert ((OpKind.B, stage, m) in counts) != (split <= set(counts))
    for rank, program in enumerate(s.programs):
        position = {op.key: i for i, op in enumerate(program)}
        for op in program:
            assert op.kind.is_compute and s.stage_ranks[op.stage] == rank
            if op.kind in (OpKind.B, OpKind.I):
                assert position[(OpKind.F, op.stage, op.microbatch)] < position[op.key]
            if op.kind is OpKind.W:
                assert position[(OpKind.I, op.stage, op.microbatch)] < position[op.key]


@SETTINGS
@given(configs())
def test_every_schedule_runs_to_the_end_under_the_contract(config):
    entry, pp, mb, vpp = config
    validate(entry.build(pp, mb, vpp))  # DeadlockError with the stuck ops otherwise


@pytest.mark.parametrize("entry", FIXED.values(), ids=list(FIXED))
def test_every_alias_builds_the_same_schedule(entry):
    vpp = entry.default_vpp
    reference = entry.build(2, 4, vpp)
    for alias in (entry.name, *entry.aliases):
        for spelling in (alias, alias.upper(), f" {alias.replace('-', '_')} "):
            assert canonical_schedule_name(spelling) == entry.name
            assert build_schedule(spelling, 2, 4, vpp).programs == reference.programs


@pytest.mark.parametrize("entry", [e for e in SCHEDULES.values() if e.built_from_costs])
def test_a_schedule_built_from_costs_answers_to_its_aliases_and_has_no_fixed_order(entry):
    for alias in (entry.name, *entry.aliases):
        assert canonical_schedule_name(alias.upper()) == entry.name
    with pytest.raises(ConfigError, match="is built from a run's simulated costs"):
        entry.build(2, 4, entry.default_vpp)


def test_no_spelling_names_two_schedules():
    owners = Counter(a.lower().replace("_", "-") for e in SCHEDULES.values()
                     for a in (e.name, *e.aliases))
    assert set(owners.values()) == {1}


@pytest.mark.parametrize("entry", SCHEDULES.values(), ids=list(SCHEDULES))
def test_degrees_outside_the_rules_name_the_field(entry):
    for args, field in (((0, 4, entry.default_vpp), "pp"), ((2, 0, entry.default_vpp),
                                                            "microbatches")):
        with pytest.raises(ConfigError, match=field):
            entry.build(*args)
    with pytest.raises(ConfigError, match="vpp"):
        entry.build(2, 4, entry.min_vpp - 1 if entry.max_vpp is None else entry.max_vpp + 1)
    if entry.microbatch_rule is not None:
        refused = next(m for m in range(1, 64) if entry.microbatch_rule(4, m))
        with pytest.raises(ConfigError, match=f"got {refused}"):
            entry.build(4, refused, entry.default_vpp)


def test_unknown_name_lists_every_choice():
    with pytest.raises(ConfigError, match=", ".join(SCHEDULES)):
        schedule_entry("zbv-nope")


def test_every_name_torchs_get_schedule_class_accepts():
    """torch.distributed.pipelining's get_schedule_class (torch 2.13) maps these names,
    case-insensitively; the two runtime base classes run an order loaded from a CSV."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    names = ["1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
             "PipelineScheduleSingle", "PipelineScheduleMulti", "ZBVZeroBubble", "DualPipeV"]
    for name in names:
        schedules.get_schedule_class(name)  # still a name torch accepts
        for spelling in (name, name.lower(), name.upper()):
            if name.startswith("PipelineSchedule"):
                with pytest.raises(ConfigError, match="--schedule-csv PATH"):
                    schedule_entry(spelling)
            else:
                torch_class = schedules.get_schedule_class(spelling).__name__
                assert schedule_entry(spelling) is schedule_entry(torch_class)
