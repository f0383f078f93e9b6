"""`device-memory`: the GPU's memory near capacity (out-of-memory risk: retries, OOMs, a peak
near capacity, reserved far above allocated) or far from it while the GPU waits (the batch that
fits, from what is held across steps against the step's transient peak).

judge() on synthetic figures; the rule on committed traces with profile_memory events."""

from __future__ import annotations

from dataclasses import replace

from stallscope.diagnose.device_memory import FROM_EVENTS, FROM_RUN, DeviceMemory
from stallscope.diagnose.rules.device_memory import (
    HEADROOM,
    OOM_RISK,
    MemoryEvidence,
    advise,
    device_memory,
    fit_factor,
    judge,
    predicted_peak,
)
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES

GB = 1 << 30
BASE = DeviceMemory(device="cuda:0", source=FROM_RUN, relative=False, peak_allocated=20 * GB,
                    peak_reserved=22 * GB, capacity=80 * GB, held=8 * GB, retries=0, ooms=0,
                    inactive_split=0, samples=10)


def _e(busy: float | None = 50.0, batch: int | None = 32, **device: object) -> MemoryEvidence:
    return MemoryEvidence(replace(BASE, **device), busy, batch)  # type: ignore[arg-type]


def test_a_peak_near_capacity_is_an_out_of_memory_risk():
    j = judge(_e(peak_allocated=70 * GB, peak_reserved=75 * GB))
    assert j.found and j.cause == OOM_RISK and not j.fragmented


def test_retries_are_a_risk_however_low_the_peak_and_medium_severity():
    e = _e(retries=3)
    j = judge(e)
    assert j.found and j.cause == OOM_RISK
    f = advise(e, j)
    assert f.severity == "medium" and "retried 3 times" in f.title
    assert "expandable_segments:True" in f.recommendation
    assert "accumulate gradients" in f.recommendation


def test_reserved_far_above_allocated_near_capacity_advises_expandable_segments():
    e = _e(peak_allocated=50 * GB, peak_reserved=74 * GB)
    j = judge(e)
    assert j.cause == OOM_RISK and j.fragmented
    f = advise(e, j)
    assert "expandable_segments" in f.recommendation and f.severity == "low"
    assert "activation checkpointing" in f.recommendation  # transient 42 of 50 GB


def test_room_and_a_waiting_gpu_give_the_batch_that_fits_with_the_lr_caveat():
    e = _e(busy=40.0)
    j = judge(e)
    assert j.found and j.cause == HEADROOM
    # (0.9 * 80 - 8 - 2 cached) / 12 = 5.2 times the batch
    assert j.fit_factor == 5.2 and fit_factor(e.device) == 5.2
    f = advise(e, j)
    assert "A batch of up to 160 (now 32)" in f.recommendation
    assert "learning rate follows the batch" in f.recommendation
    assert f.evidence["predicted_peak_mb"] == (8 + 5 * 12) * 1024
    assert f.severity == "info" and f.estimated_saving_pct == 0.0


def test_a_busy_gpu_or_a_full_one_has_no_headroom_finding():
    assert not judge(_e(busy=95.0)).found
    assert not judge(_e(peak_allocated=40 * GB, peak_reserved=45 * GB, busy=30.0)).found
    assert not judge(_e(busy=None)).found  # no step time to judge the GPU's use by


def test_the_predicted_peak_is_held_plus_the_transient_times_the_factor():
    assert predicted_peak(BASE, 2) == 8 * GB + 2 * 12 * GB
    assert predicted_peak(replace(BASE, relative=True, source=FROM_EVENTS), 2) is None


def test_the_v100_trace_has_room_for_a_larger_batch():
    model = build_model(load_trace(
        SAMPLES / "public" / "hta" / "v100_rank1of2_df_index_resolver.pt.trace.json.gz"))
    a = device_memory(model)
    assert a.status == "finding"
    f = a.finding
    assert f.evidence["capacity_mb"] == round(34089730048 / (1 << 20))
    assert f.evidence["cause"] == HEADROOM and f.evidence["batch_fit_factor"] >= 2
    assert "learning rate" in f.recommendation


def test_a_kineto_trace_of_sizes_only_is_not_assessed_and_says_why():
    model = build_model(load_trace(
        SAMPLES / "public" / "kineto"
        / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"))
    a = device_memory(model)
    assert a.status == "not_assessed" and "not the device's total" in a.detail
