"""What each GPU of a trace ran inside the steps: compute, communication and memory kernels,
the communication hidden under compute, and Kineto's own per-kernel estimates.

Why: users of multi-rank tools (HolisticTraceAnalysis' kernel-type breakdown and comm-comp
overlap, the TensorBoard plugin's GPU summary) read a rank by these figures: how much of its
step its GPU computes, how much it communicates and how much of that communication runs
while compute runs (hidden) rather than alone (exposed, the step waits for it). Definitions
are in docs/metrics.md ("GPU kernels by type", "GPU summary"); each is computed once, here,
and every view prints these numbers.

A kernel is *communication* when its name is a collective's (trace/kernels.py's COMM_NAME, the
comm-bound rule's own: nccl, rccl, msccl), *memory* when it is a copy or memset
(`gpu_memcpy`/`gpu_memset`), else *compute*. Times are unions over the device's streams
(concurrent kernels of one type count once), clipped to the judged steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope.diagnose.common import MIN_COMPUTE_MAJOR
from stallscope.diagnose.rules.comm_bound import host_collectives
from stallscope.trace.intervals import Timeline
from stallscope.trace.kernels import COMM_NAME, device_major, kernel_kind
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_array, name_mask

# The exclusive split of step wall time, in drawing order: each microsecond of a step goes to
# the first that applies of compute with communication (hidden), compute alone, communication
# alone (exposed), memory alone, else idle.
SPLIT = ("compute", "comm_hidden", "comm_exposed", "memory", "idle")


def kernel_mix(model: TraceModel) -> list[dict[str, Any]] | None:
    """Per device that ran work inside the steps, the kernel-type split (docs/metrics.md);
    None for a trace without GPU work or steps."""
    gpu = model.gpu
    if not model.has_gpu or not model.steps or gpu.empty:
        return None
    windows = model.windows
    kernel = gpu["kind"].to_numpy() == "kernel"
    comm = kernel & name_mask(gpu["name"], COMM_NAME)
    kinds = {"compute": kernel & ~comm, "communication": comm, "memory": ~kernel}
    ts, end = gpu["ts"].to_numpy(), gpu["end"].to_numpy()
    device = gpu["device"].to_numpy()
    inside = gpu["step"].to_numpy() >= 0
    out = []
    for dev in model.gpu_devices:
        on = (device == dev) & inside
        if on.any():
            out.append(_device_mix(dev, windows, {k: (ts[m & on], end[m & on])
                                                  for k, m in kinds.items()}))
    return out or None


def _device_mix(dev: str, windows: np.ndarray,
                spans: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """One device's split: each type's union time per step, and the exclusive split."""
    w0, w1 = windows[:, 0], windows[:, 1]
    tl = Timeline.from_intervals((w0, w1), *spans.values())
    lengths = tl.lengths
    judged = tl.bucket(w0, w1) >= 0
    cover = {k: tl.cover(*iv) & judged for k, iv in spans.items()}
    comp, comm, mem = cover["compute"], cover["communication"], cover["memory"]
    parts = {
        "compute": comp & ~comm,
        "comm_hidden": comp & comm,
        "comm_exposed": comm & ~comp,
        "memory": mem & ~comp & ~comm,
        "idle": judged & ~comp & ~comm & ~mem,
    }
    window = float(lengths[judged].sum())
    n = len(windows)
    comm_us = float(lengths[comm].sum())
    hidden_us = float(lengths[comp & comm].sum())
    return {
        "device": dev,
        "per_step_us": {
            "compute": round(float(lengths[comp].sum()) / n, 3),
            "communication": round(comm_us / n, 3),
            "memory": round(float(lengths[mem].sum()) / n, 3),
            "comm_hidden": round(hidden_us / n, 3),
        },
        "split_pct": {k: round(100.0 * float(lengths[m].sum()) / window, 2) if window else 0.0
                      for k, m in parts.items()},
        # HTA's comm-comp overlap: the share of communication time that compute overlaps.
        "comm_hidden_pct": round(100.0 * hidden_us / comm_us, 2) if comm_us > 0 else None,
    }


def host_comm(model: TraceModel) -> dict[str, Any] | None:
    """A CPU-only trace's collectives (gloo/MPI/UCC host ranges, as comm-bound measures them):
    time per step, its share of the step and the share of it hidden under the process's
    compute ops; None for a GPU trace or one without host collectives in its steps."""
    if model.has_gpu or not model.steps or model.total_step_us <= 0:
        return None
    r = host_collectives(model)
    if r is None or r["comm"] <= 0:
        return None
    n, hidden = len(model.steps), r["comm"] - r["exposed"]
    return {
        "per_step_us": {"communication": round(r["comm"] / n, 3),
                        "comm_hidden": round(hidden / n, 3)},
        "share_pct": round(100.0 * r["comm"] / model.total_step_us, 2),
        "comm_hidden_pct": round(100.0 * hidden / r["comm"], 2),
    }


def busiest(mix: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The device with the least idle share: the one a rank's step waits on."""
    if not mix:
        return None
    return min(mix, key=lambda d: (d["split_pct"]["idle"], d["device"]))


def gpu_summary(model: TraceModel) -> list[dict[str, Any]] | None:
    """Per device, the tensor-core share of compute kernel time and Kineto's estimated SM
    efficiency and achieved occupancy (docs/metrics.md, "GPU summary"); a figure the trace
    does not hold is None and `missing` says why. None for a trace without kernels in steps."""
    gpu = model.gpu
    if not model.has_gpu or not model.steps or gpu.empty:
        return None
    kernel = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
    if not kernel.any():
        return None
    windows = model.windows
    # Each kernel's time inside its step (a kernel running past its step's end is cut there).
    step = gpu["step"].to_numpy()
    ts = gpu["ts"].to_numpy()
    clipped_end = np.minimum(gpu["end"].to_numpy(), windows[np.maximum(step, 0), 1])
    device = gpu["device"].to_numpy()
    compute = kernel & ~name_mask(gpu["name"], COMM_NAME)
    tensor = np.zeros(len(gpu), dtype=bool)
    tensor[compute] = name_array(gpu["name"], kernel_kind, compute) == "tensor_core"
    dur = gpu["dur"].to_numpy()
    tc_note = _tensor_core_note(model)
    blocks = _column(gpu, "blocks_per_sm")
    occupancy = _column(gpu, "occupancy")
    out = []
    for dev in model.gpu_devices:
        on = kernel & (device == dev)
        if not on.any():
            continue
        missing = [tc_note] if tc_note else []
        row: dict[str, Any] = {"device": dev, "tensor_core_pct": None,
                               "sm_efficiency_pct": None, "occupancy_pct": None}
        comp_us = float(np.nansum(dur[compute & on]))
        if tc_note is None and comp_us > 0:
            row["tensor_core_pct"] = round(
                100.0 * float(np.nansum(dur[compute & on & tensor])) / comp_us, 2)
        sm = _sm_efficiency(ts[on], clipped_end[on], blocks[on], windows)
        if sm is None:
            missing.append("no kernel carries Kineto's \"blocks per SM\"")
        row["sm_efficiency_pct"] = sm
        occ = _weighted(occupancy[on], clipped_end[on] - ts[on])
        if occ is None:
            missing.append("no kernel carries Kineto's \"est. achieved occupancy %\"")
        row["occupancy_pct"] = occ
        row["missing"] = "; ".join(missing) if missing else None
        out.append(row)
    return out or None


def _column(gpu: Any, name: str) -> np.ndarray:
    """A gpu-table column as floats, all NaN where the table has none (older models)."""
    if name in gpu:
        return gpu[name].to_numpy(dtype=float)
    return np.full(len(gpu), np.nan)


def _tensor_core_note(model: TraceModel) -> str | None:
    """Why the tensor-core share is not given (None: it is)."""
    major, source = device_major(model)
    if source == "ROCm":
        return ("tensor-core share not given: ROCm matrix-core kernels are not told apart by "
                "name")
    if major is None:
        return ("tensor-core share not given: the GPU's compute capability is unknown (no "
                "deviceProperties, no architecture in the kernel names)")
    if major < MIN_COMPUTE_MAJOR:
        return f"no tensor cores: compute capability {major} (tensor cores arrived with 7.0)"
    return None


def _sm_efficiency(ts: np.ndarray, end: np.ndarray, blocks: np.ndarray,
                   windows: np.ndarray) -> float | None:
    """The TensorBoard plugin's "Est. SM Efficiency": at each moment min(1, the summed
    "blocks per SM" of the kernels running), averaged over the steps' wall time (idle time
    counts as 0); None without the argument."""
    ok = np.isfinite(blocks) & (blocks > 0) & (end > ts)
    if not ok.any():
        return None
    w0, w1 = windows[:, 0], windows[:, 1]
    tl = Timeline.from_intervals((w0, w1), (ts[ok], end[ok]))
    n = len(tl.edges) - 1
    lo = np.searchsorted(tl.edges, ts[ok], side="left")
    hi = np.searchsorted(tl.edges, end[ok], side="left")
    delta = np.zeros(n + 1)
    np.add.at(delta, lo, blocks[ok])
    np.add.at(delta, hi, -blocks[ok])
    level = np.clip(np.cumsum(delta[:-1]), 0.0, 1.0)
    judged = tl.bucket(w0, w1) >= 0
    window = float(tl.lengths[judged].sum())
    if window <= 0:
        return None
    return round(100.0 * float((tl.lengths * level)[judged].sum()) / window, 2)


def _weighted(values: np.ndarray, weights: np.ndarray) -> float | None:
    """The `weights`-weighted mean of the `values` that are percents (0-100); None without
    any."""
    ok = np.isfinite(values) & (values >= 0) & (values <= 100) & (weights > 0)
    if not ok.any():
        return None
    return round(float(np.average(values[ok], weights=weights[ok])), 2)
