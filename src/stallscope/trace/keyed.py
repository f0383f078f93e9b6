"""Rows matched by key on arrays: what pandas' `merge` and `map` did, without their fixed cost
per call (the model, the rules and the replay each join GPU work to its runtime call by
correlation id, on every rank file of a job)."""

from __future__ import annotations

import numpy as np


def first_match(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Per query, the position of the first row of `keys` holding it (-1: none); NaN keys and
    queries match nothing."""
    keys = np.asarray(keys, dtype=float)
    queries = np.asarray(queries, dtype=float)
    known = np.flatnonzero(~np.isnan(keys))
    ids, first = np.unique(keys[known], return_index=True)
    out = np.full(len(queries), -1, dtype=np.int64)
    if len(ids):
        at = np.minimum(np.searchsorted(ids, queries), len(ids) - 1)
        hit = ids[at] == queries
        out[hit] = known[first[at[hit]]]
    return out


def missing_last(codes: np.ndarray) -> np.ndarray:
    """Category codes as a sort key that puts the missing ones (-1) after every other, as
    pandas sorts and groups them. The key is int64 whatever the codes' width: codes are int8
    for a small table, where numpy 2.4 wraps the int64 maximum to -1 (sorting missing first)
    and numpy 2.5 raises OverflowError."""
    codes = np.asarray(codes).astype(np.int64)
    return np.where(codes < 0, np.iinfo(np.int64).max, codes)


def pick(values: np.ndarray, positions: np.ndarray, missing: object) -> np.ndarray:
    """`values[positions]`, with `missing` where a position is -1 (as from `first_match`)."""
    out = np.full(len(positions), missing, dtype=np.result_type(values, type(missing)))
    found = positions >= 0
    out[found] = values[positions[found]]
    return out


def inner_join(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs (left, right) with equal keys, in the order of an inner `merge`: left rows in
    order, each with its matches in right order. A NaN key matches nothing."""
    order = np.argsort(right, kind="stable")
    lo = np.searchsorted(right[order], left, side="left")
    n = np.searchsorted(right[order], left, side="right") - lo
    n[np.isnan(left)] = 0
    first = np.cumsum(n) - n
    offset = np.arange(int(n.sum())) - np.repeat(first, n)
    return np.repeat(np.arange(len(left)), n), order[np.repeat(lo, n) + offset]
