"""`allocator-churn`: device memory freed and allocated again inside steady-state steps. The
real corpus has no steady-state churn, so the positive comes from
`sample_traces/make_synthetic.py`, generated afresh into a temporary folder."""

from __future__ import annotations

from stallscope.diagnose.rules.allocator_churn import allocator_churn
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import real_trace


def _real(name: str) -> TraceModel:
    return build_model(load_trace(real_trace(name)))


def test_empty_cache_churn_is_found(synthetic: dict[str, TraceModel]):
    a = allocator_churn(synthetic["allocator-churn"])
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["steady_state_steps"] == 3 and ev["steps_with_calls"] == 3
    assert ev["free_calls"] == 15 and ev["malloc_calls"] == 12
    assert "aten::linear > aten::empty" in ev["ops"]
    assert "empty_cache" in a.finding.recommendation
    assert "expandable_segments" in a.finding.snippet
    # Capped by the GPU's busy time: far below the 88% the calls take on the host.
    assert a.finding.estimated_saving_pct < ev["churn_share_pct"]


def test_growth_in_first_step_only_is_clear(synthetic: dict[str, TraceModel]):
    a = allocator_churn(synthetic["allocator-steady"])
    assert a.status == "clear"
    assert "first step" in a.detail


def test_whole_trace_window_is_not_assessed():
    a = allocator_churn(_real("hta/a100_alexnet_pageable_htod.pt.trace.json.gz"))
    assert a.status == "not_assessed"
    assert "24 malloc and 15 free" in a.detail


def test_real_steady_state_has_no_churn():
    a = allocator_churn(_real("hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz"))
    assert a.status == "clear"
