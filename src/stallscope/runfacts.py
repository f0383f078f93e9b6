"""Run facts: what a recording knows about its run that the trace cannot show (how it was
invoked and ended, its DataLoaders, cores, unprofiled steps), one file per rank beside the trace.

Plain data (no torch): `stallscope run` fills it in inside the training process and writes it;
the replay, the rules and the writers read it back. A trace analysed on its own has no run
facts, and every consumer must work without them.

It is data about the trace, read by the stages above it, so `replay` and `diagnose` never import
`capture` (tests/test_layers.py). It sits in the base layer rather than in `trace/` because the
capture builds these records while the script runs, and `capture` and `trace` are sibling
rooms that must not import each other: a shape both need lives below both. What reads the
trace's own `host` metadata back is in the trace stage (trace/otherload.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class LoaderInfo:
    """One DataLoader the script constructed, as it was configured, and how much it was used."""

    # The user's own line that built it: "train.py:42", relative to the working folder when
    # inside it (under a framework, the script's line that led to it: capture/frameworks.py).
    call_site: str
    num_workers: int
    pin_memory: bool
    batch_size: int | None
    prefetch_factor: int | None
    persistent_workers: bool
    dataset: str  # class name, with its length when it has one: "ImageFolder (50000 items)"
    dataset_len: int | None = None
    batches: int = 0  # batches drawn over the whole run
    batches_recorded: int = 0  # batches drawn while the profiler recorded
    drop_last: bool = False
    # `run --set`: what was passed to torch instead of the script's values (the fields above
    # are the effective configuration), and the script's own values of those keys.
    overrides: dict[str, Any] = field(default_factory=dict)
    built_with: dict[str, Any] = field(default_factory=dict)
    # While recording, summed over `batches_recorded` fetches: the wall time the fetch took
    # in the training process, the CPU time of the thread that fetched (loading in the
    # process, or receiving from workers; not torch's intra-op threads, which spin while
    # idle), the CPU time of the whole process meanwhile (spinning threads included: what the
    # fetch took from the cores), and the bytes of tensors returned. Wall much above the
    # thread's CPU means loading waited (storage, network) rather than computed.
    fetch_wall_us: float = 0.0
    fetch_cpu_us: float = 0.0
    fetch_process_cpu_us: float = 0.0
    fetch_bytes: float = 0.0
    # Inside the loader over the recording (capture/anatomy.py): fetch and collate wall/CPU per
    # batch, per worker, the wait in the training process; `bound` is its class: waiting,
    # cpu-bound, collate/transfer-bound or main-process-bound (None: not measured); and
    # (capture/transfer.py) shipping and pinning per batch, bursts, worker restarts.
    anatomy: dict[str, Any] = field(default_factory=dict)
    bound: str | None = None
    # Who built it (capture/frameworks.py): the framework between the script and torch
    # ("transformers.Trainer", "lightning", "accelerate"; None: the script itself), the user's
    # frame with its function ("train.py:42 in main"), the call whose arguments set this
    # loader ("DataLoader", or "TrainingArguments" when Trainer built it from them) and where
    # that call is (None: not found), and the framework's own line that called DataLoader(...)
    # when it is not the user's (accelerate rebuilds the loader it is given).
    framework: str | None = None
    user_site: str | None = None
    configured_in: str = "DataLoader"
    settings_site: str | None = None
    built_at: str | None = None
    # The dataset's large attributes and what holds their items (capture/memory.py
    # describe_storage): Python objects that workers copy as they touch them, or arrays.
    dataset_storage: list[dict[str, Any]] = field(default_factory=list)

    @property
    def measured(self) -> dict[str, float] | None:
        """Per-batch means of the fetch measurements, or None before any recorded batch."""
        n = self.batches_recorded
        if n <= 0 or self.fetch_wall_us <= 0:
            return None
        return {"wall_us": self.fetch_wall_us / n, "cpu_us": self.fetch_cpu_us / n,
                "process_cpu_us": self.fetch_process_cpu_us / n, "bytes": self.fetch_bytes / n}


@dataclass
class RunContext:
    """One process's run: how it was invoked, how it ended, and the facts around it."""

    command: list[str]  # the stallscope command line, as typed
    target: str  # the script path or module name
    rank: int | None = None
    world_size: int | None = None
    step_source: str | None = None  # optimizer, dataloader or marker; None: no step seen
    steps_requested: int = 0
    steps_recorded: int = 0  # complete steps in the trace
    boundaries_seen: int = 0  # step boundaries seen over the whole run
    # The steps skipped before the profiler started, timed without it (us; capture/session.py)
    unprofiled_steps_us: list[float] = field(default_factory=list)
    # Other load over those steps (capture/hostload.py other_load) with the stepping thread's
    # run and run-queue wait per step (main_run_us, main_wait_us); {} where not measured.
    unprofiled_load: dict[str, Any] = field(default_factory=dict)
    # How the recording window was chosen (capture/steady.py): skip, extra_steps, extra_s,
    # steady, why, first_step; None when recording never began.
    window: dict[str, Any] | None = None
    # finished | stopped | exception | exit | interrupted | terminated | timed out
    ended: str = "finished"
    exit_status: int = 0
    traces: list[str] = field(default_factory=list)
    dataloaders: list[LoaderInfo] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # `run --set KEY=VALUE`: DataLoader constructor overrides requested for every loader.
    overrides: dict[str, Any] = field(default_factory=dict)
    # `run --record-shapes`: the profiler recorded each op's input shapes (off by default).
    record_shapes: bool = False
    # The memory budget ended recording early (capture/budget.py Cut.to_dict()), or None.
    recording_cut: dict[str, Any] | None = None
    # What drove the steps, phase by phase: [{"driver", "from_boundary"}] (capture/steps.py).
    step_phases: list[dict[str, Any]] = field(default_factory=list)
    # Whose trace `traces` holds: "stallscope" (its own steps) or "script-profiler" (the
    # script starts its own profiler and stallscope stepped aside: capture/foreign.py).
    trace_source: str = "stallscope"
    # The script's own profiler, when it started one: kind, site, the files it wrote, the copy
    # analysed (ScriptProfiler.to_dict()); None when it started none.
    script_profiler: dict[str, Any] | None = None

    @property
    def partial(self) -> bool:
        """Fewer steps recorded than asked for: the report describes only part of a window.
        Never for the script's own trace: its profiler's schedule decided its steps."""
        if self.trace_source != "stallscope":
            return False
        return self.steps_recorded < self.steps_requested

    @property
    def cores_per_process(self) -> int | None:
        value = self.environment.get("cpu", {}).get("cores_per_process")
        return value if isinstance(value, int) else None

    def training_loader(self) -> LoaderInfo | None:
        """The loader the recorded steps drew from (the busiest one while recording)."""
        used = [d for d in self.dataloaders if d.batches_recorded > 0]
        if not used:
            return None
        return max(used, key=lambda d: d.batches_recorded)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["partial"] = self.partial
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunContext:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        loader_names = {f.name for f in fields(LoaderInfo)}
        kwargs["dataloaders"] = [
            LoaderInfo(**{k: v for k, v in d.items() if k in loader_names})
            for d in data.get("dataloaders", [])
        ]
        return cls(**kwargs)

    def save(self, path: Path) -> None:
        from stallscope.outputs import write_atomic

        write_atomic(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> RunContext:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
