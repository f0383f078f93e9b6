"""`inner_join` and `first_match` give what pandas' merge and first-row lookup gave: the model
joins copies to their calls and the replay launches to their kernels with them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.trace.keyed import first_match, inner_join, pick


def test_inner_join_pairs_rows_in_merge_order_with_duplicates_and_nan() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        left = rng.integers(0, 8, int(rng.integers(0, 30))).astype(float)
        right = rng.integers(0, 8, int(rng.integers(0, 30))).astype(float)
        left[rng.random(len(left)) < 0.1] = np.nan
        right[rng.random(len(right)) < 0.1] = np.nan
        merged = (pd.DataFrame({"k": left, "li": np.arange(len(left))})
                  .dropna(subset=["k"])
                  .merge(pd.DataFrame({"k": right, "ri": np.arange(len(right))}).dropna(), on="k"))
        li, ri = inner_join(left, right)
        assert li.tolist() == merged["li"].tolist()
        assert ri.tolist() == merged["ri"].tolist()


def test_first_match_finds_the_first_row_of_each_key_and_pick_fills_the_rest() -> None:
    keys = np.array([5.0, np.nan, 3.0, 5.0, 3.0])
    queries = np.array([3.0, 5.0, 4.0, np.nan, 9.0])
    found = first_match(keys, queries)
    assert found.tolist() == [2, 0, -1, -1, -1]
    assert pick(np.array([10, 11, 12, 13, 14]), found, -1).tolist() == [12, 10, -1, -1, -1]
    # Nothing to look up in: every query is missing, and pick does not index the empty array.
    assert first_match(np.array([]), queries).tolist() == [-1] * 5
    assert np.isnan(pick(np.array([]), np.full(2, -1), np.nan)).all()
