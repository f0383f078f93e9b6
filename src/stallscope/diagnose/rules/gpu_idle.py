"""`gpu-idle`: the GPU sits idle inside the training step, and whose fault that is.

Per device, the time inside step windows when no kernel, memcpy or memset runs, with every idle
gap split the way HolisticTraceAnalysis's idle-time breakdown does: a *host-wait* gap is one the
host caused (the runtime call that launched the next GPU work started only after the GPU had
gone idle: the host was late, busy loading data, blocked, or simply too slow at launching small
kernels); any other gap had its next work already queued (it waited on a stream/event
dependency or another device) or is the tail of the step. The part of the idle time during
which the host was waiting on the DataLoader is reported separately, because that cause and its
fix belong to `dataloader-bound`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import IDLE_THRESHOLD_PCT, idle_windows, judged_steps, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Change, RuleSpec
from stallscope.runfacts import RunContext
from stallscope.trace.grouped import group_sums
from stallscope.trace.intervals import Timeline
from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import column_equals_text, name_flags, name_mask, regex_hit
from stallscope.trace.workload import step_word
from stallscope.units import millis, percent

RULE_ID = "gpu-idle"

# Among the idle time not explained by the DataLoader, the share one cause needs to be named
# as the dominant one; below this the advice covers both.
DOMINANT_SHARE = 0.6
# How many of the largest idle gaps to list as evidence.
TOP_GAPS = 5
# A host-wait gap whose host ran this long (us) before launching the work that ended it was
# not launch overhead: a launch costs the host ~5-10 us and an ATen op's dispatch ~10-20 us, so
# 100 us without a launch is several ops' worth of host time that launched nothing (data
# preprocessing, tokenisation, Python bookkeeping, CPU tensor ops).
CPU_WORK_MIN_GAP_US = 100.0
TOP_HOST_OPS = 5
# Runtime calls that issue GPU work: an op during which one is made launched something.
ISSUING_CALL = re.compile(r"Launch|Memcpy|Memset")

# Idle gap causes: the next GPU work was launched after the GPU went idle (the host was late);
# it had been launched before (it waited on a dependency, or the step ended); its launch is not
# in the trace (no runtime call with its correlation id), so no cause can be given.
GAP_KINDS = ("host-wait", "other", "launch-unknown")
IDLE_DOCS = "https://hta.readthedocs.io/en/latest/source/features/idle_time_breakdown.html"


def gpu_idle(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    if not model.steps or model.total_step_us <= 0:
        return Assessment(RULE_ID, "not_assessed", "No step windows to measure idle time in.")
    windows = idle_windows(model)
    total = float((windows[:, 1] - windows[:, 0]).sum())
    if total <= 0:
        return Assessment(RULE_ID, "not_assessed", "No GPU work inside the analysed window.")
    n = len(model.steps)
    host = _host_layers(model)
    by_device = {dev: _gap_pieces(model, dev, windows, host) for dev in model.gpu_devices}
    idle_by_device = {dev: float(p.us.sum()) for dev, p in by_device.items()}
    # The busiest device bounds the step: idle there is what the step could actually lose.
    dev = min(idle_by_device, key=lambda d: idle_by_device[d])
    idle = idle_by_device[dev]
    idle_pct = pct(idle, total)
    if idle_pct < IDLE_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The busiest GPU (device {dev}) is idle {percent(idle_pct)} of step time (threshold "
            f"{percent(IDLE_THRESHOLD_PCT, 0)}).",
        )
    p = by_device[dev]
    # Sums by kind and by gap as pandas' groupby gave them (trace/grouped.py), kinds labelled
    # in their sorted order as groupby("kind") did.
    kind_label = _KIND_SORT_LABEL[p.kind_code]
    by_kind = group_sums(p.us, kind_label, len(GAP_KINDS))
    host_us, other_us, unknown_us = (float(by_kind[_KIND_SORT_LABEL[k]]) for k in range(3))
    loader_us = float(p.loader_us.sum())
    sync_us = float(p.sync_us.sum())
    # Idle time not explained by the DataLoader wait, split by cause.
    not_loader = group_sums(p.us - p.loader_us, kind_label, len(GAP_KINDS))
    rest_host, rest_other, rest_unknown = (float(not_loader[_KIND_SORT_LABEL[k]])
                                           for k in range(3))
    rest = rest_host + rest_other + rest_unknown
    # One row per gap: its pieces (one per step it spans) are consecutive.
    gap_first = np.flatnonzero(np.r_[True, p.gap[1:] != p.gap[:-1]]) if len(p.gap) else p.gap
    gap_label = np.cumsum(np.r_[True, p.gap[1:] != p.gap[:-1]]) - 1 if len(p.gap) else p.gap
    gap_us = group_sums(p.us, gap_label, len(gap_first))
    gap_loader = group_sums(p.loader_us, gap_label, len(gap_first))
    gap_kind = p.kind_code[gap_first]
    top = _largest(gap_us, TOP_GAPS)
    g = model.gpu
    kernels = ((g["device"].to_numpy() == dev) & (g["kind"].to_numpy() == "kernel")
               & (g["step"].to_numpy() >= 0))
    kernel_dur = g["dur"].to_numpy()[kernels]
    host_gaps = gap_us[gap_kind == 0]
    evidence = {
        "device": dev,
        "idle_share_pct": idle_pct,
        "idle_ms_per_step": ms(idle / n),
        "host_wait_share_pct": pct(host_us, total),
        "other_share_pct": pct(other_us, total),
        "launch_unknown_share_pct": pct(unknown_us, total),
        "host_wait_pct_of_idle": pct(host_us, idle),
        "idle_during_dataloader_pct": pct(loader_us, idle),
        "idle_during_sync_pct": pct(sync_us, idle),
        "unexplained_idle_share_pct": pct(rest, total),
        "gaps_per_step": round(len(gap_first) / n, 1),
        "median_host_wait_gap_us": round(_median(host_gaps), 1) if len(host_gaps) else 0.0,
        "kernels_per_step": round(len(kernel_dur) / n, 1),
        "median_kernel_us": round(_median(kernel_dur), 1) if len(kernel_dur) else 0.0,
        "largest_gaps": [
            {"step": model.steps[int(p.step[f])].name,
             "at_ms_into_step": ms(float(p.offset_us[f])), "ms": ms(float(gap_us[i])),
             "kind": GAP_KINDS[gap_kind[i]],
             "during_dataloader_ms": ms(float(gap_loader[i])),
             "next_gpu_work": str(p.next_name[f])[:80]}
            for i, f in ((int(i), int(gap_first[i])) for i in top)
        ],
        "steps": n,
    }
    if len(idle_by_device) > 1:
        evidence["idle_share_pct_by_device"] = {
            d: pct(u, total) for d, u in idle_by_device.items()
        }
    if model.steps_source == "whole-trace":
        evidence["window"] = (
            "no ProfilerStep markers: the span from the first to the last GPU activity"
        )
    cause = _idle_cause(loader_us, idle, rest_host, rest_other, rest_unknown)
    # Without recorded host ops nothing says what the host did (legacy GPU-only exports).
    if len(model.ops):
        cpu_pieces = _cpu_work_pieces(p, gap_label, len(gap_first))
    else:
        cpu_pieces = np.zeros(len(p.gap), dtype=bool)
    cpu_us = float(p.cpu_work_us[cpu_pieces].sum())
    if cpu_us > 0:
        evidence["cpu_work_share_pct"] = pct(cpu_us, total)
        evidence["cpu_work_ms_per_step"] = ms(cpu_us / n)
        evidence["cpu_work_ops"] = _cpu_work_ops(model, host, p, p.gap[cpu_pieces], n)
    if cause in ("host-wait", "mixed") and cpu_us >= DOMINANT_SHARE * rest_host > 0:
        cause = "host-cpu-work"
    regions = _host_regions(model, p, windows, n, host_us)
    if regions:
        evidence["host_wait_under"] = regions
        # Host time no launch-overhead fix removes: name it as the cause when it holds most
        # of the host-wait idle and the host-wait idle is the larger part.
        region = regions[0]
        if cause in ("host-wait", "mixed", "host-cpu-work") and rest_host >= rest_other \
                and region["pct_of_host_wait"] >= REGION_CAUSE_PCT:
            cause = region["kind"]
    evidence["dominant_cause"] = cause
    rec, snippet, precondition = _idle_advice(model, cause, evidence, rest_host, rest_other)
    title = f"The GPU is idle {percent(idle_pct)} of each {step_word(model.workload)}" + {
        "dataloader": ", mostly while the host waits for the DataLoader",
        "host-wait": ", waiting for the host to launch work",
        "host-cpu-work": ", while the host does CPU work that launches nothing"
        + _ops_named(evidence),
        "other": ", with work queued behind dependencies or after the step's last kernel",
        "launch-unknown": "",
        "mixed": (f": {percent(pct(rest_host, total))} waiting for the host's launches"
                  f"{_region_words(evidence, model, ' (the host in ')}, "
                  f"{percent(pct(rest_other, total))} with work queued behind dependencies"),
        "host-optimizer": _region_words(evidence, model),
        "allocator": _region_words(evidence, model),
    }[cause]
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=rec,
        snippet=snippet,
        precondition=precondition,
        estimated_saving_pct=_bound_pct(p, windows, judged_steps(n)),
        saving_basis=(
            f"upper bound: the idle time of the busiest GPU (device {dev}) inside the steps, "
            "less the part during which the host waited on the DataLoader (that is "
            "dataloader-bound's saving, not counted twice), if the GPU were kept busy through "
            "every remaining gap; the step can never get shorter than that GPU's busy time"
        ),
        docs=IDLE_DOCS,
    )
    return Assessment.found(finding)


def _bound_pct(p: _GapPieces, windows: np.ndarray, judged: slice) -> float:
    """The idle time not spent waiting on the DataLoader, as a share of the steps the plan's
    median and floor are over (not the first step, which carries work queued before the
    recording): a bound over all steps, set against the median of the others, claimed more
    than the step less its floor allowed (real-h200-r1-w8-pinned: 57.4% against 50.4%)."""
    first, stop = judged.start, judged.stop
    mine = (p.step >= first) & (p.step < stop)
    total = float((windows[first:stop, 1] - windows[first:stop, 0]).sum())
    return pct(float((p.us[mine] - p.loader_us[mine]).sum()), total) if total > 0 else 0.0


def idle_gaps(model: TraceModel, dev: str, windows: np.ndarray | None = None) -> pd.DataFrame:
    """Idle pieces of one device inside the windows (default: the steps), one row per
    (gap, step) piece.

    Columns: gap (gap index), step, us (idle length inside the step), offset_us (piece start
    from the step start), kind (one of GAP_KINDS), next_name (the GPU work that ended the gap),
    loader_us / sync_us (part of the piece during which the stepping thread waited in
    DataLoader.__next__ / a synchronising call), cpu_work_us (part of a host-wait piece before
    the launch that ended the gap, outside those waits and outside runtime calls: the host was
    doing something other than launching), start_us (the piece's start in trace time).
    """
    windows = model.windows if windows is None else windows
    p = _gap_pieces(model, dev, windows, _host_layers(model))
    out = pd.DataFrame({
        "gap": p.gap, "step": p.step, "us": p.us, "start_us": p.start_us,
        "loader_us": p.loader_us, "sync_us": p.sync_us, "cpu_work_us": p.cpu_work_us,
    })
    out["offset_us"] = p.offset_us
    out["kind"] = np.array(GAP_KINDS, dtype=object)[p.kind_code]
    out["next_name"] = p.next_name
    # The CPU-work segments themselves (disjoint, in time order), for naming what ran in them.
    out.attrs["cpu_work_segments"] = p.cpu_work_segments
    return out


@dataclass
class _HostLayers:
    """The host intervals every device's gaps are cut by (start and end arrays), built once
    per rule call rather than once per device."""

    sync: tuple[np.ndarray, np.ndarray]
    loader: tuple[np.ndarray, np.ndarray]
    runtime: tuple[np.ndarray, np.ndarray]
    quiet_rows: np.ndarray  # positions in model.ops of the stepping thread's CPU-work ops
    busy_rows: np.ndarray  # ... and of its ops that launched something
    quiet: tuple[np.ndarray, np.ndarray]
    busy: tuple[np.ndarray, np.ndarray]


def _host_layers(model: TraceModel) -> _HostLayers:
    syncs, copies = model.syncs, model.copies
    s_in = syncs["step"].to_numpy() >= 0
    c_in = (copies["step"].to_numpy() >= 0) & (copies["wait_us"].to_numpy() > 0)
    c_ts = copies["ts"].to_numpy()
    sync = (
        np.concatenate([syncs["ts"].to_numpy()[s_in], c_ts[c_in]]),
        np.concatenate([syncs["end"].to_numpy()[s_in],
                        (c_ts + copies["wait_us"].to_numpy())[c_in]]),
    )
    quiet_rows, busy_rows = _op_split(model)
    ops_ts = model.ops["ts"].to_numpy(dtype=float)
    ops_end = model.ops["end"].to_numpy(dtype=float)
    return _HostLayers(
        sync=sync,
        loader=_loader_intervals(model),
        runtime=(model.runtime["ts"].to_numpy(dtype=float),
                 model.runtime["end"].to_numpy(dtype=float)),
        quiet_rows=quiet_rows,
        busy_rows=busy_rows,
        quiet=(ops_ts[quiet_rows], ops_end[quiet_rows]),
        busy=(ops_ts[busy_rows], ops_end[busy_rows]),
    )


@dataclass
class _GapPieces:
    """idle_gaps' rows as arrays, in (gap, step) order (see idle_gaps for the columns)."""

    gap: np.ndarray
    step: np.ndarray
    us: np.ndarray
    start_us: np.ndarray
    loader_us: np.ndarray
    sync_us: np.ndarray
    cpu_work_us: np.ndarray
    offset_us: np.ndarray
    kind_code: np.ndarray  # index into GAP_KINDS
    next_name: np.ndarray
    cpu_work_segments: tuple[np.ndarray, np.ndarray, np.ndarray]
    # Each host-wait gap from its start to the launch that ended it, in trace time.
    host_wait_iv: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))


def _gap_pieces(model: TraceModel, dev: str, windows: np.ndarray,
                host: _HostLayers) -> _GapPieces:
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
    gap_start = np.concatenate([before[is_gap], [max(covered[-1], lo) if len(end) else lo]])
    gap_end = np.concatenate([ts[is_gap], [hi]])
    launch = np.concatenate([gpu["launch_ts"].to_numpy()[rows[is_gap]], [np.nan]])
    names = np.concatenate([_take(gpu["name"], rows[is_gap]), ["(none: end of the step)"]])
    tail = np.zeros(len(gap_start), dtype=bool)
    tail[-1] = True
    keep = gap_end > gap_start
    gap_start, gap_end, launch, names = gap_start[keep], gap_end[keep], launch[keep], names[keep]
    tail = tail[keep]
    kind_code = np.where(np.isnan(launch), 2, np.where(launch >= gap_start, 0, 1))
    kind_code[tail] = 1  # after the last GPU work: nothing left to launch in the window

    # Host-wait gaps, up to the launch of the work that ends them: the host ran something
    # other than that launch (the only launch a host-wait gap can hold: any earlier one would
    # have ended the gap).
    hw = kind_code == 0
    pre_iv = (gap_start[hw], np.minimum(launch[hw], gap_end[hw]))
    # Time inside a runtime call is the CUDA runtime's (a slow launch, an allocation), not CPU
    # work of the user's. Host time inside an op that launched GPU work is that op's dispatch
    # and Python glue (launch overhead); CPU work is time in ops that launched nothing, or in
    # no op at all.
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), (gap_start, gap_end),
                                 host.sync, host.loader, pre_iv, host.runtime, host.quiet,
                                 host.busy)
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    in_gap = tl.cover(gap_start, gap_end) & (bucket >= 0)
    starts, lengths = tl.starts, tl.lengths
    seg_gap = np.searchsorted(gap_start, starts, side="right") - 1
    loader_m, sync_m = tl.cover(*host.loader), tl.cover(*host.sync)
    pre_m = tl.cover(*pre_iv) & ~loader_m & ~sync_m & ~tl.cover(*host.runtime)
    pre_m &= tl.cover(*host.quiet) | ~tl.cover(*host.busy)
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
    piece_gap = gap[first]
    piece_step = step[first]
    piece_start = _group_min(starts[in_gap], label, npieces)
    cpu_seg = pre_m & in_gap
    return _GapPieces(
        gap=piece_gap,
        step=piece_step,
        us=group_sums(length, label, npieces),
        start_us=piece_start,
        loader_us=group_sums(np.where(loader_in, length, 0.0), label, npieces),
        sync_us=group_sums(np.where(sync_m[in_gap] & ~loader_in, length, 0.0), label,
                            npieces),
        cpu_work_us=group_sums(np.where(pre_m[in_gap], length, 0.0), label, npieces),
        offset_us=piece_start - windows[piece_step, 0],
        kind_code=kind_code[piece_gap],
        next_name=names[piece_gap],
        cpu_work_segments=(starts[cpu_seg], tl.edges[1:][cpu_seg], seg_gap[cpu_seg]),
        host_wait_iv=pre_iv,
    )


def _op_split(model: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """The stepping thread's ops, as positions in model.ops, split into those during which no
    thread of the process issued a launch, copy or memset (CPU work) and those during which one
    did (autograd launches the backward from its own thread, so `loss.backward()` on the
    stepping thread counts as launching)."""
    ops = model.ops
    rows = np.arange(len(ops))
    if model.main_tid is not None and len(ops):
        rows = np.flatnonzero(column_equals_text(ops["tid"], str(model.main_tid)))
    rt = model.runtime
    issues = name_flags(rt["name"], lambda s: regex_hit(ISSUING_CALL, s, anywhere=True))
    ts = np.sort(rt["ts"].to_numpy(dtype=float)[issues])
    inside = (np.searchsorted(ts, ops["end"].to_numpy(dtype=float)[rows], side="left")
              - np.searchsorted(ts, ops["ts"].to_numpy(dtype=float)[rows], side="left"))
    return rows[inside == 0], rows[inside > 0]


# Host regions under which host-wait idle can sit that no launch-overhead fix (CUDA graphs,
# torch.compile) removes: the optimizer step's host work (a for-loop optimizer, or one whose
# own host computation is long, such as Shampoo's preconditioner), and device allocator calls.
# A region is listed when it holds this share of the host-wait idle.
REGION_MIN_PCT = 10.0
# ... and is named as the idle's cause when it holds this share of the host-wait idle: the
# largest part, and a change to it (an allocator left steady, a cheaper optimizer step) comes
# before launch-overhead fixes, which would leave it in place.
REGION_CAUSE_PCT = 40.0
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(.+)\.step$")
_ALLOCATOR_CALL = re.compile(r"^(?:(?:cuda|hip)(?:Malloc|Free)(?:Async)?|cuMem(?:Alloc|Free)"
                             r"(?:_v2)?)$")


def _host_regions(model: TraceModel, p: _GapPieces, windows: np.ndarray, n: int,
                  host_wait_us: float) -> list[dict]:
    """How much of the host-wait idle the host spent inside the optimizer step or in device
    allocator calls, per step, largest first: what the host was doing while the GPU waited."""
    hw_s, hw_e = p.host_wait_iv
    if not len(hw_s) or host_wait_us <= 0:
        return []
    found: list[tuple[str, str, tuple[np.ndarray, np.ndarray]]] = []
    ops = model.ops
    if len(ops):
        mine = np.ones(len(ops), dtype=bool) if model.main_tid is None else \
            column_equals_text(ops["tid"], str(model.main_tid))
        opt = name_mask(ops["name"], _OPTIMIZER_STEP) & mine
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
    if not found:
        return []
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), (hw_s, hw_e),
                                 *(iv for _, _, iv in found))
    idle = tl.cover(hw_s, hw_e) & (tl.bucket(windows[:, 0], windows[:, 1]) >= 0)
    out = []
    for kind, name, iv in found:
        us = float(tl.lengths[idle & tl.cover(*iv)].sum())
        share = pct(us, host_wait_us)
        if share >= REGION_MIN_PCT:
            out.append({"kind": kind, "region": name, "ms_per_step": ms(us / n),
                        "pct_of_host_wait": share})
    return sorted(out, key=lambda r: -r["ms_per_step"])


def _region_words(ev: dict, model: TraceModel, lead: str = ", while the host is busy in ") -> str:
    regions = ev.get("host_wait_under") or []
    if not regions:
        return ""
    word = step_word(model.workload)
    named = ", ".join(f"{r['region']} {millis(r['ms_per_step'])} ms per {word}"
                      for r in regions[:2])
    return f"{lead}{named}" + (")" if lead.endswith("(the host in ") else "")


def _region_advice(cause: str, ev: dict) -> tuple[str, str]:
    """What helps when the host-wait idle sits under the optimizer step or allocator calls."""
    top = ev["host_wait_under"][0]
    share = (f"{percent(top['pct_of_host_wait'], 0)} of the GPU's host-wait idle "
             f"({millis(top['ms_per_step'])} ms per step) falls inside {top['region']}")
    if cause == "allocator":
        rec = (f"{share}: the host is in device allocator calls while the GPU has nothing to "
               "run. Each cudaMalloc/cudaFree synchronises or stalls the host; the caching "
               "allocator makes them only when its cache misses or is emptied. Remove "
               "torch.cuda.empty_cache() (and memory-stat resets) from the loop, keep tensor "
               "shapes steady between steps, and let segments grow instead of being re-made.")
        snippet = (
            "# no torch.cuda.empty_cache() inside the training loop; let the allocator grow\n"
            "# segments instead of freeing and re-allocating them (before the first CUDA call):\n"
            "import os\n"
            "os.environ.setdefault(\"PYTORCH_CUDA_ALLOC_CONF\", \"expandable_segments:True\")")
        return rec, snippet
    name = _OPTIMIZER_STEP.match(top["region"])
    opt = name.group(1) if name else top["region"]
    rec = (f"{share}: the optimizer's own host work, which CUDA graphs or torch.compile of the "
           f"model do not remove. Time {opt}.step() alone to confirm. A torch optimizer with a "
           "per-parameter loop takes foreach=True or fused=True; an optimizer whose host "
           "computation is long (Shampoo's preconditioner roots, second-order statistics) "
           "should update that state less often, compute it on the GPU, or overlap it with "
           "the next step.")
    if "shampoo" in opt.lower():
        snippet = ("# Distributed Shampoo: compute the preconditioners every N steps\n"
                   f"optimizer = {opt}(model.parameters(), lr=lr, precondition_frequency=100, "
                   "...)")
    else:
        snippet = ("# a built-in optimizer: one multi-tensor or fused kernel per step\n"
                   f"optimizer = torch.optim.{opt}(model.parameters(), lr=lr, fused=True)  "
                   "# or foreach=True")
    return rec, snippet


def _cpu_work_pieces(p: _GapPieces, gap_label: np.ndarray, ngaps: int) -> np.ndarray:
    """Mask of the host-wait pieces of gaps whose host ran at least CPU_WORK_MIN_GAP_US before
    the launch that ended them (outside DataLoader and sync waits)."""
    per_gap = group_sums(p.cpu_work_us, gap_label, ngaps)[gap_label]
    return (p.kind_code == 0) & (per_gap >= CPU_WORK_MIN_GAP_US) & (p.cpu_work_us > 0)


def _cpu_work_ops(model: TraceModel, host: _HostLayers, p: _GapPieces, cpu_gaps: np.ndarray,
                  n: int) -> list[dict]:
    """The stepping thread's host ops by their time inside the CPU-work part of the gaps
    (ops nest, so a parent and its child both count), plus the time no recorded op covers."""
    op_ts, op_end = host.quiet
    seg_start, seg_end, seg_gap = p.cpu_work_segments
    mine = np.isin(seg_gap, cpu_gaps)
    starts, ends = seg_start[mine], seg_end[mine]
    # Covered length up to t over these disjoint intervals, so an op's overlap is a difference.
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right") - 1
        inside = np.where(i >= 0, np.clip(t - starts[np.clip(i, 0, None)], 0.0,
                                          (ends - starts)[np.clip(i, 0, None)]), 0.0)
        return before[np.clip(i, 0, None)] * (i >= 0) + inside

    out = []
    if len(op_ts):
        overlap = covered(op_end) - covered(op_ts)
        label, names = _sorted_name_labels(model.ops["name"], host.quiet_rows)
        by_name = group_sums(overlap, label, len(names))
        positive = np.flatnonzero(by_name > 0)
        for i in positive[_largest(by_name[positive], TOP_HOST_OPS)]:
            out.append({"op": names[i][:100], "ms_per_step": ms(float(by_name[i]) / n)})
        tl = Timeline.from_intervals((starts, ends), (op_ts, op_end))
        bare = tl.cover(starts, ends) & ~tl.cover(op_ts, op_end)
        bare_us = float(tl.lengths[bare].sum())
    else:
        bare_us = float((ends - starts).sum())
    if bare_us > 0:
        out.append({"op": "(no recorded op: Python code or untraced work)",
                    "ms_per_step": ms(bare_us / n)})
    return sorted(out, key=lambda r: -r["ms_per_step"])[:TOP_HOST_OPS]


def _ops_named(ev: dict) -> str:
    ops = [("Python code or untraced work" if o["op"].startswith("(") else o["op"])
           for o in ev.get("cpu_work_ops", [])[:2]]
    return f" ({', '.join(ops)})" if ops else ""


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
_KIND_SORT_LABEL = np.argsort(np.argsort(np.array(GAP_KINDS)))


def _group_min(values: np.ndarray, label: np.ndarray, ngroups: int) -> np.ndarray:
    """Per-label minimum (exact whatever the order)."""
    out = np.full(ngroups, np.inf)
    np.minimum.at(out, label, values)
    return out


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, largest first, ties in order (pandas' nlargest)."""
    return np.argsort(-values, kind="stable")[:k]


def _median(values: np.ndarray) -> float:
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


def _sorted_name_labels(col: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Labels of `rows` by `col.astype(str)` numbered in sorted name order, as groupby did
    (-1: missing name), and the names."""
    cats = _string_categories(col)
    if cats is None:
        codes, uniques = pd.factorize(col.iloc[rows].astype(str))
        names = np.asarray(uniques, dtype=object)
    else:
        codes = col.cat.codes.to_numpy()[rows]
        names = np.asarray(cats, dtype=object)
    used = np.unique(codes[codes >= 0])
    used = used[np.argsort(names[used])]
    rank = np.full(len(names) + 1, -1)
    rank[used] = np.arange(len(used))
    return rank[codes], [str(s) for s in names[used]]


def _idle_cause(
    loader_us: float, idle: float, rest_host: float, rest_other: float, rest_unknown: float
) -> str:
    """The cause that explains most of the idle time: the DataLoader wait when it covers half
    of it, else host-wait or other when one dominates the gaps whose launch is known."""
    if idle > 0 and loader_us >= 0.5 * idle:
        return "dataloader"
    known = rest_host + rest_other
    if rest_unknown > known:
        return "launch-unknown"
    if known <= 0:
        return "mixed"
    if rest_host >= DOMINANT_SHARE * known:
        return "host-wait"
    if rest_other >= DOMINANT_SHARE * known:
        return "other"
    return "mixed"


def _launch_snippet(model: TraceModel) -> str:
    """Fewer launches, spelled for the trace's torch: torch.compile from 2.0, CUDA graphs
    (make_graphed_callables) from 1.10, only a larger batch before that."""
    bigger = (
        "# and/or a larger batch per step, so each kernel does more work per launch:\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)"
    )
    if has(model, (2, 0)):
        return (
            f"{for_torch(model)}\n"
            "# Fewer, larger launches: fuse small ops and replay the step as a CUDA graph\n"
            "model = torch.compile(model, mode=\"reduce-overhead\")  # CUDA graphs + fusion\n"
            + bigger
        )
    if has(model, (1, 10)):
        return (
            f"{for_torch(model)} (torch.compile needs 2.0)\n"
            "# Replay the forward and backward as CUDA graphs (static shapes, no host sync):\n"
            "model = torch.cuda.make_graphed_callables(model, (sample_inputs,))\n" + bigger
        )
    return (
        f"{for_torch(model)}\n"
        "# torch.compile (2.0) and CUDA graphs (1.10) are not in this torch: upgrading gives\n"
        "# both. In this version, a larger batch per step makes each launch do more work:\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size, ...)"
    )


_CPU_WORK_SNIPPET = (
    "# Do per-sample CPU work in the Dataset, where DataLoader workers run it in parallel\n"
    "class Prepared(torch.utils.data.Dataset):\n"
    "    def __getitem__(self, i):\n"
    "        return preprocess(self.raw[i])  # tokenise / decode / resize here\n"
    "loader = torch.utils.data.DataLoader(Prepared(raw), batch_size=bs, num_workers=4,\n"
    "                                     pin_memory=True, persistent_workers=True)\n"
    "for batch in loader:  # no preprocessing between here and the model call\n"
    "    out = model(batch.to(device, non_blocking=True))"
)
_DEPENDENCY_SNIPPET = (
    "# Find what the queued work waits on: cross-stream waits, events, other devices\n"
    "# e.g. do not make the compute stream wait on a side stream before it must:\n"
    "with torch.cuda.stream(side):\n"
    "    batch = batch.to(device, non_blocking=True)\n"
    "...  # independent compute here\n"
    "torch.cuda.current_stream().wait_stream(side)  # wait as late as possible\n"
    "batch.record_stream(torch.cuda.current_stream())"
)


def _idle_advice(
    model: TraceModel, cause: str, ev: dict, rest_host: float, rest_other: float
) -> tuple[str, str, str]:
    steps = ev["steps"]
    host_part = (
        f"host-wait gaps ({millis(ms(rest_host / steps))} ms per step: the next kernel was "
        f"launched only after the GPU ran dry; {ev['kernels_per_step']:.0f} kernels per step, "
        f"median {ev['median_kernel_us']} us)"
    )
    other_part = (
        f"gaps with work already queued ({millis(ms(rest_other / steps))} ms per step: it "
        "waited on a stream/event dependency or another device, or the step ended before the "
        "next launch)"
    )
    if has(model, (2, 0)):
        fewer = ("launch fewer, larger kernels (torch.compile fuses elementwise ops; "
                 "mode=\"reduce-overhead\" also replays the step as a CUDA graph, removing "
                 "per-kernel launch cost)")
    elif has(model, (1, 10)):
        fewer = ("launch fewer, larger kernels (this torch has CUDA graphs, "
                 "torch.cuda.make_graphed_callables, which remove per-kernel launch cost; "
                 "torch.compile needs torch 2.0)")
    else:
        fewer = ("launch fewer, larger kernels (torch.compile and CUDA graphs need a newer "
                 "torch than the one that recorded this trace: 2.0 and 1.10)")
    launch = (
        f"Keep the GPU fed: {fewer}, raise the batch size so each kernel does more work, and "
        "remove host work between launches (Python-side bookkeeping, .item()/.cpu() calls)."
    )
    dependency = (
        "Look for what the queued work waited on: cudaStreamWaitEvent/wait_stream between "
        "streams, a synchronising call before the next launch, or a peer device; move waits as "
        "late as possible and keep independent work launched ahead of them."
    )
    if cause == "host-cpu-work":
        ops = ", ".join(f"{o['op']} {millis(o['ms_per_step'])} ms"
                        for o in ev.get("cpu_work_ops", []))
        rec = (
            f"For {millis(ev['cpu_work_ms_per_step'])} ms per step "
            f"({percent(ev['cpu_work_share_pct'])} of step time) the GPU had nothing to run while "
            f"the stepping thread did CPU work that launched no GPU work (per step: {ops}). This "
            "is not launch overhead: CUDA graphs, torch.compile or fewer kernels would not remove "
            "it. Take that work off the critical path: do preprocessing, tokenisation and image "
            "processing in the Dataset or collate_fn so DataLoader workers (num_workers > 0) "
            "prepare the next batch while the GPU runs this one, precompute it once, or move it "
            "onto the GPU."
        )
        snippet = _CPU_WORK_SNIPPET
    elif cause in ("host-optimizer", "allocator"):
        rec, snippet = _region_advice(cause, ev)
    elif cause == "dataloader":
        rec = (
            f"{percent(ev['idle_during_dataloader_pct'], 0)} of the GPU's idle time is the host "
            "waiting for the next batch: that cause and its fix are reported by "
            f"`dataloader-bound`. The rest ({percent(ev['unexplained_idle_share_pct'])} of step "
            "time) is "
            + (f"mostly {host_part}. {launch}" if rest_host >= rest_other
               else f"mostly {other_part}. {dependency}")
        )
        snippet = _launch_snippet(model) if rest_host >= rest_other else _DEPENDENCY_SNIPPET
    elif cause == "host-wait":
        rec = f"The idle time is mostly {host_part}. {launch}"
        snippet = _launch_snippet(model)
    elif cause == "other":
        rec = f"The idle time is mostly {other_part}. {dependency}"
        snippet = _DEPENDENCY_SNIPPET
    elif cause == "launch-unknown":
        rec = (
            f"{percent(ev['launch_unknown_share_pct'])} of step time is idle before GPU work whose "
            "launching runtime call is not in the trace, so host-wait cannot be told from a "
            "dependency wait; of the gaps whose launch is known, "
            + (f"most are {host_part}. {launch}" if rest_host >= rest_other
               else f"most are {other_part}. {dependency}")
        )
        snippet = _launch_snippet(model) if rest_host >= rest_other else _DEPENDENCY_SNIPPET
    else:
        rec = f"The idle time splits between {host_part} and {other_part}. {launch} {dependency}"
        snippet = _launch_snippet(model)
    regions = ev.get("host_wait_under") or []
    if regions and cause not in ("host-optimizer", "allocator"):
        rec += " Of the host-wait idle, " + "; ".join(
            f"{percent(r['pct_of_host_wait'], 0)} ({millis(r['ms_per_step'])} ms per step) falls "
            f"inside {r['region']}" for r in regions) + (
            ": host work that CUDA graphs and torch.compile do not remove (an optimizer's own "
            "host computation, device allocations).")
    if ev["idle_during_sync_pct"] >= 25.0:
        rec += (
            f" During {percent(ev['idle_during_sync_pct'], 0)} of the idle time the host was "
            "blocked waiting on the GPU while the GPU had nothing running: the queued work waited "
            "on something outside this process's GPU timeline (another rank, another stream's "
            "event): see host-device-sync and rank-imbalance."
        )
    precondition = (
        "Launch-overhead fixes help when the host cannot issue work as fast as the GPU runs it "
        "(many short kernels, host-wait gaps); CUDA graphs need static shapes and no host "
        "synchronisation inside the captured region. Dependency gaps are fixed by reordering "
        "or removing the waits, not by faster launching."
    )
    return rec, snippet, precondition


# --------------------------------------------------------------------------- comm-bound


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    """The change by the idle's cause: launch overhead (host-wait gaps) is what CUDA graphs
    remove, from torch 1.10 (make_graphed_callables; torch.compile's reduce-overhead from 2.0);
    allocator calls are what a steady caching allocator removes. Host work that launches
    nothing, the optimizer's own host time, dependency gaps: none of these."""
    cause = (finding.evidence or {}).get("dominant_cause")
    if cause == "allocator":
        return [Change("allocator", "steady")]
    if cause == "host-wait" and has(model, (1, 10)):
        return [Change("cuda_graphs", "true")]
    return []


def no_change(finding: Finding) -> str:
    ev = finding.evidence or {}
    cause = ev.get("dominant_cause")
    under = (ev.get("host_wait_under") or [{}])[0]
    if cause == "host-optimizer":
        return (f"its host-wait idle sits under {under.get('region')} "
                f"({under.get('ms_per_step')} ms per step): the optimizer's own host work, "
                "whose change (fewer preconditioner updates, a fused or foreach "
                "implementation) the replay models only for torch's built-in for-loop "
                "optimizers (single-tensor-optimizer)")
    if cause == "host-wait":
        return "CUDA graphs need torch 1.10 or later; this trace's torch is older"
    if cause == "host-cpu-work":
        return ("moving the host's preprocessing into DataLoader workers is not a change "
                "the replay models (it does not know which host work is per-sample)")
    if cause == "dataloader":
        return "its cause is the DataLoader wait: dataloader-bound's change"
    return ("its gaps wait on dependencies (other streams, events, peers) or mix causes: "
            "no single change the replay models removes them")


SPEC = RuleSpec(
    id=RULE_ID,
    title="the GPU sits idle inside the training step",
    summary="the GPU idles inside steps: host-wait (launch came late) vs other, per device; "
            "names what the host was in meanwhile (the optimizer step, cudaMalloc/cudaFree) "
            "and replays CUDA graphs for launch overhead or a steady allocator",
    check=gpu_idle,
    thresholds={"IDLE_THRESHOLD_PCT": IDLE_THRESHOLD_PCT, "DOMINANT_SHARE": DOMINANT_SHARE,
                "CPU_WORK_MIN_GAP_US": CPU_WORK_MIN_GAP_US, "REGION_MIN_PCT": REGION_MIN_PCT,
                "REGION_CAUSE_PCT": REGION_CAUSE_PCT},
    what_if=("cuda_graphs", "allocator"),
    changes=changes,
    no_change=no_change,
)
