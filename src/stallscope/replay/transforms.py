"""Edits a fix makes to a graph: selecting nodes and ops by what they are, then shortening,
scaling or unblocking them. Each function changes the graph it is given in place: pass a copy
that owns the arrays it names (`Graph.copy(*UNBLOCKS)`, say)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.replay.graph import CALL, RESUME, Graph
from stallscope.trace.intervals import enclosing

# The arrays each edit writes in place: what the copy it is given must own.
UNBLOCKS = ("h_dur", "h_wait", "h_after", "h_ret")
SCALES_HOST = ("h_dur",)
SCALES_GPU = ("g_dur",)
REMOVES_GPU = ("g_dur", "g_gap")
TIGHTENS = ("g_gap",)
OVERLAPS = ("g_dur", "g_lat", "g_anchor", "g_cross", "g_cgap")
JOINS = ("h_release", "h_delay", "h_lead")


def within(g: Graph, ranges: pd.DataFrame) -> np.ndarray:
    """Host nodes that ran inside one of `ranges` (columns tid, ts, end) on the same thread."""
    out = np.zeros(len(g.h_ts), dtype=bool)
    if ranges.empty:
        return out
    tids = ranges["tid"].astype(str).to_numpy()
    for t_index, tid in enumerate(g.thread_ids):
        mine = ranges[tids == tid]
        nodes = np.flatnonzero(g.h_thread == t_index)
        if mine.empty or not len(nodes):
            continue
        inner, _ = enclosing(mine["ts"].to_numpy(dtype=float), mine["end"].to_numpy(dtype=float),
                             g.h_ts[nodes], g.h_rec_end[nodes])
        out[nodes[inner >= 0]] = True
    return out


def launched_by(g: Graph, nodes: np.ndarray) -> np.ndarray:
    """GPU ops whose launch call is one of the selected host nodes."""
    has = g.g_launch >= 0
    out = np.zeros(len(g.g_ts), dtype=bool)
    out[has] = nodes[g.g_launch[has]]
    return out


def unblock(g: Graph, nodes: np.ndarray) -> None:
    """The selected calls no longer wait for the GPU: they take their name's typical time."""
    calls = nodes & (g.h_kind == CALL)
    g.h_dur[calls] = np.minimum(g.h_dur[calls], g.h_typical[calls])
    g.h_wait[nodes] = -1
    g.h_after[nodes] = -1
    g.h_ret[nodes] = 0.0


def scale_host(g: Graph, nodes: np.ndarray, factor: float) -> None:
    """The selected host nodes take `factor` times their time (their waits are kept)."""
    g.h_dur[nodes] *= factor


def scale_gpu(g: Graph, ops: np.ndarray, factor: float) -> None:
    """The selected GPU ops take `factor` times their time."""
    g.g_dur[ops] *= factor


def remove_gpu(g: Graph, ops: np.ndarray) -> None:
    """The selected GPU ops no longer run (their slot on the stream takes no time)."""
    g.g_dur[ops] = 0.0
    g.g_gap[ops] = 0.0


def tighten_streams(g: Graph, ops: np.ndarray, gap_us: float) -> None:
    """The selected ops follow their predecessor after at most `gap_us` (one graph launch
    instead of one launch each)."""
    g.g_gap[ops] = np.minimum(g.g_gap[ops], gap_us)


def chains(g: Graph, member: np.ndarray) -> np.ndarray:
    """Chain id of each GPU op, -1 for ops in none: runs of selected ops that follow each other
    on one stream with nothing else between them, launched from one host thread in one step
    (the kernels of one op region between two GEMM/conv kernels, say)."""
    n = len(g.g_ts)
    out = np.full(n, -1)
    if not n or not member.any():
        return out
    thread = np.where(g.g_launch >= 0, g.h_thread[np.clip(g.g_launch, 0, None)], -1)
    prev = np.r_[-1, np.arange(n - 1)]
    same = np.r_[False, (g.g_stream[1:] == g.g_stream[:-1]) & (thread[1:] == thread[:-1])
                 & (g.g_step[1:] == g.g_step[:-1])]
    starts = member & ~(same & member[np.clip(prev, 0, None)])
    ids = np.cumsum(starts) - 1
    out[member] = ids[member]
    return out

def overlap_collectives(g: Graph, bucketed: np.ndarray, prefetched: np.ndarray,
                        hide: np.ndarray, wait: np.ndarray, bucket_us: float) -> int:
    """Collectives start as soon as their inputs are ready instead of when the host launched
    them; how many were moved.

    `bucketed` (gradient all-reduce / reduce-scatter) are released through the step's `hide`
    (backward compute) ops: the gradients a collective carries are ready in step with backward
    (its share of the step's collective time), and one that takes longer than a bucket
    (`bucket_us`) is sent bucket by bucket as they fill, so it starts when its first bucket is
    ready, or early enough to end one bucket after its last gradient, whichever is later (one
    op stands for its buckets; see `_release`). `prefetched`
    (all-gathers) start when the compute before the previous all-gather of their stream ended
    (one ahead). A collective is never moved later than it ran. `wait` (per op, time spent
    waiting for slower ranks) leaves each collective and is added to the step's last one: the
    optimizer still waits for the slowest rank."""
    g.g_launch = g.g_launch.copy()  # shared between copies: what a fix may change is copied
    freed = np.zeros(len(g.g_ts), dtype=bool) if g.g_moved is None else g.g_moved.copy()
    end = g.g_ts + g.g_dur
    moved = 0
    for s in range(g.steps):
        in_step = g.g_step == s
        ops = np.flatnonzero(in_step & (bucketed | prefetched))
        if not len(ops):
            continue
        ops = ops[np.argsort(g.g_ts[ops], kind="stable")]
        w = wait[ops]
        g.g_dur[ops] -= w
        g.g_dur[ops[-1]] += w.sum()
        back = np.flatnonzero(in_step & hide)
        back = back[np.argsort(g.g_ts[back], kind="stable")]
        targets = np.full(len(ops), -1)
        late = bucketed[ops] & (len(back) > 0)
        if late.any():
            compute = float(g.g_dur[back].sum())
            share = _release(g.g_dur[ops[late]], compute, bucket_us)
            done = np.cumsum(g.g_dur[back]) / max(compute, 1e-9)
            k = np.clip(np.searchsorted(done, share - 1e-12, side="left"), 0, len(back) - 1)
            targets[late] = back[k]
        targets[prefetched[ops]] = _one_ahead(g, ops, prefetched)[prefetched[ops]]
        # -2: nothing to wait for but the all-gather before it on its stream.
        ok = (targets == -2) | ((targets >= 0) & (end[np.clip(targets, 0, None)] < g.g_ts[ops]))
        c, tgt = ops[ok], targets[ok]
        g.g_launch[c] = -1
        g.g_lat[c] = 0.0
        g.g_anchor[c] = -np.inf
        g.g_cross[c] = np.maximum(tgt, -1)
        g.g_cgap[c] = 0.0
        freed[c] = True
        moved += len(c)
    g.g_moved = freed
    return moved


def _release(t: np.ndarray, compute: float, bucket_us: float) -> np.ndarray:
    """Per collective (transfer times `t`, in order), the share of the backward compute
    (`compute` us) by whose end it may start. It carries the gradients from share a to b
    (cumulative shares of the collective time); sent as buckets of `bucket_us`, its first
    bucket is ready at a + (bucket/t)(b - a), and it ends no sooner than one bucket after b:
    as one op of length t it starts at the later of those, b - (t - bucket) / compute."""
    total = max(float(t.sum()), 1e-9)
    b = np.cumsum(t) / total
    a = b - t / total
    tail = np.minimum(t, bucket_us)
    first = a + np.divide(tail, t, out=np.ones_like(t), where=t > 0) * (b - a)
    return np.clip(np.maximum(first, b - (t - tail) / max(compute, 1e-9)), 0.0, 1.0)


def _one_ahead(g: Graph, ops: np.ndarray, prefetched: np.ndarray) -> np.ndarray:
    """For each all-gather in `ops` (one step's collectives, time order), the last op on
    another stream of its device that ended before the previous all-gather of its stream
    started (-2 when none did: it may follow that all-gather at once); -1 for the first."""
    out = np.full(len(ops), -1)
    end = g.g_ts + g.g_dur
    step = np.flatnonzero(g.g_step == g.g_step[ops[0]])
    step = step[np.argsort(end[step], kind="stable")]
    ends = end[step]
    last: dict[int, int] = {}  # stream -> its previous all-gather
    for i, op in enumerate(ops.tolist()):
        if not prefetched[op]:
            continue
        prev = last.get(int(g.g_stream[op]))
        last[int(g.g_stream[op])] = op
        if prev is None:
            continue
        k = int(np.searchsorted(ends, g.g_ts[prev], side="right"))
        cand = step[:k]
        cand = cand[(g.g_device[cand] == g.g_device[op]) & (g.g_stream[cand] != g.g_stream[op])]
        out[i] = cand[-1] if len(cand) else -2
    return out


def join_after(g: Graph, issuers: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """A thread that sat idle while another thread (one holding `issuers`: the autograd thread
    that issued the collectives) ran, and resumed after it ended, waited for it (the join at
    the end of backward). `start`/`end`: the host nodes' times replayed on `g` as it is. The
    resumed node now starts that other thread's last node's end plus the slack it had in that
    replay, instead of after a fixed idle time: the join adds nothing to `g`'s own replay, and
    whatever the change then takes off the other thread reaches the waiting one. How many joins
    were added."""
    threads = np.unique(g.h_thread[issuers])
    heads = np.flatnonzero((g.h_kind == RESUME) & (g.h_release < 0) & (g.h_lead > 0))
    added = 0
    pool = np.flatnonzero(np.isin(g.h_thread, threads))
    pool = pool[np.argsort(end[pool], kind="stable")]
    for n in heads:
        window = pool[np.searchsorted(end[pool], start[n] - g.h_lead[n], side="left"):
                      np.searchsorted(end[pool], start[n], side="right")]
        other = window[(g.h_thread[window] != g.h_thread[n])
                       & (g.h_rec_end[window] <= g.h_ts[n])]
        if not len(other):
            continue
        m = other[np.argmax(end[other])]
        g.h_release[n] = m
        g.h_delay[n] = start[n] - end[m]
        g.h_lead[n] = 0.0
        added += 1
    return added
