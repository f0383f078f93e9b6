"""`watch`'s timeline carries memory: the step log gains the job's memory after each sweep of
the memory sampler, the series reads it, and report.json's `watch.memory` condenses it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from stallscope.capture import memory
from stallscope.capture.steplog import StepLog
from stallscope.wholerun.series import StepSeries
from stallscope.wholerun.summary import MEMORY_POINTS, memory_over_run, summarise


class Sampler:
    """The two attributes of capture/memory.py MemorySampler the step log reads."""

    def __init__(self) -> None:
        self.job_bytes: int | None = None
        self.job_sweeps = 0

    def swept(self, mb: float) -> None:
        self.job_bytes, self.job_sweeps = int(mb * (1 << 20)), self.job_sweeps + 1


def test_a_step_after_a_sweep_carries_the_jobs_memory_once(tmp_path: Path) -> None:
    sampler = Sampler()
    log = StepLog(tmp_path / "steps.jsonl")
    log.memory = sampler
    log.boundary(0.0, None, False)
    sampler.swept(400.0)
    log.boundary(0.0, 0, False)  # step 1: the sweep before it
    log.boundary(0.0, 0, False)  # step 2: no new sweep
    sampler.swept(512.5)
    log.boundary(0.0, 0, False)  # step 3
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [x.get("mem_mb") for x in lines] == [400.0, None, 512.5]
    series = StepSeries.from_jsonl(tmp_path / "steps.jsonl")
    assert series.mem_mb[0] == 400.0 and math.isnan(series.mem_mb[1])


def test_the_sampler_sums_the_training_process_resident_and_the_workers_own_memory() -> None:
    me = os.getpid()
    s = memory.MemorySampler(lambda: [("main", me, None, None)])
    s.sweep()
    rss = memory.rollup(me)
    assert rss is not None and s.job_sweeps == 1
    assert abs((s.job_bytes or 0) - rss["rss"]) < 64 << 20  # the same process, moments apart
    assert memory.job_bytes([("main", {"rss": 100}), ("worker", {"uss": 7, "rss": 90}),
                             ("worker", {"uss": 5})]) == 112
    assert memory.job_bytes([("worker", {"uss": 5})]) is None
    peak = s.snapshot()["processes"][0]["peak_rss_bytes"]
    assert peak is not None and peak >= rss["rss"] - (64 << 20)


def test_the_run_summary_keeps_first_peak_and_last_and_a_bounded_series() -> None:
    n = 5000
    mem = np.full(n, np.nan)
    mem[::2] = np.linspace(300.0, 500.0, n // 2)
    mem[3001] = 900.0  # one sample's peak survives the thinning
    series = StepSeries.from_records(
        [{"step": i + 1, "step_ms": 10.0, "mem_mb": None if np.isnan(m) else float(m)}
         for i, m in enumerate(mem)])
    got = memory_over_run(series)
    assert got is not None and got["samples"] == n // 2 + 1
    assert got["first_mb"] == 300.0 and got["first_step"] == 1
    assert got["peak_mb"] == 900.0 and got["peak_step"] == 3002
    assert got["last_mb"] == 500.0
    assert len(got["points"]) <= MEMORY_POINTS and [3002, 900.0] in got["points"]
    assert summarise(series)["memory"] == got


def test_a_log_without_memory_says_none() -> None:
    series = StepSeries.from_records([{"step": i, "step_ms": 5.0} for i in range(1, 50)])
    assert memory_over_run(series) is None and summarise(series)["memory"] is None
