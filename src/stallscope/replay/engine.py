"""Replay a dependency graph: when would each node have run, given its durations and edges.

Host nodes are grouped into segments: runs of a thread's nodes that nothing outside the thread
holds back (a segment starts at a release or a wait, and a wait is a segment of its own). Only
segment heads are visited one by one, in recorded order, which is a valid order because every
edge points back in recorded time; the nodes inside a segment follow at fixed offsets. A GPU
stream is resolved lazily, when a host wait or the end needs it, in chunks computed at once:
on a chain whose ops are released at r and take d after a gap g, the ends are
C + max(carry, running max of (r + d - C)), with C the running sum of g + d. The Python work is
per segment and per chunk, not per event.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallscope.replay.graph import Graph

# Stream chunks up to this many ops are replayed op by op in Python.
SMALL_CHUNK = 8


@dataclass
class Replay:
    """Replayed times (same time axis as the trace) and the step durations they give."""

    step_us: np.ndarray
    host_start: np.ndarray
    host_end: np.ndarray
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    # Per step, the latest end of the GPU ops recorded in it (NaN when it has none).
    gpu_done: np.ndarray | None = None
    # The first step's GPU time: from its start to gpu_done[0], less the recorded tail.
    gpu_first_us: float = np.nan
    # Per step, the busiest device's busy time (union) over the ops it launched, as replayed
    # or as recorded (`kept_need`), whichever is more: the time the step cannot take less than
    # once steps follow each other (0 when it has none). Work that runs past the step's end is
    # still the step's: in a steady run each step's GPU work fits in one step's time.
    gpu_need: np.ndarray | None = None

    @property
    def paced_step_us(self) -> np.ndarray:
        """Each step as long as the slowest of: the host's step; the time the GPU took to
        finish this step's work after the previous step's (for the first step, after the step
        began, less the GPU tail the recording itself ran past the step's end); and the step's
        own GPU work (`gpu_need`). A host that no longer waits (sync=off, non_blocking) runs
        ahead of a busy GPU and its own steps shrink, but the queue then grows every step, and
        a single step (an inference call) is not done before its GPU work is: the time a user
        measures is the GPU's."""
        steps = self.step_us
        if self.gpu_done is not None and len(steps):
            period = np.concatenate([[self.gpu_first_us], np.diff(self.gpu_done)])
            steps = np.fmax(steps, period)
        if self.gpu_need is not None and len(steps):
            steps = np.fmax(steps, self.gpu_need)
        return steps


class ReplayOrderError(RuntimeError):
    """The recorded dependencies cannot be replayed in any order (a cycle: two events with
    one correlation id, a launch recorded after the sync that waits for its work). Only a
    damaged or hand-edited trace does this; the plan then says so and predicts nothing."""


def replay(graph: Graph) -> Replay:
    """Replay `graph` as it stands (a fix changes the graph first)."""
    try:
        return _Run(graph).go()
    except RecursionError:  # resolving a stream re-entered itself: a dependency cycle
        raise ReplayOrderError("replay order: the recorded dependencies form a cycle") from None


class _Run:
    def __init__(self, g: Graph) -> None:
        self.g = g
        n = len(g.h_ts)
        first = np.concatenate([[True], g.h_thread[1:] != g.h_thread[:-1]]) if n else \
            np.zeros(0, bool)
        waits = (g.h_wait >= 0) | (g.h_after >= 0)
        after_wait = np.concatenate([[False], waits[:-1]]) if n else np.zeros(0, bool)
        head = first | (g.h_release >= 0) | waits | after_wait
        self.seg = np.cumsum(head) - 1
        self.heads = np.flatnonzero(head)
        step = np.concatenate([[0.0], g.h_dur[:-1]]) + g.h_lead
        step[head] = 0.0
        run = np.cumsum(step)
        self.offset = run - run[self.heads][self.seg] if n else run
        last = np.concatenate([self.heads[1:] - 1, [n - 1]]) if n else self.heads
        self.seg_len = self.offset[last] + g.h_dur[last]
        self.wait_seg = waits[self.heads]
        nseg = len(self.heads)
        # seg_done: the segment's start is known (its end too, unless it is still waiting).
        self.seg_start = np.full(nseg, np.nan)
        self.seg_end = np.full(nseg, np.nan)
        # GPU streams: contiguous ranges of ops
        m = len(g.g_ts)
        bounds = np.flatnonzero(np.concatenate([[True], g.g_stream[1:] != g.g_stream[:-1]])) \
            if m else np.zeros(0, np.int64)
        self.s_first = bounds
        self.s_end = np.concatenate([bounds[1:], [m]]) if m else bounds
        self.s_of = {int(g.g_stream[b]): i for i, b in enumerate(bounds)}
        self.done = self.s_first.copy()  # per stream: ops before this index are resolved
        self.gpu_start = np.full(m, np.nan)
        self.gpu_end = np.full(m, np.nan)
        # The ops that wait on another stream, in order: a chunk ends at the next one after it.
        self.crossing = np.flatnonzero(g.g_cross >= 0).tolist()
        self.launch_seg = np.where(g.g_launch >= 0, self.seg[np.clip(g.g_launch, 0, None)], -1) \
            if m and n else np.full(m, -1)
        self.seg_done = np.zeros(nseg, dtype=bool)
        self.launch_off = (self.offset[np.clip(g.g_launch, 0, None)] + g.g_lat) if m and n \
            else np.zeros(m)

    # -- host

    def node_start(self, nodes: np.ndarray) -> np.ndarray:
        return self.seg_start[self.seg[nodes]] + self.offset[nodes]

    def node_end(self, node: int) -> float:
        s = self.seg[node]
        end = float(self.seg_end[s]) if self.wait_seg[s] else float(
            self.seg_start[s] + self.offset[node] + self.g.h_dur[node])
        if end != end:  # NaN: max() would drop it without a word
            raise ReplayOrderError("replay order: a release was not resolved before its node")
        return end

    # -- GPU

    def gpu_end_of(self, op: int) -> float:
        if np.isnan(self.gpu_end[op]):
            self.resolve(op)
        return float(self.gpu_end[op])

    def resolve(self, op: int) -> None:
        """Resolve `op`'s stream up to and including `op`."""
        g = self.g
        si = self.s_of[int(g.g_stream[op])]
        while self.done[si] <= op:
            i = int(self.done[si])
            k = bisect.bisect_right(self.crossing, i)
            j = min(self.crossing[k] if k < len(self.crossing) else len(g.g_ts),
                    int(self.s_end[si]))
            if j - op - 1 > SMALL_CHUNK:  # go on past `op` while the launches are known
                ls = self.launch_seg[op + 1 : j]
                pending = np.flatnonzero((ls >= 0) & ~self.seg_done[np.clip(ls, 0, None)])
                if len(pending):
                    j = op + 1 + int(pending[0])
            elif j > op + 1:  # a few ops: look one by one
                seg_done = self.seg_done
                for q, s in enumerate(self.launch_seg[op + 1 : j].tolist(), op + 1):
                    if s >= 0 and not seg_done[s]:
                        j = q
                        break
            self._chunk(si, i, j)
            self.done[si] = j

    def _chunk(self, si: int, i: int, j: int) -> None:
        if j - i <= SMALL_CHUNK:
            self._small_chunk(si, i, j)
            return
        g = self.g
        ops = np.arange(i, j)
        release = g.g_anchor[ops].copy()
        launched = g.g_launch[ops] >= 0
        if launched.any():
            starts = self.node_start(g.g_launch[ops[launched]])
            if np.isnan(starts).any():
                raise ReplayOrderError("replay order: a launch was not resolved before its op")
            release[launched] = np.maximum(release[launched], starts + g.g_lat[ops[launched]])
        if g.g_cross[i] >= 0:
            release[0] = max(release[0], self.gpu_end_of(int(g.g_cross[i])) + g.g_cgap[i])
        carry = self.gpu_end[i - 1] if i > self.s_first[si] else -np.inf
        dur = g.g_dur[ops]
        inc = g.g_gap[ops] + dur
        c = np.cumsum(inc)
        end = c + np.maximum(carry, np.maximum.accumulate(release + dur - c))
        self.gpu_end[ops] = end
        self.gpu_start[ops] = end - dur

    def _small_chunk(self, si: int, i: int, j: int) -> None:
        """The same recurrence, op by op: a few ops cost less in Python than in numpy calls
        (the chunk's slices are read as plain lists, which index much faster)."""
        g = self.g
        seg_start, seg_done = self.seg_start, self.seg_done
        prev = float(self.gpu_end[i - 1]) if i > self.s_first[si] else -np.inf
        rows = zip(g.g_anchor[i:j].tolist(), self.launch_seg[i:j].tolist(),
                   self.launch_off[i:j].tolist(), g.g_gap[i:j].tolist(),
                   g.g_dur[i:j].tolist(), strict=True)
        cross = int(g.g_cross[i])
        for k, (start, s, off, gap, dur) in enumerate(rows, i):
            if s >= 0:
                if not seg_done[s]:
                    raise ReplayOrderError("replay order: a launch was not resolved before its op")
                start = max(start, float(seg_start[s]) + off)
            if k == i and cross >= 0:
                start = max(start, self.gpu_end_of(cross) + float(g.g_cgap[i]))
            start = max(start, prev + gap)
            prev = start + dur
            self.gpu_start[k], self.gpu_end[k] = start, prev

    # -- the whole replay

    def go(self) -> Replay:
        g = self.g
        heads = self.heads
        # Recorded order; at one instant, a released node after the rest (its releaser may have
        # ended exactly then).
        order = np.lexsort((heads, g.h_release[heads] >= 0, g.h_ts[heads]))
        last_end = g.thread_origin.astype(float).copy()
        seen = np.zeros(len(last_end), dtype=bool)
        for s in order:
            h = int(heads[s])
            t = int(g.h_thread[h])
            start = (last_end[t] if seen[t] else g.thread_origin[t]) + g.h_lead[h]
            r = int(g.h_release[h])
            if r >= 0:
                start = max(start, self.node_end(r) + g.h_delay[h])
            # Started: what it launches at its start may be what it waits for (a blocking copy
            # waits for its own copy).
            self.seg_start[s], self.seg_done[s] = start, True
            end = start + self.seg_len[s]
            if self.wait_seg[s]:
                w = int(g.h_wait[h])
                if w >= 0:
                    end = max(end, self.gpu_end_of(w) + g.h_ret[h])
                a = int(g.h_after[h])
                if a >= 0:
                    end = max(end, self.node_end(a) + g.h_ret[h])
            self.seg_end[s] = end
            last_end[t], seen[t] = end, True
        for si in range(len(self.s_first)):
            if self.done[si] < self.s_end[si]:
                self.resolve(int(self.s_end[si]) - 1)
        host_start = self.node_start(np.arange(len(g.h_ts)))
        host_end = host_start + g.h_dur
        wait_heads = heads[self.wait_seg]
        host_end[wait_heads] = self.seg_end[self.wait_seg]
        steps = host_start[g.step_end] - host_start[g.step_start]
        done = _gpu_done(g, self.gpu_end, len(steps))
        tail = _tails(g, len(steps))
        first = float(done[0] - host_start[g.step_start[0]] - tail[0]) if len(steps) else np.nan
        need = np.fmax(gpu_need(g, self.gpu_start, self.gpu_end, len(steps)),
                       kept_need(g, len(steps)))
        return Replay(steps, host_start, host_end, self.gpu_start, self.gpu_end, done, first,
                      need)


def _tails(g: Graph, n: int) -> np.ndarray:
    """Per recorded step, the GPU work it let run past its end (prof.step() is called when the
    host is done, not the GPU). The first replayed step may leave as much (`gpu_first_us`),
    so the unchanged graph replays to the recorded first step."""
    if not n:
        return np.zeros(0)
    ends = g.g_ts + g.g_dur
    return np.nan_to_num(np.fmax(_gpu_done(g, ends, n) - g.h_ts[g.step_end[:n]], 0.0))


def _in_step(g: Graph, n: int) -> np.ndarray:
    """Per GPU op, the step (among the first `n`) that launched it (graph.py `g_step`), else
    -1; work queued before the recording is no step's own."""
    own = g.g_step < n if g.g_queued is None else (g.g_step < n) & ~g.g_queued
    return np.where(own, g.g_step, -1)


def kept_need(g: Graph, n: int) -> np.ndarray:
    """`gpu_need` with each op where the recording ran it, for as long as it now takes: the
    overlaps of the step's work as recorded. A change that moves launches (CUDA graphs, no
    host sync) leaves work on other streams as concurrent as it was, so the step's GPU work
    is no less than this; only a change that frees ops from their recorded place
    (`Graph.g_moved`: collectives overlapped with compute) lets them overlap more."""
    keep = None if g.g_moved is None else ~g.g_moved
    return gpu_need(g, g.g_ts, g.g_ts + g.g_dur, n, keep)


def gpu_need(g: Graph, start: np.ndarray, end: np.ndarray, n: int,
             keep: np.ndarray | None = None) -> np.ndarray:
    """Per step, the busiest device's busy time (the union of its ops' [start, end)) over the
    ops the step launched (`_in_step`; those of `keep`, if given), at their replayed times: a
    fix that moves the work keeps it in its step, so the step's GPU work is never lost from
    it."""
    need = np.zeros(n)
    step = _in_step(g, n)
    ok = (step >= 0) & ~np.isnan(start) & ~np.isnan(end)
    if keep is not None:
        ok &= keep
    if not n or not ok.any():
        return need
    # The codes number the devices differently from a factorize of these ops alone, but the
    # groups, their ops' order within each and so every sum and maximum below are the same.
    codes = g.g_device_code if g.g_device_code is not None else \
        pd.factorize(g.g_device.astype(str))[0]
    dev = codes[ok]
    s, e, k = start[ok], end[ok], step[ok]
    order = np.lexsort((s, k, dev))
    s, e, k, dev = s[order], e[order], k[order], dev[order]
    group = dev * n + k
    new = np.r_[True, group[1:] != group[:-1]]
    # The busy union of each group: each op adds what lies past the latest end before it.
    firsts = np.flatnonzero(new)
    prev = np.empty(len(e))
    for a, b in zip(firsts.tolist(), [*firsts[1:].tolist(), len(e)], strict=True):
        prev[a] = -np.inf
        np.maximum.accumulate(e[a : b - 1], out=prev[a + 1 : b])
    add = np.clip(e - np.maximum(s, prev), 0.0, None)
    busy = np.bincount(np.cumsum(new) - 1, weights=add)
    np.maximum.at(need, k[firsts], busy)
    return need


def _gpu_done(g: Graph, gpu_end: np.ndarray, n: int) -> np.ndarray:
    """Per step, the latest replayed end of the GPU ops that started inside it as recorded;
    NaN for none."""
    done = np.full(n, np.nan)
    step = _in_step(g, n)
    inside = step >= 0
    if inside.any():
        np.fmax.at(done, step[inside], gpu_end[inside])
    return done
