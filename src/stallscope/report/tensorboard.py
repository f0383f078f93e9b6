"""The report as TensorBoard views: per-step scalars, the findings as text, and the trace.

Written with `torch.utils.tensorboard.SummaryWriter` into the folder that holds the trace, so
`tensorboard --logdir OUT/tensorboard` shows the trace (PyTorch profiler plugin) and these views
as one run. The trace there is the plugin-ready copy (report/tensorboard_trace.py): the plugin
counts torch 2.x DataLoader time only once the loader events carry a category it parses.

Tags, with `P` empty for one trace and `rank0/` (or the file's stem) per trace when
there are several:

- `P step_time_ms`: wall time of each step;
- `P host_share_pct/<category>`: each host category's share of that step (dataloader, sync,
  h2d_copy, other_copy, host_compute; they sum to 100);
- `P gpu_idle_pct/gpu<N>`: each GPU's idle share of that step, when the trace has a GPU;
- `stallscope/findings` (text): the verdict and a table of findings.

The global step is N of `ProfilerStep#N`, so the charts line up with the trace viewer's step
names; steps without that marker are numbered by their index. Several ranks go into one event
file with per-rank tag prefixes rather than one file per rank: one run folder holds the traces
of every rank, TensorBoard would show a second file in that folder as the same run anyway, and
a single file is written (and replaced) as a unit.

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

from stallscope.errors import OutputError
from stallscope.report.build import Report
from stallscope.report.labels import saving_label
from stallscope.report.tensorboard_trace import plugin_name, write_plugin_copy
from stallscope.text import md
from stallscope.trace.model import HOST_CATEGORIES

# Marks stallscope's event files in a run folder, so a new report replaces the old views rather
# than adding a second set of points at the same steps. TensorBoard reads any file whose name
# contains "tfevents".
EVENT_SUFFIX = ".stallscope"
FINDINGS_TAG = "stallscope/findings"
_STEP_NUMBER = re.compile(r"^ProfilerStep#(\d+)$")
_UNSAFE_TAG = re.compile(r"[^-\w./]")  # what TensorBoard would otherwise rewrite, with a warning


def write_tensorboard(report: Report, run_dir: Path) -> Path:
    """Write the scalars and findings text of `report` into `run_dir`; return the event file.

    The event file is written in a staging folder and moved into `run_dir` once closed: event
    files are append-only, so a crash mid-write must not leave half a set of points in the run
    TensorBoard shows. Earlier stallscope event files in `run_dir` are then removed.
    """
    from torch.utils.tensorboard import SummaryWriter

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".stallscope-tb-", dir=run_dir.parent))
    except OSError as exc:
        raise OutputError(f"cannot write TensorBoard files in {run_dir}: {exc}") from None
    try:
        writer = SummaryWriter(log_dir=str(staging), filename_suffix=EVENT_SUFFIX)
        try:
            _write_scalars(writer, report)
            writer.add_text(FINDINGS_TAG, findings_markdown(report), global_step=0)
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
    write_trace_copies(report, run_dir)
    return final


def write_trace_copies(report: Report, run_dir: Path) -> list[Path]:
    """Put every analysed trace into `run_dir` as the profiler plugin reads it; file names
    that would collide (same name, different folders) get their folder's name in front."""
    written: list[Path] = []
    used: set[str] = set()
    for trace in report.traces:
        source = Path(trace["path"])
        name = plugin_name(source)
        if name in used:
            name = f"{_tag(source.parent.name)}_{name}"
        used.add(name)
        written.append(write_plugin_copy(source, run_dir, name))
    return written


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
        for device, parts in step["gpu_us"].items():
            idle = 100.0 * parts.get("idle", 0.0) / duration
            writer.add_scalar(f"{prefix}gpu_idle_pct/{_device_tag(device)}", idle, gstep)


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


def findings_markdown(report: Report) -> str:
    """The verdict, the step time and a findings table, for TensorBoard's text dashboard."""
    lines = [f"**Verdict:** {md(report.verdict)}", ""]
    t = report.summary.get("step_time_us")
    if t:
        lines += [
            f"Median step time {t['median'] / 1000:.1f} ms over {report.summary['steps']} "
            f"step(s){f' in {len(report.traces)} traces' if len(report.traces) > 1 else ''}.",
            "",
        ]
    if not report.findings:
        lines.append("No findings.")
        return "\n".join(lines)
    several = len(report.traces) > 1
    head = ["severity", "id", *(["trace"] if several else []), "title", "saves (of the step)"]
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
    return "\n".join(lines)


def _device_tag(device: str) -> str:
    return f"gpu{device}" if str(device).isdigit() else _tag(str(device))


def _stem(name: str) -> str:
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def _tag(text: str) -> str:
    return _UNSAFE_TAG.sub("_", text.replace("/", "_")) or "trace"
