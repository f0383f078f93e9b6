"""The one-thread probe: a few unprofiled steps with one intra-op thread, just before recording.

A CPU step with several intra-op threads waits at every parallel op for its slowest thread. When
other processes (or the run's own loader workers) hold the cores, that thread is often preempted and
the step runs many times longer than on a quiet machine (docs/performance.md, "Figures behind the
code"). No share of the run-queue wait accounts for that, so the trace alone cannot say what the
step would take with fewer threads, on this machine or a quiet one. One thread has no barrier to
wait at: its steps under load, less the share of their time the thread waited for cores others held
(replay/unload.py), are the quiet one-thread steps. So once the run is steady, `run` times
`PROBE_STEPS` steps with `torch.set_num_threads(1)`, restores the script's count, lets one step
settle, and records; the replay grounds `torch_threads=1` (the cpu-oversubscription change, and
the workers' own single thread) on that measurement (replay/threads.py).

Only for a CPU-only run of one process with two or more intra-op threads whose epoch has the
batches to spare; never for a distributed job (every rank must record the same steps).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from stallscope.capture import hostload

PROBE_STEPS = 5
# After the probe, the step at the script's own thread count before the profiler starts (the
# thread pool grows back in it): the probe's last boundary is the last skipped one.
SETTLE_STEPS = 1


def skip_reason(cuda: bool, threads: int, world_size: int, batches_left: int | None,
                window_steps: int) -> str:
    """Why no probe is run ("" when one is): the note `run` keeps in the trace."""
    if cuda:
        return "a GPU run: its step's compute is not on the host's intra-op threads"
    if threads < 2:
        return "the training process runs one intra-op thread"
    if world_size > 1:
        return "a distributed job: every rank records the same steps"
    need = PROBE_STEPS + SETTLE_STEPS + window_steps + 1
    if batches_left is not None and 0 < batches_left < need + 1:
        return (f"{batches_left} batch(es) were left in this epoch: too few for the probe's "
                f"{PROBE_STEPS + SETTLE_STEPS} step(s) and the recorded window")
    return ""


class ThreadProbe:
    """Sets one intra-op thread for `PROBE_STEPS` steps, timing them and reading the
    scheduler's figures over them; restores the script's thread count after."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.at: list[float] = []
        self.waits: list[float] = []  # per probe step, the wait for the DataLoader (us)
        self._start: hostload.CpuSample | None = None
        self.result: dict[str, Any] | None = None

    def begin(self) -> None:
        """At the boundary that starts the first probe step."""
        torch.set_num_threads(1)
        self._start = hostload.sample()
        self.at = [time.perf_counter()]

    def boundary(self, wait_us: float) -> None:
        """At each boundary while probing, with the step's wait for the DataLoader: the last
        one restores the script's threads."""
        if self.result is not None:
            return
        self.at.append(time.perf_counter())
        self.waits.append(wait_us)
        if len(self.at) > PROBE_STEPS:
            load = hostload.other_load(self._start, hostload.sample())
            torch.set_num_threads(self.threads)
            steps = [round((b - a) * 1e6, 1) for a, b in zip(self.at, self.at[1:], strict=False)]
            self.result = {"threads": self.threads, "probe_threads": 1, "steps_us": steps,
                           "loader_wait_us": [round(w, 1) for w in self.waits], **load}
