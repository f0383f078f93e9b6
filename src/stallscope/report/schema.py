"""report.json as a contract: typed definitions of its shape, and the JSON Schema made from them.

CI gates and dashboards read report.json; they need to know which keys are always there, which
may be null, and in which unit each number is. These msgspec Structs are that description;
`msgspec.json.schema` turns them into the JSON Schema shipped beside this module
(`report.schema.json`) and copied to docs/report-schema.json (tests/test_report_schema.py checks
both are current and that every shared real trace's report.json validates).

Rules the schema states, and the writers keep:
- Absent values are `null`, never `""` (json_writer turns the empty strings of the in-memory
  objects into null).
- The unit is a word in the key's name: `us` microseconds (every time the report measures:
  steps, breakdowns, plans, timelines, hot ops), `ms` milliseconds (only in
  `findings[].evidence`, which rules word for people, e.g. `wait_ms_per_step`, and in
  `dataloaders[].anatomy`), `pct` percent of the named whole (0-100), `mb` megabytes, `bytes`,
  `s` seconds (only in `run`'s capture context). A number with no unit word is a count or an id.
- `verdict` is the report's first line (`verdict.text`) and what it speaks of (`verdict.id`).

Evidence, the timeline's marks, `run` and the capture context stay open objects: their keys
belong to the rule or the capture that wrote them and are documented there (docs/rules.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")
SCHEMA_ID = "https://stallscope.dev/report-schema.json"

Severity = Literal["high", "medium", "low", "info"]
Json = dict[str, Any]


class Verdict(msgspec.Struct, forbid_unknown_fields=True):
    """The report's first line, and what it speaks of: a finding id, or one of
    `too-little-to-judge`, `no-finding`, `no-bottleneck`, `gpu-bound`; `finding`: the id of
    the finding the page leads with (its main-bottleneck card, title and top recommendation),
    null when nothing was found."""

    text: str
    id: str
    finding: str | None = None


class StepTime(msgspec.Struct, forbid_unknown_fields=True):
    """Step wall time over the judged steps, in microseconds."""

    median: float
    mean: float
    p90: float
    min: float
    max: float


class Summary(msgspec.Struct, forbid_unknown_fields=True):
    """`breakdown_pct`: each host category's share of step wall time (dataloader: time in the
    loader, all the time the training thread spends inside DataLoader `__next__`; sync,
    h2d_copy, other_copy, host_compute); `gpu_pct`: per GPU, kernel/memcpy/memset/idle shares."""

    steps: int
    step_time_us: StepTime | None
    breakdown_pct: dict[str, float]
    gpu_pct: dict[str, dict[str, float]]


class Step(msgspec.Struct, forbid_unknown_fields=True):
    """One judged step. `dataloader_us` is the time inside the DataLoader's `__next__`;
    `dataloader_wait_us` the part of it with no GPU work running (the loader wait, the
    dataloader-bound finding's figure and the TensorBoard profiler plugin's DataLoader share);
    `breakdown_us` splits `duration_us` by host category."""

    name: str
    duration_us: float
    breakdown_us: dict[str, float]
    dataloader_us: float
    dataloader_wait_us: float
    gpu_us: dict[str, dict[str, float]]
    trace: str | None = None  # the trace's label, when the report covers several


class FindingRecording(msgspec.Struct, forbid_unknown_fields=True):
    """One recording's own figures of a cause seen in several recordings of one process or
    rank: its trace, title, severity, saving (of its own step) and evidence."""

    trace: str
    title: str
    severity: Severity
    estimated_saving_pct: float
    saving_kind: str
    predicted_step_us: float | None
    plan_rank: int | None
    caused_by: str | None
    evidence: Json


class Finding(msgspec.Struct, forbid_unknown_fields=True):
    """One diagnosed bottleneck: one per cause (rule, device, rank), however many recordings
    show it. `estimated_saving_pct` is of step time; `saving_kind` says whether it was
    replayed (`replayed`) or is an upper bound (`upper_bound`). Its fields are the recording
    the report leads with (`trace`, whose plan is `plan`); `recordings` holds each recording's
    own figures when several show the cause, else it is empty."""

    id: str
    title: str
    severity: Severity
    evidence: Json
    recommendation: str
    snippet: str | None
    precondition: str | None
    estimated_saving_pct: float
    saving_basis: str
    saving_kind: str
    docs: str | None
    trace: str | None
    caused_by: str | None
    predicted_step_us: float | None
    plan_rank: int | None
    # An unreplayed cause whose upper bound outranks its trace's fix plan: the report leads
    # with it (its bound beats the plan's first change, whose own range reaches the step
    # unchanged or stays under the bound).
    leads_plan: bool = False
    recordings: list[FindingRecording] = []


class Assessment(msgspec.Struct, forbid_unknown_fields=True):
    rule: str
    status: Literal["finding", "clear", "not_assessed"]
    detail: str | None
    trace: str | None


class PlanEntry(msgspec.Struct):
    id: str
    change: str
    predicted_step_us: float
    saving_pct: float
    assumptions: list[str]
    # [low, high] around predicted_step_us: the replayed steps' spread, widened by the plan's
    # model_error_pct, never below the GPU work kept.
    predicted_range_us: list[float] = []


class Plan(msgspec.Struct):
    """The replayed fix plan of one trace (diagnose/plan.py), times in microseconds."""

    trace: str
    measured_step_us: float
    replayed_step_us: float
    floor_us: float
    entries: list[PlanEntry]
    what_if: Json | None = None
    # The step the fixes start from: measured, less the profiler's own cost on the host.
    baseline_step_us: float | None = None
    # How that cost was found: op_us, measured (or assumed), source, ops_per_step,
    # step_cost_us (replay/unprofile.py).
    profiler: Json | None = None
    # Other tenants' share of the host's run-queue wait, taken out of the baseline:
    # wait_share_pct, own_share_pct, others_share_pct, demand_cores, cores, step_cost_us
    # (replay/unload.py); {} without the kernel's figures.
    load: Json | None = None
    # A loader whose workers lag, replayed at their pace (replay/loader.py Rounds): workers,
    # pace_us, worker_load_us, steps, waited_steps, mean/median/max_wait_us, added_us (what the
    # pace adds to the median step), note; {} otherwise.
    rounds: Json | None = None
    # The replay's measured error that widens every predicted range, in %.
    model_error_pct: float | None = None


class KernelTimes(msgspec.Struct, forbid_unknown_fields=True):
    """Microseconds per judged step during which kernels of each type run on the GPU
    (concurrent kernels of one type counted once); `comm_hidden`: communication while compute
    runs."""

    compute: float
    communication: float
    memory: float
    comm_hidden: float


class KernelSplit(msgspec.Struct, forbid_unknown_fields=True):
    """The judged steps' wall time on one GPU, each moment given to the first that applies:
    compute with communication (`comm_hidden`), compute alone (`compute`), communication alone
    (`comm_exposed`), copies and memsets alone (`memory`), else `idle`; percent, summing to
    100."""

    compute: float
    comm_hidden: float
    comm_exposed: float
    memory: float
    idle: float


class KernelMix(msgspec.Struct, forbid_unknown_fields=True):
    """One GPU's kernels by type over the judged steps (report/kernel_mix.py, docs/metrics.md).
    `comm_hidden_pct`: the share of communication time during which compute runs
    (HolisticTraceAnalysis' comm-comp overlap); null without communication."""

    device: str
    per_step_us: KernelTimes
    split_pct: KernelSplit
    comm_hidden_pct: float | None


class GpuSummary(msgspec.Struct, forbid_unknown_fields=True):
    """One GPU over the judged steps: `tensor_core_pct`, the share of compute kernel time in
    tensor-core kernels (by name); `sm_efficiency_pct`, Kineto's "blocks per SM" as the
    TensorBoard plugin's Est. SM Efficiency; `occupancy_pct`, Kineto's "est. achieved occupancy
    %" weighted by kernel time. A figure the trace does not hold is null and `missing` says
    why (null when nothing is missing)."""

    device: str
    tensor_core_pct: float | None
    sm_efficiency_pct: float | None
    occupancy_pct: float | None
    missing: str | None


class HostCommTimes(msgspec.Struct, forbid_unknown_fields=True):
    communication: float
    comm_hidden: float


class HostComm(msgspec.Struct, forbid_unknown_fields=True):
    """A CPU-only trace's collectives (gloo/MPI/UCC host ranges) over the judged steps:
    microseconds per step in them and hidden under the process's compute ops, their share of
    step wall time (`share_pct`) and the share of them hidden (`comm_hidden_pct`)."""

    per_step_us: HostCommTimes
    share_pct: float
    comm_hidden_pct: float


class Rank(msgspec.Struct, forbid_unknown_fields=True):
    """One rank's row: its step times, breakdowns, the kernel split of its busiest GPU (null
    for a CPU-only rank), a CPU-only rank's host collectives (null otherwise) and its
    findings' ids."""

    rank: int
    label: str
    steps: int
    step_time_us: StepTime | None
    breakdown_pct: dict[str, float]
    gpu_pct: dict[str, dict[str, float]]
    kernel_mix: KernelMix | None
    host_comm: HostComm | None
    findings: list[str]


class Recording(msgspec.Struct, forbid_unknown_fields=True):
    """What recording the trace cost (report/recording.py), from `stallscope run`'s metadata:
    `record_shapes`, whether input shapes were recorded; `op_us`, what the profiler added per
    tiny `torch.add` call, measured by the run (the figure the replay takes out per
    recorded op), `op_us_per_event` the same per op event that call recorded (it records
    several on the CPU), `launch_op_us` per kernel-launching call (with CUDA); `ops_per_step`,
    the host ops recorded per judged step; `estimated_step_cost_us` and `estimated_share_pct`
    (of the median step): an estimate, ops_per_step times op_us_per_event (`estimate_per`:
    `event`, CPU-only traces), or times op_us (`call`: traces with GPU activity, or where events
    were not counted); `unprofiled_step_us`, the
    median of the steps timed without the profiler just before recording, and
    `recorded_above_unprofiled_pct`, the median recorded step against it (measured). Null
    where the trace does not say."""

    record_shapes: bool | None
    op_us: float | None
    op_us_per_event: float | None
    launch_op_us: float | None
    ops_per_step: float
    estimated_step_cost_us: float | None
    estimated_share_pct: float | None
    estimate_per: Literal["event", "call"] | None
    unprofiled_step_us: float | None
    recorded_above_unprofiled_pct: float | None


class Trace(msgspec.Struct):
    label: str
    path: str
    rank: int | None
    world_size: int | None
    schema: str
    torch_version: str
    steps_source: str
    workload: str
    gpu_devices: list[str]
    dataloader: str | None
    skipped_events: int
    summary: Summary
    notes: list[str]
    startup: Json | None
    set_aside_steps: list[Json]
    too_little: str | None
    plan: Plan | None
    findings: list[str]
    # Per GPU that ran work in the judged steps; null for a trace without any.
    kernel_mix: list[KernelMix] | None = None
    gpu_summary: list[GpuSummary] | None = None
    host_comm: HostComm | None = None
    recording: Recording | None = None


class HotOp(msgspec.Struct):
    """A host op or GPU kernel and its time over the judged steps: `total_us` summed over its
    calls (inclusive, as the profiler's CPU total); `per_step_us` and `share_pct` the time any
    call ran (a union: calls that overlap, on two threads or streams, count once)."""

    name: str
    calls: int
    total_us: float
    per_step_us: float
    share_pct: float


class WatchStep(msgspec.Struct):
    """One step of a watched run (capture/steplog.py): its wall time and the process's CPU time
    in it, its DataLoader wait, its loader's epoch, when it began (s after the first boundary),
    whether it was recorded under the profiler (then slower, set aside) and whether it stood
    out as a stall (`spike`); the stepping thread's wait for a core in it (`runq_ms`) and
    whether it lies in a stretch other load explains (`load`). Null where not
    measured."""

    step: int
    step_ms: float | None
    loader_wait_ms: float | None
    host_sync_ms: float | None
    cpu_ms: float | None
    epoch: int | None
    start_s: float | None
    profiled: bool
    spike: bool
    runq_ms: float | None = None
    load: bool = False


class WatchCapture(msgspec.Struct, forbid_unknown_fields=True):
    """A window recorded under the profiler and diagnosed: where it began (`first_step`, the
    first recorded step), what it found (`verdict`, as the report's own), why it was taken
    (`kind`: `first`, the report's own window; `regime`, a change in the step-time mix;
    `periodic`, a recurring stall; `why` in words), its trace (`trace`; null for the first,
    whose trace is the report's) and, for a periodic capture, the stall it holds (`stall`: its
    longest recorded step, against their median, and that step's breakdown in percent), and
    its fix plan (`plan`: each change with the step before it and the replay's prediction
    after it, in microseconds). Defaults and bounds: docs/watch.md."""

    first_step: int | None
    verdict: Verdict
    kind: str | None = None
    why: str | None = None
    trace: str | None = None
    stall: WatchStall | None = None
    plan: list[Json] | None = None


class WatchStall(msgspec.Struct, forbid_unknown_fields=True):
    """The longest step a periodic capture recorded (report.json steps[] `name`)."""

    step: str | None
    step_ms: float
    median_step_ms: float
    breakdown_pct: dict[str, float]


class Watch(msgspec.Struct):
    """`stallscope watch` only: the whole run step by step, where its step-time mix changed
    (`regimes`), its recurring stalls (`periodic`: at epoch starts, every N steps), the stalls
    nothing explains (`outliers`), the windows recorded under the profiler (`captures`), the
    stretches other load on the machine explains (`load`: no regime, no capture); the stretch
    the report leads with (`headline`: the regime, recurring stall or best level that lost the
    most time, what it lost and on what basis, the capture recorded in it, the sentence) and
    the capture the report's findings and plan describe (`diagnosed`, 1-based); the job's memory
    over the run (`memory`: where it began, its peak, where it ended and a few [step, MB]
    points; null where it was not sampled). Method and thresholds: docs/watch.md."""

    n_steps: int
    measured_steps: int
    wall_ms: float
    median_step_ms: float | None
    loader_wait_share: float | None
    steps: list[WatchStep]
    regimes: list[Json]
    periodic: list[Json]
    outliers: Json
    captures: list[WatchCapture]
    method: Json
    notes: list[str]
    step_log: str
    headline: Json | None = None
    diagnosed: int | None = None
    load: list[Json] = []
    memory: Json | None = None


class MemoryDevice(msgspec.Struct, forbid_unknown_fields=True):
    """One device's memory over the recording, measured (diagnose/device_memory.py): its peaks
    allocated and reserved against its capacity, from the trace's profile_memory events or
    `stallscope run`'s per-step figures (`source`). `relative_to_start`: the trace carries only
    each allocation's size, so the peak is above where memory stood when the recording started
    and `peak_pct_of_capacity` is null. `held_bytes`: allocated at the steps' boundaries at its
    lowest (what does not scale with the batch); `transient_bytes`: the peak above it.
    `alloc_retries` and `ooms`: the allocator's counts since the process started (`run` only)."""

    trace: str
    device: str
    source: str
    relative_to_start: bool
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    capacity_bytes: int | None
    peak_pct_of_capacity: float | None
    held_bytes: int | None
    transient_bytes: int | None
    alloc_retries: int | None
    ooms: int | None
    inactive_split_bytes: int | None
    samples: int


class MemoryWorker(msgspec.Struct, forbid_unknown_fields=True):
    """One DataLoader worker's own (unique) memory at its first and last sample, its resident
    size at the last, and the seconds between (`stallscope run`'s samples)."""

    trace: str
    pid: int
    worker_id: int | None
    loader: str | None
    unique_start_bytes: int
    unique_end_bytes: int
    resident_bytes: int
    seconds: float


class MemoryHost(msgspec.Struct, forbid_unknown_fields=True):
    """The machine's memory during the run: its total, the least available, the container's
    limit and the file it was read from, what the job held (its processes' proportional sizes
    summed)."""

    trace: str
    total_bytes: int | None
    available_min_bytes: int | None
    limit_bytes: int | None
    limit_source: str | None
    job_bytes: int | None


class Memory(msgspec.Struct, forbid_unknown_fields=True):
    """Memory, measured: `status` is `measured` when any figure below is, else `not_assessed`;
    `not_assessed` says why no device figure is there (null when one is); `sentence` is the
    report's line on it."""

    status: Literal["measured", "not_assessed"]
    devices: list[MemoryDevice]
    workers: list[MemoryWorker]
    host: MemoryHost | None
    not_assessed: str | None
    sentence: str


class Report(msgspec.Struct, forbid_unknown_fields=True):
    """report.json, top level."""

    schema_version: int
    stallscope_version: str
    verdict: Verdict
    # What every view calls each key of breakdown_pct / gpu_pct: `dataloader` is "time in the
    # loader" (all of DataLoader `__next__`); the dataloader-bound finding's `wait_share_pct`
    # is "loader wait (no GPU work)", the part of it with nothing running on the GPU.
    category_names: dict[str, str]
    source: Json
    environment: Json
    steps: list[Step]
    summary: Summary
    findings: list[Finding]
    assessments: list[Assessment]
    traces: list[Trace]
    notes: list[str]
    run: Json | None
    ranks: list[Rank]
    dataloaders: list[Json]
    timeline: Json
    top_host_ops: list[HotOp]
    top_gpu_kernels: list[HotOp]
    plan: Plan | None
    what_if: Json | None
    watch: Watch | None = None
    memory: Memory | None = None


def json_schema(root: type, schema_id: str, title: str, doc: str) -> dict[str, Any]:
    """The JSON Schema of the Struct `root`, headed by its id, title and the second paragraph
    of the module docstring `doc` (report.json's here, compare.json's in compare_schema.py)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        "description": doc.split("\n\n")[1].replace("\n", " "),
        **msgspec.json.schema(root),
    }


def shipped(schema: dict[str, Any]) -> str:
    """A schema as the shipped file holds it: sorted keys, two-space indent."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def report_schema() -> dict[str, Any]:
    """The JSON Schema of report.json, made from the Structs above."""
    return json_schema(Report, SCHEMA_ID, "stallscope report.json", __doc__)


def render_schema() -> str:
    """The schema as the shipped file holds it: sorted keys, two-space indent."""
    return shipped(report_schema())


def check(data: dict[str, Any]) -> Report:
    """Decode report.json data against the typed definitions; raises msgspec.ValidationError
    naming the first key that breaks the contract."""
    return msgspec.convert(data, Report, strict=False)
