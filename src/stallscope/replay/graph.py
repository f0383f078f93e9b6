"""The recorded steps of one trace as a dependency graph: host threads, GPU streams, and the edges
between them that decided when each thing ran.

Host: every thread of the stepping process that launches GPU work (the stepping thread, the
autograd thread, ...) is a chain of nodes: runtime calls, DataLoader fetches, step markers, and
the CPU time between them ("fill"). A thread that sat idle and then resumed right after another
thread finished something was released by it (backward starts when the main thread hands it the
graph, the main thread resumes when backward ends): that is an edge, found by timing. A runtime
call that returned right after the GPU work submitted before it finished (a stream or device
sync, a blocking copy, the implicit sync in cudaFree) waited for it: another edge, also found by
timing, so these waits are covered without a list of names. A launch call blocked by a full
launch queue returns when the oldest queued op ends, not the last: such a call (a launch made
with about a thousand ops pending) waits for the op that ended just before it returned.

GPU: each stream is a chain; an op starts no earlier than its launch call (by correlation id)
plus the launch latency, and no earlier than the previous op on its stream; an op that waited
beyond both for an op on another stream (cudaStreamWaitEvent) gets that edge.

Every slack (launch latency, gap after the previous op, wake-up delay, return delay) is taken
from the trace, so replaying the unchanged graph reproduces the recording; a fix changes
durations or removes edges, and the replay shows what follows (see docs/replay.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stallscope.trace.keyed import first_match, pick
from stallscope.trace.model import LOADER_NAME, STEP_NAME, TraceModel
from stallscope.trace.names import name_array, name_mask

# Host node kinds: CPU time between points; a runtime call; a DataLoader fetch; a step boundary;
# the start of a busy stretch after the thread sat idle.
FILL, CALL, LOADER, MARK, RESUME = 0, 1, 2, 3, 4
# Host events closer than this (us) belong to one busy stretch: the Python between two ops.
MERGE_US = 100.0
# A thread that resumes within this (us) of another thread finishing was released by it. The
# real traces hand backward to the autograd thread and back in 114-700 us.
WAKE_US = 1000.0
# A call that returns within this (us) after GPU work ends waited for that work.
RETURN_US = 50.0
# ...and only if it lasted this much (us) longer than its name's typical call.
WAIT_MARGIN_US = 10.0
# A call name's typical (not waiting) length: this quantile of its calls, at most TYPICAL_CAP_US
# (a call that does not wait returns in microseconds; when every sync of a name waits, its
# quantile would be a waiting length).
TYPICAL_QUANTILE = 0.1
TYPICAL_CAP_US = 30.0
# Clock tolerance (us) between host and GPU timestamps.
CLOCK_US = 2.0
# A GPU op that starts within this (us) of being able to was not held back by anything else.
READY_US = 10.0
# The CUDA driver queues about 1,024 launches; a launch made with that many ops pending blocks
# until one finishes. hta/v100_rank0_ns_resolution's 696 long launch calls return with 1,019-
# 1,021 ops pending, 5-7 us after an op ends; its short ones and those of every other shared
# trace have far fewer pending (median 0-560) or do not outlast their name's typical call.
QUEUE_FULL_DEPTH = 900
LAUNCH_CALL = re.compile(r"^(?:cuda|cu|hip)(?:Ext)?(?:Module)?Launch|^(?:cuda|hip)GraphLaunch")
# Fallbacks when a trace shows too few clean examples to measure them.
DEFAULT_LAUNCH_US = 5.0
DEFAULT_STREAM_GAP_US = 1.5
# `_event_kind` of an event name.
LOADER_RANGE, STEP_RANGE = 1, 2
# Event categories of host work (a thread is busy inside them).
BUSY_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver", "python_function"})


@dataclass
class Graph:
    """Arrays of host nodes (h_*) and GPU ops (g_*); see the module docstring.

    Host node n starts at max(end of the previous node on its thread + h_lead[n],
    end of h_release[n] + h_delay[n]) and ends at max(start + h_dur[n],
    end of GPU op h_wait[n] + h_ret[n], end of host node h_after[n] + h_ret[n]).
    GPU op g starts at max(start of its launch node + g_lat[g], end of the previous op on its
    stream + g_gap[g], end of g_cross[g] + g_cgap[g], g_anchor[g]) and lasts g_dur[g].
    """

    # host nodes, each thread's contiguous and in time order
    h_thread: np.ndarray
    h_kind: np.ndarray
    h_ts: np.ndarray  # recorded start
    h_rec_end: np.ndarray  # recorded end
    h_dur: np.ndarray  # fixed part of the duration
    h_lead: np.ndarray  # idle time before the node kept as it was (no release explains it)
    h_release: np.ndarray  # host node whose end released this one, or -1
    h_delay: np.ndarray
    h_wait: np.ndarray  # GPU op whose end this node waited for, or -1
    h_after: np.ndarray  # host node whose end (+ h_ret) this node waits for, or -1 (loader)
    h_ret: np.ndarray
    h_name: np.ndarray  # index into h_names: call name, loader range name, "" for the rest
    h_names: list[str]
    h_typical: np.ndarray  # a call's typical length when it does not wait (its name's short calls)
    thread_ids: list[str]  # thread index -> tid
    thread_origin: np.ndarray  # recorded start of each thread's first node
    markers: np.ndarray  # the step-boundary nodes (each step's start and end), in time order
    step_start: np.ndarray  # per step, its start marker node
    step_end: np.ndarray  # per step, its end marker node
    # GPU ops, each stream's contiguous and in time order
    g_stream: np.ndarray
    g_device: np.ndarray  # object: device id
    g_kind: np.ndarray  # object: kernel | memcpy | memset
    g_name: np.ndarray  # index into g_names
    g_names: list[str]
    g_ts: np.ndarray
    g_dur: np.ndarray
    g_bytes: np.ndarray
    g_launch: np.ndarray  # host node of the launch call, or -1
    g_lat: np.ndarray
    g_gap: np.ndarray
    g_cross: np.ndarray  # GPU op on another stream this op waited for, or -1
    g_cgap: np.ndarray
    g_anchor: np.ndarray  # recorded start for ops nothing else explains, else -inf
    # The window's step that launched each op (-1 outside; an op queued before the recording:
    # where it ran), see `_launched_step`.
    g_step: np.ndarray
    launch_us: float  # typical launch latency measured in this trace
    # Ops queued before the recording: no recorded step's own work (None: none).
    g_queued: np.ndarray | None = None
    # GPU ops a change freed from their recorded place beside the rest (comm=overlap's
    # collectives, started as soon as their inputs are ready), or None for none: the step's
    # GPU work keeps the recorded overlaps of the others (replay/engine.py `gpu_need`).
    g_moved: np.ndarray | None = None
    # Per GPU op, its device as a code (`g_device` read as text, factorized): every replay
    # groups the ops by device, and reading the object column as text each time cost more
    # than the rest of the grouping. None: worked out where it is needed.
    g_device_code: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return len(self.step_start)

    def copy(self, *writes: str) -> Graph:
        """A graph a fix may change without touching this one: it shares every array but those
        named in `writes` (of `_MUTABLE`), which it copies for the fix to change in place; an
        array the fix replaces whole (`out.h_dur = g.h_dur * f`) need not be named. A scenario
        then holds only what its changes changed. Every shared array is made read-only, so a
        change written into one not named fails at once instead of changing the other graph."""
        unknown = set(writes) - set(_MUTABLE)
        if unknown:
            raise ValueError(f"not a graph array a fix may change: {sorted(unknown)}")
        for k in _MUTABLE:
            getattr(self, k).flags.writeable = False
        return replace(self, **{k: getattr(self, k).copy() for k in writes})

    def host_named(self, test: Callable[[str], bool]) -> np.ndarray:
        """Host nodes whose name passes `test` (evaluated once per distinct name)."""
        return np.array([test(n) for n in self.h_names], dtype=bool)[self.h_name]

    def gpu_named(self, test: Callable[[str], bool]) -> np.ndarray:
        """GPU ops whose name passes `test` (evaluated once per distinct name)."""
        return np.array([test(n) for n in self.g_names], dtype=bool)[self.g_name]


# What a fix may change; the rest of a graph is shared between its copies.
_MUTABLE = ("h_dur", "h_lead", "h_release", "h_delay", "h_wait", "h_after", "h_ret", "g_dur",
            "g_gap", "g_lat", "g_cross", "g_cgap", "g_anchor")


def build_graph(model: TraceModel, steps: slice | None = None) -> Graph | None:
    """The dependency graph of the model's steps (or of `steps` of them, consecutive); None
    when there is nothing to replay."""
    chosen = model.steps[steps] if steps is not None else model.steps
    if not chosen or model.main_tid is None:
        return None
    # Rows are selected as masks on the tables' arrays, never as frames: the tables are small
    # and pandas' per-call overhead, not the data, was the cost.
    ev = model.trace.events
    w0, w1 = chosen[0].start_us, chosen[-1].end_us
    ev_kind = name_array(ev["name"], _event_kind).astype(np.int64)
    main_pid = _main_pid(model, ev_kind == STEP_RANGE)
    ev_ts, ev_end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    pid_codes, pid_ids = _id_codes(ev["pid"])
    host_rows = _code_is(pid_codes, pid_ids, main_pid) & (ev_end > w0) & (ev_ts < w1)
    gpu = _gpu_ops(model, w0, w1)
    rt = model.runtime
    rt_rows = (rt["end"].to_numpy() > w0) & (rt["ts"].to_numpy() < w1)
    rt_tid, rt_tids = _id_codes(rt["tid"])
    launched = _isin(rt["correlation"].to_numpy(dtype=float)[rt_rows], gpu["correlation"])
    launching = _id_strings(rt_tid[rt_rows][launched], rt_tids)
    threads = [model.main_tid] + sorted(launching - {model.main_tid})
    starts = np.array([s.start_us for s in chosen])
    ends = np.array([s.end_us for s in chosen])
    markers_ts = np.unique(np.concatenate([starts, ends]))
    host, names = _host_nodes(ev, host_rows, ev_kind[host_rows], rt, rt_rows, threads,
                              model.main_tid, markers_ts, w0, w1)
    g = _link_gpu(gpu, host)
    _find_releases(host)
    _find_joins(host)
    _find_waits(host, g)
    _find_queue_waits(host, names, g)
    markers = np.flatnonzero(host["kind"] == MARK)  # one per boundary time, in order
    step_start = markers[np.searchsorted(markers_ts, starts)]
    step_end = markers[np.searchsorted(markers_ts, ends)]
    g_codes, g_names = _factorize_names(g["name"], _name_labels(model.gpu["name"]))
    step, queued = _launched_step(g, host["ts"], starts, ends)
    return Graph(
        h_thread=host["thread"], h_kind=host["kind"], h_ts=host["ts"], h_rec_end=host["end"],
        h_dur=host["dur"], h_lead=host["lead"], h_release=host["release"],
        h_delay=host["delay"], h_wait=host["wait"], h_after=np.full(len(host["ts"]), -1),
        h_ret=host["ret"], h_name=host["name"], h_names=names,
        h_typical=host["typical"], thread_ids=threads,
        thread_origin=host["origin"], markers=markers, step_start=step_start,
        step_end=step_end,
        g_stream=g["stream"], g_device=g["device"], g_kind=g["kind"], g_name=g_codes,
        g_names=g_names,
        g_ts=g["ts"], g_dur=g["dur"], g_bytes=g["bytes"], g_launch=g["launch"],
        g_lat=g["lat"], g_gap=g["gap"], g_cross=g["cross"], g_cgap=g["cgap"],
        g_anchor=g["anchor"], g_step=step, launch_us=g["launch_us"], g_queued=queued,
        g_device_code=pd.factorize(g["device"].astype(str))[0],
    )


def _launched_step(g: dict[str, np.ndarray], host_ts: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU op, the step of the window whose host launched it (-1: none), and whether it was
    queued before the recording.

    By launch, not by start: a host that runs ahead of a busy GPU (the launch queue filling)
    launches a step's work long before the GPU runs it, and that work is the step's own: the
    step cannot settle shorter than it. An op with no recorded launch belongs with the op
    before it on its stream (work whose launch the trace lost); an op before its stream's first
    recorded launch was queued before the recording: it is no recorded step's own, but it is
    the same kind of work, so a fix changes it where it ran (its step is where it started). A
    stream with no recorded launch at all (a trace without correlation ids) goes by where each
    op started."""
    def step_at(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right") - 1
        return np.where((k >= 0) & (t < ends[np.clip(k, 0, None)]), k, -1)

    launch, stream = g["launch"], g["stream"]
    if not len(launch):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    launched = launch >= 0
    by_launch = step_at(host_ts[np.where(launched, launch, 0)])
    # Streams are contiguous: the last launched op at or before each op, and its stream's head.
    idx = np.arange(len(launch))
    last = np.maximum.accumulate(np.where(launched, idx, -1))
    head = np.r_[True, stream[1:] != stream[:-1]]
    first_of_stream = np.maximum.accumulate(np.where(head, idx, 0))
    inherit = last >= first_of_stream
    none_launched = ~np.logical_or.reduceat(launched, np.flatnonzero(head))[np.cumsum(head) - 1]
    queued = ~inherit & ~none_launched
    step = np.where(inherit, by_launch[np.where(inherit, last, 0)], step_at(g["ts"]))
    return step.astype(np.int64), queued


def _equals(column: pd.Series, value: str) -> np.ndarray:
    """`column == value` for a categorical column of ids, by category code (no per-row string
    conversion: the event table has hundreds of thousands of rows, a few dozen distinct ids)."""
    return _code_is(*_id_codes(column), value)


def _id_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Each row's id as a code (-1: missing) into an object array of the distinct ids as
    strings (`column.astype(str)`): a categorical's own codes, so comparing ids costs no
    per-row string."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return (column.array.codes,
                np.asarray(column.array.categories.astype(str), dtype=object))
    codes, uniques = pd.factorize(column.astype(str))
    return codes, np.asarray(uniques, dtype=object)


def _code_is(codes: np.ndarray, ids: np.ndarray, value: str) -> np.ndarray:
    """Rows whose id (see `_id_codes`) is `value`; a missing id is none."""
    hits = np.flatnonzero(ids == value)
    return codes == hits[0] if len(hits) == 1 else np.isin(codes, hits)


def _id_strings(codes: np.ndarray, ids: np.ndarray) -> set[str]:
    """The distinct ids of these rows as strings, a missing one as "nan" (what
    `{str(t) for t in column.unique()}` gave)."""
    out = {str(ids[c]) for c in np.unique(codes[codes >= 0]).tolist()}
    return out | {"nan"} if (codes < 0).any() else out


def _isin(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Series.isin on floats: NaN is in `among` when `among` holds a NaN."""
    out = np.isin(values, among)
    if np.isnan(among).any():
        out |= np.isnan(values)
    return out


def _name_codes(column: pd.Series) -> np.ndarray:
    """Each row's name as a code into `_name_labels(column)` (-1: missing)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.array.codes.astype(np.int64)
    return pd.factorize(column.astype(str).to_numpy(dtype=object))[0].astype(np.int64)


def _name_labels(column: pd.Series) -> np.ndarray:
    """The names `_name_codes` point at, as `.astype(str)` gives them (object array)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return np.asarray(column.array.categories.astype(str), dtype=object)
    return np.asarray(pd.factorize(column.astype(str).to_numpy(dtype=object))[1], dtype=object)


def _factorize_names(codes: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """pd.factorize of the rows' names (codes in order of first appearance, -1 for a missing
    name), done on the integer codes: distinct codes are distinct names, and hashing ints
    is cheaper than hashing the strings."""
    out = np.full(len(codes), -1, dtype=np.int64)
    present = codes >= 0
    first, uniques = pd.factorize(codes[present])
    out[present] = first
    return out, [str(n) for n in labels[uniques]]


def _main_pid(model: TraceModel, is_step: np.ndarray | None = None) -> str:
    """The process that steps: the one holding most ProfilerStep ranges, else most events of
    the stepping thread. `is_step`: the events that are ProfilerStep ranges, when known."""
    ev = model.trace.events
    if is_step is None:
        is_step = name_mask(ev["name"], STEP_NAME)
    rows = is_step if is_step.any() else _equals(ev["tid"], str(model.main_tid))
    pid = ev["pid"]
    if isinstance(pid.dtype, pd.CategoricalDtype):
        codes = pid.array.codes[rows]
        counts = np.bincount(codes[codes >= 0], minlength=len(pid.array.categories))
        if len(counts) and (counts == counts.max()).sum() == 1 and counts.max() > 0:
            return str(pid.array.categories.astype(str)[int(counts.argmax())])
    # A tie (or no categorical): value_counts' own order decides, as it always did.
    return str(pid[rows].astype(str).value_counts().idxmax())


@functools.lru_cache(maxsize=1 << 17)
def _event_kind(name: str) -> int:
    """LOADER_RANGE for a DataLoader fetch range, STEP_RANGE for a ProfilerStep range, else 0
    (cached: one look-up per distinct name instead of one match per pattern)."""
    if LOADER_NAME.match(name):
        return LOADER_RANGE
    return STEP_RANGE if STEP_NAME.match(name) else 0


# ---------------------------------------------------------------------------- host


def _host_nodes(ev: pd.DataFrame, ev_rows: np.ndarray, ev_kind: np.ndarray,
                runtime: pd.DataFrame, rt_rows: np.ndarray, threads: list[str], main_tid: str,
                markers_ts: np.ndarray, w0: float, w1: float
                ) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per thread, in time order: its POIs (runtime calls, loader fetches, step markers, the
    start of each busy stretch), each after a fill node (see `_fill_and_pois`), and the table
    of names their `name` codes index. The events are `ev`'s rows where `ev_rows` (`ev_kind`:
    their `_event_kind`), the runtime calls `runtime`'s where `rt_rows`."""
    busy_cat = name_array(ev["cat"], BUSY_CATS.__contains__, ev_rows).astype(bool)
    is_loader = ev_kind == LOADER_RANGE
    is_step = ev_kind == STEP_RANGE
    ev_tid, ev_tids = _id_codes(ev["tid"])
    ev_tid = ev_tid[ev_rows]
    ev_ts, ev_end = ev["ts"].to_numpy()[ev_rows], ev["end"].to_numpy()[ev_rows]
    # Names as codes into one table: "" (fill, markers, resumes), the runtime calls' names,
    # the loader ranges' names; no per-node string.
    rt_names = runtime["name"]
    if not isinstance(rt_names.dtype, pd.CategoricalDtype):
        rt_names = rt_names.astype("category")
    rt_cats = list(map(str, rt_names.cat.categories))
    loader_of = np.empty(len(is_loader), dtype=object)  # the loader rows' names, as str(name)
    loader_of[is_loader] = name_array(ev["name"], str, _subset(ev_rows, is_loader))
    loader_names = sorted(set(loader_of[is_loader].tolist()))
    table = ["", *rt_cats, *loader_names]
    loader_code = {n: 1 + len(rt_cats) + i for i, n in enumerate(loader_names)}
    call_codes = rt_names.array.codes[rt_rows] + 1
    rt_tid, rt_tids = _id_codes(runtime["tid"])
    rt_tid = rt_tid[rt_rows]
    rt_ts, rt_end = runtime["ts"].to_numpy()[rt_rows], runtime["end"].to_numpy()[rt_rows]
    rt_corr = runtime["correlation"].to_numpy(dtype=float)[rt_rows]
    parts: list[dict[str, np.ndarray]] = []
    for t_index, t in enumerate(threads):
        mine = _code_is(ev_tid, ev_tids, t) & (busy_cat | is_loader) & ~is_step
        on_thread = _code_is(rt_tid, rt_tids, t)
        lrows = np.flatnonzero(mine & is_loader) if t == main_tid else np.zeros(0, np.intp)
        lrows = lrows[_nargsort(ev_ts[lrows])]
        l_ts, l_end = ev_ts[lrows], ev_end[lrows]
        poi_ts = [rt_ts[on_thread], l_ts]
        poi_end = [rt_end[on_thread], l_end]
        poi_kind = [np.full(int(on_thread.sum()), CALL), np.full(len(lrows), LOADER)]
        poi_name = [call_codes[on_thread],
                    np.array([loader_code[n] for n in loader_of[lrows].tolist()],
                             dtype=np.int64)]
        poi_corr = [rt_corr[on_thread], np.full(len(lrows), np.nan)]
        if t == main_tid:
            poi_ts.append(markers_ts)
            poi_end.append(markers_ts)
            poi_kind.append(np.full(len(markers_ts), MARK))
            poi_name.append(np.zeros(len(markers_ts), dtype=np.int64))
            poi_corr.append(np.full(len(markers_ts), np.nan))
        ts, end = np.concatenate(poi_ts), np.concatenate(poi_end)
        kind, name = np.concatenate(poi_kind), np.concatenate(poi_name)
        corr = np.concatenate(poi_corr)
        # Calls inside a DataLoader fetch are part of the fetch.
        inside = _inside(ts, l_ts, l_end) & (kind == CALL)
        keep = ~inside & (end >= w0) & (ts <= w1)
        ts, end, kind, name, corr = ts[keep], end[keep], kind[keep], name[keep], corr[keep]
        if not len(ts):
            continue
        ts = np.clip(ts, w0, w1)
        end = np.clip(end, ts, w1)
        b_start, b_end = _blocks(ev_ts[mine], ev_end[mine], w0, w1, ts, end)
        # Each busy stretch after the first starts with a resume point.
        resumes = b_start[1:]
        ts = np.concatenate([ts, resumes])
        end = np.concatenate([end, resumes])
        kind = np.concatenate([kind, np.full(len(resumes), RESUME)])
        name = np.concatenate([name, np.zeros(len(resumes), dtype=np.int64)])
        corr = np.concatenate([corr, np.full(len(resumes), np.nan)])
        rank = np.select([kind == MARK, kind == RESUME], [0, 1], 2)
        order = np.lexsort((rank, ts))  # at one instant: a marker, then a resume, then the rest
        ts, end, kind, name, corr = ts[order], end[order], kind[order], name[order], corr[order]
        # Overlapping POIs (badly nested events) are laid end to end.
        before = np.maximum.accumulate(np.concatenate([[ts[0]], end[:-1]]))
        ts = np.maximum(ts, before)
        end = np.maximum(end, ts)
        origin = w0 if t == main_tid else min(ts[0], b_start[0])
        prev_end = np.concatenate([[origin], end[:-1]])
        parts.append(_fill_and_pois(t_index, prev_end, ts, end, kind, name, corr,
                                    b_start, b_end, origin))
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    # Indexed by thread: a thread with nothing in the window has no part (and no node), so its
    # origin is never read, but the threads after it keep their indexes.
    out["origin"] = np.full(len(threads), float(w0))
    for p in parts:
        out["origin"][p["thread"][0]] = p["origin"][0]
    return out, table


def _subset(rows: np.ndarray, within: np.ndarray) -> np.ndarray:
    """The mask of all rows selecting `rows`' selected rows where `within` (a mask of those)."""
    out = np.zeros(len(rows), dtype=bool)
    out[np.flatnonzero(rows)[within]] = True
    return out


def _nargsort(values: np.ndarray) -> np.ndarray:
    """The non-NaN values in order, ties in row order, then the NaNs in row order (a stable
    sort: numpy's default one orders ties by the CPU's vector width)."""
    nan = np.isnan(values)
    idx = np.arange(len(values))
    return np.concatenate([idx[~nan][values[~nan].argsort(kind="stable")], idx[nan]])


def _inside(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each point lies strictly inside one of the (non-overlapping, sorted) ranges."""
    if not len(starts):
        return np.zeros(len(ts), dtype=bool)
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(ts), dtype=bool)
    out[ok] = (ts[ok] > starts[i[ok]]) & (ts[ok] < ends[i[ok]])
    return out


def _blocks(ev_ts: np.ndarray, ev_end: np.ndarray, w0: float, w1: float, poi_ts: np.ndarray,
            poi_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The thread's busy stretches: its events (and POIs) merged across gaps under MERGE_US."""
    s = np.concatenate([np.clip(ev_ts, w0, w1), poi_ts])
    e = np.concatenate([np.clip(ev_end, w0, w1), poi_end])
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > reach[:-1] + MERGE_US])
    ids = np.cumsum(new) - 1
    starts = s[new]
    ends = np.zeros(len(starts))
    np.maximum.at(ends, ids, e)
    return starts, ends


def _fill_and_pois(t_index: int, prev_end: np.ndarray, ts: np.ndarray, end: np.ndarray,
                   kind: np.ndarray, name: np.ndarray, corr: np.ndarray, b_start: np.ndarray,
                   b_end: np.ndarray, origin: float) -> dict[str, np.ndarray]:
    """Two nodes per POI: the CPU time since the previous POI that fell inside busy stretches,
    then the POI, whose lead is the idle time before it (non-zero only where a stretch starts,
    since every stretch start is a resume POI)."""
    n = len(ts)
    blen = b_end - b_start
    cum = np.concatenate([[0.0], np.cumsum(blen)])

    def covered(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(b_start, x, side="right") - 1
        jc = np.clip(j, 0, None)
        part = np.clip(x - b_start[jc], 0.0, blen[jc])
        return np.where(j >= 0, cum[jc] + part, 0.0)

    fill = np.clip(covered(ts) - covered(prev_end), 0.0, ts - prev_end)
    lead = ts - prev_end - fill
    out_kind = np.empty(2 * n, dtype=np.int8)
    out_kind[0::2], out_kind[1::2] = FILL, kind
    rec_ts = np.empty(2 * n)
    rec_ts[0::2], rec_ts[1::2] = prev_end, ts
    rec_end = np.empty(2 * n)
    rec_end[0::2], rec_end[1::2] = prev_end + fill, end
    dur = np.empty(2 * n)
    dur[0::2], dur[1::2] = fill, end - ts
    leads = np.zeros(2 * n)
    leads[1::2] = lead
    names = np.zeros(2 * n, dtype=np.int64)
    names[1::2] = name
    corrs = np.full(2 * n, np.nan)
    corrs[1::2] = corr
    # The POI after an idle stretch may have been released by another thread; the fill before
    # that idle ended a stretch, a point other threads may be released by.
    idle = lead > MERGE_US
    resume = np.full(2 * n, np.nan)
    resume[1::2] = np.where(idle, ts, np.nan)
    ender = np.zeros(2 * n, dtype=bool)
    ender[0::2] = idle
    return {
        "thread": np.full(2 * n, t_index), "kind": out_kind, "ts": rec_ts, "end": rec_end,
        "dur": dur, "lead": leads, "name": names, "corr": corrs, "resume": resume,
        "ender": ender, "release": np.full(2 * n, -1), "delay": np.zeros(2 * n),
        "wait": np.full(2 * n, -1), "ret": np.zeros(2 * n), "origin": np.full(2 * n, origin),
        "typical": np.zeros(2 * n),
    }


def _find_releases(host: dict[str, np.ndarray]) -> None:
    """A thread back from idling within WAKE_US of another thread ending a stretch was released
    by it: the fork into backward, the join after it. Its idle time stops being fixed."""
    heads = np.flatnonzero(~np.isnan(host["resume"]))
    _release(host, heads, np.flatnonzero(host["ender"]), WAKE_US)


def _find_joins(host: dict[str, np.ndarray]) -> None:
    """The stepping thread back from idling, not released by a thread that went idle, waited
    for the other launching threads: it resumes after the last node another thread ended
    while it sat idle (the join at the end of backward, where the autograd thread hands the
    step back and goes on with its own bookkeeping, so it does not go idle within WAKE_US).
    Kept as a fixed idle time, a change that shortens backward (launch overhead, a launch
    queue that frees sooner) would never reach the step."""
    heads = np.flatnonzero(~np.isnan(host["resume"]) & (host["thread"] == 0)
                           & (host["release"] < 0) & (host["lead"] > 0))
    _release(host, heads, np.flatnonzero(host["thread"] != 0), host["lead"][heads])


def _release(host: dict[str, np.ndarray], heads: np.ndarray, by: np.ndarray,
             within: float | np.ndarray) -> None:
    """Each of `heads` (nodes back from idling) released by the latest of `by` on another
    thread that ended at most `within` before it resumed (ended by the resume: replay order).
    Its idle time is then explained by the release and no longer holds it back."""
    if not len(heads) or not len(by):
        return
    idx = _latest_other(host["end"][by], host["thread"][by], host["resume"][heads],
                        host["thread"][heads], within)
    found = np.where(idx >= 0, by[np.clip(idx, 0, None)], -1)
    has = found >= 0
    h, r = heads[has], found[has]
    host["release"][h] = r
    host["delay"][h] = host["ts"][h] - host["end"][r]
    host["lead"][h] = 0.0


def _find_waits(host: dict[str, np.ndarray], g: dict) -> None:
    """A call that lasted well beyond its name's typical length and returned right after GPU
    work submitted before it finished, waited for that work (device-wide or one stream)."""
    calls = np.flatnonzero(host["kind"] == CALL)
    if not len(calls) or not len(g["ts"]):
        return
    # A name's typical call is a short one: most sync calls do wait, so not the median.
    typical = _group_quantile(host["name"][calls], host["dur"][calls], TYPICAL_QUANTILE)
    typical = np.minimum(typical, TYPICAL_CAP_US)
    host["typical"][calls] = typical
    long = host["dur"][calls] > typical + WAIT_MARGIN_US
    cand = calls[long]
    if not len(cand):
        return
    c_ts, c_end = host["ts"][cand], host["end"][cand]
    submitted = g["submit"]
    best = np.full(len(cand), -1)
    best_gap = np.full(len(cand), np.inf)
    groups = [np.arange(len(submitted))] + [np.flatnonzero(g["stream"] == s)
                                             for s in range(int(g["stream"].max(initial=-1)) + 1)]
    for members in groups:
        if not len(members):
            continue
        order = members[np.argsort(submitted[members], kind="stable")]
        g_end = g["ts"][order] + g["dur"][order]
        run_max = np.maximum.accumulate(g_end)
        arg = _running_argmax(g_end)
        k = np.searchsorted(submitted[order], c_ts, side="left") - 1
        ok = k >= 0
        kk = np.clip(k, 0, None)
        last_end = np.where(ok, run_max[kk], -np.inf)
        gap = c_end - last_end
        fits = ok & (last_end > c_ts) & (gap >= -CLOCK_US) & (gap <= RETURN_US)
        better = fits & (gap < best_gap)
        best[better] = order[arg[kk[better]]]
        best_gap[better] = gap[better]
    _own_copies(host, g, cand, best, best_gap)
    # A stream out of launch order (clock skew, odd traces) would make the op depend on a launch
    # made after the call began: no wait is inferred then.
    has = best >= 0
    has[has] = g["reach"][best[has]] <= c_ts[has]
    n = cand[has]
    host["wait"][n] = best[has]
    host["ret"][n] = best_gap[has]
    host["dur"][n] = np.minimum(typical[long][has], host["dur"][n])


def _own_copies(host: dict[str, np.ndarray], g: dict, cand: np.ndarray, best: np.ndarray,
                best_gap: np.ndarray) -> None:
    """A copy call that returned right after its own copy ended waited for it (a copy from or
    to pageable memory is synchronous for the host; it runs after the work queued before it on
    its stream). The ops submitted before the call miss it, and without this edge the call kept
    its recorded length as fixed host time: a change that moved or removed the queued work
    left the host waiting as long as before, and one that unblocked an earlier copy let the
    host end the step before its GPU work. Updates `best`/`best_gap` (per candidate call)."""
    slot = np.full(len(host["ts"]), -1)
    slot[cand] = np.arange(len(cand))
    ops = np.flatnonzero((g["launch"] >= 0) & (g["kind"] == "memcpy"))
    ops = ops[slot[g["launch"][ops]] >= 0]
    if not len(ops):
        return
    i = slot[g["launch"][ops]]
    op_end = g["ts"][ops] + g["dur"][ops]
    gap = host["end"][cand][i] - op_end
    fits = (op_end > host["ts"][cand][i]) & (gap >= -CLOCK_US) & (gap <= RETURN_US)
    better = fits & (gap < best_gap[i])
    best[i[better]] = ops[better]
    best_gap[i[better]] = gap[better]


def _find_queue_waits(host: dict[str, np.ndarray], names: list[str], g: dict) -> None:
    """A launch call that lasted well beyond its name's typical length while the launch queue
    was full (QUEUE_FULL_DEPTH ops submitted before it still pending when it returned) waited
    for a slot: for the op that ended last before it returned. Faster GPU work then frees the
    slot sooner, and the host launches sooner."""
    calls = np.flatnonzero((host["kind"] == CALL) & (host["wait"] < 0))
    if not len(calls) or not len(g["ts"]):
        return
    launch = np.array([bool(LAUNCH_CALL.match(n)) for n in names], dtype=bool)
    calls = calls[launch[host["name"][calls]]]
    cand = calls[host["dur"][calls] > host["typical"][calls] + WAIT_MARGIN_US]
    if not len(cand):
        return
    c_ts, c_end = host["ts"][cand], host["end"][cand]
    g_end = g["ts"] + g["dur"]
    submitted = np.sort(g["submit"])
    by_end = np.argsort(g_end, kind="stable")
    ends = g_end[by_end]
    # Ops submitted before the call, less those ended by its return (those ended by then were
    # submitted before it: its thread was inside the call).
    pending = (np.searchsorted(submitted, c_ts, side="left")
               - np.searchsorted(ends, c_end, side="right"))
    j = np.searchsorted(ends, c_end + CLOCK_US, side="right") - 1
    ok = (pending >= QUEUE_FULL_DEPTH) & (j >= 0)
    op = by_end[np.clip(j, 0, None)]
    gap = c_end - g_end[op]
    ok &= (g_end[op] > c_ts) & (gap <= RETURN_US) & (g["submit"][op] < c_ts)
    ok &= g["reach"][op] <= c_ts
    n = cand[ok]
    host["wait"][n] = op[ok]
    host["ret"][n] = gap[ok]
    host["dur"][n] = np.minimum(host["typical"][n], host["dur"][n])


def _running_argmax(values: np.ndarray) -> np.ndarray:
    """Index of the running maximum at each position."""
    idx = np.arange(len(values))
    is_new = np.concatenate([[True], values[1:] > np.maximum.accumulate(values)[:-1]])
    return np.maximum.accumulate(np.where(is_new, idx, 0))


def _group_quantile(groups: np.ndarray, values: np.ndarray, q: float) -> np.ndarray:
    """Each row's group's `q` quantile (linear interpolation), bit for bit what
    `Series(values).groupby(groups).transform(lambda d: d.quantile(q))` gave: numpy's linear
    method (virtual index (n - 1) * q, then its two-sided lerp) over every group at once,
    without a Python call per group. Values with a NaN take pandas' own path."""
    if np.isnan(values).any():
        return pd.Series(values).groupby(groups).transform(lambda d: d.quantile(q)).to_numpy()
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    n = np.diff(np.r_[starts, len(g)])
    virtual = (n - 1) * np.array([q])
    prev = np.floor(virtual)
    gamma = virtual - prev
    lo = starts + prev.astype(np.intp)
    hi = starts + np.minimum(prev.astype(np.intp) + 1, n - 1)
    a, b = v[lo], v[hi]
    diff = b - a
    result = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    out = np.empty(len(values))
    out[order] = np.repeat(result, n)
    return out


# ---------------------------------------------------------------------------- GPU


def _gpu_ops(model: TraceModel, w0: float, w1: float) -> dict[str, np.ndarray]:
    """GPU ops that ran in the window or were launched in it: their columns as arrays
    (device and kind as object arrays of str, as `.astype(str)` gives them; name as a code
    into `_name_labels`, -1 when missing)."""
    gpu = model.gpu
    launch_ts, ts, end = (gpu[c].to_numpy(dtype=float) for c in ("launch_ts", "ts", "end"))
    rows = ((launch_ts >= w0) & (launch_ts < w1)) | ((end > w0) & (ts < w1))
    return {
        "ts": ts[rows], "dur": gpu["dur"].to_numpy(dtype=float)[rows],
        "stream": gpu["stream"].to_numpy(dtype=float)[rows],
        "device": gpu["device"].astype(str).to_numpy(dtype=object)[rows],
        "kind": gpu["kind"].astype(str).to_numpy(dtype=object)[rows],
        "name": _name_codes(gpu["name"])[rows],
        "bytes": gpu["bytes"].to_numpy(dtype=float)[rows],
        "correlation": gpu["correlation"].to_numpy(dtype=float)[rows],
        "step": gpu["step"].to_numpy()[rows],
    }


def _link_gpu(gpu: dict[str, np.ndarray], host: dict[str, np.ndarray]) -> dict:
    """Each op's launch node, stream chain and cross-stream wait, with every slack measured."""
    stream_id = np.where(np.isnan(gpu["stream"]), -1.0, gpu["stream"])
    dev_codes, _ = pd.factorize(gpu["device"], sort=False)
    sid_codes, sids = pd.factorize(stream_id, sort=False)
    key = dev_codes * (len(sids) + 1) + sid_codes
    stream = np.searchsorted(np.unique(key), key).astype(np.int64)
    order = np.lexsort((gpu["ts"], stream))
    gpu = {k: v[order] for k, v in gpu.items()}
    stream = stream[order]
    ts = gpu["ts"]
    dur = gpu["dur"]
    end = ts + dur
    n = len(ts)
    # launch node by correlation id (the first call node of each id)
    call_nodes = np.flatnonzero(host["kind"] == CALL)
    caller = first_match(host["corr"][call_nodes], gpu["correlation"])
    launch = pick(call_nodes, caller, -1).astype(np.int64)
    launch_ts = np.where(launch >= 0, host["ts"][np.clip(launch, 0, None)], np.nan)
    first = np.concatenate([[True], stream[1:] != stream[:-1]]) if n else np.zeros(0, bool)
    prev_end = np.where(first, -np.inf, np.concatenate([[-np.inf], end[:-1]]))
    # Typical latencies, from ops that met an idle stream / followed their predecessor.
    idle_stream = (launch >= 0) & (prev_end < launch_ts)
    lat_seen = (ts - launch_ts)[idle_stream]
    lat_seen = lat_seen[lat_seen >= 0]
    launch_us = float(np.percentile(lat_seen, 10)) if len(lat_seen) >= 5 else DEFAULT_LAUNCH_US
    gaps_seen = (ts - prev_end)[~first & ((launch < 0) | (launch_ts + launch_us < prev_end))]
    gaps_seen = gaps_seen[(gaps_seen >= 0) & (gaps_seen < READY_US)]
    gap_us = float(np.median(gaps_seen)) if len(gaps_seen) >= 5 else DEFAULT_STREAM_GAP_US
    lat_rec = ts - launch_ts
    ready_launch = np.where(launch >= 0, launch_ts + launch_us, -np.inf)
    ready = np.maximum(ready_launch, prev_end)
    explained = ts - ready <= READY_US
    lat = np.where(launch >= 0, np.minimum(lat_rec, launch_us), 0.0)
    gap = np.where(first, 0.0, np.minimum(ts - prev_end, gap_us))
    cross = np.full(n, -1)
    cgap = np.zeros(n)
    anchor = np.full(n, -np.inf)
    stream_bound = ~first & (prev_end >= ready_launch)
    # Explained: the binding constraint keeps its measured slack exactly.
    gap = np.where(explained & stream_bound, ts - prev_end, gap)
    lat = np.where(explained & ~stream_bound & (launch >= 0), lat_rec, lat)
    # Not explained: another stream's op that ended just before, else the delay stays where it
    # was (on the launch, the stream, or the recorded time).
    late = np.flatnonzero(~explained)
    if len(late):
        other = _latest_end_on_other_stream(ts, end, stream, gpu["device"], late)
        has = other >= 0
        cross[late[has]] = other[has]
        cgap[late[has]] = ts[late[has]] - end[other[has]]
        rest = late[~has]
        sb = stream_bound[rest]
        gap[rest[sb]] = ts[rest[sb]] - prev_end[rest[sb]]
        launched = rest[~sb & (launch[rest] >= 0)]
        lat[launched] = lat_rec[launched]
        orphan = rest[~sb & (launch[rest] < 0)]
        anchor[orphan] = ts[orphan]
    # Ops no launch explains and that were first on their stream keep their recorded start.
    lone = (launch < 0) & first & (cross < 0)
    anchor[lone] = ts[lone]
    unlaunched_free = (launch < 0) & ~first & explained
    gap[unlaunched_free] = ts[unlaunched_free] - prev_end[unlaunched_free]
    submit = np.where(launch >= 0, launch_ts, ts)
    return {
        "stream": stream, "device": gpu["device"], "kind": gpu["kind"], "name": gpu["name"],
        "ts": ts, "dur": dur, "bytes": gpu["bytes"], "launch": launch, "lat": lat,
        "gap": gap, "cross": cross, "cgap": cgap, "anchor": anchor,
        "step": gpu["step"], "launch_us": launch_us,
        "submit": submit, "reach": _reach(launch_ts, stream, cross),
        "correlation": gpu["correlation"],
    }


def _reach(launch_ts: np.ndarray, stream: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """Per op, the latest launch its replay needs: those of the ops before it on its stream and,
    through cross-stream waits, theirs, recursively. A host wait on the op is only kept when
    this is before the call (a stream recorded out of launch order would otherwise make the
    replay need a launch the host has not reached). Iterated to a fixed point: each round is
    one more cross-stream hop."""
    own = np.nan_to_num(launch_ts, nan=-np.inf)
    # `_link_gpu` sorts the ops by stream: each stream's running maximum (what
    # groupby(stream).cummax() gave) is one contiguous slice.
    cut = (np.flatnonzero(np.diff(stream)) + 1).tolist()
    segments = list(zip([0, *cut], [*cut, len(stream)], strict=True))

    def cummax(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for a, b in segments:
            out[a:b] = np.maximum.accumulate(x[a:b])
        return out

    reach = cummax(own)
    has = cross >= 0
    for _ in range(64):
        lifted = reach.copy()
        lifted[has] = np.maximum(lifted[has], reach[cross[has]])
        new = cummax(lifted)
        if np.array_equal(new, reach):
            break
        reach = new
    return reach


def _latest_end_on_other_stream(ts: np.ndarray, end: np.ndarray, stream: np.ndarray,
                                device: np.ndarray, late: np.ndarray) -> np.ndarray:
    """For each late op, the op on another stream of its device that ended latest within
    READY_US before it started (or CLOCK_US after), or -1."""
    out = np.full(len(late), -1)
    for dev in np.unique(device[late]):
        mine = np.flatnonzero(device == dev)
        qi = np.flatnonzero(device[late] == dev)
        q = late[qi]
        idx = _latest_other(end[mine], stream[mine], ts[q] + CLOCK_US, stream[q],
                            READY_US + CLOCK_US)
        out[qi] = np.where(idx >= 0, mine[np.clip(idx, 0, None)], -1)
    return out


def _latest_other(ends: np.ndarray, owners: np.ndarray, at: np.ndarray, mine: np.ndarray,
                  within: float | np.ndarray) -> np.ndarray:
    """Index into `ends` of the latest end at or before each `at`, at most `within` before it,
    whose owner (thread, stream) differs from `mine`; -1 when none. Steps back over a few ends
    of the query's own owner, vectorised over the queries."""
    order = np.argsort(ends, kind="stable")
    e = ends[order]
    pos = np.searchsorted(e, at, side="right") - 1
    found = np.full(len(at), -1)
    for _ in range(8):
        ok = (pos >= 0) & (found < 0)
        if not ok.any():
            break
        p = np.clip(pos, 0, None)
        cand = order[p]
        close = ok & (e[p] >= at - within)
        other = owners[cand] != mine
        hit = close & other
        found[hit] = cand[hit]
        pos = np.where(ok & close & ~other, pos - 1, -1)
    return found
