"""report.json's `watch` section from one run's step series.

`captures` is left empty: the command fills it with the profiler windows it recorded at each
regime start and periodic stall, each with its own verdict from the usual pipeline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope import loadrule
from stallscope.wholerun import periodic, regimes, spikes
from stallscope.wholerun.series import StepSeries

MAX_KEPT_STEPS = 20_000
MEMORY_POINTS = 120  # the memory series report.json keeps: at most this many [step, MB] points


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _regime_dicts(v: periodic.Valid, found: list[regimes.Regime]) -> list[dict[str, Any]]:
    """The script's regimes (stretches of other load are `_load_dicts`'), each with the steps of
    the load stretches inside its span (`load_steps`: left out of its medians)."""
    loads = [r for r in found if r.load is not None]
    found = [r for r in found if r.load is None]
    out: list[dict[str, Any]] = []
    for i, r in enumerate(found):
        out.append({
            **_span(v, r),
            "median_loader_wait_ms": round(r.median_wait_ms, 3),
            "loader_wait_share": round(r.wait_share, 4),
            **_wall(v, r),
            "median_cpu_ms": round(r.median_cpu_ms, 3) if np.isfinite(r.median_cpu_ms)
            else None,
            "cpu_ratio": None if i == 0 else _round(regimes.cpu_ratio(found[i - 1], r)),
            "change": None if i == 0 else regimes.what_changed(found[i - 1], r),
            "median_runq_ms": _finite(r.median_runq_ms),
            "load_steps": sum(min(r.end, x.end) - max(r.start, x.start) for x in loads
                              if x.start < r.end and x.end > r.start),
        })
    return out


def _load_dicts(v: periodic.Valid, found: list[regimes.Regime]) -> list[dict[str, Any]]:
    """The stretches other load on the machine explains: never a regime, never captured."""
    out: list[dict[str, Any]] = []
    for r in found:
        if r.load is None:
            continue
        out.append({
            **_span(v, r),
            "median_runq_ms": _finite(r.median_runq_ms),
            "median_cpu_ms": _finite(r.median_cpu_ms),
            **_wall(v, r),
            "why": r.load,
        })
    return out


def _span(v: periodic.Valid, r: regimes.Regime) -> dict[str, Any]:
    """Where a stretch lies and its median step."""
    return {"first_step": int(v.steps[r.start]), "last_step": int(v.steps[r.end - 1]),
            "steps": int(r.end - r.start), "median_step_ms": round(r.median_step_ms, 3)}


def _wall(v: periodic.Valid, r: regimes.Regime) -> dict[str, Any]:
    """The time a stretch took, and its share of the run's."""
    wall = float(v.step_ms[r.start:r.end].sum())
    return {"wall_ms": round(wall, 3),
            "share_of_wall": round(wall / v.wall_ms, 4) if v.wall_ms > 0 else 0.0}


def _finite(x: float) -> float | None:
    return round(x, 3) if np.isfinite(x) else None


def _kept(series: StepSeries) -> tuple[np.ndarray, str | None]:
    """The steps report.json keeps (and the page, which embeds it), as positions: at most
    about MAX_KEPT_STEPS, 2x that at worst: every step up to it; past it, every k-th step, the
    slowest step of each k (so the chart's peaks and the stalls stay), and every step under the
    profiler. A day of 10 ms steps is 8.6 million steps (200k of them made 33 MB of JSON); the
    step file keeps every one. Only the kept steps become records: making one of every step
    took 4.9 s of the 6.5 s summary of 400,000 steps (under cProfile)."""
    n = len(series)
    if n <= MAX_KEPT_STEPS:
        return np.arange(n), None
    every = -(-n // MAX_KEPT_STEPS)
    starts = np.arange(0, n, every)
    # The slowest of each k as report.json writes it (rounded, _opt), the first on a tie:
    # only steps near their block's maximum are rounded in Python to find it.
    ms = np.where(np.isfinite(series.step_ms), series.step_ms, 0.0)
    top = np.maximum.reduceat(ms, starts)
    block = np.arange(n) // every
    slowest: dict[int, int] = {}
    for i in np.flatnonzero(ms >= top[block] - 1e-3).tolist():
        b = i // every
        if b not in slowest and round(float(ms[i]), 4) == round(float(top[b]), 4):
            slowest[b] = i
    keep = np.union1d(np.union1d(starts, list(slowest.values())),
                      np.flatnonzero(series.profiled))  # type: ignore[arg-type]
    return keep, (f"report.json keeps {len(keep):,} of the {n:,} steps (every {every}th, the "
                  f"slowest of each {every} and every step under the profiler); the step file "
                  "holds them all")


def memory_over_run(series: StepSeries) -> dict[str, Any] | None:
    """The job's memory over the run, from the steps that carry it (capture/steplog.py): where
    it began, its peak and the step of it, where it ended, and at most MEMORY_POINTS [step, MB]
    points, each the largest of its stretch of samples so that a peak stays. None when the log
    carries none (memory sampling off, an older log)."""
    has = np.isfinite(series.mem_mb)
    if not has.any():
        return None
    steps, mb = series.step[has], series.mem_mb[has]
    n = int(mb.size)
    every = max(1, -(-n // MEMORY_POINTS))
    picks = [s + int(np.argmax(mb[s:s + every])) for s in range(0, n, every)]
    k = int(np.argmax(mb))
    return {
        "what": "the training process's resident memory plus its DataLoader workers' own "
                "(unique) memory, MB, measured by the memory sampler at most every "
                "half second",
        "samples": n,
        "first_mb": round(float(mb[0]), 1), "first_step": int(steps[0]),
        "peak_mb": round(float(mb[k]), 1), "peak_step": int(steps[k]),
        "last_mb": round(float(mb[-1]), 1), "last_step": int(steps[-1]),
        "points": [[int(steps[i]), round(float(mb[i]), 1)] for i in picks],
    }


def summarise(series: StepSeries) -> dict[str, Any]:
    """The `watch` section: steps[], regimes[], periodic[], outliers, captures: []."""
    ok = series.valid
    wall = series.wall_ms()
    step_ms = series.step_ms[ok]
    found_spikes = spikes.find_spikes(step_ms) if step_ms.size else spikes.Spikes(
        np.zeros(0, dtype=bool), step_ms, step_ms, 0.0)
    v = periodic.Valid(series.step[ok], series.epoch[ok], step_ms, series.loader_wait_ms[ok],
                       found_spikes, wall)
    keep, kept_note = _kept(series)
    steps = series.to_records(keep.tolist())
    spike = np.isin(series.step[keep], v.steps[found_spikes.mask])
    for rec, flag in zip(steps, spike.tolist(), strict=True):
        rec["spike"] = flag
    notes: list[str] = []
    if kept_note:
        notes.append(kept_note)
    n_valid = int(ok.sum())
    if n_valid < regimes.MIN_STEPS:
        notes.append(f"{n_valid} measured steps: fewer than {regimes.MIN_STEPS}, so the run "
                     "is one regime (too short to split)")
    recorded = int(series.profiled.sum())  # type: ignore[union-attr]
    if recorded:
        notes.append(f"{recorded} steps recorded under the profiler (slower by its own cost) "
                     "were set aside")
    if n_valid + recorded < len(series):
        notes.append(f"{len(series) - n_valid - recorded} steps without a usable duration "
                     "were left out")
    if series.skipped_lines:
        notes.append(f"{series.skipped_lines} lines of the step file did not decode")
    epoch_entry, used = periodic.epoch_starts(v)
    found_periodic, used = periodic.periodic_stalls(v, used, series.step[series.valid])
    stalls = ([epoch_entry] if epoch_entry else []) + found_periodic
    beside = regimes.Beside(series.cpu_ms[ok], series.runq_ms[ok],
                            series.held("others_cores")[ok], series.held("probe_us")[ok])
    stretches = regimes.find_regimes(step_ms, v.wait_ms, found_spikes.mask, beside=beside)
    in_load = np.zeros(len(keep), dtype=bool)
    for r in stretches:
        if r.load is not None:
            in_load |= (series.step[keep] >= v.steps[r.start]) & (
                series.step[keep] <= v.steps[r.end - 1])
    for rec, flag in zip(steps, in_load.tolist(), strict=True):
        rec["load"] = flag
    return {
        "n_steps": len(series),
        "measured_steps": n_valid,
        "wall_ms": round(wall, 3),
        # The DataLoader's share of the measured steps' time, over the whole run.
        "loader_wait_share": (round(float(v.wait_ms.sum()) / float(step_ms.sum()), 4)
                              if step_ms.size and step_ms.sum() > 0 else None),
        "median_step_ms": round(float(np.median(step_ms)), 3) if step_ms.size else None,
        "steps": steps,
        "regimes": _regime_dicts(v, stretches),
        "load": _load_dicts(v, stretches),
        "periodic": stalls,
        "outliers": periodic.outliers(v, used),
        "captures": [],
        "memory": memory_over_run(series),
        "method": {
            "regimes": "penalised l2 change points (ruptures KernelCPD, linear kernel) on "
                       "log step time and loader-wait share, spikes and periodic stalls "
                       f"flattened, penalty {regimes.PEN_BETA} x log(n) in noise sd; regimes "
                       f"closer than {regimes.MIN_STEP_RATIO}x in step time and "
                       f"{round(100 * regimes.MIN_SHARE_DELTA)} points in loader share merged, "
                       "and those whose difference adds up to under "
                       f"{regimes.MIN_REGIME_MS / 1000:g} s over the shorter one's steps; each "
                       "boundary moved to where the median level switches (least absolute "
                       f"deviation within {regimes.REFINE_STEPS} steps)",
            "load": "a stretch slower than its neighbour is other load when the "
                    "stepping thread's run-queue wait (schedstat), past the neighbour's share "
                    f"of the step, is at least {round(100 * loadrule.LOAD_EXPLAINS)}% of the "
                    f"step's growth, or is at least {round(100 * loadrule.LOAD_SHARE)}% of the "
                    f"step and {round(100 * loadrule.LOAD_SHARE_DELTA)} points more than the "
                    "neighbour's; or, with that wait at least "
                    f"{round(100 * loadrule.LOAD_SHARE)}% of the step, the process's CPU time "
                    f"per wall ms is {loadrule.LOAD_SPIN:g}x the neighbour's (threads "
                    f"spinning), or other processes held {loadrule.OTHERS_DELTA:g} cores more "
                    f"while that CPU time per wall ms grew less than {loadrule.CPU_KEPT:g}x; or "
                    "a fixed piece of work took "
                    f"{loadrule.CORE_SLOWER:g}x the CPU time (a slower core), enough to explain "
                    f"{round(100 * loadrule.LOAD_EXPLAINS)}% of the growth",
            "spikes": f"log step time > {spikes.SPIKE_Z} robust sd and "
                      f"{round(100 * spikes.MIN_EXCESS)}% over the {spikes.WINDOW}-step "
                      "rolling median",
        },
        "notes": notes,
    }
