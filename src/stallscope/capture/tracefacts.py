"""stallscope's facts in the trace itself, so `analyze` of it knows them too: how steps were
found, and what the replay needs that the profiler cannot see (cores, the CPU the process used,
the other load, what each loader's fetches cost, what one recorded op cost the host).

Each part of the session measures its own facts; this module only gathers them, in one fixed
order, for the first capture (capture/recorder.py) and for each later one (capture/recapture.py
adds its own window's unprofiled steps and why it was taken).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stallscope import __version__
from stallscope.capture import budget, memory, opcost, steady
from stallscope.capture.recordhost import RecordedHost
from stallscope.capture.startwait import StartWait
from stallscope.capture.steps import StepDriver
from stallscope.capture.unprofiled import UnprofiledSteps


@dataclass
class TraceFacts:
    """The session's parts whose facts the trace carries; read, never changed, here."""

    record_shapes: bool
    driver: StepDriver
    wait: StartWait
    unprofiled: UnprofiledSteps
    host: RecordedHost
    budget: budget.RecordingBudget
    cost: opcost.ProfilerCost
    watcher: Any  # the LoaderWatcher
    memory: memory.RunMemory

    def metadata(self, incomplete_step: str | None) -> dict[str, Any]:
        """The trace's `stallscope` metadata, as of now (`incomplete_step`: the step the
        recording stopped in, when it stopped early)."""
        meta: dict[str, Any] = {
            "tool": f"stallscope {__version__}",
            # Kineto does not record it; advice is spelled for this version (trace/version.py).
            "torch": torch.__version__,
            "step_source": self.driver.source,
            "incomplete_step": incomplete_step,
            "window": self.wait.window,
            # The profiler's settings, and what one op cost under them (measured after recording).
            "record_shapes": self.record_shapes,
            "profiler_cost": self.cost.value,
        }
        cut = self.budget.cut
        optional = {"thread_probe": self.wait.probe_metadata(),
                    "recording_cut": cut.to_dict() if cut is not None else None,
                    "dynamo": self.wait.compile.metadata()}
        meta.update((k, v) for k, v in optional.items() if v is not None)
        if self.host.begun:
            # The steps timed without the profiler just before recording (the judged group):
            # the replay sets the recorded steps against them (replay/unprofile.py).
            meta["unprofiled_steps_us"] = self.unprofiled.steps_us()[-steady.MAX_GROUP:]
            meta["host"] = self.host.figures()
            meta["loaders"] = self.watcher.recorded_metadata()
        meta["memory"] = self.memory.metadata(self.watcher.loaders)
        return meta

    def after_recording(self) -> dict[str, Any]:
        """What is measured once the recording has stopped, patched into its trace: the
        profiler's cost per op, and memory after one last sweep (no recorded step pays for
        either)."""
        extra = {"profiler_cost": self.cost.measure()}
        if self.memory.last_sweep():
            extra["memory"] = self.memory.metadata(self.watcher.loaders)
        return extra
