"""`pageable-h2d-copy`: host-to-device copies from pageable memory, on real traces
(sample_traces/public, committed)."""

from __future__ import annotations

from stallscope.diagnose.registry import changes_for
from stallscope.diagnose.rules.pageable_h2d_copy import pageable_h2d_copy
from stallscope.diagnose.spec import Change
from tests.conftest import real_trace, report_of
from tests.rules.builders import real


def findings(report, rule: str) -> list:
    return [f for f in report.findings if f.id == rule]


def test_alexnet_pageable_htod_is_start_up_not_a_step_cost():
    report = report_of(real_trace("hta/a100_alexnet_pageable_htod.pt.trace.json.gz"))
    # README: 150 MB at ~4.3 GB/s, but every copy is a one-off upload before the first forward
    # (the measured forward copies nothing): start-up, said as such, not a step's bottleneck.
    assert not findings(report, "pageable-h2d-copy")
    (trace,) = report.traces
    what = trace["startup"]["what"]
    assert "16 host-to-device copies from pageable memory" in what
    assert "at 4." in what and "GB/s" in what
    # The trace has no ProfilerStep markers: the report must say how it coped.
    assert any("No ProfilerStep" in n for n in report.notes)


NW4 = "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"


def test_resnet50_batches_copied_from_pageable_memory_are_a_finding():
    # The V100 ResNet50 job with 4 workers copies its 19.3 MB batch from pageable memory each
    # step, at 6.7 GB/s: pinning it is the change, with non_blocking after it.
    a = pageable_h2d_copy(real(NW4))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["bytes_per_step"] > 19_000_000 and 6.0 < ev["achieved_gbps"] < 7.5
    assert "pin_memory=True" in a.finding.snippet
    assert changes_for(a.finding, real(NW4)) == [Change("pin_memory", "true"),
                                                  Change("non_blocking", "true")]


def test_copies_under_a_megabyte_per_step_are_clear():
    # rank 0 of 16 on A100: its pageable copies total 1.3 KiB per step (scalars, indices).
    a = pageable_h2d_copy(real("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"))
    assert a.status == "clear"
