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
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import for_torch, has, torch_version
from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_key, fixed
from stallscope.runfacts import RunContext
from stallscope.trace.keyed import inner_join, missing_last
from stallscope.trace.model import TraceModel
from stallscope.trace.names import OPTIMIZER_STEP, name_array, name_flags, regex_hit
from stallscope.units import millis

RULE_ID = "single-tensor-optimizer"
# Kernels per optimizer step from which the per-parameter loop is worth reporting. foreach
# needs about (ops per update) x ceil(params / ~100 tensors per launch) launches, i.e. a few to
# a few dozen; at 5-40 us of host time per launch, fewer than 50 launches cost well under a
# millisecond per step, and a small model's loop is then not worth changing.
MIN_KERNELS_PER_STEP = 50
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


def _str_codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Integer codes of a column's values compared as strings (-1: missing) and the strings,
    read off a categorical's codes: one code per thread, not one string per event."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes, uniques = col.array.codes, col.array.categories.tolist()
    else:
        codes, uniques = pd.factorize(col, use_na_sentinel=True)
    labels: dict[str, int] = {}
    remap = np.array([labels.setdefault(str(u), len(labels)) for u in uniques] + [-1])
    return remap[codes], list(labels)


def _step_class(name: str) -> str:
    """The optimizer class of an `Optimizer.step#<Name>.step` range, else ''."""
    m = OPTIMIZER_STEP.match(name)
    return m.group(1) if m else ""


def _outermost(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Order (by thread, then start) of the optimizer ranges that are not nested in an earlier
    one of their thread: an optimizer wrapping another is folded into the outer."""
    # Missing threads sort last and are never nested (as pandas sorts and groups them).
    key = missing_last(tid)
    order = np.lexsort((ts, key))
    key, ts, end = key[order], ts[order], end[order]
    nested = np.zeros(len(order), dtype=bool)
    cuts = np.flatnonzero(np.diff(key)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
        if tid[order[lo]] < 0:
            continue
        # Latest end of the ranges before each one (a missing end is no reach).
        reach = np.fmax.accumulate(end[lo:hi])
        reach[np.isnan(end[lo:hi])] = np.nan
        nested[lo + 1:hi] = ts[lo + 1:hi] < reach[:-1]
    return order[~nested]


def _assign(ts: np.ndarray, tid: np.ndarray, r_ts: np.ndarray, r_end: np.ndarray,
            r_tid: np.ndarray) -> np.ndarray:
    """Position (into the ranges, which must not overlap per thread and come sorted by start
    within a thread) of the range around each event on the same thread, or -1. `tid` and
    `r_tid` are codes of the same thread strings."""
    out = np.full(len(ts), -1)
    for t in np.unique(r_tid[r_tid >= 0]):
        mine_r = np.flatnonzero(r_tid == t)
        starts, ends = r_ts[mine_r], r_end[mine_r]
        mine = np.flatnonzero(tid == t)
        idx = np.searchsorted(starts, ts[mine], side="right") - 1
        ok = idx >= 0
        ok[ok] &= ts[mine][ok] < ends[idx[ok]]
        out[mine[ok]] = mine_r[idx[ok]]
    return out


def _covered(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of [lo, hi) covered by the union of the intervals, per query."""
    if len(starts) == 0:
        return np.zeros(len(lo))
    order = np.argsort(starts, kind="stable")
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
    # Plain arrays throughout: the frames are small, so pandas' per-call cost would dominate.
    optimizer = name_array(ops["name"], _step_class)
    is_step = (optimizer != "") & (ops["step"].to_numpy() >= 0)
    if not is_step.any():
        return Assessment(
            RULE_ID,
            "not_assessed",
            "No Optimizer.step ranges inside the profiled steps (optimizer not a "
            "torch.optim.Optimizer, or stepped outside the profiled window).",
        )
    op_ts, op_end = ops["ts"].to_numpy(), ops["end"].to_numpy()
    op_tid, tid_labels = _str_codes(ops["tid"])
    steps = np.flatnonzero(is_step)
    rows = steps[_outermost(op_tid[steps], op_ts[steps], op_end[steps])]  # the ranges, in ops
    r_ts, r_end, r_tid = op_ts[rows], op_end[rows], op_tid[rows]
    # Kernels launched from inside each range: runtime calls of the range's thread, joined by
    # correlation id to the kernels.
    rt = model.runtime
    rt_tid, rt_labels = _str_codes(rt["tid"])
    same = {label: i for i, label in enumerate(tid_labels)}
    rt_tid = np.array([same.get(label, -2) for label in rt_labels] + [-1])[rt_tid]
    rt_range = _assign(rt["ts"].to_numpy(), rt_tid, r_ts, r_end, r_tid)
    rt_corr = rt["correlation"].to_numpy()
    launched = np.flatnonzero((rt_range >= 0) & ~np.isnan(rt_corr))
    gpu = model.gpu
    gpu_corr = gpu["correlation"].to_numpy()
    kernel_rows = np.flatnonzero((gpu["kind"].to_numpy() == "kernel") & ~np.isnan(gpu_corr))
    left, right = inner_join(gpu_corr[kernel_rows], rt_corr[launched])
    k_rows, k_range = kernel_rows[left], rt_range[launched[right]]  # one row per join match
    multi_kernel = name_flags(gpu["name"], _multi_tensor_kernel)[k_rows]
    # Multi-tensor/fused ops inside the ranges (only those ops need placing in a range).
    multi_op = np.flatnonzero(name_flags(ops["name"], _multi_tensor_op))
    op_range = _assign(op_ts[multi_op], op_tid[multi_op], r_ts, r_end, r_tid)
    n_ranges = len(rows)
    kernels = np.bincount(k_range, minlength=n_ranges)
    multi = (np.bincount(k_range[multi_kernel], minlength=n_ranges)
             + np.bincount(op_range[op_range >= 0], minlength=n_ranges))
    verdict = judge(optimizer[rows], kernels, multi)
    if verdict is not None:
        return verdict
    per_range = pd.DataFrame({"optimizer": optimizer[rows].astype(object), "ts": r_ts,
                              "end": r_end, "dur": ops["dur"].to_numpy()[rows],
                              "kernels": kernels, "multi": multi})
    return _found(model, per_range, k_rows, k_range)


def judge(optimizers: np.ndarray, kernels: np.ndarray, multi: np.ndarray) -> Assessment | None:
    """Clear when every optimizer's steps use multi-tensor/fused kernels or launch few; None:
    a finding. Per Optimizer.step range: its class, its kernels, its multi-tensor ones."""
    names, of_range = np.unique(optimizers, return_inverse=True)
    per_opt_ranges = np.bincount(of_range, minlength=len(names))
    per_opt_kernels = np.bincount(of_range, weights=kernels, minlength=len(names))
    per_opt_multi = np.bincount(of_range, weights=multi, minlength=len(names))
    kernels_per_step = per_opt_kernels / per_opt_ranges  # counts: exact as floats
    if not ((per_opt_multi == 0) & (kernels_per_step >= MIN_KERNELS_PER_STEP)).any():
        described = "; ".join(
            f"{name}: {k:.0f} kernels per step" + (", multi-tensor/fused" if m else "")
            for name, k, m in zip(names, kernels_per_step, per_opt_multi, strict=True)
        )
        return Assessment(
            RULE_ID,
            "clear",
            f"Optimizer steps use multi-tensor/fused kernels or launch few kernels ({described}; "
            f"threshold {MIN_KERNELS_PER_STEP} per-parameter kernels per step).",
        )
    return None


def _multi_tensor_kernel(name: str) -> bool:
    return regex_hit(MULTI_TENSOR_KERNEL, name, anywhere=True)


def _multi_tensor_op(name: str) -> bool:
    return regex_hit(MULTI_TENSOR_OP, name)


def _found(model: TraceModel, per_range: pd.DataFrame, k_rows: np.ndarray,
           k_range: np.ndarray) -> Assessment:
    """The finding for the for-loop optimizer with the most host time, from the ranges (one row
    each: optimizer, ts, end, dur, kernels, multi) and the launched kernels (gpu rows and their
    range, one per launch match). Sums go through pandas in the rows' order as before (its
    groupby sums are compensated), so figures keep their bits; only findings pay for it."""
    gpu = model.gpu
    kernel_dur = pd.Series(gpu["dur"].to_numpy()[k_rows])
    per_range["kernel_us"] = (kernel_dur.groupby(k_range).sum()
                              .reindex(per_range.index, fill_value=0.0))
    # GPU idle during each range, on the device that ran the optimizer's kernels.
    device = gpu["device"].iloc[k_rows].mode().iloc[0] if len(k_rows) else None
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
    name = str(looped["host_us"].idxmax())
    r = looped.loc[name]
    n = len(model.steps)
    total = model.total_step_us
    mine = k_rows[per_range["optimizer"].to_numpy()[k_range] == name]
    # A categorical's value_counts lists every category: names no optimizer kernel has are 0.
    top = gpu["name"].iloc[mine].reset_index(drop=True).value_counts().head(3)
    top = top[top > 0]
    # Host time saved can only shorten the step while the GPU has idle time to absorb it.
    gpu_idle = max(total - busiest_gpu_us(model), 0.0)
    saved = min(float(r.host_us), gpu_idle)
    evidence: dict[str, Any] = {
        "optimizer": name,
        "optimizer_steps": int(r.ranges),
        "kernels_per_optimizer_step": round(float(r.kernels_per_step), 1),
        "host_ms_per_optimizer_step": ms(float(r.host_us) / r.ranges),
        "gpu_kernel_ms_per_optimizer_step": ms(float(r.kernel_us) / r.ranges),
        "gpu_idle_ms_per_optimizer_step": ms(float(r.idle_us) / r.ranges),
        "optimizer_share_of_step_pct": pct(float(r.host_us), total),
        "gpu_idle_share_of_step_pct": pct(gpu_idle, total),
        "step_ms_mean": ms(total / n),
        "top_kernels": [{"name": str(k)[:120], "count_per_step": round(float(c / r.ranges), 1)}
                        for k, c in top.items()],
    }
    return Assessment.found(advise(model, name, r, evidence, saved, total))


def advise(model: TraceModel, name: str, r: Any, evidence: dict[str, Any], saved: float,
           total: float) -> Finding:
    """The finding: the foreach/fused option of a torch.optim class, or a torch._foreach_* step.
    `r`: the optimizer's summary row (ranges, host_us, kernels_per_step, kernel_us)."""
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
    return Finding(
        id=RULE_ID,
        title=(
            f"{name}.step() launches {r.kernels_per_step:.0f} per-parameter kernels "
            f"({millis(ms(float(r.host_us) / r.ranges), 'tenths')} ms per step)"
        ),
        evidence=evidence,
        recommendation=(
            "The optimizer updates parameters one tensor at a time: each step launches "
            f"{r.kernels_per_step:.0f} small kernels and no multi-tensor kernel, taking "
            f"{millis(ms(float(r.host_us) / r.ranges), 'tenths')} ms of host time while the GPU "
            f"computes {millis(ms(float(r.kernel_us) / r.ranges), 'hundredths')} ms. " + how
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


def optimizer_ms(evidence: dict[str, Any]) -> float | None:
    """The optimizer's host time per training step, compare's quantity: its share of the step
    times the step (its own `host_ms_per_optimizer_step` is per optimizer call, and a step may
    make several)."""
    share = evidence_key("optimizer_share_of_step_pct")(evidence)
    step = evidence_key("step_ms_mean")(evidence)
    return None if share is None or step is None else share * step / 100.0


SPEC = RuleSpec(
    id=RULE_ID,
    title="the optimizer launches per-parameter kernels",
    summary="the optimizer launches per-parameter kernels (no `foreach`/`fused`)",
    check=single_tensor_optimizer,
    thresholds={"MIN_KERNELS_PER_STEP": MIN_KERNELS_PER_STEP},
    what_if=("optimizer",),
    changes=fixed(Change("optimizer", "foreach")),
    order=110,
    metric=Metric("optimizer host time", MS, optimizer_ms, "optimizer_share_of_step_pct",
                  ("step_ms_mean",)),
)
