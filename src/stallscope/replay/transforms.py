"""Edits a fix makes to a graph: selecting nodes and ops by what they are, then shortening,
scaling or unblocking them. Each function changes the graph it is given (pass a copy)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.replay.graph import CALL, Graph
from stallscope.trace.intervals import enclosing


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

