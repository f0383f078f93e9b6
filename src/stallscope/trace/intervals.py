"""Vectorised interval arithmetic over a shared time axis.

The model needs exclusive breakdowns ("this microsecond counts as data loading, not as sync"),
overlaps ("loader time during which no GPU works") and per-step sums. All of them reduce to one
idea: cut the time axis at every interval boundary into elementary segments, mark which layers
cover each segment, then sum segment lengths with numpy. No per-event Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Timeline:
    """Elementary segments of a time axis: `edges[i]..edges[i+1]` is segment i."""

    edges: np.ndarray

    @classmethod
    def from_intervals(cls, *groups: tuple[np.ndarray, np.ndarray]) -> Timeline:
        points = [np.asarray(a, dtype=np.float64) for s, e in groups for a in (s, e)]
        edges = np.unique(np.concatenate(points)) if points else np.empty(0)
        return cls(edges)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.edges)

    @property
    def starts(self) -> np.ndarray:
        return self.edges[:-1]

    def cover(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Boolean mask of the segments covered by at least one of the intervals."""
        n = max(len(self.edges) - 1, 0)
        if n == 0 or len(starts) == 0:
            return np.zeros(n, dtype=bool)
        lo = np.searchsorted(self.edges, np.asarray(starts, dtype=np.float64), side="left")
        hi = np.searchsorted(self.edges, np.asarray(ends, dtype=np.float64), side="left")
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, lo, 1)
        np.add.at(delta, hi, -1)
        return np.cumsum(delta[:-1]) > 0

    def bucket(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Index of the (non-overlapping) window holding each segment, -1 outside all windows."""
        n = max(len(self.edges) - 1, 0)
        seg = self.starts
        idx = np.searchsorted(np.asarray(starts, dtype=np.float64), seg, side="right") - 1
        inside = idx >= 0
        inside[inside] &= seg[inside] < np.asarray(ends, dtype=np.float64)[idx[inside]]
        out = np.full(n, -1, dtype=np.int64)
        out[inside] = idx[inside]
        return out

    def sum_by(self, mask: np.ndarray, buckets: np.ndarray, n_buckets: int) -> np.ndarray:
        """Covered length per window: sum of segment lengths where `mask`, grouped by bucket."""
        keep = mask & (buckets >= 0)
        return np.bincount(buckets[keep], weights=self.lengths[keep], minlength=n_buckets)[
            :n_buckets
        ]


def exclusive(masks: list[np.ndarray]) -> list[np.ndarray]:
    """Give each segment to the first mask (in priority order) that covers it."""
    taken = np.zeros_like(masks[0]) if masks else np.zeros(0, dtype=bool)
    out = []
    for m in masks:
        mine = m & ~taken
        out.append(mine)
        taken |= m
    return out


def enclosing(
    starts: np.ndarray, ends: np.ndarray, q_starts: np.ndarray, q_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Innermost and outermost interval containing each query, as indices (-1: none).

    The intervals are one thread's ranges, which nest like a call stack. Each range's parent
    is found per nesting depth with searchsorted, then a query climbs from the last range that
    starts before it to the first ancestor that also ends after it: O((n + q) log n + q * depth)
    in numpy, where a pairwise containment test would be O(n * q).
    """
    n, q = len(starts), len(q_starts)
    inner = np.full(q, -1, dtype=np.int64)
    outer = np.full(q, -1, dtype=np.int64)
    if n == 0 or q == 0:
        return inner, outer
    order = np.lexsort((-ends, starts))  # by start; an enclosing range before what it encloses
    s, e = starts[order], ends[order]
    pos = np.arange(n)
    depth = pos - np.searchsorted(np.sort(e), s, side="right")  # ranges still open at s[i]
    parent = np.full(n, -1, dtype=np.int64)
    root = pos.copy()
    for d in np.unique(depth[depth > 0]):
        up = np.flatnonzero(depth == d - 1)
        mine = np.flatnonzero(depth == d)
        k = np.searchsorted(up, mine) - 1
        ok = k >= 0
        parent[mine[ok]] = up[k[ok]]
        root[mine[ok]] = root[up[k[ok]]]  # depths ascend, so the parent's root is final
    cur = np.searchsorted(s, q_starts, side="right") - 1
    for _ in range(int(depth.max()) + 2):
        climb = (cur >= 0) & (e[np.clip(cur, 0, None)] < q_ends)
        if not climb.any():
            break
        cur[climb] = parent[cur[climb]]
    found = cur >= 0
    inner[found] = order[cur[found]]
    top = root[cur[found]]
    contains = e[top] >= q_ends[found]  # a root always does when the ranges nest properly
    outer[np.flatnonzero(found)[contains]] = order[top[contains]]
    outer[np.flatnonzero(found)[~contains]] = order[cur[found][~contains]]
    return inner, outer
