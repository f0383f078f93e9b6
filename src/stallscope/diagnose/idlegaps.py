"""gpu-idle's geometry: each device's idle gaps inside the step windows, cut per step, with the
cause HolisticTraceAnalysis's idle-time breakdown gives them, the part of each during which the
stepping thread waited on the DataLoader or on the GPU, and the host regions (the optimizer
step, device allocator calls) the host-wait idle falls under.

A *host-wait* gap is one the host caused: the runtime call that launched the next GPU work
started only after the GPU had gone idle. Any other gap had its next work already queued (it
waited on a stream/event dependency or another device) or is the tail of the step; a gap whose
launch is not in the trace gets no cause. What the host's threads did during each host-wait gap
is diagnose/idlethreads.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallscope.diagnose.common import ms, pct
from stallscope.trace.grouped import group_sums
from stallscope.trace.intervals import Timeline
from stallscope.trace.keyed import first_match, pick
from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import OPTIMIZER_STEP, column_equals_text, name_mask

GAP_KINDS = ("host-wait", "other", "launch-unknown")
# Host regions under which host-wait idle can sit that no launch-overhead fix (CUDA graphs,
# torch.compile) removes: the optimizer step's host work (a for-loop optimizer, or one whose
# own host computation is long, such as Shampoo's preconditioner), and device allocator calls.
# A region is listed when it holds this share of the host-wait idle.
REGION_MIN_PCT = 10.0
_ALLOCATOR_CALL = re.compile(r"^(?:(?:cuda|hip)(?:Malloc|Free)(?:Async)?|cuMem(?:Alloc|Free)"
                             r"(?:_v2)?)$")


@dataclass
class HostLayers:
    """The host intervals every device's gaps are cut by (start and end arrays), built once
    per rule call rather than once per device."""

    sync: tuple[np.ndarray, np.ndarray]
    loader: tuple[np.ndarray, np.ndarray]


def host_layers(model: TraceModel) -> HostLayers:
    syncs, copies = model.syncs, model.copies
    s_in = syncs["step"].to_numpy() >= 0
    c_in = (copies["step"].to_numpy() >= 0) & (copies["wait_us"].to_numpy() > 0)
    c_ts = copies["ts"].to_numpy()
    sync = (
        np.concatenate([syncs["ts"].to_numpy()[s_in], c_ts[c_in]]),
        np.concatenate([syncs["end"].to_numpy()[s_in],
                        (c_ts + copies["wait_us"].to_numpy())[c_in]]),
    )
    return HostLayers(sync=sync, loader=_loader_intervals(model))


@dataclass(frozen=True)
class HostWaitGaps:
    """The host-wait gaps of one device in trace time: each from the GPU going idle (`start`)
    to the start of the runtime call that launched the work ending it (`launch`, at most
    `end`), then that call's latency to `end`; the thread (`tid`, "" when unknown) and the
    name of that call."""

    start: np.ndarray
    launch: np.ndarray
    end: np.ndarray
    tid: np.ndarray
    call: np.ndarray


@dataclass
class GapPieces:
    """idle_gaps' rows as arrays, in (gap, step) order (see idle_gaps for the columns)."""

    gap: np.ndarray
    step: np.ndarray
    us: np.ndarray
    start_us: np.ndarray
    loader_us: np.ndarray
    sync_us: np.ndarray
    offset_us: np.ndarray
    kind_code: np.ndarray  # index into GAP_KINDS
    next_name: np.ndarray
    host_wait: HostWaitGaps


def idle_gaps(model: TraceModel, dev: str, windows: np.ndarray | None = None) -> pd.DataFrame:
    """Idle pieces of one device inside the windows (default: the steps), one row per
    (gap, step) piece.

    Columns: gap (gap index), step, us (idle length inside the step), offset_us (piece start
    from the step start), kind (one of GAP_KINDS), next_name (the GPU work that ended the gap),
    loader_us / sync_us (part of the piece during which the stepping thread waited in
    DataLoader.__next__ / a synchronising call), start_us (the piece's start in trace time).
    """
    windows = model.windows if windows is None else windows
    p = gap_pieces(model, dev, windows, host_layers(model))
    out = pd.DataFrame({
        "gap": p.gap, "step": p.step, "us": p.us, "start_us": p.start_us,
        "loader_us": p.loader_us, "sync_us": p.sync_us,
    })
    out["offset_us"] = p.offset_us
    out["kind"] = np.array(GAP_KINDS, dtype=object)[p.kind_code]
    out["next_name"] = p.next_name
    return out


@dataclass(frozen=True)
class _Gaps:
    start: np.ndarray
    end: np.ndarray
    launch: np.ndarray  # start of the launching call, NaN when unknown
    kind_code: np.ndarray
    names: np.ndarray
    tid: np.ndarray
    call: np.ndarray


def _gaps(model: TraceModel, dev: str, windows: np.ndarray) -> _Gaps:
    """One device's idle gaps over the windows' span, with what ended each."""
    gpu = model.gpu
    rows = np.flatnonzero(gpu["device"].to_numpy() == dev)
    all_ts = gpu["ts"].to_numpy()
    rows = rows[np.argsort(all_ts[rows], kind="stable")]
    ts, end = all_ts[rows], gpu["end"].to_numpy()[rows]
    lo, hi = float(windows[:, 0].min()), float(windows[:, 1].max())
    # Merge overlapping work with a running max of `end`; a gap opens wherever the next event
    # starts after everything before it has finished.
    covered = np.maximum.accumulate(end) if len(end) else end
    before = np.concatenate([[lo], np.maximum(covered[:-1], lo)]) if len(end) else np.array([])
    is_gap = ts > before
    start = np.concatenate([before[is_gap], [max(covered[-1], lo) if len(end) else lo]])
    stop = np.concatenate([ts[is_gap], [hi]])
    launch = np.concatenate([gpu["launch_ts"].to_numpy()[rows[is_gap]], [np.nan]])
    names = np.concatenate([_take(gpu["name"], rows[is_gap]), ["(none: end of the step)"]])
    rt = model.runtime
    call = first_match(rt["correlation"].to_numpy(),
                       np.concatenate([gpu["correlation"].to_numpy()[rows[is_gap]], [np.nan]]))
    tid = pick(rt["tid"].astype(str).to_numpy(dtype=object), call, "")
    call_name = pick(rt["name"].astype(str).to_numpy(dtype=object), call, "")
    tail = np.zeros(len(start), dtype=bool)
    tail[-1] = True
    keep = stop > start
    kind = np.where(np.isnan(launch), 2, np.where(launch >= start, 0, 1))
    kind[tail] = 1  # after the last GPU work: nothing left to launch in the window
    return _Gaps(start[keep], stop[keep], launch[keep], kind[keep], names[keep], tid[keep],
                 call_name[keep])


def gap_pieces(model: TraceModel, dev: str, windows: np.ndarray,
               host: HostLayers) -> GapPieces:
    """The gaps of `dev` cut by the windows, one piece per (gap, step)."""
    g = _gaps(model, dev, windows)
    hw = g.kind_code == 0
    host_wait = HostWaitGaps(g.start[hw], np.minimum(g.launch[hw], g.end[hw]), g.end[hw],
                             g.tid[hw], g.call[hw])
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), (g.start, g.end),
                                 host.sync, host.loader)
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    in_gap = tl.cover(g.start, g.end) & (bucket >= 0)
    starts, lengths = tl.starts, tl.lengths
    seg_gap = np.searchsorted(g.start, starts, side="right") - 1
    loader_m, sync_m = tl.cover(*host.loader), tl.cover(*host.sync)
    gap, step, length = seg_gap[in_gap], bucket[in_gap], lengths[in_gap]
    loader_in = loader_m[in_gap]
    # Pieces are the (gap, step) groups numbered in sorted order, as groupby(sort=True) did.
    key = gap * max(len(windows), 1) + step
    if len(key) == 0 or (key[1:] >= key[:-1]).all():
        new = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, dtype=bool)
        label, first = np.cumsum(new) - 1, np.flatnonzero(new)
    else:
        _, first, label = np.unique(key, return_index=True, return_inverse=True)
    npieces = len(first)
    piece_gap, piece_step = gap[first], step[first]
    piece_start = _group_min(starts[in_gap], label, npieces)
    return GapPieces(
        gap=piece_gap,
        step=piece_step,
        us=group_sums(length, label, npieces),
        start_us=piece_start,
        loader_us=group_sums(np.where(loader_in, length, 0.0), label, npieces),
        sync_us=group_sums(np.where(sync_m[in_gap] & ~loader_in, length, 0.0), label,
                            npieces),
        offset_us=piece_start - windows[piece_step, 0],
        kind_code=g.kind_code[piece_gap],
        next_name=g.names[piece_gap],
        host_wait=host_wait,
    )


def host_regions(model: TraceModel, hw: HostWaitGaps, windows: np.ndarray, n: int,
                 host_wait_us: float) -> list[dict]:
    """How much of the host-wait idle the host spent inside the optimizer step or in device
    allocator calls, per step, largest first: what the host was doing while the GPU waited."""
    if not len(hw.start) or host_wait_us <= 0:
        return []
    found = _regions(model)
    if not found:
        return []
    pre = (hw.start, hw.launch)
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), pre,
                                 *(iv for _, _, iv in found))
    idle = tl.cover(*pre) & (tl.bucket(windows[:, 0], windows[:, 1]) >= 0)
    out = []
    for kind, name, iv in found:
        us = float(tl.lengths[idle & tl.cover(*iv)].sum())
        share = pct(us, host_wait_us)
        if share >= REGION_MIN_PCT:
            out.append({"kind": kind, "region": name, "ms_per_step": ms(us / n),
                        "pct_of_host_wait": share})
    return sorted(out, key=lambda r: -r["ms_per_step"])


def _regions(model: TraceModel) -> list[tuple[str, str, tuple[np.ndarray, np.ndarray]]]:
    """The optimizer-step ranges of the stepping thread, by name, and the allocator calls."""
    found: list[tuple[str, str, tuple[np.ndarray, np.ndarray]]] = []
    ops = model.ops
    if len(ops):
        mine = np.ones(len(ops), dtype=bool) if model.main_tid is None else \
            column_equals_text(ops["tid"], str(model.main_tid))
        opt = name_mask(ops["name"], OPTIMIZER_STEP) & mine
        for name in sorted(set(ops["name"][opt].astype(str))):
            rows = opt & (ops["name"].astype(str) == name).to_numpy()
            found.append(("host-optimizer", name,
                          (ops["ts"].to_numpy(dtype=float)[rows],
                           ops["end"].to_numpy(dtype=float)[rows])))
    rt = model.runtime
    if len(rt):
        alloc = name_mask(rt["name"], _ALLOCATOR_CALL)
        if alloc.any():
            found.append(("allocator", "cudaMalloc/cudaFree",
                          (rt["ts"].to_numpy(dtype=float)[alloc],
                           rt["end"].to_numpy(dtype=float)[alloc])))
    return found


def _loader_intervals(model: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """DataLoader `__next__` ranges of the stepping thread (the model keeps only their sums)."""
    ev = model.trace.events
    if model.loader_kind is None or model.main_tid is None or len(ev) == 0:
        return np.empty(0), np.empty(0)
    mine = np.flatnonzero(column_equals_text(ev["tid"], str(model.main_tid)))
    names = ev["name"]
    loader = mine[name_mask(names, LOADER_NAME, mine)]
    return ev["ts"].to_numpy(dtype=float)[loader], ev["end"].to_numpy(dtype=float)[loader]


# ---------------------------------------------------------------- pandas-identical numpy
# These replace pandas calls on small frames, whose per-call overhead was most of this rule's
# cost, and give the same bits: a report must not change by one ulp.

# GAP_KINDS code -> its rank among the sorted kind names (groupby("kind") labels).
KIND_SORT_LABEL = np.argsort(np.argsort(np.array(GAP_KINDS), kind="stable"), kind="stable")


def _group_min(values: np.ndarray, label: np.ndarray, ngroups: int) -> np.ndarray:
    """Per-label minimum (exact whatever the order)."""
    out = np.full(ngroups, np.inf)
    np.minimum.at(out, label, values)
    return out


def largest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, largest first, ties in order (pandas' nlargest)."""
    return np.argsort(-values, kind="stable")[:k]


def median(values: np.ndarray) -> float:
    """Series.median: the median of the non-NaN values."""
    return float(np.nanmedian(values[~np.isnan(values)]))


def _string_categories(col: pd.Series) -> pd.Index | None:
    """The categories of a categorical column of strings, else None."""
    dtype = col.dtype
    if isinstance(dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(
            dtype.categories.dtype):
        return dtype.categories
    return None


def _take(col: pd.Series, rows: np.ndarray) -> np.ndarray:
    """col.to_numpy()[rows] without converting the rows not taken."""
    cats = _string_categories(col)
    if cats is None:
        return col.to_numpy()[rows]
    codes = col.cat.codes.to_numpy()[rows]
    return np.r_[np.asarray(cats, dtype=object), np.nan][codes]
