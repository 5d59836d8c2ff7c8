"""Naive model parallelism against its closed forms: one microbatch at a time, so with
uniform F and B the iteration takes M * P * (F + B) and every rank idles (P-1)/P of it,
holding one microbatch; added through the registry alone (schedules/pipelines/naive.py)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate
from schedule_levels import in_flight
from test_cli import clustersim


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24))
def test_unit_makespan_is_m_times_2p_and_one_microbatch_is_held(pp, mb):
    s = build_schedule("naive", pp, mb)
    assert validate(s).makespan == mb * 2 * pp
    for program in s.programs:
        assert max(in_flight(program)) == 1


@pytest.mark.parametrize("pp, mb", [(4, 3), (2, 5)])
def test_simulated_with_uniform_costs(tmp_path, pp, mb):
    metrics = tmp_path / "m.json"
    clustersim("simulate", "--schedule", "naive", "--pp", str(pp), "--microbatches", str(mb),
               "--uniform-costs", "1,2", "--model", "llama3-8b", "--num-layers", "32",
               "-o", str(tmp_path / "g.html"), "--metrics-json", str(metrics))
    data = json.loads(metrics.read_text())
    assert data["iteration_time"] == mb * pp * (1 + 2)
    assert data["bubble_fraction"] == pytest.approx((pp - 1) / pp)
    assert set(data["per_rank"]["peak_in_flight_microbatches"].values()) == {1}
