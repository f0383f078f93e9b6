"""The device's memory as the recording saw it: peak allocated and reserved against capacity.

Two sources, read the same way for every rule and the report:
- a trace recorded with `profile_memory=True` carries the allocator's `[memory]` instant events
  (trace/decode.py `add_memory`): each allocation or free, and, in recent torch, the device's
  totals after it (`Total Allocated`, `Total Reserved`). Older traces write only the change
  (`Bytes`): their peak is relative to the memory held when the recording started, which the
  trace does not say. The capacity is deviceProperties' `totalGlobalMem`.
- stallscope run writes the allocator's own figures at each recorded step (capture/memory.py:
  the process's peaks, never reset, its retries and out-of-memory count) and the device's
  capacity from `cudaMemGetInfo`.

"Held across steps" is the allocated memory at the steps' boundaries at its lowest (weights,
optimizer state, what the script keeps): what does not scale with the batch. The step's
transient peak is the peak above it (activations, gradients in flight): what does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from stallscope.trace.model import TraceModel

CUDA = 1  # c10's DeviceType for CUDA (ROCm builds write it too); 0 is the CPU
FROM_EVENTS = "profile_memory events"
FROM_RUN = "stallscope run's per-step figures"


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory over the recording (bytes; None where the source does not say)."""

    device: str  # "cuda:1"; "cuda" for `run`'s figures (the script's current device)
    source: str  # FROM_EVENTS or FROM_RUN
    relative: bool  # peaks are above the memory held when the recording started (unknown)
    peak_allocated: int | None
    peak_reserved: int | None
    capacity: int | None
    held: int | None  # allocated at the steps' boundaries, at its lowest (relative: ditto)
    retries: int | None  # the allocator's retries after freeing its cache (cumulative)
    ooms: int | None  # out-of-memory errors raised (cumulative)
    inactive_split: int | None  # cached bytes split by smaller allocations (fragmentation)
    samples: int  # events, or recorded steps

    @property
    def peak_share(self) -> float | None:
        """Peak reserved (what the allocator took from the device) over capacity."""
        peak = self.peak_reserved if self.peak_reserved is not None else self.peak_allocated
        if self.relative or peak is None or not self.capacity:
            return None
        return peak / self.capacity

    @property
    def transient(self) -> int | None:
        """The step's transient peak: peak allocated above what is held across steps (the
        same whether both are relative to the recording's start or not)."""
        if self.peak_allocated is None or self.held is None:
            return None
        return max(0, self.peak_allocated - self.held)


def device_memory(model: TraceModel) -> list[DeviceMemory]:
    """Every device's memory the trace records, `run`'s figures first; [] when none."""
    out = []
    run = from_run(model.trace.capture)
    if run is not None:
        out.append(run)
    if not out:  # the run's figures are the allocator's own: the events add nothing to them
        out.extend(from_events(model.trace.memory, model.trace.devices,
                               [s.start_us for s in model.steps]))
    return out


def not_assessed(model: TraceModel) -> str:
    """Why a trace has no device memory figures, in words."""
    mem = model.trace.capture.get("memory")
    if isinstance(mem, dict):
        return ("stallscope run recorded no CUDA memory figures (the script did not use "
                "CUDA, or CUDA was not initialised when the steps were recorded)")
    if len(model.trace.memory):
        return "the trace's memory events are the host's only (no device allocation recorded)"
    return ("the trace has no memory events (recorded without profile_memory=True) and no "
            "figures from stallscope run")


def from_events(events: pd.DataFrame, devices: list[dict[str, Any]],
                step_starts: list[float]) -> list[DeviceMemory]:
    """Per CUDA device, the figures of its `[memory]` events (see the module's docstring)."""
    if not len(events):
        return []
    capacity = {_int(d.get("id")): _int(d.get("totalGlobalMem")) for d in devices
                if isinstance(d, dict)}
    out = []
    gpu = events[events["device_type"] == CUDA]
    for dev, rows in gpu.groupby("device_id", sort=True):
        allocated = rows["allocated"].to_numpy()
        relative = bool(np.isnan(allocated).all())
        if relative:  # the changes only: the level above the recording's start
            allocated = np.cumsum(np.nan_to_num(rows["bytes"].to_numpy()))
        reserved = rows["reserved"].to_numpy()
        has_reserved = not np.isnan(reserved).all()
        dev_id = int(dev) if math.isfinite(dev) else None
        out.append(DeviceMemory(
            device=f"cuda:{dev_id}" if dev_id is not None else "cuda",
            source=FROM_EVENTS, relative=relative,
            peak_allocated=max(0, int(np.nanmax(allocated))) if len(allocated) else None,
            peak_reserved=int(np.nanmax(reserved)) if has_reserved else None,
            capacity=capacity.get(dev_id), held=_held(rows["ts"].to_numpy(), allocated,
                                                      step_starts),
            retries=None, ooms=None, inactive_split=None, samples=len(rows)))
    return out


def _held(ts: np.ndarray, allocated: np.ndarray, starts: list[float]) -> int | None:
    """Allocated at the steps' starts (the last event before each), at its lowest; over the
    whole recording where no step starts after an event."""
    ok = ~np.isnan(allocated)
    ts, allocated = ts[ok], allocated[ok]
    if not len(ts):
        return None
    at = np.searchsorted(ts, np.asarray(starts, dtype=np.float64), side="right") - 1
    at = at[at >= 0]
    return int(allocated[at].min()) if len(at) else int(allocated.min())


def from_run(capture: Mapping[str, Any]) -> DeviceMemory | None:
    """stallscope run's per-step CUDA figures (capture/memory.py `device_figures`)."""
    mem = capture.get("memory")
    steps = [s for s in (mem.get("device") or []) if isinstance(s, dict)] if isinstance(
        mem, dict) else []
    if not steps:
        return None

    def most(key: str) -> int | None:
        values = [v for s in steps if (v := _int(s.get(key))) is not None]
        return max(values) if values else None

    held = [v for s in steps if (v := _int(s.get("allocated_bytes"))) is not None]
    return DeviceMemory(
        device="cuda", source=FROM_RUN, relative=False,
        peak_allocated=most("peak_allocated_bytes"), peak_reserved=most("peak_reserved_bytes"),
        capacity=most("total_bytes"), held=min(held) if held else None,
        retries=_int(steps[-1].get("num_alloc_retries")),
        ooms=_int(steps[-1].get("num_ooms")), inactive_split=most("inactive_split_bytes"),
        samples=len(steps))


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) and value >= 0 else None

