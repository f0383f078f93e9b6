"""`gpu-bound`: the GPU is busy nearly all of the step, so the GPU's own work is the bottleneck.

When the busiest GPU runs work for at least GPU_BOUND_BUSY_PCT of the step, no host-side change
(more loader workers, pinned memory, CUDA graphs, a larger batch) can shorten the step much: the
step is as long as that GPU's work. The useful answer is then what the GPU spends its time on
(the top kernels and their share) and what makes those kernels faster: tensor cores through
mixed precision when fp32 GEMM/convolution dominates on hardware that has them
(diagnose/common.py's classification), fusing many small elementwise kernels
(torch.compile), or the model itself.

A full launch queue is part of the same picture. The CUDA driver queues about a thousand
launches per stream; once the host is that far ahead, `cudaLaunchKernel` blocks until the GPU
frees a slot. A trace then shows long launch calls (hundreds of microseconds instead of ~5 us)
while the GPU is busy throughout them. That host time is not launch overhead: CUDA graphs and
fewer launches would not help, since the host is merely waiting for the GPU. It is reported here
as evidence (`launch_queue_full`), not as its own rule, because it is a symptom of this
bottleneck with the same fix and the same lost time: a second finding would count it twice.

Saving: 0, labelled. The step is bounded by GPU work, and what faster kernels would save is only
modelled for mixed precision, which `no-mixed-precision` reports (and the replay predicts) with
its own figure; claiming it here too would count it twice, and fusion's gain cannot be measured
from a trace. The report's verdict names this finding when nothing else is worth fixing.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import (
    IDLE_THRESHOLD_PCT,
    MIN_COMPUTE_MAJOR,
    MIN_FP32_SHARE_PCT,
    idle_windows,
    ms,
    pct,
)
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.intervals import Timeline
from stallscope.trace.kernels import COMM_NAME, classify_kernels
from stallscope.trace.model import TraceModel
from stallscope.trace.names import per_name
from stallscope.trace.workload import step_word
from stallscope.units import percent

RULE_ID = "gpu-bound"

# The complement of gpu-idle's threshold: below 10% idle the GPU loses less than one step in
# ten to waiting, and the few percent of launch latency between back-to-back kernels that no
# user change removes is most of that. Every trace with a GPU is then either gpu-idle (the
# GPU waits: fix what it waits for) or gpu-bound (it does not: make its work faster).
GPU_BOUND_BUSY_PCT = 100.0 - IDLE_THRESHOLD_PCT
# A kernel launch costs the host ~5-10 us; a launch call 50 us or longer waited for something,
# and with the GPU busy all through it, that something is a free slot in the launch queue.
LONG_LAUNCH_US = 50.0
# Share of the launch call's time the GPU must be busy for the wait to be the queue's.
QUEUE_BUSY_PCT = 90.0
# Share of step time spent in such calls from which the full queue is reported.
QUEUE_FULL_SHARE_PCT = 5.0
# Share of kernel time in elementwise/reduction kernels from which fusion is suggested: each is
# a memory round trip that torch.compile can merge with its neighbours.
FUSION_SHARE_PCT = 15.0
TOP_KERNELS = 5
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution"

LAUNCH_CALL = re.compile(r"^(?:cuda|cu|hip)(?:Ext)?(?:Module)?Launch(?:Cooperative)?Kernel")
ELEMENTWISE = re.compile(
    r"elementwise|vectorized_|unrolled_|reduce_kernel|reduction|softmax|layer_?norm|"
    r"batch_?norm|index_|copy_kernel|fill_kernel|triton_(?:poi|red|per)",
    re.IGNORECASE,
)
COMM = COMM_NAME  # NCCL, RCCL and MSCCL collective kernels (trace/kernels.py)


def gpu_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    if not model.steps or model.total_step_us <= 0:
        return Assessment(RULE_ID, "not_assessed", "No step windows to measure GPU time in.")
    windows = idle_windows(model)
    total = float((windows[:, 1] - windows[:, 0]).sum())
    if total <= 0:
        return Assessment(RULE_ID, "not_assessed", "No GPU work inside the analysed window.")
    busy_by_dev = {
        dev: sum(s.gpu_us[dev]["kernel"] + s.gpu_us[dev]["memcpy"] + s.gpu_us[dev]["memset"]
                 for s in model.steps)
        for dev in model.gpu_devices
    }
    dev = max(busy_by_dev, key=lambda d: busy_by_dev[d])
    busy_pct = min(pct(busy_by_dev[dev], total), 100.0)
    word = step_word(model.workload)
    if busy_pct < GPU_BOUND_BUSY_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"The busiest GPU (device {dev}) is busy {percent(busy_pct)} of {word} time (threshold "
            f"{percent(GPU_BOUND_BUSY_PCT, 0)}): it waits, see gpu-idle.",
        )
    n = len(model.steps)
    gpu = model.gpu[(model.gpu["device"] == dev) & (model.gpu["step"] >= 0)]
    kernels = gpu[gpu["kind"] == "kernel"]
    kernel_us = float(kernels["dur"].sum())
    evidence: dict = {
        "device": dev,
        "gpu_busy_share_pct": busy_pct,
        "gpu_busy_ms_per_step": ms(busy_by_dev[dev] / n),
        "memcpy_share_of_busy_pct": pct(float(gpu.loc[gpu["kind"] == "memcpy", "dur"].sum()),
                                        float(gpu["dur"].sum())),
        "kernels_per_step": round(len(kernels) / n, 1),
        "top_kernels": _top_kernels(kernels, kernel_us, n),
        "workload": model.workload,
        "steps": n,
    }
    evidence.update(_kernel_classes(model, kernels, kernel_us))
    queue = launch_queue_full(model, dev)
    if queue:
        evidence["launch_queue_full"] = queue
    levers = _levers(evidence)
    evidence["levers"] = [lever for lever, _ in levers]
    return Assessment.found(advise(model, evidence, levers))


def advise(model: TraceModel, evidence: dict[str, Any], levers: list[tuple[str, str]]) -> Finding:
    """The finding: host-side fixes do not shorten a GPU-bound step; what makes its work faster."""
    dev, busy_pct = evidence["device"], evidence["gpu_busy_share_pct"]
    word = step_word(model.workload)
    queue = evidence.get("launch_queue_full")
    title = f"The GPU is the bottleneck: device {dev} is busy {percent(busy_pct)} of each {word}"
    if queue:
        title += (", and the host blocks on a full launch queue for "
                  f"{percent(queue['share_of_step_pct'], 0)} of it")
    top = evidence["top_kernels"][0] if evidence["top_kernels"] else None
    rec = (
        f"The GPU runs work {percent(busy_pct)} of each {word}, so the {word} is as long as the "
        "GPU's work: host-side fixes (more DataLoader workers, CUDA graphs, fewer launches, a "
        "larger batch) will not shorten it."
    )
    if top:
        rec += (f" The top kernel, {short_kernel(top['name'])}, takes "
                f"{percent(top['share_pct'], 0)} of kernel time (top kernels in the evidence).")
    if queue:
        rec += (
            f" The {percent(queue['share_of_step_pct'], 0)} of the {word} spent inside "
            f"{queue['calls_per_step']:g} launch calls per {word} over {LONG_LAUNCH_US:.0f} us is "
            "the host waiting for a free slot in the GPU's launch queue while the GPU was busy "
            f"({percent(queue['gpu_busy_during_pct'], 0)} of that time): not launch overhead, so "
            "CUDA graphs or a larger batch would not remove it."
        )
    rec += " What makes the GPU's work faster: " + "; ".join(t for _, t in levers) + "."
    return Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=rec,
        snippet=_snippet(evidence, model.workload),
        precondition=(
            "Holds while the GPU stays this busy: once a kernel-side fix shortens GPU work, the "
            "host or the input pipeline may become the limit again (re-measure). Mixed precision "
            "needs tensor cores (compute capability 7+) and numerics that tolerate it; "
            "torch.compile needs code it can trace."
        ),
        estimated_saving_pct=0.0,
        saving_basis=(
            "0, not an estimate of zero gain: the step is bounded by the GPU's work, and what "
            "faster kernels save is modelled only for mixed precision, whose figure is "
            "no-mixed-precision's (replayed there) and not counted twice; fusion's gain cannot "
            "be measured from the trace"
        ),
        docs=DOCS,
    )


def _top_kernels(kernels: pd.DataFrame, kernel_us: float, n: int) -> list[dict]:
    top = kernels.groupby("name", observed=True)["dur"].agg(["sum", "count"])
    top = top.sort_values("sum", ascending=False, kind="stable").head(TOP_KERNELS)
    return [
        {"name": str(name)[:120], "ms_per_step": ms(r["sum"] / n),
         "share_pct": pct(r["sum"], kernel_us), "calls_per_step": round(r["count"] / n, 1)}
        for name, r in top.iterrows()
    ]


def _kernel_classes(model: TraceModel, kernels: pd.DataFrame, kernel_us: float) -> dict:
    """Shares of kernel time by what could make it faster."""
    if kernels.empty:
        return {"fp32_gemm_conv_share_pct": 0.0, "tensor_core_share_pct": 0.0,
                "elementwise_share_pct": 0.0, "communication_share_pct": 0.0,
                "tensor_cores": False}
    kind = classify_kernels(kernels["name"])
    elementwise = per_name(kernels["name"], lambda s: bool(ELEMENTWISE.search(s)))
    comm = per_name(kernels["name"], lambda s: bool(COMM.search(s)))
    majors = model.compute_major
    major = majors.get(str(kernels["device"].iloc[0]), min(majors.values(), default=0))
    amd = any("AMD" in str(d.get("name", "")) for d in model.trace.devices)
    ew = kernels[elementwise & ~comm]
    return {
        "fp32_gemm_conv_share_pct": pct(float(kernels.loc[kind == "fp32", "dur"].sum()),
                                        kernel_us),
        "tensor_core_share_pct": pct(float(kernels.loc[kind == "tensor_core", "dur"].sum()),
                                     kernel_us),
        "elementwise_share_pct": pct(float(ew["dur"].sum()), kernel_us),
        "elementwise_median_us": round(float(ew["dur"].median()), 1) if len(ew) else 0.0,
        "communication_share_pct": pct(float(kernels.loc[comm, "dur"].sum()), kernel_us),
        "compute_major": major or None,
        "tensor_cores": bool(major >= MIN_COMPUTE_MAJOR and not amd),
    }


def _levers(ev: dict) -> list[tuple[str, str]]:
    """(id, advice) for each change the kernel mix supports, strongest evidence first."""
    out = []
    if ev["tensor_cores"] and ev["fp32_gemm_conv_share_pct"] >= MIN_FP32_SHARE_PCT:
        out.append(("mixed-precision", (
            f"fp32 GEMM/convolution kernels take {percent(ev['fp32_gemm_conv_share_pct'], 0)} of "
            "kernel time on a GPU with tensor cores: run them in bf16/fp16 under autocast (see "
            "no-mixed-precision for the modelled gain)")))
    if ev["elementwise_share_pct"] >= FUSION_SHARE_PCT:
        out.append(("fusion", (
            "elementwise/normalisation/reduction kernels take "
            f"{percent(ev['elementwise_share_pct'], 0)} of kernel time (median "
            f"{ev['elementwise_median_us']:g} us each): torch.compile fuses neighbours into fewer "
            "kernels, saving their memory round trips")))
    if ev["communication_share_pct"] >= FUSION_SHARE_PCT:
        out.append(("communication", (
            f"collective kernels take {percent(ev['communication_share_pct'], 0)} of kernel time: "
            "see comm-bound")))
    if not out:
        out.append(("kernels", (
            "no single class of kernel dominates: profile the top kernels (cudnn.benchmark for "
            "convolutions, channels_last, fewer or smaller layers), or use a faster GPU")))
    return out


def _snippet(ev: dict, workload: str) -> str:
    levers = ev["levers"]
    parts = []
    if "mixed-precision" in levers:
        dtype = "bfloat16" if (ev.get("compute_major") or 0) >= 8 else "float16"
        if workload == "inference":
            parts.append(
                "with torch.inference_mode(), torch.autocast(device_type=\"cuda\", "
                f"dtype=torch.{dtype}):\n    outputs = model(batch)")
        else:
            parts.append(
                f"with torch.autocast(device_type=\"cuda\", dtype=torch.{dtype}):\n"
                "    outputs = model(inputs)  # see no-mixed-precision for the full step")
    if "fusion" in levers:
        parts.append("model = torch.compile(model)  # default mode: fuses elementwise kernels")
    if not parts:
        parts.append("torch.backends.cudnn.benchmark = True  # fastest conv algorithms for "
                     "fixed input shapes\nmodel = model.to(memory_format=torch.channels_last)")
    return "\n\n".join(parts)


def launch_queue_full(model: TraceModel, dev: str) -> dict | None:
    """Long launch calls of the stepping process during which `dev` was busy: the host blocked
    on a full launch queue. None when they are under QUEUE_FULL_SHARE_PCT of step time."""
    rt = model.runtime
    if rt.empty or model.total_step_us <= 0:
        return None
    # Every thread of the stepping process: autograd launches the backward pass from its own.
    is_launch = per_name(rt["name"], lambda s: bool(LAUNCH_CALL.match(s))).to_numpy(dtype=bool)
    calls = rt[is_launch & (rt["step"].to_numpy() >= 0)
               & (rt["dur"].to_numpy() >= LONG_LAUNCH_US)]
    if calls.empty:
        return None
    g = model.gpu[model.gpu["device"] == dev]
    cs, ce = calls["ts"].to_numpy(), calls["end"].to_numpy()
    tl = Timeline.from_intervals((cs, ce), (g["ts"].to_numpy(), g["end"].to_numpy()))
    in_call = tl.cover(cs, ce)
    call_us = float(tl.lengths[in_call].sum())
    busy_us = float(tl.lengths[in_call & tl.cover(g["ts"].to_numpy(), g["end"].to_numpy())].sum())
    share = pct(call_us, model.total_step_us)
    busy_during = pct(busy_us, call_us)
    if share < QUEUE_FULL_SHARE_PCT or busy_during < QUEUE_BUSY_PCT:
        return None
    n = len(model.steps)
    return {
        "share_of_step_pct": share,
        "ms_per_step": ms(call_us / n),
        "calls_per_step": round(len(calls) / n, 1),
        "median_call_us": round(float(np.median(calls["dur"].to_numpy())), 1),
        "gpu_busy_during_pct": busy_during,
        "calls": sorted({str(c) for c in calls["name"]}),
    }


def verdict_line(finding: Finding) -> str:
    """The report's first line when this finding is the answer: the bound, the top kernel and
    the kernel-side levers, with no saving claimed (see the module docstring)."""
    ev = finding.evidence
    short = {
        "mixed-precision": f"mixed precision (fp32 GEMM/conv take "
                           f"{percent(ev.get('fp32_gemm_conv_share_pct', 0), 0)} of kernel time)",
        "fusion": f"torch.compile to fuse elementwise kernels "
                  f"({percent(ev.get('elementwise_share_pct', 0), 0)} of kernel time)",
        "communication": "less exposed communication (see comm-bound)",
        "kernels": "faster top kernels",
    }
    levers = ", ".join(short[lever] for lever in ev.get("levers", []) if lever in short)
    top = (ev.get("top_kernels") or [{}])[0]
    said = f"{finding.title}."
    if top.get("name"):
        said += (f" Top kernel: {short_kernel(top['name'])} ({percent(top['share_pct'], 0)} of "
                 "kernel time).")
    return said + f" Only faster GPU work shortens it: {levers or 'faster top kernels'}."


def short_kernel(name: str, width: int = 40) -> str:
    """A kernel name a headline can hold: no `void`, no argument list, template arguments
    collapsed to `<…>` where it is too long, then at most `width` characters, ending in an
    ellipsis (the whole name is in the evidence's top kernels)."""
    name = name.removeprefix("void ").split("(", 1)[0].strip()
    if len(name) > width:
        previous = None
        while previous != name:  # innermost template arguments first
            previous, name = name, re.sub(r"<[^<>]*>", "\x00", name)
        name = name.replace("\x00", "<\u2026>")
    return name if len(name) <= width else name[: width - 1] + "\u2026"


SPEC = RuleSpec(
    id=RULE_ID,
    title="the GPU is busy nearly all of the step",
    summary="the busiest GPU works nearly all of the step: what its time goes to, and what "
            "makes those kernels faster",
    check=gpu_bound,
    thresholds={"GPU_BOUND_BUSY_PCT": GPU_BOUND_BUSY_PCT, "LONG_LAUNCH_US": LONG_LAUNCH_US,
                "QUEUE_BUSY_PCT": QUEUE_BUSY_PCT, "QUEUE_FULL_SHARE_PCT": QUEUE_FULL_SHARE_PCT,
                "FUSION_SHARE_PCT": FUSION_SHARE_PCT, "MIN_FP32_SHARE_PCT": MIN_FP32_SHARE_PCT},
    # Offered to --what-if (its fusion advice); the plan does not replay it on its own.
    what_if=("compile",),
    order=160,
    metric=Metric("GPU busy", MS, evidence_key("gpu_busy_ms_per_step"), "gpu_busy_share_pct"),
    verdict_metric=("gpu_busy_share_pct", "gpu_busy_pct"),
    bound=True,
    per_device=True,
)
