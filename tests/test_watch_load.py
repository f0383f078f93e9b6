"""`watch`'s other-load sampler: the step log gains the cores other processes held and the probe's
CPU time after each sweep, the series holds each sweep's figures over the steps after it, and
the sampler counts the job's own processes as the job's (tests/test_watch_regimes.py judges
stretches on these figures)."""

from __future__ import annotations

import json
import math
import os
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from stallscope.capture import hostload, loadsampler
from stallscope.capture.loadsampler import LoadSampler
from stallscope.capture.steplog import StepLog
from stallscope.wholerun.series import StepSeries


class Swept:
    """The three attributes of LoadSampler the step log reads."""

    def __init__(self) -> None:
        self.sweeps = 0
        self.others_cores = self.probe_us = math.nan

    def swept(self, others: float, probe: float) -> None:
        self.sweeps += 1
        self.others_cores, self.probe_us = others, probe


def test_a_step_after_a_sweep_carries_the_other_load_once_and_the_series_holds_it(
        tmp_path: Path) -> None:
    load = Swept()
    log = StepLog(tmp_path / "steps.jsonl")
    log.load = load
    log.boundary(0.0, None, False)
    load.swept(1.25, 180.0)
    log.boundary(0.0, 0, False)  # step 1: the sweep before it
    log.boundary(0.0, 0, False)  # step 2: no new sweep
    load.swept(math.nan, 190.5)  # others not measured at this sweep
    log.boundary(0.0, 0, False)  # step 3
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [x.get("others_cores") for x in lines] == [1.25, None, None]
    assert [x.get("probe_us") for x in lines] == [180.0, None, 190.5]
    assert log.last_probe_us == 190.5  # what the live trigger is handed, held
    series = StepSeries.from_jsonl(tmp_path / "steps.jsonl")
    assert series.others_cores[0] == 1.25 and math.isnan(series.others_cores[1])
    np.testing.assert_array_equal(series.held("probe_us"), [180.0, 180.0, 190.5])
    np.testing.assert_array_equal(series.held("others_cores"), [1.25, 1.25, 1.25])


def test_held_is_unknown_before_the_first_sweep() -> None:
    s = StepSeries.from_records([{"step": i + 1, "step_ms": 5.0,
                                  "probe_us": 200.0 if i == 2 else None} for i in range(4)])
    held = s.held("probe_us")
    assert np.isnan(held[:2]).all() and held[2:].tolist() == [200.0, 200.0]


def test_the_sampler_measures_the_probe_and_the_others_while_the_run_goes() -> None:
    sampler = LoadSampler(lambda: [("main", os.getpid(), None, None)])
    sampler.start()
    try:
        deadline = time.monotonic() + 10
        while sampler.sweeps < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    assert sampler.sweeps >= 2
    assert sampler.probe_us > 0
    assert 0 <= sampler.others_cores <= (os.cpu_count() or 1)


CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait steal")


def test_the_jobs_own_workers_are_not_other_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cores busy for 1.5 s of a 1 s sweep interval (two cores), of which the training
    process took 0.5 s and a listed worker 0.7 s: others held 0.3 cores. The same busy time
    with the worker unlisted: 1.0 core."""
    clock = {"wall": 100.0, "busy": 0.0, "main": 0.0, "worker": 0.0}

    def per_cpu(percpu: bool = True) -> list[CpuTimes]:
        half = clock["busy"] / 2
        return [CpuTimes(half, 0.0, 0.0, 50.0, 0.0, 0.0)] * 2

    class Proc:
        def __init__(self, pid: int | None = None) -> None:
            self.pid = os.getpid() if pid is None else pid

        def cpu_affinity(self) -> list[int]:
            return [0, 1]

        def nice(self) -> int:
            return 0

    monkeypatch.setattr(loadsampler.psutil, "cpu_times", per_cpu)
    monkeypatch.setattr(loadsampler.psutil, "Process", Proc)
    monkeypatch.setattr(loadsampler, "_several_local_processes", lambda: False)
    monkeypatch.setattr(loadsampler.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(hostload, "process_cpu", lambda p: clock[
        "main" if p.pid == os.getpid() else "worker"])

    def interval(listed: bool) -> float:
        sampler = LoadSampler(lambda: [("main", os.getpid(), None, None)] + (
            [("worker", 4242, "train.py:9", 0)] if listed else []))
        sampler.sweep()
        for k, v in (("wall", 1.0), ("busy", 1.5), ("main", 0.5), ("worker", 0.7)):
            clock[k] += v
        sampler.sweep()
        return sampler.others_cores

    assert interval(listed=True) == pytest.approx(0.3)
    assert interval(listed=False) == pytest.approx(1.0)
