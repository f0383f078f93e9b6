"""The report as TensorBoard views: per-step scalars, the verdict and the fix plan as scalars,
the findings as text, and the trace.

Written with `torch.utils.tensorboard.SummaryWriter` into one run folder below the logdir
(`OUT/tensorboard/<run>/`: the script's name under `run`, the trace's or folder's name under
`analyze --tensorboard`), the folder that holds the trace, so `tensorboard --logdir
OUT/tensorboard` shows the trace (PyTorch profiler plugin) and these views as one run, under one
name (files straight in the logdir would be run "." for TensorBoard and "tensorboard" for the
plugin). The trace there is the plugin-ready copy (report/tensorboard_trace.py): the plugin's
Overview then shows the report's steps, step time and DataLoader share, and the text says where
it cannot.

Tags, with `P` empty for one trace and `rank0/` (or the file's stem) per trace when
there are several:

- `P step_time_ms`: wall time of each step;
- `P host_share_pct/<category>`: each host category's share of that step (dataloader, sync,
  h2d_copy, other_copy, host_compute; they sum to 100);
- `P dataloader_wait_pct`: the loader wait (no GPU work) of that step, the figure the
  dataloader-bound verdict and the plugin's DataLoader share use;
- `P gpu_idle_pct/gpu<N>`: each GPU's idle share of that step, when the trace has a GPU;
- `stallscope/verdict/<metric>`: the figure the verdict line states (VERDICT_METRIC), one
  point at step 0;
- `stallscope/plan/step_ms` (and `_low`, `_high`, the range): the fix plan's step, at step 0 as
  measured (without the profiler's cost where the plan says so), at step k after the plan's
  k-th fix; `stallscope/plan/floor_ms`: the floor no fix in the plan goes below;
- `stallscope/findings` (text): the verdict, a table of findings, and what the PyTorch Profiler
  tab shows of each trace.

The global step of the per-step tags is N of `ProfilerStep#N`, so the charts line up with the
trace viewer's step names; steps without that marker are numbered by their index. Several ranks
go into one event file with per-rank tag prefixes rather than one file per rank: one run folder
holds the traces of every rank, TensorBoard would show a second file in that folder as the same
run anyway, and a single file is written (and replaced) as a unit.

torch is imported here, inside the function, never at module level: only `run` has it loaded
already, and `analyze` must start fast unless `--tensorboard` asks for this writer.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from stallscope.diagnose.registry import ALL_RULES, flagged
from stallscope.errors import OutputError
from stallscope.report.build import Report
from stallscope.report.labels import baseline, saving_label
from stallscope.report.tensorboard_trace import (
    PLUGIN_NAME,
    PluginCopy,
    plugin_name,
    write_plugin_copy,
)
from stallscope.text import md
from stallscope.trace.model import HOST_CATEGORIES
from stallscope.units import ms, percent

# Marks stallscope's event files in a run folder, so a new report replaces the old views rather
# than adding a second set of points at the same steps. TensorBoard reads any file whose name
# contains "tfevents".
EVENT_SUFFIX = ".stallscope"
FINDINGS_TAG = "stallscope/findings"
VERDICT_TAG = "stallscope/verdict/"
PLAN_TAG = "stallscope/plan/"
# The figure each verdict states, by finding id: (the finding's evidence key, the tag's name),
# as each rule declares it (RuleSpec.verdict_metric). A verdict on another finding states its
# saving (estimated_saving_pct).
VERDICT_METRIC = {spec.id: spec.verdict_metric for spec in ALL_RULES if spec.verdict_metric}
# The plugin's Average Step Time is said to be the report's mean when within this (us): the
# report's times are rounded to 1 ns, the plugin's figure to 1 us.
SAME_STEP_US = 1.0
_STEP_NUMBER = re.compile(r"^ProfilerStep#(\d+)$")
_UNSAFE_TAG = re.compile(r"[^-\w./]")  # what TensorBoard would otherwise rewrite, with a warning


def write_tensorboard(report: Report, run_dir: Path) -> Path:
    """Write the trace copies, scalars and findings text of `report` into `run_dir`; return
    the event file.

    The event file is written in a staging folder and moved into `run_dir` once closed: event
    files are append-only, so a crash mid-write must not leave half a set of points in the run
    TensorBoard shows. Earlier stallscope event files in `run_dir` are then removed.
    """
    from torch.utils.tensorboard import SummaryWriter

    copies = write_trace_copies(report, run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".stallscope-tb-", dir=run_dir.parent))
    except OSError as exc:
        raise OutputError(f"cannot write TensorBoard files in {run_dir}: {exc}") from None
    try:
        writer = SummaryWriter(log_dir=str(staging), filename_suffix=EVENT_SUFFIX)
        try:
            _write_scalars(writer, report)
            _write_verdict(writer, report)
            _write_plan(writer, report)
            writer.add_text(FINDINGS_TAG, findings_markdown(report, copies), global_step=0)
        finally:
            writer.close()
        (written,) = staging.iterdir()
        final = run_dir / written.name
        os.replace(written, final)
    except OSError as exc:
        raise OutputError(f"cannot write TensorBoard files in {run_dir}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in run_dir.glob(f"events.out.tfevents.*{EVENT_SUFFIX}"):
        if old != final:
            old.unlink(missing_ok=True)
    return final


def run_name(paths: list[str]) -> str:
    """The run folder `analyze --tensorboard` writes into below OUT/tensorboard: the trace's
    name without its suffixes (or the folder's name); for several, their common folder's."""
    if not paths:
        return "trace"
    if len(paths) == 1:
        return _tag(_stem(Path(paths[0]).name))
    parents = {Path(p).resolve().parent for p in paths}
    common = Path(os.path.commonpath([str(p) for p in parents]))
    return _tag(common.name or _stem(Path(paths[0]).name))


def write_trace_copies(report: Report, run_dir: Path) -> list[PluginCopy]:
    """Put every analysed trace into `run_dir` as the profiler plugin reads it; file names
    that would collide (same name, different folders) get their folder's name in front."""
    written: list[PluginCopy] = []
    used: set[str] = set()
    for trace in report.traces:
        source = Path(trace["path"])
        name = plugin_name(source)
        if name in used:
            name = f"{_tag(source.parent.name)}_{name}"
        used.add(name)
        written.append(write_plugin_copy(source, run_dir, name, judged_steps(report, trace)))
    return written


def judged_steps(report: Report, trace: dict[str, Any]) -> list[str]:
    """The names of the steps the report judged in `trace` ([] when they were inferred: the
    trace has no `ProfilerStep#N` marker to keep or set aside)."""
    if trace.get("steps_source") != "ProfilerStep":
        return []
    return [s["name"] for s in steps_of(report, trace["label"])]


def steps_of(report: Report, label: str) -> list[dict[str, Any]]:
    """The judged steps of one trace."""
    single = len(report.traces) == 1
    return [s for s in report.steps if single or s.get("trace") == label]


def loader_wait_pct(steps: list[dict[str, Any]]) -> float | None:
    """The loader wait (no GPU work) over `steps`, % of their wall time: what the
    dataloader-bound verdict and the plugin's DataLoader share measure."""
    total = sum(s["duration_us"] for s in steps)
    if total <= 0:
        return None
    return 100.0 * sum(s.get("dataloader_wait_us", 0.0) for s in steps) / total


def _write_scalars(writer: Any, report: Report) -> None:
    prefixes = trace_prefixes(report)
    index: dict[str, int] = {}
    for step in report.steps:
        label = step.get("trace", "")
        prefix = prefixes.get(label, "")
        number = index.get(label, 0)
        index[label] = number + 1
        gstep = global_step(step["name"], number)
        duration = step["duration_us"]
        writer.add_scalar(f"{prefix}step_time_ms", duration / 1000.0, gstep)
        if duration <= 0:
            continue
        for category in HOST_CATEGORIES:
            share = 100.0 * step["breakdown_us"].get(category, 0.0) / duration
            writer.add_scalar(f"{prefix}host_share_pct/{category}", share, gstep)
        if "dataloader_wait_us" in step:
            writer.add_scalar(f"{prefix}dataloader_wait_pct",
                              100.0 * step["dataloader_wait_us"] / duration, gstep)
        for device, parts in step["gpu_us"].items():
            idle = 100.0 * parts.get("idle", 0.0) / duration
            writer.add_scalar(f"{prefix}gpu_idle_pct/{_device_tag(device)}", idle, gstep)


def verdict_metric(report: Report) -> tuple[str, float] | None:
    """The figure the verdict line states, as (tag name, value); None when the verdict names
    no finding (too little to judge, no finding)."""
    lead = report.lead
    if lead is None:
        return None
    if flagged(report.verdict_id, "bound"):
        lead = next((f for f in report.findings if f.id == report.verdict_id and not f.caused_by
                     and f.trace == lead.trace), lead)
    # "No bottleneck worth fixing" states the largest finding's saving, not its own figure.
    key, name = (VERDICT_METRIC.get(lead.id, ("", "")) if report.verdict_id != "no-bottleneck"
                 else ("", ""))
    value = lead.evidence.get(key) if key else None
    if isinstance(value, (int, float)):
        return name, float(value)
    return f"{_tag(lead.id)}_saving_pct", float(lead.estimated_saving_pct)


def _write_verdict(writer: Any, report: Report) -> None:
    metric = verdict_metric(report)
    if metric is not None:
        writer.add_scalar(VERDICT_TAG + metric[0], metric[1], 0)


def plan_points(plan: dict[str, Any]) -> list[tuple[float, list[float] | None]]:
    """The fix plan's step, measured then after each fix: (median us, [low, high] or None)."""
    points: list[tuple[float, list[float] | None]] = [(baseline(plan), None)]
    points += [(e["predicted_step_us"], e.get("predicted_range_us")) for e in plan["entries"]]
    return points


def _write_plan(writer: Any, report: Report) -> None:
    if not report.plan or not report.plan.get("entries"):
        return
    floor = report.plan.get("floor_us")
    for k, (step_us, rng) in enumerate(plan_points(report.plan)):
        writer.add_scalar(PLAN_TAG + "step_ms", step_us / 1000.0, k)
        low, high = rng or (step_us, step_us)
        writer.add_scalar(PLAN_TAG + "step_ms_low", low / 1000.0, k)
        writer.add_scalar(PLAN_TAG + "step_ms_high", high / 1000.0, k)
        if floor:
            writer.add_scalar(PLAN_TAG + "floor_ms", floor / 1000.0, k)


def global_step(name: str, index: int) -> int:
    """N of `ProfilerStep#N`, else the step's position in its trace."""
    match = _STEP_NUMBER.match(name)
    return int(match.group(1)) if match else index


def trace_prefixes(report: Report) -> dict[str, str]:
    """Tag prefix per trace label: none for a single trace, `rank<N>/` or the file stem else."""
    if len(report.traces) <= 1:
        return {t["label"]: "" for t in report.traces}
    out = {}
    for t in report.traces:
        name = f"rank{t['rank']}" if t["rank"] is not None else _stem(t["label"])
        out[t["label"]] = _tag(name) + "/"
    return out


def findings_markdown(report: Report, copies: list[PluginCopy] | None = None) -> str:
    """The verdict, the step time, a findings table, and what the PyTorch Profiler tab shows
    of each trace copy, for TensorBoard's text dashboard."""
    lines = [f"**Verdict:** {md(report.verdict)}", ""]
    t = report.summary.get("step_time_us")
    if t:
        lines += [
            f"Median step time {ms(t['median'], 'tenths')} ms over {report.summary['steps']} "
            f"step{'s' if report.summary['steps'] != 1 else ''}"
            f"{f' in {len(report.traces)} traces' if len(report.traces) > 1 else ''}.",
            "",
        ]
    if not report.findings:
        lines.append("No findings.")
    else:
        several = len(report.traces) > 1
        head = ["severity", "id", *(["trace"] if several else []), "title",
                "saves (of the step)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f in report.findings:
            cells = [
                f.severity,
                f"`{f.id}`",
                *([md(f.trace)] if several else []),
                md(f.title) + (f" (caused by `{f.caused_by}`)" if f.caused_by else ""),
                saving_label(f)[1],
            ]
            lines.append("| " + " | ".join(cells) + " |")
    for trace, copy in zip(report.traces, copies or [], strict=False):
        lines += ["", plugin_note(report, trace, copy)]
    return "\n".join(lines)


def plugin_note(report: Report, trace: dict[str, Any], copy: PluginCopy) -> str:
    """What the PyTorch Profiler tab's Overview shows of one trace copy, against the report:
    the same steps, step time and DataLoader share, or where and why it differs."""
    steps = steps_of(report, trace["label"])
    match = PLUGIN_NAME.match(copy.path.name)
    worker = md(match.group(1) if match else copy.path.name)
    head = f"**PyTorch Profiler tab** (Overview, worker `{worker}`): "
    if not copy.steps:
        return head + (
            "the trace has no ProfilerStep#N marker, so the plugin takes the whole trace for "
            f"one step; its figures do not compare with this report's {len(steps)} "
            f"step{'s' if len(steps) != 1 else ''} ({md(trace.get('steps_source', ''))}).")
    shown = [name for name, _, _ in copy.steps]
    names = f"{shown[0]} to {shown[-1]}" if len(shown) > 1 else shown[0]
    mine = [s["name"] for s in steps]
    parts = [f"{len(shown)} step{'s' if len(shown) != 1 else ''} ({names})"
             + (", the steps this report judges" if shown == mine else
                f", not the {len(mine)} this report judges: the plugin leaves out the last "
                "steps when they launched less GPU work than the one before")]
    mean = sum(s["duration_us"] for s in steps) / len(steps) if steps else 0.0
    plugin = copy.step_time_us or 0.0
    same = abs(plugin - mean) <= SAME_STEP_US
    if same or shown != mine:
        parts.append(f"Average Step Time {ms(plugin)} ms"
                     + (", this report's mean" if shown == mine else ""))
    else:
        parts.append(
            f"Average Step Time {ms(plugin)} ms: its steps end when the GPU finishes the work "
            f"they launched, and the GPU ran behind the host, so it is longer than this "
            f"report's mean of {ms(mean)} ms over the host's step ranges")
    wait = loader_wait_pct(steps)
    if wait is not None:
        parts.append(f"DataLoader {'' if same else 'about '}{percent(wait)}, this report's loader "
                     "wait (no GPU work)" + ("" if same else ", over the plugin's longer steps"))
    if (t := report.summary.get("step_time_us")) and len(report.traces) == 1:
        parts.append(f"the report leads with the median step, {ms(t['median'])} ms")
    return head + "; ".join(parts) + "."


def _device_tag(device: str) -> str:
    return f"gpu{device}" if str(device).isdigit() else _tag(str(device))


def _stem(name: str) -> str:
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def _tag(text: str) -> str:
    return _UNSAFE_TAG.sub("_", text.replace("/", "_")) or "trace"
