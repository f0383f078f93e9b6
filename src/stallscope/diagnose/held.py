"""What the host's waits on the GPU waited behind, read off the GPU timeline.

A wait (a stream or device sync, a blocking copy) returns when an op it waits for ends: the
awaited op. While the host waits, that op's stream either runs the work queued before it (the
queue a sync drains: reading the value later removes the wait) or runs nothing although work is
queued on it: the stream is held, by a cross-stream wait (`cudaStreamWaitEvent`,
`wait_stream`) on work that runs on other streams, or by something this process's GPU timeline
does not show (another rank, another device, an event from outside). A held wait is not the
host's to remove: the awaited work runs as late whether the host waits or not. What held it is
told apart by what the device ran meanwhile: a collective on another stream, other work on
another stream, or nothing at all, with work queued on other streams or without.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallscope.trace.intervals import Timeline, exclusive
from stallscope.trace.kernels import COLLECTIVE, COMM_NAME
from stallscope.trace.names import name_array, name_mask

# Other streams named as what a wait was held behind, most time first...
MAX_BEHIND = 4
# ...and, like the awaited streams, only those with at least this share of the held time.
NAMED_SHARE = 0.05


@dataclass(frozen=True)
class Behind:
    """Another stream that ran while an awaited stream was held."""

    stream: str
    kind: str  # "collective" or "compute"
    op: str  # what ran longest there during the holds (a collective by its name: "SendRecv")
    us: float  # during the holds, summed over the steps


@dataclass(frozen=True)
class Held:
    """The waits' time (each up to its awaited op's start), split by what the GPU did: summed
    over the steps, each instant counted once (the union of the waits)."""

    own_us: float  # the awaited stream ran its queued work (or the awaited op is unknown)
    collective_us: float  # held; a collective ran on another stream
    compute_us: float  # held; other work (no collective) ran on another stream
    idle_queued_us: float  # held; the device ran nothing, with work queued on other streams
    idle_us: float  # held; the device ran nothing and nothing else was queued on it
    streams: tuple[str, ...]  # the awaited streams, the longest held first (NAMED_SHARE)
    behind: tuple[Behind, ...]  # other streams that ran during the holds, most time first

    @property
    def held_us(self) -> float:
        return self.collective_us + self.compute_us + self.idle_queued_us + self.idle_us

    @property
    def gpu_idle_us(self) -> float:
        """Held time during which the device ran nothing."""
        return self.idle_queued_us + self.idle_us


@dataclass(frozen=True)
class _Ops:
    """The GPU table's columns the split reads, as arrays, and the timeline it cuts."""

    ts: np.ndarray
    end: np.ndarray
    device: np.ndarray  # str
    stream: np.ndarray  # float, -1 where unknown
    launch: np.ndarray  # the launch call's start, NaN where unknown
    near: np.ndarray  # ran during the waits' span
    queued: np.ndarray  # launched before the span's end, started after its start
    coll: np.ndarray  # a collective kernel
    tl: Timeline

    def ran(self, rows: np.ndarray) -> np.ndarray:
        """Segments during which one of `rows` ran."""
        rows = rows & self.near
        return self.tl.cover(self.ts[rows], self.end[rows])

    def pending(self, rows: np.ndarray) -> np.ndarray:
        """Segments during which one of `rows` was launched and had not started."""
        rows = rows & self.queued
        return self.tl.cover(self.launch[rows], self.ts[rows])


def held_waits(gpu: pd.DataFrame, w0: np.ndarray, w1: np.ndarray, device: np.ndarray,
               stream: np.ndarray, collectives: np.ndarray | None = None) -> Held:
    """What the waits [w0, w1) waited behind; `device`/`stream`: the awaited op's (str / float,
    NaN where unknown: then the whole wait counts as the stream's own). `gpu`: the model's GPU
    table (kind, device, stream, name, ts, end, launch_ts); `collectives`: per row, the
    collective its host range names ("" where none: trace/kernels.py `host_kinds`)."""
    known = np.isfinite(stream) & (w1 > w0)
    if not known.any() or not len(gpu):
        return Held(float(np.sum(w1 - w0)), 0.0, 0.0, 0.0, 0.0, (), ())
    ops = _ops(gpu, float(w0.min()), float(w1.max()), w0, w1)
    wait_any = ops.tl.cover(w0, w1)
    masks = [np.zeros(len(wait_any), bool) for _ in range(5)]  # own, coll, compute, idle q, idle
    by_stream: dict[str, float] = {}
    behind: list[pd.DataFrame] = []
    for d, s in sorted(set(zip(device[known].tolist(), stream[known].tolist(), strict=True))):
        mine = known & (device == d) & (stream == s)
        held, parts = _split(ops, w0[mine], w1[mine], d, s)
        by_stream[_stream_name(s)] = float(ops.tl.lengths[held].sum())
        behind.append(_overlaps(ops, held, (ops.device == d) & (ops.stream != s)))
        for i, m in enumerate(parts):
            masks[i] |= m
    own, c, comp, idle_q, idle = exclusive(masks)
    own |= wait_any & ~(own | c | comp | idle_q | idle)  # awaited op unknown, or nothing held
    sums = [float(ops.tl.lengths[m].sum()) for m in (own, c, comp, idle_q, idle)]
    floor = NAMED_SHARE * sum(sums[1:])
    streams = sorted((k for k, v in by_stream.items() if v > 0 and v >= floor),
                     key=lambda k: (-by_stream[k], k))
    labels = name_array(gpu["name"], _label)
    if collectives is not None:
        labels = np.where(collectives != "", collectives, labels)
    named = tuple(b for b in _behind(pd.concat(behind, ignore_index=True), ops, labels)
                  if b.us >= floor)
    return Held(own_us=sums[0], collective_us=sums[1], compute_us=sums[2],
                idle_queued_us=sums[3], idle_us=sums[4], streams=tuple(streams),
                behind=named[:MAX_BEHIND])


def _ops(gpu: pd.DataFrame, lo: float, hi: float, w0: np.ndarray, w1: np.ndarray) -> _Ops:
    ts, end = gpu["ts"].to_numpy(dtype=float), gpu["end"].to_numpy(dtype=float)
    launch = gpu["launch_ts"].to_numpy(dtype=float)
    near = (end > lo) & (ts < hi)
    queued = np.isfinite(launch) & (launch < hi) & (ts > lo)
    tl = Timeline.from_intervals((w0, w1), (ts[near], end[near]), (launch[queued], ts[queued]))
    return _Ops(ts, end, gpu["device"].astype(str).to_numpy(),
                np.nan_to_num(gpu["stream"].to_numpy(dtype=float), nan=-1.0), launch, near,
                queued, (gpu["kind"].to_numpy() == "kernel") & name_mask(gpu["name"], COMM_NAME),
                tl)


def _split(ops: _Ops, w0: np.ndarray, w1: np.ndarray, device: str, stream: float
           ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The waits on one stream: where it was held (it ran nothing with work queued on it ahead
    of the awaited op: not launched by the waiting call itself, as a copy's own op is), and the
    segments by what the device ran then (own, collective, compute, idle with work queued
    elsewhere, idle)."""
    on = ops.device == device
    mine = on & (ops.stream == stream)
    other = on & (ops.stream != stream)
    order = np.argsort(w0, kind="stable")
    a, b = w0[order], w1[order]
    k = np.searchsorted(a, ops.launch, side="right") - 1
    by_wait = (k >= 0) & (ops.launch < b[np.clip(k, 0, None)])  # launched inside a wait
    waited = ops.tl.cover(w0, w1)
    busy = ops.ran(mine)
    held = waited & ~busy & ops.pending(mine & ~by_wait)
    return held, [waited & busy, held & ops.ran(other & ops.coll), held & ops.ran(other),
                  held & ops.pending(other), held]


def _stream_name(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else str(s)


def _overlaps(ops: _Ops, held: np.ndarray, rows: np.ndarray) -> pd.DataFrame:
    """Each op of `rows` (ops on streams other than the held one) by its overlap with the held
    time: its row and overlap (us), those that overlap at all."""
    cum = np.concatenate([[0.0], np.cumsum(np.where(held, ops.tl.lengths, 0.0))])
    idx = np.flatnonzero(rows & ops.near)
    top = len(cum) - 1
    overlap = (cum[np.clip(np.searchsorted(ops.tl.edges, ops.end[idx]), 0, top)]
               - cum[np.clip(np.searchsorted(ops.tl.edges, ops.ts[idx]), 0, top)])
    frame = pd.DataFrame({"row": idx, "us": overlap})
    return frame[frame["us"] > 0]


def _behind(overlaps: pd.DataFrame, ops: _Ops, labels: np.ndarray) -> tuple[Behind, ...]:
    """The other streams that ran during the holds, with how long (summed over the held
    streams' holds) and the op that ran longest there (`labels`: each op's short name)."""
    if overlaps.empty:
        return ()
    rows = overlaps["row"].to_numpy()
    frame = pd.DataFrame({
        "stream": [_stream_name(s) for s in ops.stream[rows]],
        "op": labels[rows], "coll": ops.coll[rows], "us": overlaps["us"].to_numpy(),
    })
    per_op = frame.groupby(["stream", "op"], sort=True).agg(
        us=("us", "sum"), coll=("coll", "any")).reset_index()
    out = []
    for s, named in per_op.groupby("stream", sort=True):
        top = named.sort_values(["us", "op"], ascending=[False, True], kind="stable").iloc[0]
        kind = "collective" if bool(named["coll"].any()) else "compute"
        out.append(Behind(str(s), kind, str(top["op"]), float(named["us"].sum())))
    out.sort(key=lambda b: (-b.us, b.stream))
    return tuple(out)


def _label(name: str) -> str:
    """A short name for an op: a collective's kind (`SendRecv`), else its name's start."""
    found = COLLECTIVE.search(name)
    if found:
        return found.group(1)
    short = name.removeprefix("void ").split("(")[0]
    return short if len(short) <= 60 else short[:57] + "..."
