"""Host waits that cost nothing (host-device-sync) and communication on every backend
(comm-bound): gloo/CPU collectives, all-to-all advice, overlap savings capped by the compute
there is to hide under, and a sync=off prediction paced by the GPU."""

from __future__ import annotations

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.fixes import Change
from stallscope.diagnose.rules.comm_bound import comm_bound
from stallscope.diagnose.rules.host_device_sync import host_device_sync
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace, report_of

RANK3OF8 = "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz"
V100_TEST = "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz"
GLOO300 = "hta/cpu_only_rank34of300_gloo.pt.trace.json.gz"
RANK0OF128 = "hta/rank0of128_sampled.pt.trace.json.gz"


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
    # step); sync=off takes about 10.6 ms off that, down to the busiest GPU's 60.7 ms of work
    # per step (the floor), never below it
    assert report.plan["floor_us"] <= entry["predicted_step_us"] < 65_000
    assert entry["predicted_step_us"] == pytest.approx(60_700, rel=0.01)


def test_gloo_all_reduce_on_cpu_is_assessed_with_gloo_advice() -> None:
    # rank 34 of 300: gloo:all_reduce ranges cover 85% of the only step; no compute beside them.
    a = comm_bound(_model(GLOO300))
    assert a.status == "finding"
    f = a.finding
    assert f.evidence["backend"] == "gloo" and f.evidence["where"] == "host"
    assert f.evidence["exposed_share_pct"] > 80
    for said in ("no_sync()", "bucket_cap_mb", "fp16", "GLOO_SOCKET_IFNAME"):
        assert said in f.recommendation + f.snippet, said
    # Nothing to overlap with: the bound is what halving the bytes can give, not the overlap.
    assert f.evidence["hideable_share_pct"] == 0.0
    assert f.estimated_saving_pct == pytest.approx(f.evidence["exposed_share_pct"] / 2, abs=0.02)


@pytest.mark.parametrize("rank", [0, 1])
def test_recorded_two_process_gloo_ddp_job_is_comm_bound(rank: int) -> None:
    model = build_model(load_trace(SAMPLES / f"cpu-gloo-ddp-rank{rank}.pt.trace.json.gz"))
    assert model.trace.world_size == 2 and not model.has_gpu
    a = comm_bound(model)
    assert a.status == "finding"
    ev = a.finding.evidence
    assert (ev["backend"], ev["pattern"], ev["top_collectives"][0]["collective"]) == (
        "gloo", "all-reduce", "all_reduce")
    assert 0 < ev["overlap_pct"] < 100  # DDP starts buckets during backward: part is hidden
    assert a.finding.estimated_saving_pct <= ev["exposed_share_pct"]


def test_all_to_all_gets_its_own_advice_not_ddp_buckets() -> None:
    # rank 0 of 128 (TorchRec: nccl:all_to_all, KJTAllToAll): the exposed kernels are NCCL
    # SendRecv, which is how NCCL runs all-to-all.
    f = comm_bound(_model(RANK0OF128)).finding
    assert f.evidence["pattern"] == "all-to-all"
    assert f.evidence["top_collectives"][0]["collective"] == "AllToAll"
    assert "TrainPipelineSparseDist" in f.recommendation + f.snippet
    assert "bucket_cap_mb" not in f.snippet


def test_overlap_saving_never_exceeds_the_compute_to_hide_under() -> None:
    # rank 0 of 128: 27.4% of the step is exposed all-to-all but the device runs compute
    # kernels only 17.1% of it: overlap cannot hide more than that.
    f = comm_bound(_model(RANK0OF128)).finding
    ev = f.evidence
    assert ev["hideable_share_pct"] < ev["exposed_share_pct"]
    assert f.estimated_saving_pct == ev["hideable_share_pct"]
    total_ms = ev["exposed_ms_per_step"] / ev["exposed_share_pct"] * 100
    assert f.estimated_saving_pct <= 100 * ev["compute_ms_per_step"] / total_ms + 0.01
    report = report_of(real_trace(RANK0OF128))
    (comm,) = [x for x in report.findings if x.id == "comm-bound"]
    assert comm.saving_kind == "upper_bound" and comm.estimated_saving_pct <= 17.2
