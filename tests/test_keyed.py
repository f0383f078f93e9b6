"""`inner_join` and `first_match` give what pandas' merge and first-row lookup gave: the model
joins copies to their calls and the replay launches to their kernels with them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.diagnose.rules.single_tensor_optimizer import _outermost
from stallscope.trace.keyed import first_match, inner_join, missing_last, pick


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


def test_missing_codes_sort_last_even_when_the_codes_are_int8() -> None:
    # A small table's category codes are int8: the int64 maximum must not wrap to -1 (numpy
    # 2.4, missing threads sorted first) or overflow (numpy 2.5: `run` died on a real H200
    # trace with "Python integer 9223372036854775807 out of bounds for int8").
    codes = np.array([-1, 3, 0, -1, 127], dtype=np.int8)
    key = missing_last(codes)
    assert key.dtype == np.int64
    assert np.argsort(key, kind="stable").tolist() == [2, 1, 4, 0, 3]


def test_optimizer_ranges_of_a_missing_thread_come_after_the_known_threads() -> None:
    tid = np.array([-1, 0, 1], dtype=np.int8)
    ts = np.array([0.0, 10.0, 20.0])
    end = ts + 5.0
    assert _outermost(tid, ts, end).tolist() == [1, 2, 0]
