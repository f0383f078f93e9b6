"""`group_sums` gives pandas' groupby sums bit for bit: the rules moved off pandas for speed
and every figure of the report must stay what it was (a pandas upgrade that changes how its
groupby adds would show here first)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallscope.trace.grouped import exact_sums, group_sums


def _pandas(values: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    keys = pd.Series(np.where(labels >= 0, labels, np.nan))  # -1: no group, as NaN keys
    sums = pd.Series(values).groupby(keys).sum()
    out = np.zeros(n)
    out[sums.index.to_numpy(dtype=np.int64)] = sums.to_numpy()
    return out


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
@pytest.mark.parametrize("odd", ["none", "nan", "inf", "missing-label"])
def test_group_sums_match_pandas_bit_for_bit(order: str, odd: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        size, n = int(rng.integers(1, 400)), int(rng.integers(1, 12))
        # Trace-like durations: microseconds with fractions, spanning orders of magnitude.
        values = rng.random(size) * 10.0 ** rng.integers(-2, 7, size)
        labels = rng.integers(0, n, size)
        if order == "sorted":
            labels = np.sort(labels)
        if odd == "nan":
            values[rng.random(size) < 0.1] = np.nan
        elif odd == "inf":
            values[rng.integers(0, size)] = np.inf
        elif odd == "missing-label":
            labels = np.where(rng.random(size) < 0.1, -1, labels)
            if order == "sorted":
                labels = np.sort(labels)
        ours, theirs = group_sums(values, labels, n), _pandas(values, labels, n)
        assert ours.tobytes() == theirs.tobytes(), (ours, theirs)


def test_exact_sums_are_whole_microsecond_like_values_only() -> None:
    assert exact_sums(np.array([1.0, 2.5, 1e6, 0.125]))
    assert not exact_sums(np.array([0.1, 0.2]))
    assert not exact_sums(np.array([2.0**52, 2.0**52]))


@pytest.mark.parametrize("odd", ["none", "nan", "inf", "missing-label"])
def test_many_small_groups_in_row_order_match_pandas_bit_for_bit(odd: str) -> None:
    """Timeline pieces: hundreds of thousands of rows in small groups, labels not in order
    (the sum is taken group by group in rounds there, not row by row)."""
    rng = np.random.default_rng(11)
    size, n = 60_000, 9_000
    values = rng.random(size) * 10.0 ** rng.integers(-2, 7, size)
    labels = rng.integers(0, n, size)
    if odd == "nan":
        values[rng.random(size) < 0.1] = np.nan
    elif odd == "inf":
        values[rng.integers(0, size, 5)] = np.inf
    elif odd == "missing-label":
        labels = np.where(rng.random(size) < 0.1, -1, labels)
    ours, theirs = group_sums(values, labels, n), _pandas(values, labels, n)
    assert ours.tobytes() == theirs.tobytes()
