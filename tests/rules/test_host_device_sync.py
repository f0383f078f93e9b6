"""`host-device-sync`: the host waits for the GPU inside the step. Waits that cost nothing
(the GPU stays busy through them) are clear, waits that leave it idle count, and the sync=off
replay is paced by the GPU."""

from __future__ import annotations

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.fixes import Change
from stallscope.diagnose.rules.host_device_sync import host_device_sync
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import real_trace, report_of

RANK3OF8 = "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz"
V100_TEST = "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz"


def _model(relative: str):
    return build_model(load_trace(real_trace(relative)))


def test_waits_under_a_gpu_busy_through_and_after_them_are_clear() -> None:
    # v100 rank 1 of 2: the host waits 43% of the step, but the GPU is idle 2.5% of those
    # waits and 3.7% of the step: a host that did not wait would only queue further ahead.
    a = host_device_sync(_model(V100_TEST))
    assert a.status == "clear"
    assert "stays busy" in a.detail and "43.0%" in a.detail


def test_waits_that_leave_the_gpu_idle_afterwards_still_count() -> None:
    # rank 3 of 8: the GPU is busy through the waits (1% idle) but then idles ~12 ms per step
    # while the host, which lost its lead, re-fills the queue; the replay without the syncs
    # predicts a 15% shorter step, so the finding stays, with that evidence.
    a = host_device_sync(_model(RANK3OF8))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["gpu_idle_during_waits_pct"] < 2.0
    assert ev["gpu_idle_after_waits_ms_per_step"] > 10.0
    assert 10.0 < ev["costly_wait_share_pct"] <= ev["sync_share_pct"]


def test_sync_off_cannot_beat_a_busy_gpu_in_the_replay() -> None:
    # Without its waits the host runs ahead of a busy GPU: its own steps shrink but the queue
    # grows every step. The step a user measures is the GPU's (was predicted 122 -> 72 ms).
    report = analyze_paths([real_trace(V100_TEST)], what_if=[Change("sync", "off")])
    assert report.what_if["predicted_step_us"] > 0.95 * report.what_if["measured_step_us"]
    assert "sync=off" not in report.verdict


def test_sync_off_still_predicts_the_lost_lead_on_rank3of8() -> None:
    report = report_of(real_trace(RANK3OF8))
    assert "sync=off" in report.verdict
    entry = report.plan_entry(report.top_finding)
    # measured 76.9 ms; 71.3 ms without the profiler's assumed cost (6,786 recorded ops per
    # step); sync=off takes about 5.3 ms off that, down to the busiest GPU's 66.0 ms of work
    # per step as recorded (the floor), never below it: the streams overlap no more than they
    # did (it read 60.7 ms when the replay let them)
    assert report.plan["floor_us"] <= entry["predicted_step_us"] < 71_000
    assert entry["predicted_step_us"] == pytest.approx(66_000, rel=0.01)


def findings(report, rule: str) -> list:
    return [f for f in report.findings if f.id == rule]


def test_queue_wait_in_memcpy_is_sync_not_a_slow_copy():
    report = report_of(real_trace("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"))
    (sync,) = findings(report, "host-device-sync")
    top = sync.evidence["sources"][0]
    assert top["call"] == "cudaMemcpyAsync DtoH"
    assert 140 <= top["max_ms"] <= 150  # the ~147 ms calls
    assert top["bytes_max"] == 704
    assert top["gpu_copy_us_max"] < 20
    assert "not a slow transfer" in sync.recommendation
    assert not findings(report, "pageable-h2d-copy")
