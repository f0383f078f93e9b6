"""Stalls that recur: every N steps (evaluation, checkpointing, logging) or at epoch starts.

Both are explained spikes (spikes.py). Epoch starts are looked at first, when epochs are known,
because with a fixed epoch length they would also read as a period. Each stall carries its cost
(excess over the rolling median, summed over its steps), its share of the run's wall time, where
it happens (steps), and how much of it the loader wait explains: an epoch-start stall in the
loader wait is worker start-up, whose fix is persistent_workers=True; one outside it is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallscope.wholerun.spikes import Spikes, rolling_median

EPOCH_Z = 3.0  # an epoch's first steps are tested against a hypothesis: a looser z than spikes
EPOCH_MIN_EXCESS = 0.10  # and at least 10% over the rolling median
MAX_EPOCH_STALL = 5  # steps at an epoch start that can belong to its stall (prefetch refill)
MIN_OCCURRENCES = 3  # a period needs this many stalls in phase
MIN_COVERAGE = 0.6  # and stalls at this share of its slots in the run
MAX_CANDIDATES = 100  # periods tried: the most frequent gaps between spikes (bounds the time)
MAX_PHASES = 3  # phases tried per period: those holding the most spikes
ALPHA = 0.01  # and random spikes would line up as well with at most this chance (see _chance)
MAX_PERIODS = 3  # distinct periods reported (logging, evaluation, checkpointing)
NESTED_FACTOR = 3.0  # in-phase stalls this much costlier than their median may be a longer period
MAX_LISTED = 50  # steps listed per stall in report.json
LOADER_FIX_SHARE = 0.5  # the loader wait must explain this much of an epoch-start stall


@dataclass(frozen=True)
class Valid:
    """The valid steps' arrays, aligned."""

    steps: np.ndarray
    epoch: np.ndarray
    step_ms: np.ndarray
    wait_ms: np.ndarray
    spikes: Spikes
    wall_ms: float


def _in_loader(v: Valid, idx: np.ndarray) -> float | None:
    """Share of the stalls' excess that is excess loader wait (None when there is no excess)."""
    excess = v.spikes.excess_ms[idx]
    total = float(excess.sum())
    if total <= 0:
        return None
    wait_excess = np.clip(v.wait_ms - rolling_median(v.wait_ms), 0.0, None)[idx]
    return round(float(np.minimum(wait_excess, excess).sum()) / total, 3)


def _entry(v: Valid, idx: np.ndarray, **extra: Any) -> dict[str, Any]:
    excess = v.spikes.excess_ms[idx]
    cost = float(excess.sum())
    out: dict[str, Any] = dict(extra)
    out.update({
        "first_step": int(v.steps[idx[0]]),
        "last_step": int(v.steps[idx[-1]]),
        "count": int(idx.size),
        "steps": [int(s) for s in v.steps[idx[:MAX_LISTED]]],
        "median_excess_ms": round(float(np.median(excess)), 3),
        "cost_ms": round(cost, 3),
        "share_of_wall": round(cost / v.wall_ms, 4) if v.wall_ms > 0 else 0.0,
        "in_loader_wait": _in_loader(v, idx),
    })
    return out


def epoch_starts(v: Valid) -> tuple[dict[str, Any] | None, np.ndarray]:
    """The epoch-start stall (or None) and the positions it explains."""
    used = np.zeros(v.steps.size, dtype=bool)
    known = v.epoch >= 0
    if not known.any():
        return None, used
    _, first = np.unique(v.epoch[known], return_index=True)
    order = np.flatnonzero(known)[np.sort(first)]  # each epoch's first position, in run order
    if order.size < 2:
        return None, used
    resid = np.log(v.step_ms / v.spikes.baseline_ms) / v.spikes.scale
    slow = (resid > EPOCH_Z) & (v.step_ms > (1 + EPOCH_MIN_EXCESS) * v.spikes.baseline_ms)
    runs: list[np.ndarray] = []
    for pos in order:
        j = pos
        while (j < v.steps.size and j - pos < MAX_EPOCH_STALL and v.epoch[j] == v.epoch[pos]
               and slow[j]):
            j += 1
        runs.append(np.arange(pos, j))
    later = runs[1:]
    stalled = sum(1 for r in later if r.size)
    if stalled < max(1, math.ceil(0.5 * len(later))):
        return None, used
    idx = np.concatenate([r for r in runs if r.size])
    used[idx] = True
    later_idx = np.concatenate([r for r in later if r.size])
    entry = _entry(v, idx, kind="epoch_start", epochs=int(order.size),
                   epochs_stalled=int(stalled + (runs[0].size > 0)),
                   epoch_first_steps=[int(v.steps[p]) for p in order[:MAX_LISTED]],
                   steps_per_stall=float(np.median([r.size for r in runs if r.size])))
    saves = float(v.spikes.excess_ms[later_idx].sum())
    in_loader = entry["in_loader_wait"]
    if in_loader is not None and in_loader >= LOADER_FIX_SHARE:
        entry["fix"] = {
            "change": "DataLoader(..., persistent_workers=True)",
            "precondition": "num_workers > 0 (with 0 workers there is no start-up to keep); "
                            "the workers and their memory then live between epochs",
            "saves_ms": round(saves, 3),
            "saves_share_of_wall": round(saves / v.wall_ms, 4) if v.wall_ms > 0 else 0.0,
            "note": "the first epoch's start-up stays: it is paid once",
        }
    else:
        entry["fix"] = None
        entry["note"] = ("the stall is outside the loader wait: not worker start-up, so "
                         "persistent_workers=True would not remove it")
    return entry, used


def _chance(hits: int, slots: int, spikes: int, span: int, tol: int) -> float:
    """How likely `spikes` spikes at random over `span` steps put `hits` in a period's `slots`.

    Any pair of spikes proposes a period and a phase, so the first 2 hits are free: the tail
    is over the other slots, each hit by chance with q (a spike within the tolerance), and
    multiplied by the number of pairs tried (Bonferroni). 3 stalls among 3 spikes in 300
    steps come out near 0.09: too likely by chance, so such a period needs more occurrences.
    """
    q = 1.0 - (1.0 - min(spikes / max(span, 1), 1.0)) ** (2 * tol + 1)
    rest, need = slots - 2, hits - 2
    tail = sum(math.comb(rest, j) * q**j * (1 - q) ** (rest - j) for j in range(need, rest + 1))
    return min(1.0, tail * spikes * (spikes - 1) / 2)


def _slots(measured: np.ndarray | None, r: int, n: int, lo: int, hi: int, tol: int) -> int:
    """The period's slots in [lo, hi] (phase `r`) where a stall could be seen: with a step
    measured within the tolerance (`measured`: sorted step numbers; None: all of them). A slot
    the profiler recorded (`watch`'s periodic capture takes one) was never judged."""
    # a slot just past either end still counts when a step within the tolerance was measured
    # (a hit there would otherwise outnumber the slots)
    first, last = math.ceil((lo - tol - r) / n), math.floor((hi + tol - r) / n)
    if measured is None:
        measured = np.arange(lo, hi + 1)
    if last < first:
        return 0
    at = r + n * np.arange(first, last + 1)
    left = np.searchsorted(measured, at - tol, side="left")
    right = np.searchsorted(measured, at + tol, side="right")
    return int((right > left).sum())


def _gaps(pos: np.ndarray, excess: np.ndarray, levels: bool) -> np.ndarray:
    """Gaps between neighbouring spikes (next and next but one), among all spikes and among
    the costlier ones: dozens of small spikes between 0.3 s saves must not hide the saves'
    gap (it would be no gap between neighbours). Without `levels`, among all spikes only."""
    out = []
    cuts = (-math.inf, float(np.median(excess)), 0.5 * float(excess.max())) if levels else (
        -math.inf,)
    for cut in cuts:
        sub = pos[excess >= cut]
        out += [np.diff(sub), sub[2:] - sub[:-2]]
    return np.concatenate(out)


def _best_period(pos: np.ndarray, excess: np.ndarray, lo: int,
                 hi: int, measured: np.ndarray | None = None,
                 levels: bool = True) -> tuple[int, np.ndarray] | None:
    """The period explaining most of `pos` (sorted step numbers of spikes costing `excess`),
    and which of them it explains.

    The chance test counts only spikes at least half as costly as the period's median stall:
    on a busy machine, dozens of small preemption spikes must not hide 6 checkpoints 3x their
    size (they could not line up as those do).
    """
    if pos.size < MIN_OCCURRENCES:
        return None
    gaps = _gaps(pos, excess, levels)
    values, freq = np.unique(gaps[(gaps >= 2) & (gaps <= (hi - lo) // (MIN_OCCURRENCES - 1))],
                             return_counts=True)
    cands = values[np.lexsort((values, -freq))][:MAX_CANDIDATES]  # most frequent gaps first
    best: tuple[tuple[float, int, float, int], int, np.ndarray] | None = None
    for n in cands.tolist():
        tol = 1 if n >= 10 else 0
        res = pos % n
        per_phase = np.bincount(res, minlength=n)
        if tol:
            per_phase = per_phase + np.roll(per_phase, 1) + np.roll(per_phase, -1)
        phases = np.argsort(-per_phase, kind="stable")[:MAX_PHASES]
        for r in phases[per_phase[phases] >= MIN_OCCURRENCES].tolist():
            d = (res - r) % n
            near = np.flatnonzero((d <= tol) | (d >= n - tol))
            slot = np.round((pos[near] - r) / n)
            order = np.argsort(-excess[near], kind="stable")
            _, first = np.unique(slot[order], return_index=True)
            hit = np.zeros(pos.size, dtype=bool)  # one spike per slot: the costliest
            hit[near[order[first]]] = True
            k = int(first.size)
            slots = _slots(measured, r, n, lo, hi, tol)
            if k < MIN_OCCURRENCES or slots <= 0 or k / slots < MIN_COVERAGE:
                continue
            big = excess >= 0.5 * np.median(excess[hit])
            chance = _chance(int((hit & big).sum()), slots, int(big.sum()), hi - lo + 1, tol)
            if chance > ALPHA:
                continue
            # the least likely by chance wins: every 50 over every 25 with 2 noise spikes in
            score = (min(-math.log10(max(chance, 1e-300)), 300.0), k, k / slots, -n)
            if best is None or score > best[0]:
                best = (score, n, hit)
    if best is None:
        return None
    return best[1], best[2]


def periodic_stalls(v: Valid, explained: np.ndarray, measured: np.ndarray | None = None
                    ) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Periodic stalls among the spikes not yet explained, and the positions they explain.

    The run's first step is never one: it holds the start-up (first batch, caches, workers)
    and would otherwise pose as the first of any period it happens to fall in. `measured`:
    the steps a stall could have been seen at (sorted; the valid steps when None).
    """
    used = explained.copy()
    found: list[dict[str, Any]] = []
    if v.steps.size == 0:
        return found, used
    lo, hi = int(v.steps[0]), int(v.steps[-1])
    startup = np.zeros(v.steps.size, dtype=bool)
    startup[0] = True
    measured = np.sort(v.steps) if measured is None else np.sort(measured)
    for _ in range(MAX_PERIODS):
        cand = np.flatnonzero(v.spikes.mask & ~used & ~startup)
        got = _best_period(v.steps[cand], v.spikes.excess_ms[cand], lo, hi, measured)
        if got is None:
            break
        n, hit = got
        idx = cand[hit]
        used[idx] = True
        big = idx[v.spikes.excess_ms[idx] > NESTED_FACTOR * np.median(v.spikes.excess_ms[idx])]
        inner = _best_period(v.steps[big], v.spikes.excess_ms[big], lo, hi, measured,
                             levels=False)
        if inner is not None and inner[0] % n == 0 and inner[0] > n:
            outer = big[inner[1]]
            found.append(_entry(v, outer, kind="periodic", every_steps=int(inner[0])))
            idx = np.setdiff1d(idx, outer)
        found.append(_entry(v, idx, kind="periodic", every_steps=int(n)))
    found.sort(key=lambda e: -e["cost_ms"])
    return found, used


def outliers(v: Valid, explained: np.ndarray, top: int = 10) -> dict[str, Any]:
    """Spikes nothing explains: count, cost, and the costliest few."""
    idx = np.flatnonzero(v.spikes.mask & ~explained)
    excess = v.spikes.excess_ms[idx]
    order = idx[np.argsort(-excess, kind="stable")[:top]]
    cost = float(excess.sum())
    return {
        "count": int(idx.size),
        "cost_ms": round(cost, 3),
        "share_of_wall": round(cost / v.wall_ms, 4) if v.wall_ms > 0 else 0.0,
        "largest": [{"step": int(v.steps[i]), "step_ms": round(float(v.step_ms[i]), 3),
                     "excess_ms": round(float(v.spikes.excess_ms[i]), 3)} for i in order],
    }
