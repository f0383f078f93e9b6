"""Per-group sums on arrays, with the bits pandas' groupby sum gives.

The rules once summed with `DataFrame.groupby(...).sum()`; on the small frames of a rank file
its fixed cost per call dominated, so they now sum on arrays. To keep every figure of the
report unchanged, the sums follow pandas 3's two ways of adding: `np.add.reduceat` over the
runs when the group labels never decrease and no value is NaN, else its compensated (Kahan)
running sum in row order, NaN skipped. (The two differ in the last bit: which one applies
depends on the row order, as it did under pandas.) Where every partial sum is exact
(`exact_sums`), the order does not matter and `np.bincount` gives the same bits.
"""

from __future__ import annotations

import numpy as np


def group_sums(values: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    """Sum of `values` per label 0..n-1 (label -1: dropped), as pandas' groupby sum."""
    values = np.asarray(values, dtype=np.float64)
    labels = np.asarray(labels)
    out = np.zeros(n)
    if len(values) == 0:
        return out
    if not np.isnan(values).any() and bool((labels[1:] >= labels[:-1]).all()):
        lead = int(np.searchsorted(labels, 0))
        runs_of = labels[lead:]
        if len(runs_of):
            runs = np.flatnonzero(np.r_[True, runs_of[1:] != runs_of[:-1]])
            out[runs_of[runs]] = np.add.reduceat(values[lead:], runs)
        return out
    sums, comp = [0.0] * n, [0.0] * n
    for g, v in zip(labels.tolist(), values.tolist(), strict=True):
        if g < 0 or v != v:
            continue
        y = v - comp[g]
        t = sums[g] + y
        c = t - sums[g] - y
        comp[g] = 0.0 if c != c else c  # an infinity makes it NaN: pandas resets it
        sums[g] = t
    return np.array(sums, dtype=np.float64)


def exact_sums(values: np.ndarray) -> bool:
    """Whether every sum of any of `values`, in any order, is exact in float64: all are whole
    multiples of 1/1024 and their magnitudes sum below 2**53 of those (trace times in whole
    microseconds are). Then a bincount gives the same bits as pandas' compensated groupby
    sum, which the totals were summed with before."""
    scaled = values * 1024.0
    with np.errstate(invalid="ignore"):
        whole = bool((scaled == np.floor(scaled)).all())
    return whole and float(np.abs(scaled).sum()) < 2.0**53
