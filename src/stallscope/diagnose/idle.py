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

import numpy as np
import pandas as pd

from stallscope.capture.context import RunContext
from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.trace.intervals import Timeline
from stallscope.trace.model import LOADER_NAME, TraceModel, name_matches, per_name
from stallscope.trace.workload import step_word

RULE_ID = "gpu-idle"

# Share of step time the busiest GPU is idle before the rule flags it. Back-to-back kernels
# always leave a few percent of launch latency between them that no user change removes (HTA
# calls it "kernel wait"); at 10% the GPU loses one step in ten, enough to be worth acting on.
IDLE_THRESHOLD_PCT = 10.0
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
    by_device = {dev: idle_gaps(model, dev, windows) for dev in model.gpu_devices}
    idle_by_device = {dev: float(g["us"].sum()) for dev, g in by_device.items()}
    # The busiest device bounds the step: idle there is what the step could actually lose.
    dev = min(idle_by_device, key=lambda d: idle_by_device[d])
    idle = idle_by_device[dev]
    idle_pct = pct(idle, total)
    if idle_pct < IDLE_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The busiest GPU (device {dev}) is idle {idle_pct:.1f}% of step time "
            f"(threshold {IDLE_THRESHOLD_PCT:.0f}%).",
        )
    gaps = by_device[dev]
    kind = gaps["kind"]
    by_kind = gaps.groupby("kind")["us"].sum()
    host_us, other_us, unknown_us = (float(by_kind.get(k, 0.0)) for k in GAP_KINDS)
    loader_us = float(gaps["loader_us"].sum())
    sync_us = float(gaps["sync_us"].sum())
    # Idle time not explained by the DataLoader wait, split by cause.
    not_loader = (gaps["us"] - gaps["loader_us"]).groupby(kind).sum()
    rest_host, rest_other, rest_unknown = (float(not_loader.get(k, 0.0)) for k in GAP_KINDS)
    rest = rest_host + rest_other + rest_unknown
    top = (
        gaps.groupby("gap", sort=False)
        .agg(us=("us", "sum"), step=("step", "first"), offset=("offset_us", "first"),
             kind=("kind", "first"), next_name=("next_name", "first"),
             loader_us=("loader_us", "sum"))
        .nlargest(TOP_GAPS, "us")
    )
    kernels = model.gpu[(model.gpu["device"] == dev) & (model.gpu["kind"] == "kernel")
                       & (model.gpu["step"] >= 0)]
    host_gaps = gaps[kind == "host-wait"].groupby("gap")["us"].sum()
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
        "gaps_per_step": round(gaps["gap"].nunique() / n, 1),
        "median_host_wait_gap_us": round(float(host_gaps.median()), 1) if len(host_gaps) else 0.0,
        "kernels_per_step": round(len(kernels) / n, 1),
        "median_kernel_us": round(float(kernels["dur"].median()), 1) if len(kernels) else 0.0,
        "largest_gaps": [
            {"step": model.steps[int(r.step)].name, "at_ms_into_step": ms(r.offset),
             "ms": ms(r.us), "kind": r.kind,
             "during_dataloader_ms": ms(r.loader_us), "next_gpu_work": str(r.next_name)[:80]}
            for r in top.itertuples()
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
    cpu_gaps = _cpu_work_gaps(gaps) if len(model.ops) else gaps.iloc[0:0]
    cpu_us = float(cpu_gaps["cpu_work_us"].sum())
    if cpu_us > 0:
        evidence["cpu_work_share_pct"] = pct(cpu_us, total)
        evidence["cpu_work_ms_per_step"] = ms(cpu_us / n)
        evidence["cpu_work_ops"] = _cpu_work_ops(model, gaps, cpu_gaps, n)
    if cause in ("host-wait", "mixed") and cpu_us >= DOMINANT_SHARE * rest_host > 0:
        cause = "host-cpu-work"
    evidence["dominant_cause"] = cause
    rec, snippet, precondition = _idle_advice(model, cause, evidence, rest_host, rest_other)
    title = f"The GPU is idle {idle_pct:.1f}% of each {step_word(model.workload)}" + {
        "dataloader": ", mostly while the host waits for the DataLoader",
        "host-wait": ", waiting for the host to launch work",
        "host-cpu-work": ", while the host does CPU work that launches nothing"
        + _ops_named(evidence),
        "other": ", with work queued behind dependencies or after the step's last kernel",
        "launch-unknown": "",
        "mixed": "",
    }[cause]
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=rec,
        snippet=snippet,
        precondition=precondition,
        estimated_saving_pct=pct(rest, total),
        saving_basis=(
            f"upper bound: the idle time of the busiest GPU (device {dev}) inside the steps, "
            "less the part during which the host waited on the DataLoader (that is "
            "dataloader-bound's saving, not counted twice), if the GPU were kept busy through "
            "every remaining gap; the step can never get shorter than that GPU's busy time"
        ),
        docs=IDLE_DOCS,
    )
    return Assessment.found(finding)


def idle_windows(model: TraceModel) -> np.ndarray:
    """The step windows; without ProfilerStep markers, the span of GPU activity instead of the
    whole trace (whose setup and teardown would otherwise count as idle GPU time). Inferred
    iterations are steps like ProfilerStep ones."""
    windows = model.windows
    if model.steps_source != "whole-trace" or model.gpu.empty:
        return windows
    lo, hi = float(model.gpu["ts"].min()), float(model.gpu["end"].max())
    clipped = np.column_stack([np.maximum(windows[:, 0], lo), np.minimum(windows[:, 1], hi)])
    clipped[:, 1] = np.maximum(clipped[:, 1], clipped[:, 0])
    return clipped


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
    g = model.gpu[model.gpu["device"] == dev].sort_values("ts", kind="stable")
    ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
    lo, hi = float(windows[:, 0].min()), float(windows[:, 1].max())
    # Merge overlapping work with a running max of `end`; a gap opens wherever the next event
    # starts after everything before it has finished.
    covered = np.maximum.accumulate(end) if len(end) else end
    before = np.concatenate([[lo], np.maximum(covered[:-1], lo)]) if len(end) else np.array([])
    is_gap = ts > before
    gap_start = np.concatenate([before[is_gap], [max(covered[-1], lo) if len(end) else lo]])
    gap_end = np.concatenate([ts[is_gap], [hi]])
    launch = np.concatenate([g["launch_ts"].to_numpy()[is_gap], [np.nan]])
    names = np.concatenate([g["name"].to_numpy()[is_gap], ["(none: end of the step)"]])
    tail = np.zeros(len(gap_start), dtype=bool)
    tail[-1] = True
    keep = gap_end > gap_start
    gap_start, gap_end, launch, names = gap_start[keep], gap_end[keep], launch[keep], names[keep]
    tail = tail[keep]
    kinds = np.array(GAP_KINDS, dtype=object)
    kind_code = np.where(np.isnan(launch), 2, np.where(launch >= gap_start, 0, 1))
    kind_code[tail] = 1  # after the last GPU work: nothing left to launch in the window

    syncs = model.syncs[model.syncs["step"] >= 0]
    copies = model.copies[(model.copies["step"] >= 0) & (model.copies["wait_us"] > 0)]
    sync_iv = (
        np.concatenate([syncs["ts"].to_numpy(), copies["ts"].to_numpy()]),
        np.concatenate([syncs["end"].to_numpy(), (copies["ts"] + copies["wait_us"]).to_numpy()]),
    )
    loader_iv = _loader_intervals(model)
    # Host-wait gaps, up to the launch of the work that ends them: the host ran something
    # other than that launch (the only launch a host-wait gap can hold: any earlier one would
    # have ended the gap).
    hw = kind_code == 0
    pre_iv = (gap_start[hw], np.minimum(launch[hw], gap_end[hw]))
    # Time inside a runtime call is the CUDA runtime's (a slow launch, an allocation), not CPU
    # work of the user's.
    rt_iv = (model.runtime["ts"].to_numpy(dtype=float), model.runtime["end"].to_numpy(dtype=float))
    # Host time inside an op that launched GPU work is that op's dispatch and Python glue
    # (launch overhead); CPU work is time in ops that launched nothing, or in no op at all.
    quiet, launching = split_ops(model)
    quiet_iv = (quiet["ts"].to_numpy(dtype=float), quiet["end"].to_numpy(dtype=float))
    busy_iv = (launching["ts"].to_numpy(dtype=float), launching["end"].to_numpy(dtype=float))
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), (gap_start, gap_end),
                                 sync_iv, loader_iv, pre_iv, rt_iv, quiet_iv, busy_iv)
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    in_gap = tl.cover(gap_start, gap_end) & (bucket >= 0)
    seg_gap = np.searchsorted(gap_start, tl.starts, side="right") - 1
    loader_m, sync_m = tl.cover(*loader_iv), tl.cover(*sync_iv)
    pre_m = tl.cover(*pre_iv) & ~loader_m & ~sync_m & ~tl.cover(*rt_iv)
    pre_m &= tl.cover(*quiet_iv) | ~tl.cover(*busy_iv)
    seg = pd.DataFrame({
        "gap": seg_gap[in_gap],
        "step": bucket[in_gap],
        "us": tl.lengths[in_gap],
        "start": tl.starts[in_gap],
        "loader_us": np.where(loader_m[in_gap], tl.lengths[in_gap], 0.0),
        "sync_us": np.where(sync_m[in_gap] & ~loader_m[in_gap], tl.lengths[in_gap], 0.0),
        "cpu_work_us": np.where(pre_m[in_gap], tl.lengths[in_gap], 0.0),
    })
    out = seg.groupby(["gap", "step"], sort=True).agg(
        us=("us", "sum"), start=("start", "min"), loader_us=("loader_us", "sum"),
        sync_us=("sync_us", "sum"), cpu_work_us=("cpu_work_us", "sum"),
    ).reset_index()
    gi = out["gap"].to_numpy()
    out["offset_us"] = out["start"].to_numpy() - windows[out["step"].to_numpy(), 0]
    out["kind"] = kinds[kind_code[gi]]
    out["next_name"] = names[gi]
    out = out.rename(columns={"start": "start_us"})
    # The CPU-work segments themselves (disjoint, in time order), for naming what ran in them.
    cpu_seg = pre_m & in_gap
    out.attrs["cpu_work_segments"] = (tl.starts[cpu_seg], tl.edges[1:][cpu_seg],
                                      seg_gap[cpu_seg])
    return out


def split_ops(model: TraceModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The stepping thread's ops split into those during which no thread of the process issued
    a launch, copy or memset (CPU work) and those during which one did (autograd launches the
    backward from its own thread, so `loss.backward()` on the stepping thread counts as
    launching)."""
    ops = model.ops
    if model.main_tid is not None and len(ops):
        ops = ops[ops["tid"].astype(str) == str(model.main_tid)]
    rt = model.runtime
    issues = per_name(rt["name"], lambda s: bool(ISSUING_CALL.search(s))).to_numpy(dtype=bool)
    ts = np.sort(rt["ts"].to_numpy(dtype=float)[issues])
    inside = (np.searchsorted(ts, ops["end"].to_numpy(dtype=float), side="left")
              - np.searchsorted(ts, ops["ts"].to_numpy(dtype=float), side="left"))
    return ops[inside == 0], ops[inside > 0]


def _cpu_work_gaps(gaps: pd.DataFrame) -> pd.DataFrame:
    """The host-wait pieces of gaps whose host ran at least CPU_WORK_MIN_GAP_US before the
    launch that ended them (outside DataLoader and sync waits)."""
    per_gap = gaps.groupby("gap")["cpu_work_us"].transform("sum")
    return gaps[(gaps["kind"] == "host-wait") & (per_gap >= CPU_WORK_MIN_GAP_US)
                & (gaps["cpu_work_us"] > 0)]


def _cpu_work_ops(model: TraceModel, gaps: pd.DataFrame, cpu_gaps: pd.DataFrame,
                  n: int) -> list[dict]:
    """The stepping thread's host ops by their time inside the CPU-work part of the gaps
    (ops nest, so a parent and its child both count), plus the time no recorded op covers."""
    ops, _ = split_ops(model)
    seg_start, seg_end, seg_gap = gaps.attrs["cpu_work_segments"]
    mine = np.isin(seg_gap, cpu_gaps["gap"].to_numpy())
    starts, ends = seg_start[mine], seg_end[mine]
    # Covered length up to t over these disjoint intervals, so an op's overlap is a difference.
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right") - 1
        inside = np.where(i >= 0, np.clip(t - starts[np.clip(i, 0, None)], 0.0,
                                          (ends - starts)[np.clip(i, 0, None)]), 0.0)
        return before[np.clip(i, 0, None)] * (i >= 0) + inside

    out = []
    if len(ops):
        overlap = covered(ops["end"].to_numpy(dtype=float)) - covered(
            ops["ts"].to_numpy(dtype=float))
        by_name = pd.Series(overlap, index=ops.index).groupby(
            ops["name"].astype(str)).sum()
        for name, us in by_name[by_name > 0].nlargest(TOP_HOST_OPS).items():
            out.append({"op": name[:100], "ms_per_step": ms(us / n)})
        tl = Timeline.from_intervals((starts, ends), (ops["ts"].to_numpy(), ops["end"].to_numpy()))
        bare = tl.cover(starts, ends) & ~tl.cover(ops["ts"].to_numpy(), ops["end"].to_numpy())
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
    mine = ev[ev["tid"].astype(str) == str(model.main_tid)]
    loader = mine[name_matches(mine["name"], LOADER_NAME)]
    return loader["ts"].to_numpy(dtype=float), loader["end"].to_numpy(dtype=float)


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
        f"host-wait gaps ({ms(rest_host / steps)} ms per step: the next kernel was launched only "
        f"after the GPU ran dry; {ev['kernels_per_step']} kernels per step, median "
        f"{ev['median_kernel_us']} us)"
    )
    other_part = (
        f"gaps with work already queued ({ms(rest_other / steps)} ms per step: it waited on a "
        "stream/event dependency or another device, or the step ended before the next launch)"
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
        ops = ", ".join(f"{o['op']} {o['ms_per_step']} ms" for o in ev.get("cpu_work_ops", []))
        rec = (
            f"For {ev['cpu_work_ms_per_step']} ms per step ({ev['cpu_work_share_pct']:.1f}% of "
            "step time) the GPU had nothing to run while the stepping thread did CPU work that "
            f"launched no GPU work (per step: {ops}). This is not launch overhead: CUDA graphs, "
            "torch.compile or fewer kernels would not remove it. Take that work off the critical "
            "path: do preprocessing, tokenisation and image processing in the Dataset or "
            "collate_fn so DataLoader workers (num_workers > 0) prepare the next batch while "
            "the GPU runs this one, precompute it once, or move it onto the GPU."
        )
        snippet = _CPU_WORK_SNIPPET
    elif cause == "dataloader":
        rec = (
            f"{ev['idle_during_dataloader_pct']:.0f}% of the GPU's idle time is the host waiting "
            "for the next batch: that cause and its fix are reported by `dataloader-bound`. "
            f"The rest ({ev['unexplained_idle_share_pct']:.1f}% of step time) is "
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
            f"{ev['launch_unknown_share_pct']:.1f}% of step time is idle before GPU work whose "
            "launching runtime call is not in the trace, so host-wait cannot be told from a "
            "dependency wait; of the gaps whose launch is known, "
            + (f"most are {host_part}. {launch}" if rest_host >= rest_other
               else f"most are {other_part}. {dependency}")
        )
        snippet = _launch_snippet(model) if rest_host >= rest_other else _DEPENDENCY_SNIPPET
    else:
        rec = f"The idle time splits between {host_part} and {other_part}. {launch} {dependency}"
        snippet = _launch_snippet(model)
    if ev["idle_during_sync_pct"] >= 25.0:
        rec += (
            f" During {ev['idle_during_sync_pct']:.0f}% of the idle time the host was blocked "
            "waiting on the GPU while the GPU had nothing running: the queued work waited on "
            "something outside this process's GPU timeline (another rank, another stream's "
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

