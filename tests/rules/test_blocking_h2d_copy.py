"""`blocking-h2d-copy`: the host blocks for host-to-device copies that could overlap. The real
corpus has no pinned copy that blocks the host, so the positive comes from
`sample_traces/make_synthetic.py`, generated afresh into a temporary folder (the same bytes as
the committed `sample_traces/synthetic-*` files)."""

from __future__ import annotations

import pytest

from stallscope.diagnose.rules.blocking_h2d_copy import blocking_h2d_copy
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import real_trace


def _real(name: str) -> TraceModel:
    return build_model(load_trace(real_trace(name)))


def test_blocking_pinned_copy_is_found(synthetic: dict[str, TraceModel]):
    a = blocking_h2d_copy(synthetic["blocking-h2d"])
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["source_memory"] == ["Pinned"]
    assert ev["blocked_by"] == ["cudaStreamSynchronize"]
    assert ev["blocked_ms_per_step"] == pytest.approx(2.288, abs=0.01)
    assert "non_blocking=True" in a.finding.snippet
    assert 5 <= a.finding.estimated_saving_pct <= 15


def test_non_blocking_pinned_copy_is_clear(synthetic: dict[str, TraceModel]):
    assert blocking_h2d_copy(synthetic["allocator-steady"]).status == "clear"


@pytest.mark.parametrize("name", [
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz",
    "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz",
    "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz",
    "hta/rank1of128_sampled.pt.trace.json.gz",
])
def test_real_pinned_copies_did_not_block(name: str):
    assert blocking_h2d_copy(_real(name)).status == "clear"


def test_pageable_copies_are_left_to_pageable_rule():
    a = blocking_h2d_copy(
        _real("kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"))
    assert a.status == "clear"
    assert "pageable-h2d-copy" in a.detail
