"""`watch`'s whole-run analysis (stallscope.wholerun) on step series with known truths.

The four acceptance cases of issue 34 (a loader that slows down halfway, a blocking save every
N steps, non-persistent workers over several epochs, a steady run), each over several seeds and
noise shapes, and the edge cases a real run produces: tiny runs, unmeasured steps, one huge
outlier, a torn last line in the step file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallscope.wholerun import StepSeries, summarise
from stallscope.wholerun.series import append_jsonl

# The generators the benchmark measures with (benchmarks/watch_synth.py), read from their file
# so that the tests and the benchmark's figures rest on the same series.
_SPEC = importlib.util.spec_from_file_location(
    "watch_synth", Path(__file__).resolve().parents[1] / "benchmarks" / "watch_synth.py")
assert _SPEC is not None and _SPEC.loader is not None
synth = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(synth)

SEEDS = range(4)


def _summary(step: np.ndarray, wait: np.ndarray, epoch_len: int | None = None) -> dict[str, Any]:
    out = summarise(StepSeries.from_records(synth.records(step, wait, epoch_len)))
    json.dumps(out, allow_nan=False)  # report.json must stay strict JSON
    return out


@pytest.mark.parametrize("kind", synth.NOISES)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_loader_that_slows_down_halfway_is_one_regime_boundary_within_5_percent(
        kind: str, seed: int) -> None:
    n, at = 400, 200
    step, wait = synth.loader_slows(n, at, np.random.default_rng(seed), kind)
    regimes = _summary(step, wait)["regimes"]
    assert len(regimes) == 2, regimes
    assert abs(regimes[1]["first_step"] - at) <= 0.05 * n
    assert regimes[1]["change"].startswith("steps 2.0x longer, loader wait from 3% to ")
    assert regimes[1]["loader_wait_share"] > 0.45
    assert regimes[0]["last_step"] + 1 == regimes[1]["first_step"]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_faster_second_half_says_shorter(seed: int) -> None:
    step, wait = synth.loader_slows(300, 100, np.random.default_rng(seed), extra_ms=150)
    step, wait = step[::-1].copy(), wait[::-1].copy()  # slow first, then fast
    regimes = _summary(step, wait)["regimes"]
    assert [r["first_step"] for r in regimes][1] in range(190, 211)
    assert "2.5x shorter" in regimes[1]["change"]


@pytest.mark.parametrize("kind", synth.NOISES)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_blocking_save_every_50_steps_is_found_with_its_period_and_cost(
        kind: str, seed: int) -> None:
    step, wait, hit = synth.blocking_save(500, 50, 400.0, np.random.default_rng(seed), kind)
    out = _summary(step, wait)
    periodic = [p for p in out["periodic"] if p["kind"] == "periodic"]
    assert len(periodic) == 1, out["periodic"]
    save = periodic[0]
    assert save["every_steps"] == 50
    assert save["steps"] == hit
    true_cost = float(np.sum(step[hit] - 100.0))
    assert save["cost_ms"] == pytest.approx(true_cost, rel=0.1)
    assert save["share_of_wall"] == pytest.approx(true_cost / step.sum(), rel=0.1)
    assert save["in_loader_wait"] < 0.1  # the step's own work, not the loader
    assert len(out["regimes"]) == 1  # a stall every 50 steps is not a regime change


def test_logging_every_10_and_a_checkpoint_every_100_are_two_periods() -> None:
    rng = np.random.default_rng(7)
    step, wait = synth.steady(600, rng)
    step[9::10] += 60.0
    step[99::100] += 900.0
    out = _summary(step, wait)
    periods = {p["every_steps"]: p for p in out["periodic"]}
    assert set(periods) == {10, 100}
    assert periods[100]["steps"] == list(range(99, 600, 100))
    assert periods[100]["cost_ms"] > periods[10]["cost_ms"]  # sorted costliest first
    assert out["periodic"][0]["every_steps"] == 100


@pytest.mark.parametrize("seed", SEEDS)
def test_non_persistent_workers_cost_at_each_epoch_start_with_persistent_workers_as_fix(
        seed: int) -> None:
    epochs, length, startup = 6, 60, 900.0
    step, wait = synth.epoch_starts(epochs, length, startup, np.random.default_rng(seed))
    out = _summary(step, wait, epoch_len=length)
    stalls = out["periodic"]
    assert [p["kind"] for p in stalls] == ["epoch_start"]  # not also a period of 60 steps
    stall = stalls[0]
    assert stall["epochs"] == epochs and stall["epochs_stalled"] == epochs
    assert stall["epoch_first_steps"] == [e * length for e in range(epochs)]
    firsts = [e * length for e in range(epochs)]
    true_cost = float(sum(step[f] + step[f + 1] - 200.0 for f in firsts))
    assert stall["cost_ms"] == pytest.approx(true_cost, rel=0.15)
    assert stall["in_loader_wait"] > 0.9
    fix = stall["fix"]
    assert "persistent_workers=True" in fix["change"]
    assert "num_workers > 0" in fix["precondition"]
    later = float(sum(step[f] + step[f + 1] - 200.0 for f in firsts[1:]))
    assert fix["saves_ms"] == pytest.approx(later, rel=0.15)
    assert len(out["regimes"]) == 1


def test_an_epoch_start_stall_outside_the_loader_wait_gets_no_persistent_workers_fix() -> None:
    rng = np.random.default_rng(3)
    step, wait = synth.steady(300, rng)
    step[::50] += 700.0  # e.g. an evaluation at each epoch's start: the step, not the loader
    stall = _summary(step, wait, epoch_len=50)["periodic"][0]
    assert stall["kind"] == "epoch_start"
    assert stall["fix"] is None
    assert "persistent_workers=True would not remove it" in stall["note"]


@pytest.mark.parametrize("kind", synth.NOISES)
@pytest.mark.parametrize("seed", range(8))
def test_a_steady_run_reports_no_regime_change_and_no_period(kind: str, seed: int) -> None:
    step, wait = synth.steady(500, np.random.default_rng(100 + seed), kind)
    out = _summary(step, wait)
    assert len(out["regimes"]) == 1
    assert out["regimes"][0]["change"] is None
    assert out["periodic"] == []


def test_one_huge_outlier_is_a_spike_not_a_regime() -> None:
    step, wait = synth.steady(300, np.random.default_rng(11))
    step[137] = 20_000.0
    out = _summary(step, wait)
    assert len(out["regimes"]) == 1
    assert out["periodic"] == []
    assert out["outliers"]["count"] == 1
    assert out["outliers"]["largest"][0]["step"] == 137
    assert out["outliers"]["largest"][0]["excess_ms"] == pytest.approx(19_900, rel=0.01)
    assert out["outliers"]["share_of_wall"] > 0.35
    assert [s["step"] for s in out["steps"] if s["spike"]] == [137]


@pytest.mark.parametrize("n", [0, 1, 5, 19])
def test_a_tiny_run_is_one_regime_with_a_note(n: int) -> None:
    step, wait = synth.steady(n, np.random.default_rng(n))
    out = _summary(step, wait)
    assert out["n_steps"] == n
    assert len(out["regimes"]) == (1 if n else 0)
    assert out["periodic"] == []
    assert any("fewer than 20" in note for note in out["notes"])


def test_unmeasured_steps_are_listed_but_left_out_of_the_analysis() -> None:
    step, wait, hit = synth.blocking_save(400, 40, 500.0, np.random.default_rng(5))
    recs = synth.records(step, wait)
    recs[10]["step_ms"] = float("nan")
    recs[20]["step_ms"] = 0.0
    recs[30]["step_ms"] = None
    recs[31]["step_ms"] = "fast"
    out = summarise(StepSeries.from_records(recs))
    json.dumps(out, allow_nan=False)
    assert out["n_steps"] == 400 and out["measured_steps"] == 396
    assert [out["steps"][i]["step_ms"] for i in (10, 20, 30, 31)] == [None] * 4
    assert any("4 steps without a usable duration" in note for note in out["notes"])
    assert [p["every_steps"] for p in out["periodic"]] == [40]
    assert out["periodic"][0]["steps"] == hit
    assert len(out["regimes"]) == 1


def test_the_step_file_round_trips_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    step, wait = synth.loader_slows(120, 60, np.random.default_rng(2))
    path = tmp_path / "steps.jsonl"
    for rec in synth.records(step, wait, epoch_len=40):
        append_jsonl(path, rec)
    with open(path, "a") as fh:
        fh.write('{"step": 120, "step_ms": 10')  # the script was killed mid-write
    series = StepSeries.from_jsonl(path)
    assert len(series) == 120 and series.skipped_lines == 1
    assert np.allclose(series.step_ms, step) and np.allclose(series.loader_wait_ms, wait)
    assert list(series.epoch[[0, 39, 40, 119]]) == [0, 0, 1, 2]
    again = tmp_path / "again.jsonl"
    series.to_jsonl(again)
    assert StepSeries.from_jsonl(again).to_records() == series.to_records()
    out = summarise(series)
    assert any("1 lines of the step file did not decode" in note for note in out["notes"])


def test_wall_time_counts_time_between_steps_when_start_times_show_it() -> None:
    step = np.full(100, 50.0)
    recs = synth.records(step, np.zeros(100))
    for rec in recs[50:]:
        rec["start_s"] += 2.0  # 2 s of evaluation outside any step's timer
    series = StepSeries.from_records(recs)
    assert series.wall_ms() == pytest.approx(5000.0 + 2000.0)
    assert summarise(series)["wall_ms"] == pytest.approx(7000.0)


def test_loader_wait_is_clipped_to_its_step_and_missing_waits_count_as_none() -> None:
    series = StepSeries.from_records([{"step_ms": 10.0, "loader_wait_ms": 25.0},
                                      {"step_ms": 10.0}, {"step_ms": 10.0,
                                                          "loader_wait_ms": -3}])
    assert list(series.loader_wait_ms) == [10.0, 0.0, 0.0]
    assert list(series.step) == [0, 1, 2]
    assert not math.isnan(series.wall_ms())


def test_a_change_that_lasts_under_a_second_is_not_a_regime() -> None:
    """A busy machine makes sub-second blips; the same shape over seconds is a regime."""
    rng = np.random.default_rng(9)
    step, wait = synth.loader_slows(400, 200, rng)
    fast = _summary(step / 100, wait / 100)  # 1 ms steps: each half lasts 0.2-0.4 s
    slow = _summary(step / 5, wait / 5)  # 20 ms steps: each half lasts 4-8 s
    assert len(fast["regimes"]) == 1
    assert [r["first_step"] for r in slow["regimes"]][1] in range(190, 211)


@pytest.mark.parametrize("grows", [False, True])
def test_a_slowdown_with_flat_cpu_time_is_said_to_wait_outside_the_process(grows: bool) -> None:
    """Another process taking the core: the step takes longer, the process works no longer."""
    rng = np.random.default_rng(4)
    step, wait = synth.steady(400, rng)
    cpu = step * 0.9
    step[200:] *= 1.6
    if grows:  # the model itself got more expensive: CPU time grows with the step
        cpu[200:] *= 1.6
    recs = synth.records(step, wait)
    for rec, c in zip(recs, cpu, strict=True):
        rec["cpu_ms"] = float(c)
    regimes = summarise(StepSeries.from_records(recs))["regimes"]
    assert [r["first_step"] for r in regimes] == [0, 200]
    assert regimes[1]["cpu_ratio"] == pytest.approx(1.6 if grows else 1.0, rel=0.05)
    assert ("waited outside the process" in regimes[1]["change"]) is not grows


def test_a_loader_slowdown_with_flat_cpu_time_is_told_as_the_loader_not_other_load() -> None:
    rng = np.random.default_rng(6)
    step, wait = synth.loader_slows(300, 150, rng)
    recs = synth.records(step, wait)
    for rec in recs:
        rec["cpu_ms"] = 90.0  # the loader sleeps on I/O: no more CPU time per step
    change = summarise(StepSeries.from_records(recs))["regimes"][1]["change"]
    assert change.startswith("steps 2.0x longer, loader wait from 3% to ")
    assert "outside the process" not in change


def test_the_analysis_imports_no_torch() -> None:
    """The command's parent process analyses the series; torch there would start CUDA."""
    import os
    import subprocess

    import stallscope

    src = str(Path(stallscope.__file__).resolve().parents[1])  # this tree's, not an install's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    code = "import sys, stallscope.wholerun; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_a_long_run_keeps_a_bounded_sample_with_every_spike_and_a_true_chart() -> None:
    """100,000 steps of 10 ms with a 300 ms checkpoint every 25: report.json keeps at most about
    40,000 (every 5th, the slowest of each 5, every profiled step), the step file has them all;
    the chart drawn from the sample keeps the 10 ms median line and the 300 ms peaks."""
    from stallscope.report.watch_chart import watch_chart
    from stallscope.wholerun.summary import MAX_KEPT_STEPS, summarise

    n = 100_000
    recs = [{"step": i, "start_s": i * 0.01, "step_ms": 300.0 if i % 25 == 0 else 10.0,
             "loader_wait_ms": 1.0, "epoch": 0, "profiled": 500 <= i < 505}
            for i in range(1, n + 1)]
    section = summarise(StepSeries.from_records(recs))
    kept = section["steps"]
    assert section["n_steps"] == n and len(kept) <= 2 * MAX_KEPT_STEPS + 5
    assert sum(1 for s in kept if s["step_ms"] == 300.0) == n // 25  # every stall kept
    assert {500, 501, 502, 503, 504} <= {s["step"] for s in kept if s["profiled"]}
    assert any("keeps" in note and "100,000" in note for note in section["notes"])
    assert section["periodic"] and section["periodic"][0]["every_steps"] == 25
    chart = watch_chart(section)
    assert chart is not None and chart["steps"] == n
    ys = [float(p.split(",")[1]) for p in chart["line"].split()]
    peaks = [float(p.split(",")[1]) for p in chart["peaks"].split()]
    assert max(ys) - min(ys) < 1.0  # one flat median line at 10 ms
    assert min(peaks) < min(ys) - 50  # the stalls still reach far above it


def _read_line_by_line(path: Path) -> StepSeries:
    """The step file read as it was before the typed fast path: each line by json.loads."""
    records, skipped = [], 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            if isinstance(obj, dict):
                records.append(obj)
            else:
                skipped += 1
    return StepSeries.from_records(records, skipped_lines=skipped)


ODD_LINES = [
    '{"step": 7, "step_ms": "12.5", "loader_wait_ms": 1}',  # a number written as text
    '{"step": 8, "step_ms": true, "profiled": 1}',  # a bool where a number goes
    '{"step": 9, "step_ms": NaN, "epoch": 2.7}',  # Python's json writes NaN
    '[1, 2, 3]',  # not an object
    '{"step": 10, "step_ms": 1e999, "cpu_ms": -Infinity}',
    '{"step": 11, "step_ms": 5, "note": "a\u2028b", "epoch": -1}',  # U+2028 inside a string
    '   ',
    '{"step": 12, "step_ms": 4.0, "loader_wait_ms": 9.0, "profiled": true}\r',
    '{"step": 13, "step_ms": 4.0, "loader_wait_ms": -2, "start_s": 12.5, "host_sync_ms": null}',
    '{"step": 14, "step_ms"',  # torn
]


@pytest.mark.parametrize("block", [64, 300, 1 << 20])
def test_the_fast_read_of_the_step_file_equals_the_line_by_line_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """Blocks of typed lines, odd blocks line by line: the same series either way, whatever
    the lines hold and wherever the blocks end."""
    from stallscope.wholerun import series as series_module

    monkeypatch.setattr(series_module, "BLOCK_BYTES", block)
    rng = np.random.default_rng(3)
    lines = [json.dumps({"step": i, "step_ms": float(rng.uniform(1, 9)),
                         "loader_wait_ms": float(rng.uniform(0, 1)), "epoch": i // 40,
                         "start_s": 100 + i * 0.01, "cpu_ms": 3.5, "profiled": i % 50 == 0})
             for i in range(400)]
    for k, odd in enumerate(ODD_LINES[:-1]):
        lines.insert(37 * (k + 1), odd)
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(lines) + "\n" + ODD_LINES[-1], encoding="utf-8")
    fast, slow = StepSeries.from_jsonl(path), _read_line_by_line(path)
    assert fast.skipped_lines == slow.skipped_lines == 2  # the list and the torn last line
    for name in ("step", "step_ms", "loader_wait_ms", "host_sync_ms", "cpu_ms", "epoch",
                 "start_s", "profiled"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name), equal_nan=True), name
