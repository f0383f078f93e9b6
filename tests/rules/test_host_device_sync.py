"""`host-device-sync`: the host waits for the GPU inside the step. Waits that cost nothing
(the GPU stays busy through them) are clear, waits that leave it idle count, and the sync=off
replay is paced by the GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.fixes import Change
from stallscope.diagnose.held import Held, held_waits
from stallscope.diagnose.rules.host_device_sync import (
    SPEC,
    SyncEvidence,
    host_device_sync,
    judge,
)
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
    """The host's waits still replay (sync=off takes the step toward the busiest GPU's work,
    never below it), but the exposed all-to-all, which no replayed change removes, bounds a
    larger saving and leads the report."""
    report = report_of(real_trace(RANK3OF8))
    assert report.top_finding is not None and report.top_finding.id == "comm-bound"
    sync = next(f for f in report.findings if f.id == "host-device-sync")
    assert sync.predicted_step_us is not None
    assert report.plan["floor_us"] <= sync.predicted_step_us < report.plan["baseline_step_us"]


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


QUEUE_LEN = "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"


def test_queue_len_names_the_cross_stream_wait_with_its_size():
    # Each step the host blocks ~147 ms in a 704-byte .cpu() whose stream (27) waits on the
    # compute stream (7): stream 7's kernels, an AllReduce on stream 84, and ~87 ms in which
    # the GPU runs nothing though work is queued (HTA: idle, "other"). The host not waiting
    # changes nothing (the work still runs as late), so sync=off is not the fix: the finding
    # says what the wait is on, sized, and is not replayed as a 0% change.
    report = report_of(real_trace(QUEUE_LEN))
    (sync,) = findings(report, "host-device-sync")
    ev = sync.evidence
    assert ev["wait_cause"] == "held"
    assert 130 <= ev["held_ms_per_step"] <= ev["blocked_ms_per_step"]
    assert 60 <= ev["held_share_pct"] <= ev["sync_share_pct"]
    assert ev["awaited_streams"] == ["27"]
    behind = {b["stream"]: b for b in ev["held_behind"]}
    assert behind["7"]["kind"] == "compute" and behind["7"]["ms_per_step"] > 20
    assert behind["84"]["kind"] == "collective" and behind["84"]["op"] == "AllReduce"
    parts = ev["held_breakdown_ms_per_step"]
    assert parts["gpu_idle_work_queued"] > 50
    assert sum(parts.values()) == pytest.approx(ev["blocked_ms_per_step"], rel=0.05)
    assert "held behind other streams" in sync.title
    assert "stream 84 (collective AllReduce)" in sync.recommendation
    assert "(sync=off) does not shorten the step" in sync.recommendation
    assert sync.saving_kind == "upper_bound" and sync.predicted_step_us is None
    # the bound is the held time the GPU ran nothing, never past the idle of the step
    assert 30 <= sync.estimated_saving_pct <= ev["costly_wait_share_pct"]
    plan = report.traces[0]["plan"]
    assert "held" in plan["not_replayed"]["host-device-sync"]


def test_waits_behind_a_busy_gpu_keep_sync_off_and_say_what_held_them():
    # rank 3 of 8: the waits' stream (20) queues behind stream 7's embedding backward and an
    # all-to-all, but the GPU is busy through them: the cost is the host's lost lead, which
    # sync=off wins back (replayed), and the text names what the stream waited behind.
    a = host_device_sync(_model(RANK3OF8))
    ev = a.finding.evidence
    assert ev["wait_cause"] == "own-queue"
    assert ev["held_breakdown_ms_per_step"]["gpu_idle_work_queued"] < 1.0
    assert "stream 21 (collective AllToAll)" in a.finding.recommendation
    assert Change("sync", "off") in SPEC.changes_for(a.finding, _model(RANK3OF8))


def _gpu(*ops: tuple[str, int, float, float, float]) -> pd.DataFrame:
    """A GPU table of (name, stream, launch, start, end) ops on device 0."""
    return pd.DataFrame({
        "kind": ["memcpy" if n.startswith("Memcpy") else "kernel" for n, *_ in ops],
        "device": ["0"] * len(ops), "name": [o[0] for o in ops],
        "stream": [float(o[1]) for o in ops], "launch_ts": [o[2] for o in ops],
        "ts": [o[3] for o in ops], "end": [o[4] for o in ops],
    })


def _held(gpu: pd.DataFrame, w0: float, w1: float) -> Held:
    return held_waits(gpu, np.array([w0]), np.array([w1]), np.array(["0"], dtype=object),
                      np.array([3.0]))


def test_a_held_wait_is_split_by_what_the_gpu_ran():
    # The host waits [0, 72) for a copy on stream 3 queued behind kernel C, which waits for
    # stream 1: stream 1 computes [0, 30) and [60, 70), an all-reduce runs on stream 2
    # [30, 45), then nothing runs [45, 60) while stream 1's next kernel is queued; C runs
    # [70, 72) (stream 3's own queue), then the copy.
    gpu = _gpu(("gemm", 1, -10, 0, 30), ("ncclKernel_AllReduce_Sum_f32", 2, -8, 30, 45),
               ("gemm", 1, -5, 60, 70), ("permute", 3, -1, 70, 72),
               ("Memcpy DtoH (Device -> Pageable)", 3, 0, 72, 73))
    h = _held(gpu, 0, 72)
    assert (h.own_us, h.collective_us, h.compute_us, h.idle_queued_us, h.idle_us) == (
        2, 15, 40, 15, 0)
    assert h.streams == ("3",)
    assert [(b.stream, b.kind, b.op) for b in h.behind] == [
        ("1", "compute", "gemm"), ("2", "collective", "AllReduce")]
    # Stream 1's second kernel launched only at 50: before it, nothing was queued anywhere.
    late = _held(gpu.assign(launch_ts=[-10, -8, 50, -1, 0]), 0, 72)
    assert (late.idle_queued_us, late.idle_us) == (10, 5)


def test_a_wait_on_its_own_running_queue_is_not_held():
    # Stream 3 runs its own queued kernel through the wait: the classic sync.
    h = _held(_gpu(("gemm", 3, -1, 0, 70), ("Memcpy DtoH (Device -> Pageable)", 3, 0, 70, 71),
                   ("gemm", 1, -1, 0, 50)), 0, 70)
    assert h.own_us == 70 and h.held_us == 0 and h.behind == ()
    # A copy with nothing queued ahead of it on an idle stream is not held either (a pageable
    # copy's staging): its own op, launched by the waiting call, does not count as queued.
    h = _held(_gpu(("Memcpy HtoD (Pageable -> Device)", 3, 0, 40, 45)), 0, 40)
    assert h.own_us == 40 and h.held_us == 0


def _evidence(held: Held, costly: float) -> SyncEvidence:
    return SyncEvidence("training", 1, 100.0, 50.0, 30.0,
                        cost={"waits": 50.0, "idle_during": costly, "idle_after": 0.0,
                              "costly": costly}, held=held)


def test_judge_holds_a_wait_whose_cost_is_gpu_idle_behind_other_streams():
    held = Held(5.0, 10.0, 5.0, 30.0, 0.0, ("3",), ())
    v = judge(_evidence(held, 40.0))
    assert (v.outcome, v.cause, v.saving_pct) == ("finding", "held", 30.0)
    # the same waits, the GPU busy through the holds: the host's own cost, sync=off's
    busy = Held(5.0, 10.0, 35.0, 0.0, 0.0, ("3",), ())
    v = judge(_evidence(busy, 20.0))
    assert (v.outcome, v.cause, v.saving_pct) == ("finding", "own-queue", 20.0)
    assert judge(_evidence(busy, 4.0)).outcome == "gpu-busy"
