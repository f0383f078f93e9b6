"""What the profiler adds to each op it records, measured in the run once its recording stopped.

The recorded steps ran under the profiler, and every op the host recorded paid its bookkeeping (the
RecordFunction callbacks, Kineto's event, the input shapes when they are recorded). Where the host
records many ops the step runs much longer profiled than in the user's run (docs/performance.md,
"Figures behind the code"). The replay takes that cost out of each host segment, per op it holds
(replay/unprofile.py); this module measures it: a loop of tiny ops, timed plain and under a
profiler set up as the session's, in alternating rounds, the least-disturbed (fastest) round of
each.

The loop's ops (`aten::add` on a one-element tensor) are as cheap as ops get, so the difference
is the profiler's fixed cost per recorded op; an op's own work is not made slower by it. One
loop op is more than one recorded event: `torch.add(y, 1)` on the CPU records five (`aten::add`
and the scalar's `aten::to`, `_to_copy`, `empty_strided`, `copy_`), so `events_per_op` counts
them in the last profiled round and `added_us_per_event` is the cost per event a trace holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from stallscope.capture.quiet import usdt_filtered

OPS = 1000  # ops per round
ROUNDS = 5  # rounds of each kind, alternating


@dataclass(frozen=True)
class OpCost:
    """Microseconds one recorded op costs the host, plain and profiled; their difference is
    what the profiler added."""

    plain_us: float
    profiled_us: float
    record_shapes: bool
    device: str  # "cpu", or "cuda" for ops that launch a kernel
    # Host op events the profiler recorded per loop op (None: not counted).
    events_per_op: float | None = None

    @property
    def added_us(self) -> float:
        return max(0.0, self.profiled_us - self.plain_us)

    @property
    def added_us_per_event(self) -> float | None:
        if not self.events_per_op:
            return None
        return self.added_us / self.events_per_op

    def to_dict(self) -> dict[str, Any]:
        return {"added_us": round(self.added_us, 3), "plain_us": round(self.plain_us, 3),
                "profiled_us": round(self.profiled_us, 3), "record_shapes": self.record_shapes,
                "device": self.device, "ops": OPS, "rounds": ROUNDS,
                "events_per_op": self.events_per_op,
                "added_us_per_event": (None if self.added_us_per_event is None
                                       else round(self.added_us_per_event, 3)),
                "how": f"{OPS} aten::add ops on a one-element {self.device} tensor, timed plain "
                       f"and under the profiler in {ROUNDS} alternating rounds; the fastest "
                       "round of each" + ("" if self.device != "cpu" else
                                          ", in the thread's CPU time")}


def measure(activities: list[ProfilerActivity], record_shapes: bool,
            device: str = "cpu") -> OpCost:
    """Time OPS tiny ops on `device`, plain and under `profile(activities, record_shapes)`."""
    x = torch.zeros(1, device=device)
    cuda = device != "cpu"

    # On the CPU, the thread's own CPU time: a round that waited for a core (other load on the
    # machine) is not made longer by it, so the cost is the quiet machine's, as the replay
    # needs it (replay/unload.py takes the wait out separately). Kernels run off the thread:
    # with CUDA, wall time.
    clock = time.perf_counter if cuda else time.thread_time

    def loop() -> float:
        y = x
        if cuda:
            torch.cuda.synchronize()
        start = clock()
        for _ in range(OPS):
            y = torch.add(y, 1)
        if cuda:
            torch.cuda.synchronize()
        return clock() - start

    loop()  # the first call pays one-off dispatch and allocation costs
    plain, profiled = [], []
    events: float | None = None
    for i in range(ROUNDS):
        plain.append(loop())
        with profile(activities=activities, record_shapes=record_shapes) as prof:
            profiled.append(loop())
        if i == ROUNDS - 1:
            events = host_events(prof)
    return OpCost(min(plain) / OPS * 1e6, min(profiled) / OPS * 1e6, record_shapes, device,
                  events)


def host_events(prof: Any) -> float | None:
    """Host op events per loop op in the stopped `prof` (not runtime calls or GPU activity):
    what a trace would hold. Reads Kineto's results directly (about 10 ms for 5,000 events;
    `prof.events()` takes 0.25-0.7 s); None where this torch does not offer them."""
    try:
        events = prof.profiler.kineto_results.events()
        n = sum(1 for e in events if e.device_type() == DeviceType.CPU
                and not e.name().startswith(("cuda", "hip")))
    except Exception:  # a private API: a torch without it only loses this count
        return None
    return round(n / OPS, 2) if n else None


def session_costs(activities: list[ProfilerActivity], record_shapes: bool) -> dict[str, Any]:
    """The costs the replay needs for a session recording `activities`: per CPU op, and per op
    that launches a kernel when CUDA is recorded (its runtime call is recorded too). Never
    raises: a failed measurement is said, and the replay then assumes its default."""
    out: dict[str, Any] = {}
    try:
        out["cpu_op"] = measure(activities, record_shapes, "cpu").to_dict()
        if ProfilerActivity.CUDA in activities:
            out["launch_op"] = measure(activities, record_shapes, "cuda").to_dict()
    except Exception as exc:  # the script's run matters more than this figure
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


class ProfilerCost:
    """The session's measurement of `session_costs`, taken on first ask: once the recording has
    stopped, never before (a finished profiler session leaves the process slower, and the
    unprofiled steps timed before recording are the run's baseline). While it runs, its own
    profiler sessions are the session's (`calibrating`), never the script's."""

    def __init__(self, activities: list[ProfilerActivity], record_shapes: bool) -> None:
        self.activities, self.record_shapes = activities, record_shapes
        self.value: dict[str, Any] = {}
        self.calibrating = False

    def measure(self) -> dict[str, Any]:
        if not self.value:
            self.calibrating = True
            try:
                with usdt_filtered():
                    self.value = session_costs(self.activities, self.record_shapes)
            finally:
                self.calibrating = False
        return self.value
