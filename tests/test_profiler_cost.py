"""The report says what the profiler cost the recorded steps, from the steps `run` skipped
(timed without it): on the real H200 recordings the replay, which starts from the recorded
steps, predicted no gain from bf16 (plain runs measured 17-23% faster) because the profiler
had made the step host-bound."""

from __future__ import annotations

from stallscope.report.build import profiler_cost_note

# `stallscope run` on the H200, sample_traces/gpu_workload.py --num-workers 8 (session r2): the
# 24 skipped steps, ms, as report.json's run.unprofiled_steps_us held them; recorded median 21.8.
W8_SKIPPED = [18.7, 15.3, 12.2, 11.4, 11.3, 11.5, 12.4, 16.1, 26.9, 16.7, 15.8, 15.7, 16.1, 15.8,
              15.9, 16.9, 16.7, 17.1, 20.3, 17.3, 17.1, 17.4, 17.2, 17.0]
# The same with 0 workers (loader-bound, the profiler's cost small beside the loader's wait).
W0_SKIPPED = [108.9, 100.8, 93.2, 67.3, 67.5, 68.4, 68.9, 68.5, 68.5, 67.5, 68.1, 66.9, 68.2,
              67.7, 67.6, 68.8, 67.8, 83.0, 151.7, 76.3, 69.3, 68.0, 73.6, 69.8]


def us(ms: list[float]) -> list[float]:
    return [1000.0 * v for v in ms]


def test_a_host_bound_recording_is_told_what_the_profiler_cost() -> None:
    note = profiler_cost_note(us(W8_SKIPPED), 21_840.4)
    assert note is not None
    assert "28% above" in note and "last 12 steps" in note and "(17.1 ms, measured)" in note
    assert "can save more than predicted" in note


def test_a_small_difference_or_too_few_steps_says_nothing() -> None:
    assert profiler_cost_note(us(W0_SKIPPED), 74_103.9) is None  # 7%: within run-to-run noise
    assert profiler_cost_note(us(W8_SKIPPED[:6]), 21_840.4) is None  # 3 later steps: too few
    assert profiler_cost_note([], 21_840.4) is None
