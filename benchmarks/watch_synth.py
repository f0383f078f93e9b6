"""Synthetic step series with known truths, for tests/test_watch_series.py and
benchmarks/bench_watch_detector.py: steady runs of several noise shapes, and the acceptance
cases of issue 34 (a loader that slows down, a periodic blocking save, epoch-start stalls).

Every generator takes a numpy Generator, so a case is reproduced by its seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NOISES = ("gaussian", "lognormal", "spiky", "busy", "ar1")


def noise(kind: str, n: int, rng: np.random.Generator, cv: float = 0.05) -> np.ndarray:
    """Multiplicative noise around 1: the shapes a steady step time takes.

    gaussian: symmetric, sd `cv`; lognormal: right-skewed, log sd 2 x cv; spiky: lognormal
    with 1% of steps 1.5-4x longer at random (GC, a noisy neighbour); busy: the same with 5%
    (a time slice lost to another process every 20 steps, as on the shared 2-core VM); ar1:
    gaussian with step-to-step memory (phi 0.7: thermal and frequency drift), the hardest for
    a detector that assumes independent steps.
    """
    if kind == "gaussian":
        return np.clip(1 + rng.normal(0, cv, n), 0.2, None)
    if kind == "lognormal":
        return np.exp(rng.normal(0, 2 * cv, n))
    if kind in ("spiky", "busy"):
        out = np.exp(rng.normal(0, cv, n))
        hit = rng.random(n) < (0.01 if kind == "spiky" else 0.05)
        out[hit] *= rng.uniform(1.5, 4.0, hit.sum())
        return out
    if kind == "ar1":
        phi = 0.7
        e = rng.normal(0, cv * np.sqrt(1 - phi**2), n)
        z = np.empty(n)
        z[0] = rng.normal(0, cv)
        for i in range(1, n):
            z[i] = phi * z[i - 1] + e[i]
        return np.clip(1 + z, 0.2, None)
    raise ValueError(kind)


def steady(n: int, rng: np.random.Generator, kind: str = "gaussian", step_ms: float = 100.0,
           wait_share: float = 0.03, cv: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(step_ms, loader_wait_ms) of a run with one regime."""
    step = step_ms * noise(kind, n, rng, cv)
    wait = np.minimum(step * wait_share * np.exp(rng.normal(0, 0.2, n)), step)
    return step, wait


def records(step: np.ndarray, wait: np.ndarray, epoch_len: int | None = None,
            t0: float = 1000.0) -> list[dict[str, Any]]:
    """The per-step dicts the command writes, with start times laid end to end."""
    starts = t0 + np.concatenate([[0.0], np.cumsum(step)[:-1]]) / 1e3
    out = []
    for i in range(step.size):
        rec: dict[str, Any] = {"step": i, "step_ms": float(step[i]),
                               "loader_wait_ms": float(wait[i]), "start_s": float(starts[i])}
        if epoch_len:
            rec["epoch"] = i // epoch_len
        out.append(rec)
    return out


def loader_slows(n: int, at: int, rng: np.random.Generator, kind: str = "gaussian",
                 extra_ms: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """From step `at` each batch takes `extra_ms` longer to arrive: the step grows by it, all
    of it loader wait (a dataset moved to slower storage, a cache that stopped fitting)."""
    step, wait = steady(n, rng, kind)
    bump = extra_ms * np.exp(rng.normal(0, 0.05, n - at))
    step[at:] += bump
    wait[at:] += bump
    return step, wait


def blocking_save(n: int, every: int, cost_ms: float, rng: np.random.Generator,
                  kind: str = "gaussian") -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A checkpoint written synchronously in the step after every `every` steps: the step,
    not the loader wait, grows. Returns the stalled steps as well."""
    step, wait = steady(n, rng, kind)
    hit = list(range(every - 1, n, every))
    step[hit] += cost_ms * np.exp(rng.normal(0, 0.1, len(hit)))
    return step, wait, hit


def epoch_starts(epochs: int, epoch_len: int, startup_ms: float, rng: np.random.Generator,
                 kind: str = "gaussian") -> tuple[np.ndarray, np.ndarray]:
    """Non-persistent workers: each epoch's first batch waits for the workers to start (loader
    wait), and the second waits a little for the prefetch queue to fill."""
    n = epochs * epoch_len
    step, wait = steady(n, rng, kind)
    for e in range(epochs):
        first = e * epoch_len
        cost = startup_ms * np.exp(rng.normal(0, 0.1))
        step[first] += cost
        wait[first] += cost
        step[first + 1] += 0.3 * cost
        wait[first + 1] += 0.3 * cost
    return step, wait
