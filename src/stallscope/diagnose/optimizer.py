"""`single-tensor-optimizer`: the optimizer updates parameters one tensor at a time.

PyTorch optimizers have three implementations: the per-parameter for-loop
(`_single_tensor_adam`-style), `foreach` (one `multi_tensor_apply_kernel` launch per chunk of
parameters) and `fused` (one kernel for the whole update). The for-loop launches a few small
elementwise kernels per parameter, so a model with hundreds of parameter tensors pays hundreds
of kernel launches inside `optimizer.step()`, during which the GPU mostly waits for the host.

Signal: inside the `Optimizer.step#<Name>.step` ranges (cat `cpu_op` in old traces,
`user_annotation` in new ones), the runtime calls of the same thread are joined by correlation
id to the kernels they launched. Many kernels per optimizer step and no multi-tensor or fused
kernel (nor an `aten::_foreach_*` / `aten::_fused_*` op) means the for-loop implementation.
The saving bound is the optimizer's host time, capped by the GPU's idle time in the steps:
launching the same work in a few kernels shortens the step only while the GPU waits for the
host (during the optimizer itself, or later, e.g. while the next batch loads).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stallscope.capture.context import RunContext
from stallscope.diagnose.advice import for_torch, has, torch_version
from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.trace.model import TraceModel, name_matches, per_name

RULE_ID = "single-tensor-optimizer"
# Kernels per optimizer step from which the per-parameter loop is worth reporting. foreach
# needs about (ops per update) x ceil(params / ~100 tensors per launch) launches, i.e. a few to
# a few dozen; at 5-40 us of host time per launch, fewer than 50 launches cost well under a
# millisecond per step, and a small model's loop is then not worth changing.
MIN_KERNELS_PER_STEP = 50
STEP_NAME = re.compile(r"^Optimizer\.step#(.+)\.step$")
# Kernels and ops of the multi-tensor (foreach) and fused implementations.
MULTI_TENSOR_KERNEL = re.compile(
    r"multi_tensor_apply|fused_adam|fusedadam|fused_sgd|_fused_|fused\w*optim|lamb_stage",
    re.IGNORECASE,
)
MULTI_TENSOR_OP = re.compile(r"^aten::_(?:foreach|fused)_")
# torch.optim classes that take foreach=True; the fused implementation is documented for
# Adam and AdamW on CUDA since torch 2.0.
FOREACH_CLASSES = frozenset(
    {"Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop",
     "Rprop", "SGD"}
)
FUSED_CLASSES = frozenset({"Adam", "AdamW"})
DOCS = "https://pytorch.org/docs/stable/optim.html#algorithms"


def _outermost(ranges: pd.DataFrame) -> pd.DataFrame:
    """Optimizer ranges with nested ones (an optimizer wrapping another) folded into the outer."""
    ranges = ranges.sort_values(["tid", "ts"])
    reach = ranges.groupby("tid", observed=True)["end"].cummax().shift(1)
    same_tid = ranges["tid"].eq(ranges["tid"].shift(1))
    nested = same_tid & (ranges["ts"] < reach)
    return ranges[~nested.fillna(False)]


def _assign(ts: pd.Series, tid: pd.Series, ranges: pd.DataFrame) -> np.ndarray:
    """Index (into `ranges`, which must not overlap per thread) of the range around each event
    on the same thread, or -1."""
    out = np.full(len(ts), -1)
    ts_a, tid_a = ts.to_numpy(), tid.astype(str).to_numpy()
    for t, grp in ranges.groupby(ranges["tid"].astype(str), observed=True):
        starts, ends = grp["ts"].to_numpy(), grp["end"].to_numpy()
        mine = np.flatnonzero(tid_a == t)
        idx = np.searchsorted(starts, ts_a[mine], side="right") - 1
        ok = idx >= 0
        ok[ok] &= ts_a[mine][ok] < ends[idx[ok]]
        out[mine[ok]] = grp.index.to_numpy()[idx[ok]]
    return out


def _covered(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of [lo, hi) covered by the union of the intervals, per query."""
    if len(starts) == 0:
        return np.zeros(len(lo))
    order = np.argsort(starts)
    s, e = starts[order], np.maximum.accumulate(ends[order])
    # Merge into disjoint intervals: a new one starts where it begins after all before it end.
    new = np.r_[True, s[1:] > e[:-1]]
    ms_, me = s[new], np.r_[e[np.flatnonzero(new)[1:] - 1], e[-1]]
    cum = np.r_[0.0, np.cumsum(me - ms_)]

    def upto(x: np.ndarray) -> np.ndarray:
        """Covered length before x."""
        i = np.searchsorted(ms_, x, side="right") - 1  # last interval starting at or before x
        j = np.maximum(i, 0)
        inside = np.clip(x - ms_[j], 0.0, me[j] - ms_[j])
        return np.where(i >= 0, cum[j] + inside, 0.0)

    return upto(hi) - upto(lo)


def single_tensor_optimizer(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(
            RULE_ID, "not_assessed", "No GPU activity: optimizer kernel launches cannot be seen."
        )
    ops = model.ops
    if ops.empty:
        return Assessment(RULE_ID, "not_assessed", "No CPU op events in the trace.")
    is_step = name_matches(ops["name"], STEP_NAME) & (ops["step"] >= 0)
    if not is_step.any():
        return Assessment(
            RULE_ID,
            "not_assessed",
            "No Optimizer.step ranges inside the profiled steps (optimizer not a "
            "torch.optim.Optimizer, or stepped outside the profiled window).",
        )
    steps = ops[is_step]
    ranges = steps.assign(optimizer=steps["name"].astype(str).str.extract(STEP_NAME.pattern)[0])
    ranges = _outermost(ranges)
    # Kernels launched from inside each range, joined by correlation.
    rt = model.runtime
    rt_range = _assign(rt["ts"], rt["tid"], ranges)
    launched = rt.loc[rt_range >= 0, ["correlation"]].assign(range=rt_range[rt_range >= 0])
    gpu = model.gpu
    kernels = gpu[gpu["kind"] == "kernel"].dropna(subset=["correlation"])
    kernels = kernels.merge(launched.dropna(subset=["correlation"]), on="correlation")
    kernels["multi"] = per_name(kernels["name"], lambda n: bool(MULTI_TENSOR_KERNEL.search(n)))
    op_range = _assign(ops["ts"], ops["tid"], ranges)
    multi_ops = pd.Series(op_range[(op_range >= 0) & name_matches(ops["name"], MULTI_TENSOR_OP)])

    per_range = ranges[["optimizer", "ts", "end", "dur"]].copy()
    grouped = kernels.groupby("range")
    per_range["kernels"] = grouped.size().reindex(per_range.index, fill_value=0)
    per_range["kernel_us"] = grouped["dur"].sum().reindex(per_range.index, fill_value=0.0)
    per_range["multi"] = grouped["multi"].sum().reindex(per_range.index, fill_value=0)
    per_range["multi"] += multi_ops.value_counts().reindex(per_range.index, fill_value=0)
    # GPU idle during each range, on the device that ran the optimizer's kernels.
    device = kernels["device"].mode().iloc[0] if len(kernels) else None
    dev = gpu[gpu["device"] == device] if device is not None else gpu.iloc[0:0]
    busy = _covered(dev["ts"].to_numpy(), dev["end"].to_numpy(), per_range["ts"].to_numpy(),
                    per_range["end"].to_numpy())
    per_range["idle_us"] = np.clip(per_range["dur"].to_numpy() - busy, 0.0, None)

    summary = per_range.groupby("optimizer").agg(
        ranges=("dur", "size"),
        host_us=("dur", "sum"),
        kernels=("kernels", "sum"),
        kernel_us=("kernel_us", "sum"),
        multi=("multi", "sum"),
        idle_us=("idle_us", "sum"),
    )
    summary["kernels_per_step"] = summary["kernels"] / summary["ranges"]
    many = summary["kernels_per_step"] >= MIN_KERNELS_PER_STEP
    looped = summary[(summary["multi"] == 0) & many]
    described = "; ".join(
        f"{name}: {r.kernels_per_step:.0f} kernels per step"
        + (", multi-tensor/fused" if r.multi else "")
        for name, r in summary.iterrows()
    )
    if looped.empty:
        return Assessment(
            RULE_ID,
            "clear",
            f"Optimizer steps use multi-tensor/fused kernels or launch few kernels ({described}; "
            f"threshold {MIN_KERNELS_PER_STEP} per-parameter kernels per step).",
        )
    name = str(looped["host_us"].idxmax())
    r = looped.loc[name]
    n = len(model.steps)
    total = model.total_step_us
    mine = kernels[(kernels["range"].map(per_range["optimizer"]) == name)]
    top = mine["name"].value_counts().head(3)
    # Host time saved can only shorten the step while the GPU has idle time to absorb it.
    gpu_idle = max(total - busiest_gpu_us(model), 0.0)
    saved = min(float(r.host_us), gpu_idle)
    evidence = {
        "optimizer": name,
        "optimizer_steps": int(r.ranges),
        "kernels_per_optimizer_step": round(float(r.kernels_per_step), 1),
        "host_ms_per_optimizer_step": ms(float(r.host_us) / r.ranges),
        "gpu_kernel_ms_per_optimizer_step": ms(float(r.kernel_us) / r.ranges),
        "gpu_idle_ms_per_optimizer_step": ms(float(r.idle_us) / r.ranges),
        "optimizer_share_of_step_pct": pct(float(r.host_us), total),
        "gpu_idle_share_of_step_pct": pct(gpu_idle, total),
        "step_ms_mean": ms(total / n),
        "top_kernels": [{"name": str(k)[:120], "count_per_step": round(c / r.ranges, 1)}
                        for k, c in top.items()],
    }
    known = name in FOREACH_CLASSES
    if known:
        snippet, how = _foreach_advice(model, name)
    else:
        snippet = (
            f"# in {name}.step(): update all parameters with one multi-tensor call per op\n"
            "params = [p for p in group['params'] if p.grad is not None]\n"
            "grads = [p.grad for p in params]\n"
            "torch._foreach_add_(params, grads, alpha=-lr)"
        )
        how = (
            f"{name} is not a torch.optim class with a foreach option: rewrite its step() with "
            "torch._foreach_* ops (or use a fused implementation) so one launch updates many "
            "tensors."
        )
    finding = Finding(
        id=RULE_ID,
        title=(
            f"{name}.step() launches {r.kernels_per_step:.0f} per-parameter kernels "
            f"({ms(float(r.host_us) / r.ranges):.1f} ms per step)"
        ),
        evidence=evidence,
        recommendation=(
            f"The optimizer updates parameters one tensor at a time: each step launches "
            f"{r.kernels_per_step:.0f} small kernels and no multi-tensor kernel, taking "
            f"{ms(float(r.host_us) / r.ranges):.1f} ms of host time while the GPU computes "
            f"{ms(float(r.kernel_us) / r.ranges):.2f} ms. " + how
        ),
        snippet=snippet,
        precondition=(
            "Parameters of one param group must share a device and dtype for the multi-tensor "
            "path; foreach holds intermediate results for a whole chunk of parameters, so peak "
            "memory grows slightly. The gain is launch overhead: it shows in step time only "
            "when the GPU waits for the host during the optimizer step, as measured here."
        ),
        estimated_saving_pct=pct(saved, total),
        saving_basis=(
            "upper bound: the optimizer step's host time, as if its launches cost nothing (a "
            "foreach/fused step still takes a few launches), never more than the GPU's idle "
            "time in the steps, since host time saved shortens the step only while the GPU "
            "waits for the host"
        ),
        docs=DOCS,
    )
    return Assessment.found(finding)


def _foreach_advice(model: TraceModel, name: str) -> tuple[str, str]:
    """The multi-tensor optimizer for the trace's torch: the `foreach=` argument from 1.12
    (`fused=` for Adam/AdamW from 2.0), `torch.optim._multi_tensor` before."""
    if not has(model, (1, 12)):
        snippet = (
            f"{for_torch(model)}: no foreach= argument yet\n"
            f"optimizer = torch.optim._multi_tensor.{name}(model.parameters(), ...)"
        )
        how = (
            f"Construct the multi-tensor {name} (torch.optim._multi_tensor.{name}; torch 1.12 "
            "made it the foreach=True argument): the update then runs as a few multi-tensor "
            "kernels instead of one set per parameter."
        )
        return snippet, how
    fused = name in FUSED_CLASSES and has(model, (2, 0))
    snippet = (
        f"{for_torch(model)}\n"
        f"optimizer = torch.optim.{name}(model.parameters(), ..., foreach=True)\n"
        + (f"# or, all parameters on CUDA: one fused kernel\n"
           f"optimizer = torch.optim.{name}(model.parameters(), ..., fused=True)"
           if fused else "").rstrip("\n")
    ).rstrip("\n")
    if torch_version(model) is None:  # the user's torch may be older than the spelling
        snippet += (f"\n# torch < 1.12 has no foreach argument: "
                    f"torch.optim._multi_tensor.{name}")
    how = (
        f"Construct {name} with foreach=True (the default on CUDA since torch 2.0 unless "
        "foreach=False, differentiable=True or non-CUDA parameters force the loop)"
        + (", or fused=True" if fused else "")
        + ": the update then runs as a few multi-tensor kernels instead of one set per "
        "parameter."
    )
    return snippet, how
