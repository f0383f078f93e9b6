"""From a columnar trace to the quantities the rules reason about.

Steps come from `ProfilerStep#N` ranges; without them iterations are inferred from what repeats on
the busiest thread, else the whole trace is one window; start-up and a one-off first step are set
aside (trace/windows.py). Each step's
wall time is split, without overlap, into host categories (see docs/metrics.md), and each GPU's
busy time is split into kernel / memcpy / memset / idle over the same window. Host copy calls are
joined to their GPU copies by correlation id so that a long `cudaMemcpyAsync` can be told apart:
time spent waiting for queued GPU work (sync) versus time the transfer itself took (copy).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stallscope.errors import NoStepsError
from stallscope.text import plural
from stallscope.trace.intervals import Timeline, enclosing, exclusive
from stallscope.trace.keyed import first_match, inner_join, pick
from stallscope.trace.load import Trace
from stallscope.trace.names import category_strings, column_isin, name_matches, per_name
from stallscope.trace.windows import (
    STARTUP_CALL_US,
    Iterations,
    Startup,
    describe_startup,
    first_step_outlier,
    infer_iterations,
    judged_window_note,
    repeats_under_way,
    startup_calls,
    startup_copies,
)
from stallscope.trace.workload import workload_of
from stallscope.units import duration, ms

HOST_CATEGORIES = ("dataloader", "sync", "h2d_copy", "other_copy", "host_compute")
GPU_CATEGORIES = ("kernel", "memcpy", "memset", "idle")

# At most 18 digits: a step number fits 64 bits (a longer one is damage, not a step marker).
STEP_NAME = re.compile(r"^ProfilerStep#(\d{1,18})$")
LOADER_NAME = re.compile(r"^enumerate\((?:DataLoader|DataPipe)\)#.*__next__$")
MEMCPY_CALL = re.compile(r"^(?:cuda|hip|cu)Memcpy")
MEMCPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
    }
)
NOT_AN_OP = re.compile(r"^(?:ProfilerStep#|enumerate\()")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")

# Runtime calls shorter than this (us) are not attributed to CPU ops: they cannot matter.
MIN_NAMED_CALL_US = 20.0
# A multi-process window (no steps) whose first GPU work comes this long (us) after its start
# begins with start-up (process, data and model set-up), not with work the user repeats.
STARTUP_GAP_US = 1_000_000.0
# Fewer GPU operations (kernels, copies, memsets) than this in the judged steps is too little to
# judge a training step: one forward, backward and optimizer update of even a one-layer model
# launches more, so such a window holds a test or a fragment whose idle share is set by fixed
# per-call latencies (launch, context, sync) that no change to a training loop addresses.
MIN_GPU_OPS = 10
# The floor for a CPU-only trace of a single short step, counted in host operations (cpu_op
# and user_annotation ranges of the stepping process, step and DataLoader markers excluded): one
# training step of even a one-layer model runs dozens (forward, loss, backward, optimizer
# update), so one step with fewer is a handful of events, not a step whose time can be
# apportioned. Several steps with few operations each still show what repeats, and a step of
# TINY_STEP_US or more is long ranges that say where its time went (the real trace
# hta/cpu_only_rank34of300_gloo: one 210 ms step, two gloo all_reduce of 170 ms): both judged.
MIN_HOST_OPS = 10
TINY_STEP_US = 10_000.0
# A host copy call that ends this close (us) to the start of its GPU copy, or later, waited for it.
CLOCK_TOLERANCE_US = 2.0


@dataclass
class Step:
    name: str
    start_us: float
    end_us: float
    breakdown_us: dict[str, float]
    loader_us: float
    loader_wait_us: float
    gpu_us: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class TraceModel:
    """Everything the rules need to know about one trace (one rank or one profiling span)."""

    trace: Trace
    steps: list[Step]
    steps_source: str  # "ProfilerStep", "inferred: <marker>" or "whole-trace"
    has_gpu: bool
    gpu_devices: list[str]
    loader_kind: str | None  # "single-process", "multi-process", "datapipe" or None
    copies: pd.DataFrame  # one row per host copy call joined to its GPU copy
    syncs: pd.DataFrame  # one row per explicit synchronisation call
    notes: list[str] = field(default_factory=list)
    # Event tables for rules (columns below; `step` is the index into `steps`, -1 outside).
    # gpu: kind (kernel|memcpy|memset), device, stream, name, ts, dur, end, correlation, bytes,
    #      blocks_per_sm, occupancy (Kineto's "blocks per SM", "est. achieved occupancy %"),
    #      launch_ts (start of the runtime call that launched it, NaN when unknown), step
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)
    # runtime: cuda_runtime / cuda_driver calls of the stepping process: name, tid, ts, dur,
    #          end, correlation, step
    runtime: pd.DataFrame = field(default_factory=pd.DataFrame)
    # ops: cpu_op and user_annotation events of the stepping process (all its threads): cat,
    #      name (categorical), tid, ts, dur, end, step; ProfilerStep and DataLoader ranges
    #      excluded
    ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    main_tid: str | None = None  # the thread that steps
    workload: str = "unknown"  # "training", "inference" or "unknown" (trace/workload.py)
    # One-off start-up set aside before the steady-state window (Startup.to_dict()), or None.
    startup: dict[str, Any] | None = None
    # Recorded steps left out of the verdict: name, start_us, end_us, duration_us, reason.
    set_aside: list[dict[str, Any]] = field(default_factory=list)
    # Why the judged window holds too little work (GPU work, or host operations in a CPU-only
    # trace) to judge a training step, or None.
    too_little: str | None = None

    @property
    def windows(self) -> np.ndarray:
        """Step windows as an (n, 2) array of [start, end) in trace microseconds."""
        return np.array([[s.start_us, s.end_us] for s in self.steps]).reshape(-1, 2)

    @property
    def compute_major(self) -> dict[str, int]:
        """Device id -> CUDA compute capability major, from deviceProperties."""
        out = {}
        for i, d in enumerate(self.trace.devices):
            major = d.get("computeMajor")
            if isinstance(major, int):
                out[str(d.get("id", i))] = major
        return out

    @property
    def total_step_us(self) -> float:
        return float(sum(s.duration_us for s in self.steps))


def build_model(trace: Trace) -> TraceModel:
    ev = trace.events
    notes: list[str] = []
    windows, step_names, main_pid, main_tid, inferred = _step_windows(ev, notes)
    if inferred is not None:
        step_names = inferred.names
    cut = trace.capture.get("incomplete_step")
    why = ("by the recording's memory budget" if isinstance(
        trace.capture.get("recording_cut"), dict) else "when the script ended")
    if cut in step_names and len(step_names) > 1:
        keep = [n != cut for n in step_names]
        windows, step_names = windows[keep], [n for n in step_names if n != cut]
        notes.append(f"{cut} was cut short {why}, so it is left out.")
    elif cut in step_names:
        notes.append(f"The only recorded step, {cut}, was cut short {why}: its figures are "
                     "for the part recorded.")
    notes.extend(trace.notes)
    source = "ProfilerStep" if step_names and inferred is None else "whole-trace"
    if inferred is not None:
        if inferred.refused:
            raise NoStepsError(
                f"no steps found in {trace.path.name}: no ProfilerStep#N markers and too few "
                f"iteration markers to cut at, and {inferred.refused}; record 3 or more "
                "iterations, calling prof.step() after each")
        source = f"inferred: {inferred.marker}"
        notes.append(_inferred_note(inferred, windows))
    if not len(windows):
        notes.append(f"{trace.path.name} holds no timed events that span any time: nothing in "
                     "it was analysed.")
    elif source == "whole-trace":
        notes.append(
            "No ProfilerStep#N markers (prof.step() was not called) and nothing repeats "
            "regularly on the busiest thread: the trace is analysed as one window, so per-step "
            "figures are for that window."
        )
    cols = _EventColumns.of(trace)
    host = cols.is_in("pid", (main_pid,)) if main_pid is not None else cols.none()
    loader = np.flatnonzero(host & cols.is_in("tid", (main_tid,)) & cols.matches(LOADER_NAME))
    loader_kind = _loader_kind(cols.text("name", loader), len(loader))
    loader_iv = (cols.ts[loader], cols.end[loader])

    rt = np.flatnonzero(host & cols.is_in("cat", RUNTIME_CATS))
    gpu = _GpuRows.of(cols)
    has_gpu = len(gpu.pos) > 0
    gpu_devices = sorted(dict.fromkeys(gpu.device.tolist()), key=_natural)
    copies = _copies(cols, rt, gpu)
    syncs = _syncs(cols, rt)
    ops = _OpRows.of(cols, np.flatnonzero(host & cols.is_in("cat", ("cpu_op",))
                                          & ~cols.matches(NOT_AN_OP)))
    for table in (copies, syncs):
        table["op"], table["top_op"] = _enclosing_ops(ops, table)
    origin = float(windows[0, 0]) if len(windows) else 0.0
    windows, startup = _set_aside_startup(windows, source, cols, rt, ops, gpu, copies, notes)
    windows, step_names, set_aside = _set_aside_outliers(
        windows, step_names, (cols.ts[rt], cols.arg("correlation")[rt]), gpu, source, notes)

    steps = _steps(windows, step_names, loader_iv, copies, syncs, gpu, gpu_devices)
    copies["step"] = _step_of(copies["ts"].to_numpy(), windows)
    syncs["step"] = _step_of(syncs["ts"].to_numpy(), windows)
    runtime_table = _table({
        "name": cols.take("name", rt).remove_unused_categories(),
        "tid": cols.take("tid", rt),
        "ts": cols.ts[rt],
        "dur": cols.dur[rt],
        "end": cols.end[rt],
        "correlation": cols.arg("correlation")[rt],
        "step": _step_of(cols.ts[rt], windows),
    })
    gpu_table = _gpu_table(cols, gpu, runtime_table, windows)
    is_op = np.flatnonzero(host & cols.is_in("cat", ("cpu_op", "user_annotation"))
                           & ~cols.matches(NOT_AN_OP) & ~cols.matches(LOADER_NAME))
    # Names stay categorical: tens of thousands of ops, a few hundred distinct names.
    op_table = _table({
        **{c: cols.take(c, is_op) for c in ("cat", "name", "tid")},
        "ts": cols.ts[is_op],
        "dur": cols.dur[is_op],
        "end": cols.end[is_op],
        "step": _step_of(cols.ts[is_op], windows),
    })
    workload = workload_of(op_table, gpu_table)
    if source == "whole-trace" and len(windows):
        notes.append(judged_window_note(float(windows[0, 0]), float(windows[0, 1]), origin,
                                        startup is not None,
                                        _held_annotations(op_table, windows[0])))
    too_little = (_too_little(gpu_table, windows, workload) if has_gpu
                  else _too_little_host(op_table, windows))
    if too_little:
        notes.append(f"Too little to judge: {too_little}.")
    return TraceModel(
        trace=trace,
        steps=steps,
        steps_source=source,
        has_gpu=has_gpu,
        gpu_devices=gpu_devices,
        loader_kind=loader_kind,
        copies=copies,
        syncs=syncs,
        notes=notes,
        gpu=gpu_table,
        runtime=runtime_table,
        ops=op_table,
        main_tid=main_tid,
        workload=workload,
        startup=startup.to_dict() if startup else None,
        set_aside=set_aside,
        too_little=too_little,
    )


def _inferred_note(inferred: Iterations, windows: np.ndarray) -> str:
    """What the iterations were cut at, and how regular they are."""
    lengths = windows[:, 1] - windows[:, 0]
    median = inferred.period_us
    spread = ""
    if len(lengths) and (lengths.max() > 1.3 * median or lengths.min() < 0.7 * median):
        spread = (f"; they range from {ms(lengths.min(), 'tenths')} to "
                  f"{ms(lengths.max(), 'tenths')} ms")
    stand_in = {
        "annotation": " (no Optimizer.step, DataLoader __next__ or zero_grad ranges repeat: a "
                      "repeating user annotation stands in)",
        "op": " (no iteration marker or user annotation repeats: the shallowest op that "
              "repeats regularly stands in, and may be a piece of an iteration)",
    }.get(inferred.kind, "")
    return (
        f"No ProfilerStep#N markers: {len(windows)} iterations were inferred from "
        f"'{inferred.marker}'{inferred.detail}{stand_in}, which repeats every "
        f"{ms(median, 'tenths')} ms (median) on the busiest thread{spread}; call prof.step() each "
        "iteration to mark them exactly."
    )


def _set_aside_startup(
    windows: np.ndarray, source: str, cols: _EventColumns, rt: np.ndarray, ops: _OpRows,
    gpu: _GpuRows, copies: pd.DataFrame, notes: list[str],
) -> tuple[np.ndarray, Startup | None]:
    """Start-up before the steady-state window: initialisation calls (context creation, library
    set-up, module loading) before the first step, or, in a one-window trace, up to the end of
    the last of them and of a long wait for the first GPU work. The window is trimmed so the
    rules never judge start-up as the step's bottleneck; in a one-window trace a long call made
    once copies repeat (the work is under way) is the work's own cost, not start-up."""
    if not len(windows) or not len(rt):
        return windows, None
    whole = source == "whole-trace"
    if not whole and not (cols.dur[rt] >= STARTUP_CALL_US).any():
        return windows, None  # no call long enough to be start-up (startup_calls' first test)
    runtime = cols.events.iloc[rt]
    origin = float(windows[0, 0])
    calls = startup_calls(runtime, None if whole else float(windows[0, 0]))
    if whole:
        calls = calls[(calls["end"] < windows[0, 1])
                      & (calls["ts"] < repeats_under_way(copies))]
    start = float(calls["end"].max()) if len(calls) else origin
    gap = 0.0
    if whole and len(gpu.pos):
        later = gpu.ts[gpu.ts >= start]
        first_gpu = float(later.min()) if len(later) else start
        if first_gpu - start >= STARTUP_GAP_US:
            gap, start = first_gpu - start, first_gpu
    if not len(calls) and not gap:
        return windows, None
    if len(calls):
        inner, outer = _enclosing_ops(ops, calls.reset_index(drop=True))
        calls = calls.assign(op=inner, top_op=outer)
    first_call = float(cols.ts[rt].min())
    rows, what = describe_startup(calls, first_call, gap)
    uploads = None
    if whole:
        phrase, uploads = startup_copies(copies, start)
        what += phrase
    end = start if whole else float(windows[0, 0])
    startup = Startup(origin if whole else first_call, end, rows, what, uploads)
    if whole:
        windows = windows.copy()
        windows[0, 0] = start
    notes.append(
        f"Start-up set aside: {startup.duration_us / 1e6:.2f} s before the steady-state window "
        f"({what}). One-off costs are not steps: the rules judge only what follows."
    )
    return windows, startup


def _set_aside_outliers(
    windows: np.ndarray, names: list[str], runtime: tuple[np.ndarray, np.ndarray],
    gpu: _GpuRows, source: str, notes: list[str],
) -> tuple[np.ndarray, list[str], list[dict[str, Any]]]:
    """Leave a one-off first step out of the verdict (trace/windows.py says which).
    `runtime`: the start and correlation id of each runtime call of the stepping process."""
    if source == "whole-trace" or not len(windows):
        return windows, names, []
    n = len(windows)
    if n < 3:
        notes.append(
            f"Only {plural(n, 'step')} to judge: all are kept, none set aside as an outlier (that "
            "needs "
            "3 or more); record more steps so a one-off first step can be told apart."
        )
        return windows, names, []
    durations = windows[:, 1] - windows[:, 0]
    reason = first_step_outlier(durations, _pre_window_busy(windows[0], runtime, gpu))
    if reason is None:
        return windows, names, []
    label = names[0] if names else "the first step"
    dropped = {"name": label, "start_us": round(float(windows[0, 0]), 3),
               "end_us": round(float(windows[0, 1]), 3),
               "duration_us": round(float(durations[0]), 3), "reason": reason}
    notes.append(f"{label} is left out of the verdict: {reason}.")
    return windows[1:], names[1:], [dropped]


def _pre_window_busy(window: np.ndarray, runtime: tuple[np.ndarray, np.ndarray],
                     gpu: _GpuRows) -> float:
    """GPU time inside `window` taken by work launched before the window began (merged)."""
    rt_ts, rt_corr = runtime
    if not len(gpu.pos) or not len(rt_ts):
        return 0.0
    early = rt_corr[rt_ts < window[0]]
    if not len(early):
        return 0.0
    g = np.isin(gpu.correlation, early[~np.isnan(early)])
    lo = np.clip(gpu.ts[g], window[0], window[1])
    hi = np.clip(gpu.end[g], window[0], window[1])
    if not len(lo):
        return 0.0
    tl = Timeline.from_intervals((lo, hi))
    return float(tl.lengths[tl.cover(lo, hi)].sum())


def _held_annotations(ops: pd.DataFrame, window: np.ndarray, most: int = 3) -> list[str]:
    """The user annotations inside `window` that span a tenth of it or more, in time order: what
    the user called the work judged there."""
    if not len(ops):
        return []
    span = float(window[1] - window[0])
    mask = ((ops["cat"].astype(str) == "user_annotation").to_numpy()
            & (ops["ts"].to_numpy() >= window[0]) & (ops["end"].to_numpy() <= window[1])
            & (ops["dur"].to_numpy() >= 0.1 * span))
    names = ops.loc[mask].sort_values("ts", kind="stable")["name"].astype(str)
    return list(dict.fromkeys(names))[:most]


def _too_little(gpu: pd.DataFrame, windows: np.ndarray, workload: str) -> str | None:
    """What the judged window holds, when it is too little GPU work to judge a step."""
    if int((gpu["step"].to_numpy() >= 0).sum()) >= MIN_GPU_OPS or not len(windows):
        return None
    inside = gpu[gpu["step"] >= 0]
    kernels = int((inside["kind"] == "kernel").sum())
    busy = float(inside["dur"].sum())
    span = float(windows[-1, 1] - windows[0, 0])
    return (
        f"{plural(kernels, 'kernel')} and {plural(len(inside) - kernels, 'other GPU operation')}, "
        f"{busy:.1f} us of GPU work in a {duration(span)} window (fewer than {MIN_GPU_OPS} "
        + ("GPU operations cannot be one batch of a model's inference); record several "
           "batches of the inference loop, calling prof.step() after each"
           if workload == "inference" else
           "GPU operations cannot be one training step); record several steps of the training "
           "loop, calling prof.step() after each")
    )


def _too_little_host(ops: pd.DataFrame, windows: np.ndarray) -> str | None:
    """`_too_little` for a CPU-only trace: what the judged window holds, when it is one short
    step of a handful of host operations."""
    n = int((ops["step"] >= 0).sum()) if len(ops) else 0
    if n >= MIN_HOST_OPS or len(windows) != 1:
        return None
    span = float(windows[-1, 1] - windows[0, 0])
    if span >= TINY_STEP_US:
        return None
    # So few operations say nothing of the workload (no backward pass may just be unrecorded).
    return (
        f"{plural(n, 'CPU operation')} in one {duration(span)} step (fewer than {MIN_HOST_OPS} "
        "operations cannot be a training step or a batch of a model's inference); record "
        "several steps of the loop, calling prof.step() after each"
    )


def _gpu_table(
    cols: _EventColumns, gpu: _GpuRows, runtime: pd.DataFrame, windows: np.ndarray
) -> pd.DataFrame:
    """GPU events with the host time of the call that launched each (joined by correlation),
    by start (the order of pandas' sort_values: numpy's default argsort)."""
    # The first runtime call of each correlation id launched it.
    call = first_match(runtime["correlation"].to_numpy(), gpu.correlation)
    launch_ts = pick(runtime["ts"].to_numpy(), call, np.nan)
    order = np.argsort(gpu.ts, kind="stable")
    rows = gpu.pos[order]
    return _table({
        "kind": pd.array(gpu.kind[order], dtype="str"),
        "device": pd.array(gpu.device[order], dtype="str"),
        "name": cols.take("name", rows).remove_unused_categories(),
        "ts": gpu.ts[order],
        "dur": gpu.dur[order],
        "end": gpu.end[order],
        "correlation": gpu.correlation[order],
        "bytes": gpu.bytes[order],
        "stream": cols.arg("stream")[rows],
        # Kineto's per-kernel estimates (NaN where the trace has none): the GPU summary's.
        "blocks_per_sm": cols.arg("blocks_per_sm")[rows],
        "occupancy": cols.arg("occupancy")[rows],
        "launch_ts": launch_ts[order],
        "step": _step_of(gpu.ts[order], windows),
    })


def _steps(
    windows: np.ndarray,
    step_names: list[str],
    loader_iv: tuple[np.ndarray, np.ndarray],
    copies: pd.DataFrame,
    syncs: pd.DataFrame,
    gpu: _GpuRows,
    gpu_devices: list[str],
) -> list[Step]:
    """Per-step host and GPU breakdowns, from one timeline cut at every boundary that matters."""
    has_gpu = len(gpu.pos) > 0
    copy_ts, wait_us = copies["ts"].to_numpy(), copies["wait_us"].to_numpy()
    copy_start = copy_ts + wait_us
    copy_end = copy_start + copies["copy_us"].to_numpy()
    sync_iv = (
        np.concatenate([syncs["ts"].to_numpy(), copy_ts]),
        np.concatenate([syncs["end"].to_numpy(), copy_start]),
    )
    is_h2d = (copies["direction"] == "HtoD").to_numpy()
    h2d_iv = (copy_start[is_h2d], copy_end[is_h2d])
    other_iv = (copy_start[~is_h2d], copy_end[~is_h2d])
    gpu_ivs = {}
    for dev in gpu_devices:
        for kind in ("kernel", "memcpy", "memset"):
            mine = (gpu.device == dev) & (gpu.kind == kind)
            if mine.any():
                gpu_ivs[(dev, kind)] = (gpu.ts[mine], gpu.end[mine])
    win = (windows[:, 0], windows[:, 1])
    tl = Timeline.from_intervals(win, loader_iv, sync_iv, h2d_iv, other_iv, *gpu_ivs.values())
    bucket = tl.bucket(*win)
    n = len(windows)

    def per_step(mask: np.ndarray) -> np.ndarray:
        return tl.sum_by(mask, bucket, n)

    loader_m, sync_m, h2d_m, other_m = (
        tl.cover(*iv) for iv in (loader_iv, sync_iv, h2d_iv, other_iv)
    )
    host_parts = exclusive([loader_m, sync_m, h2d_m, other_m])
    host_us = [per_step(m) for m in host_parts]
    gpu_any = np.zeros_like(loader_m)
    gpu_steps: dict[str, list[np.ndarray]] = {}
    for dev in gpu_devices:
        masks = [
            tl.cover(*gpu_ivs.get((dev, k), (np.empty(0), np.empty(0))))
            for k in ("kernel", "memcpy", "memset")
        ]
        for m in masks:
            gpu_any |= m
        gpu_steps[dev] = [per_step(m) for m in exclusive(masks)]
    loader_total = per_step(loader_m)
    loader_wait = per_step(loader_m & ~gpu_any) if has_gpu else loader_total

    steps = []
    for i, (start, end) in enumerate(windows):
        wall = end - start
        parts = {c: float(host_us[j][i]) for j, c in enumerate(HOST_CATEGORIES[:-1])}
        parts["host_compute"] = max(wall - sum(parts.values()), 0.0)
        gpu_parts = {}
        for dev, arrays in gpu_steps.items():
            busy = {k: float(a[i]) for k, a in zip(GPU_CATEGORIES[:3], arrays, strict=True)}
            busy["idle"] = max(wall - sum(busy.values()), 0.0)
            gpu_parts[dev] = busy
        steps.append(
            Step(
                name=step_names[i] if step_names else "whole trace",
                start_us=float(start),
                end_us=float(end),
                breakdown_us=parts,
                loader_us=float(loader_total[i]),
                loader_wait_us=float(loader_wait[i]),
                gpu_us=gpu_parts,
            )
        )
    return steps


def _step_windows(
    ev: pd.DataFrame, notes: list[str]
) -> tuple[np.ndarray, list[str], str | None, str | None, Iterations | None]:
    """Step windows [start, end) in trace time, their names ([] for the whole-trace window),
    and the (pid, tid) of the thread that steps. Odd step markers are noted, not hidden."""
    is_step = (name_matches(ev["name"], STEP_NAME).to_numpy()
               & column_isin(ev["cat"], ("user_annotation", "cpu_op")))
    rows = np.flatnonzero(is_step)
    if len(rows):
        all_ts = ev["ts"].to_numpy()
        rows = rows[np.argsort(all_ts[rows], kind="stable")]  # ties in row order
        names = ev["name"].iloc[rows]
        numbers = per_name(names, _step_number).to_numpy().astype(np.int64)
        first = np.zeros(len(rows), dtype=bool)
        first[np.unique(numbers, return_index=True)[1]] = True
        if not first.all():
            repeated = ~first
            again = sorted(set(numbers[repeated].tolist()))
            shown = ", ".join(f"#{n}" for n in again[:5]) + (" ..." if len(again) > 5 else "")
            notes.append(
                f"ProfilerStep numbers repeat ({shown}; {int(repeated.sum())} repeats): only the "
                "first range of each number is a step here. Two recordings in one file, or two "
                "threads stepping, do this; analyse them as separate files."
            )
            rows, numbers = rows[first], numbers[first]
        starts = all_ts[rows]
        ends = ev["end"].to_numpy()[rows]
        # A step cannot outlast the start of the next one.
        ends = np.minimum(ends, np.append(starts[1:], np.inf))
        keep = ends > starts
        if keep.any():  # else only empty markers: treated as no markers
            rows = rows[keep]
            names_out = [f"ProfilerStep#{n}" for n in numbers[keep].tolist()]
            main = _stepping_thread(ev, rows)
            return (np.column_stack([starts[keep], ends[keep]]), names_out, main[0], main[1],
                    None)
    host = ev[ev["cat"].isin(HOST_CATS)]
    body = ev[ev["cat"] != "Trace"]
    if len(body) == 0:
        return np.empty((0, 2)), [], None, None, None
    window = np.array([[body["ts"].min(), body["end"].max()]])
    if not window[0, 1] > window[0, 0]:  # events of no duration: no time to break down
        return np.empty((0, 2)), [], None, None, None
    if len(host) == 0:
        return window, [], None, None, None
    busiest = host.groupby(["pid", "tid"], observed=True)["dur"].sum().idxmax()
    mine = host[(host["pid"] == busiest[0]) & (host["tid"] == busiest[1])]
    inferred = infer_iterations(mine)
    if inferred is not None:
        return inferred.windows, [], str(busiest[0]), str(busiest[1]), inferred
    return window, [], str(busiest[0]), str(busiest[1]), None


def _step_number(name: str) -> int:
    """N of a `ProfilerStep#N` name."""
    return int(STEP_NAME.match(name).group(1))  # type: ignore[union-attr]


def _stepping_thread(ev: pd.DataFrame, rows: np.ndarray) -> tuple[str, str]:
    """(pid, tid) of the thread holding most of the step ranges at `rows`."""
    pid, tid = ev["pid"], ev["tid"]
    if isinstance(pid.dtype, pd.CategoricalDtype) and isinstance(tid.dtype, pd.CategoricalDtype):
        p, t = pid.array.codes[rows], tid.array.codes[rows]
        if p[0] >= 0 and t[0] >= 0 and (p == p[0]).all() and (t == t[0]).all():  # one thread
            return (category_strings(pid.dtype.categories)[p[0]],
                    category_strings(tid.dtype.categories)[t[0]])
    # Several: the most frequent, ties as pandas' value_counts orders them.
    main = ev.iloc[rows][["pid", "tid"]].astype(str).value_counts().idxmax()
    return main[0], main[1]


def _loader_kind(names: np.ndarray, count: int) -> str | None:
    """The DataLoader kind from the names of the training thread's `__next__` ranges."""
    text = " ".join(dict.fromkeys(str(n) for n in names))
    if "_MultiProcessingDataLoaderIter" in text:
        return "multi-process"
    if "_SingleProcessDataLoaderIter" in text:
        return "single-process"
    if "DataPipe" in text:
        return "datapipe"
    return "other" if count else None


def _device_column(cols: _EventColumns, rows: np.ndarray) -> np.ndarray:
    """`args.device` as text, else the GPU row's pid (one conversion per distinct value)."""
    raw = cols.arg("device")[rows]
    # A device id is a whole number; a fractional or out-of-range one (damage) counts as absent.
    with np.errstate(invalid="ignore"):
        whole = (raw == np.floor(raw)) & (np.abs(raw) < 2**53)
    out = cols.text("pid", rows)
    if whole.any():
        ids, where = np.unique(raw[whole], return_inverse=True)
        out[whole] = np.array([str(int(i)) for i in ids], dtype=object)[where]
    return out


def _natural(s: str) -> tuple[int, str]:
    return (int(s), "") if s.isdigit() else (1 << 30, s)


def _copies(cols: _EventColumns, rt: np.ndarray, gpu: _GpuRows) -> pd.DataFrame:
    """Host copy calls joined to their GPU copies, with the host time split into wait and copy.

    The join is pandas' inner merge on correlation, done on arrays: one row per (call, GPU
    copy) pair with equal ids, in the calls' order, then the GPU copies' order."""
    calls = rt[cols.matches(MEMCPY_CALL)[rt]]
    call_corr = cols.arg("correlation")[calls]
    dev = np.flatnonzero(gpu.kind == "memcpy")
    left, right = inner_join(call_corr, gpu.correlation[dev])
    right = dev[right]  # positions among the GPU rows
    host, copy = calls[left], gpu.pos[right]
    ts, dur, end = cols.ts[host], cols.dur[host], cols.end[host]
    ts_gpu = cols.ts[copy]
    parsed = [_memcpy_parts(n) for n in cols.text("name", copy)]
    blocking = end >= ts_gpu - CLOCK_TOLERANCE_US
    wait = ts_gpu - ts
    wait = np.minimum(np.where(wait < 0.0, 0.0, wait), dur)
    wait_us = np.where(blocking, wait, 0.0)
    return _table({
        "name": cols.take("name", host),
        "tid": cols.take("tid", host),
        "ts": ts,
        "dur": dur,
        "end": end,
        "correlation": call_corr[left],
        "name_gpu": cols.take("name", copy),
        "ts_gpu": ts_gpu,
        "dur_gpu": cols.dur[copy],
        "end_gpu": cols.end[copy],
        "stream_gpu": cols.arg("stream")[copy],  # what the copy queued behind
        "bytes": gpu.bytes[right],
        "device": pd.array(gpu.device[right], dtype="str"),
        **{part: pd.array([p[i] for p in parsed], dtype="str")
           for i, part in enumerate(("direction", "src", "dst"))},
        "blocking": blocking,
        "wait_us": wait_us,
        "copy_us": np.where(blocking, dur - wait_us, 0.0),
    })


@functools.lru_cache(maxsize=1 << 12)
def _memcpy_parts(name: str | float) -> tuple[str, str, str]:
    """Direction, source and destination memory of a GPU copy, from its name (NaN: none)."""
    found = MEMCPY_NAME.match(name) if isinstance(name, str) else None
    return (found[1], found[2], found[3]) if found else ("unknown", "unknown", "unknown")


def _syncs(cols: _EventColumns, rt: np.ndarray) -> pd.DataFrame:
    """Explicit synchronisation calls."""
    calls = rt[cols.is_in("name", tuple(SYNC_CALLS))[rt]]
    return _table({
        "name": pd.array(cols.text("name", calls), dtype="str"),
        "tid": cols.take("tid", calls),
        "ts": cols.ts[calls],
        "dur": cols.dur[calls],
        "end": cols.end[calls],
    })


def _enclosing_ops(ops: _OpRows, calls: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Innermost and outermost CPU op (same thread) around each runtime call, or ''.

    Done by time containment rather than External id, whose meaning on runtime events varies
    between Kineto versions. `calls` has a 0..n-1 index.
    """
    inner = np.full(len(calls), "", dtype=object)
    outer = np.full(len(calls), "", dtype=object)
    if len(calls) == 0 or len(ops.ts) == 0:
        return inner, outer
    # Only calls that held the host up are worth naming, and only ops at least that long can
    # hold such a call (`_OpRows` keeps only those): most ops are shorter, so this shrinks the
    # search manyfold.
    held = np.flatnonzero(calls["dur"].to_numpy() >= MIN_NAMED_CALL_US)
    tids = calls["tid"].astype(str).to_numpy(dtype=object)[held]
    call_ts, call_end = calls["ts"].to_numpy(), calls["end"].to_numpy()
    for tid in dict.fromkeys(t for t in tids.tolist() if isinstance(t, str)):
        positions = held[tids == tid]
        mine = ops.tid == tid
        if not mine.any():
            continue
        i_in, i_out = enclosing(ops.ts[mine], ops.end[mine], call_ts[positions],
                                call_end[positions])
        names = ops.name[mine]
        found = i_in >= 0
        inner[positions[found]] = names[i_in[found]]
        outer[positions[found]] = names[i_out[found]]
    return inner, outer


def _step_of(ts: np.ndarray, windows: np.ndarray) -> np.ndarray:
    if len(windows) == 0:
        return np.full(len(ts), -1)
    idx = np.searchsorted(windows[:, 0], ts, side="right") - 1
    ok = (idx >= 0) & (ts < windows[np.clip(idx, 0, None), 1])
    return np.where(ok, idx, -1)


class _EventColumns:
    """The event table's columns as arrays, read once. Rows are picked with boolean masks and
    positions on these: each pandas filter of the frame costs a fraction of a millisecond, and
    the model makes dozens of them on tables of a few thousand rows."""

    def __init__(self, events: pd.DataFrame, args: pd.DataFrame) -> None:
        self.events = events
        self.n = len(events)
        self.ts = events["ts"].to_numpy()
        self.dur = events["dur"].to_numpy()
        self.end = events["end"].to_numpy()
        if not args.index.equals(events.index):  # same rows by label, then by position
            args = args.loc[events.index]
        self.args = args

    @classmethod
    def of(cls, trace: Trace) -> _EventColumns:
        return cls(trace.events, trace.args)

    def none(self) -> np.ndarray:
        return np.zeros(self.n, dtype=bool)

    def arg(self, name: str) -> np.ndarray:
        """An `args` field (float64) per event."""
        return self.args[name].to_numpy()

    def is_in(self, column: str, values: tuple[Any, ...]) -> np.ndarray:
        return column_isin(self.events[column], values)

    def matches(self, pattern: re.Pattern[str]) -> np.ndarray:
        return name_matches(self.events["name"], pattern).to_numpy()

    def take(self, column: str, rows: np.ndarray) -> Any:
        """`events[column]` at `rows` as an array (a categorical keeps its categories)."""
        return self.events[column].array.take(rows)

    def text(self, column: str, rows: np.ndarray) -> np.ndarray:
        """`events[column].astype(str)` at `rows`, as an object array (NaN where missing)."""
        series = self.events[column]
        if isinstance(series.dtype, pd.CategoricalDtype):
            text = category_strings(series.dtype.categories)
            return text[series.array.codes[rows]]
        return series.iloc[rows].astype(str).to_numpy(dtype=object)


def _table(columns: dict[str, Any]) -> pd.DataFrame:
    """A frame of `columns` (arrays of one length) on a 0..n-1 index (pandas' default)."""
    return pd.DataFrame(columns)


@dataclass
class _GpuRows:
    """The GPU events (kernels, copies, memsets) of the trace as arrays, in table order."""

    pos: np.ndarray  # rows of the event table
    kind: np.ndarray  # object: kernel | memcpy | memset
    device: np.ndarray  # object: `args.device` as text, else the row's pid
    ts: np.ndarray
    dur: np.ndarray
    end: np.ndarray
    correlation: np.ndarray
    bytes: np.ndarray

    @classmethod
    def of(cls, cols: _EventColumns) -> _GpuRows:
        pos = np.flatnonzero(cols.is_in("cat", tuple(GPU_CATS)))
        kind = np.empty(len(pos), dtype=object)
        for cat, name in GPU_CATS.items():
            kind[cols.is_in("cat", (cat,))[pos]] = name
        return cls(pos, kind, _device_column(cols, pos), cols.ts[pos], cols.dur[pos],
                   cols.end[pos], cols.arg("correlation")[pos], cols.arg("bytes")[pos])


@dataclass
class _OpRows:
    """CPU ops long enough to hold a runtime call worth naming (see `_enclosing_ops`)."""

    tid: np.ndarray  # object: thread id as text
    ts: np.ndarray
    end: np.ndarray
    name: np.ndarray  # object: op name

    @classmethod
    def of(cls, cols: _EventColumns, rows: np.ndarray) -> _OpRows:
        rows = rows[cols.dur[rows] >= MIN_NAMED_CALL_US]
        return cls(cols.text("tid", rows), cols.ts[rows], cols.end[rows],
                   cols.text("name", rows))
