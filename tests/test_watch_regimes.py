"""Where `watch`'s whole-run analysis puts regime boundaries, and what it takes out first:
periodic stalls and one-off spikes (no regime), the start-up step (no periodic stall), and the
stretches the machine's load explains (labelled as load, no regime, no capture). Synthetic step
series shaped as the step logs of real runs (tests/test_watch_run.py runs the real ones)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from stallscope.capture.later import Trigger
from stallscope.capture.session import CaptureSession
from stallscope.wholerun import StepSeries, summarise


def series(step: np.ndarray, wait: np.ndarray, runq: np.ndarray | None = None,
           cpu: np.ndarray | None = None, others: np.ndarray | None = None,
           probe: np.ndarray | None = None, every: int = 10) -> dict[str, Any]:
    """The summary of a step log; `others` and `probe` (the other-load sampler's) are written
    on every `every`-th step only, as after each of its sweeps."""
    n = step.size
    recs = [{"step": i + 1, "step_ms": float(step[i]), "loader_wait_ms": float(wait[i]),
             "cpu_ms": None if cpu is None else float(cpu[i]),
             "runq_ms": None if runq is None else float(runq[i]),
             "others_cores": None if others is None or i % every else float(others[i]),
             "probe_us": None if probe is None or i % every else float(probe[i])}
            for i in range(n)]
    return summarise(StepSeries.from_records(recs))


def loader_turns_slow(seed: int, n: int = 400, at: int = 200, every: int = 75
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Steps of ~0.9 ms (wandering 0.3-1.5 ms, as sub-ms steps do) whose loader turns slow at
    step `at` (~35 ms, nearly all loader wait), a 0.3 s save every `every` steps, and a slow
    start-up step."""
    rng = np.random.default_rng(seed)
    fast = 0.9 * np.exp(rng.normal(0, 0.25, n)) * (1 + 0.5 * np.sin(np.arange(n) / 17))
    slow = 35.0 * np.exp(rng.normal(0, 0.01, n))
    step = np.where(np.arange(1, n + 1) >= at, slow, fast)
    wait = np.where(np.arange(1, n + 1) >= at, slow - 0.7, 0.2 * fast)
    step[np.arange(every - 1, n, every)] += 300.0
    step[0] += 40.0  # the start-up step: first batch, caches
    return step, wait


@pytest.mark.parametrize("seed", range(6))
def test_a_loader_that_turns_slow_is_one_boundary_at_the_change_and_the_save_a_period(
        seed: int) -> None:
    w = series(*loader_turns_slow(seed))
    starts = [r["first_step"] for r in w["regimes"]]
    assert len(starts) == 2 and abs(starts[1] - 200) <= 5, w["regimes"]
    assert w["regimes"][1]["change"].startswith("steps ")
    assert w["load"] == []
    periods = [p for p in w["periodic"] if p["kind"] == "periodic"]
    assert [p["every_steps"] for p in periods] == [75], w["periodic"]
    assert periods[0]["steps"] == [75, 150, 225, 300, 375]
    assert periods[0]["cost_ms"] > 5 * 290


def test_the_start_up_step_is_never_a_periodic_stall() -> None:
    # a stall every 50 steps from step 51, and a start-up step at step 1, one period before
    rng = np.random.default_rng(3)
    step = 10 * np.exp(rng.normal(0, 0.02, 300))
    step[np.arange(50, 300, 50)] += 200.0
    step[0] += 200.0
    w = series(step, np.zeros(300))
    periods = [p for p in w["periodic"] if p["kind"] == "periodic"]
    assert periods and 1 not in periods[0]["steps"], w["periodic"]
    assert periods[0]["every_steps"] == 50


def test_a_period_whose_stall_the_profiler_held_is_still_found() -> None:
    """Four saves measured and the fifth recorded under the profiler (`watch`'s periodic
    capture holds one): the slot it held is no miss."""
    rng = np.random.default_rng(0)
    n = 400
    step = np.where(np.arange(1, n + 1) >= 200, 36.0, 0.3) * np.exp(rng.normal(0, 0.05, n))
    step[np.arange(73, n, 75)] += 300.0
    step[rng.choice(n, 40, replace=False)] *= 1.8  # small spikes between the saves
    recs = [{"step": i + 1, "step_ms": float(step[i]), "profiled": 370 <= i + 1 <= 377}
            for i in range(n)]
    w = summarise(StepSeries.from_records(recs))
    periods = [p for p in w["periodic"] if p["kind"] == "periodic"]
    assert periods and periods[0]["every_steps"] == 75, (w["periodic"], w["outliers"])
    assert periods[0]["steps"][:4] == [74, 149, 224, 299]


def busy_run(seed: int, plateau: str) -> tuple[np.ndarray, ...]:
    """A steady 9 ms step (3 ms of it waiting for a core, 7.5 ms of CPU time) beside other
    processes, with a plateau from step 300 to 500 that the load explains: the thread waits
    for a core ("runq"), or intra-op threads spin (`spin`: CPU time 6x, the wait still a third
    of the step); "none": no plateau."""
    rng = np.random.default_rng(seed)
    n = 800
    jitter = np.exp(rng.normal(0, 0.08, n))
    step, runq, cpu = 9.0 * jitter, 3.0 * jitter, 7.5 * jitter
    inside = (np.arange(n) >= 300) & (np.arange(n) < 500)
    if plateau == "runq":
        step[inside], runq[inside], cpu[inside] = (60 * jitter[inside], 48 * jitter[inside],
                                                   30 * jitter[inside])
    elif plateau == "spin":
        step[inside], runq[inside], cpu[inside] = (24 * jitter[inside], 8 * jitter[inside],
                                                   45 * jitter[inside])
    return step, np.zeros(n), runq, cpu


@pytest.mark.parametrize("plateau", ["runq", "spin"])
@pytest.mark.parametrize("seed", range(3))
def test_a_plateau_the_machine_load_explains_is_load_not_a_regime(plateau: str,
                                                                    seed: int) -> None:
    w = series(*busy_run(seed, plateau))
    assert len(w["regimes"]) == 1, w["regimes"]
    assert w["regimes"][0]["load_steps"] == w["load"][0]["steps"]
    assert len(w["load"]) == 1 and abs(w["load"][0]["first_step"] - 301) <= 5, w["load"]
    assert abs(w["load"][0]["last_step"] - 500) <= 5
    assert "waited for a core" in w["load"][0]["why"]
    # the regime's figures are the quiet steps', not the plateau's
    assert w["regimes"][0]["median_step_ms"] == pytest.approx(9.0, rel=0.1)
    flagged = [s["step"] for s in w["steps"] if s["load"]]
    assert flagged[0] == w["load"][0]["first_step"] and len(flagged) == w["load"][0]["steps"]


@pytest.mark.parametrize("share", [1 / 3, 0.55])
def test_more_work_of_the_script_on_a_busy_machine_is_a_regime(share: float) -> None:
    """The step, the CPU time and the wait for a core all double from step 401: the script's
    own change, as busy as before, also where the process waits for a core over half of
    each step (a machine that gives it half a core: the extra work waits as much again)."""
    step, wait, runq, cpu = busy_run(1, "none")
    runq = share * step
    more = np.arange(step.size) >= 400
    step[more], runq[more], cpu[more] = 2 * step[more], 2 * runq[more], 2 * cpu[more]
    w = series(step, wait, runq, cpu)
    assert [r["first_step"] for r in w["regimes"]] == [1, 401], w["regimes"]
    assert w["load"] == []
    assert feed(step, runq, cpu) != []  # and the live trigger captures it


def test_without_a_run_queue_figure_nothing_is_called_load() -> None:
    step, wait, _, cpu = busy_run(0, "runq")
    w = series(step, wait, None, cpu)
    assert w["load"] == [] and len(w["regimes"]) == 3, w["regimes"]


def feed(step: np.ndarray, runq: np.ndarray, cpu: np.ndarray) -> list[int]:
    t = Trigger()
    return [i for i in range(step.size)
            if t.add(i + 1, float(step[i]), 0.0, float(runq[i]), float(cpu[i])) is not None]


@pytest.mark.parametrize("plateau", ["runq", "spin"])
def test_the_live_trigger_takes_no_capture_for_the_machine_load(plateau: str) -> None:
    step, _, runq, cpu = busy_run(0, plateau)
    assert feed(step, runq, cpu) == []
    assert feed(step, np.full(step.size, math.nan), cpu) != []  # unmeasured: a change


def test_the_session_knows_every_profiler_it_started() -> None:
    """A later capture's profiler starting is the session's own, never the script's (the
    false "The script starts its own torch.profiler" note)."""
    first, later = SimpleNamespace(profiler=object()), SimpleNamespace(profiler=object())
    session = SimpleNamespace(recorder=SimpleNamespace(prof=first),
                              watch=SimpleNamespace(started=lambda: [later]),
                              cost=SimpleNamespace(calibrating=False))
    for prof in (first, first.profiler, later, later.profiler):
        assert CaptureSession.owns(session, prof)  # type: ignore[arg-type]
    assert not CaptureSession.owns(session, SimpleNamespace(profiler=None))  # type: ignore[arg-type]
    # The profiler's per-op cost, measured after the recording, runs sessions of its own.
    session.cost.calibrating = True
    assert CaptureSession.owns(session, SimpleNamespace(profiler=None))  # type: ignore[arg-type]


def oversubscribed(seed: int, tail: str) -> tuple[np.ndarray, ...]:
    """A steady 26 ms step on a machine already oversubscribed (half of it waiting for a core,
    CPU time 0.9 of the wall), whose last 60 steps are ten times as long with the CPU time and
    the wait in proportion (the step log of a CI run beside two busy loops). `tail`: what the
    other-load sampler saw there: "slower-core" (the probe's CPU time 10x), "more-others"
    (other processes held 0.4 more of the cores), "own-work" (neither moved: the script's
    work), "unmeasured" (no sampler), "none" (no such tail)."""
    rng = np.random.default_rng(seed)
    n = 440
    jitter = np.exp(rng.normal(0, 0.08, n))
    step, runq, cpu = 26.0 * jitter, 13.0 * jitter, 23.4 * jitter
    others = 1.0 + rng.normal(0, 0.03, n)
    probe = 185.0 * np.exp(rng.normal(0, 0.03, n))
    tail_steps = np.arange(n) >= (n - 60 if tail != "none" else n)
    step[tail_steps] *= 10.2
    runq[tail_steps] *= 10.2
    cpu[tail_steps] *= 9.3
    if tail == "slower-core":
        probe[tail_steps] *= 10.0
    elif tail == "more-others":
        others[tail_steps] += 0.4
    if tail == "unmeasured":
        return step, np.zeros(n), runq, cpu
    return step, np.zeros(n), runq, cpu, others, probe


@pytest.mark.parametrize("seed", range(3))
def test_a_core_the_host_slowed_is_load_not_a_regime(seed: int) -> None:
    w = series(*oversubscribed(seed, "slower-core"))
    assert len(w["regimes"]) == 1 and len(w["load"]) == 1, (w["regimes"], w["load"])
    assert w["load"][0]["first_step"] == pytest.approx(381, abs=5)
    why = w["load"][0]["why"]
    slower = re.match(r"the cores ran ([\d.]+)x slower: a fixed piece of work took", why)
    assert slower and 9.5 <= float(slower.group(1)) <= 10.5, why


@pytest.mark.parametrize("seed", range(3))
def test_other_processes_taking_more_cores_of_an_oversubscribed_machine_is_load(
        seed: int) -> None:
    w = series(*oversubscribed(seed, "more-others"))
    assert len(w["regimes"]) == 1 and len(w["load"]) == 1, (w["regimes"], w["load"])
    why = w["load"][0]["why"]
    held = re.search(r"\(([\d.]+) cores on average, from ([\d.]+)\)", why)
    assert held and float(held.group(1)) - float(held.group(2)) == pytest.approx(0.4, abs=0.05)


@pytest.mark.parametrize("tail", ["own-work", "unmeasured"])
def test_the_same_growth_with_the_sampler_steady_or_absent_is_a_regime(tail: str) -> None:
    """The step, the CPU time and the wait grown in proportion, with other processes' cores
    and the probe unchanged: the script's own work (or, unmeasured, nothing tells it from
    load: the limit docs/watch.md states)."""
    w = series(*oversubscribed(0, tail))
    assert [r["first_step"] for r in w["regimes"]] == [1, 381], w["regimes"]
    assert w["load"] == []


def test_a_loader_that_turns_slow_on_a_busy_machine_is_a_regime_though_others_take_the_cores(
        ) -> None:
    """The loader sleeps: the stepping thread waits for no core, and other processes take the
    cores it leaves (their cores grow): the script's change, not load."""
    step, wait, runq, cpu, others, probe = oversubscribed(1, "none")
    slow = np.arange(step.size) >= 300
    step[slow] = 60.0 + step[slow]
    wait[slow] = 60.0
    runq[slow] = 0.5 * runq[slow]
    others[slow] += 0.5
    w = series(step, wait, runq, cpu, others, probe)
    assert w["load"] == [] and len(w["regimes"]) == 2, (w["regimes"], w["load"])
    assert w["regimes"][1]["first_step"] == pytest.approx(301, abs=3)


def test_the_live_trigger_takes_no_capture_for_a_slower_core() -> None:
    step, _, runq, cpu, others, probe = oversubscribed(0, "slower-core")
    t = Trigger()
    starts = [i for i in range(step.size) if t.add(
        i + 1, float(step[i]), 0.0, float(runq[i]), float(cpu[i]), float(others[i]),
        float(probe[i])) is not None]
    assert starts == []
    assert feed(step, runq, cpu) != []  # without the sampler: a change
