"""The trace as the PyTorch profiler TensorBoard plugin reads it, so its Overview agrees with us.

torch-tb-profiler 0.4.3 (deprecated, the last release) reads a trace in ways the report does not,
and its Overview (step count, average step time, DataLoader share) disagreed with the report on
the same file. The copy in the logdir fixes three things, each in the plugin's own source
(torch_tb_profiler/profiler/trace.py `create_trace_event`, event_parser.py `_parse_step`):

- DataLoader time: the plugin counts `enumerate(DataLoader)#...__next__` only as an operator; it
  drops every `user_annotation` that is not a `ProfilerStep#N` or a collective. torch 2.x records
  the loader's `__next__` as `user_annotation` (torch 1.x as `cpu_op`, then `Operator`), so the
  Overview said "DataLoader 0%" where the report said 85%. Those events, and only those, get
  `cpu_op` in the copy.
- Step count: torch 2.x also writes each step as a `gpu_user_annotation` `ProfilerStep#N` on the
  GPU lane (the span of the GPU work the step launched), which the plugin takes for a second
  step of the same number: 12 steps for 6 on `real-h200-r1-w0` (42.9 ms and DataLoader 74.7%
  against the report's 76.3 ms median, 79.0 ms mean and 81.2%). The copy renames them `GPU
  ProfilerStep#N`: the trace view still shows them, the plugin no longer counts them.
- Which steps: the report judges the steady-state steps (a one-off first step, or a repeated
  step number, is set aside: docs/metrics.md); the plugin averages every `ProfilerStep#N`. The
  copy renames the host step markers the report did not judge `set aside ProfilerStep#N`, so
  the Overview averages the steps the report judged.

Every other byte of meaning is kept (timestamps, threads, GPU events), and the copy's metadata
says what changed (`stallscope_copy`). The original trace is never modified: `analyze
--tensorboard` copies it into the logdir; `run`, whose trace was recorded inside the logdir's run
folder, keeps the original beside the copy as `<worker>[.<span>].original.json[.gz]`, a name the
plugin does not read (it reads `*.pt.trace.json[.gz]` only, and would show two files as two
spans of one worker), nor does stallscope when given the folder. stallscope reads the copy as it
reads the original: it ignores `gpu_user_annotation`, and treats `cpu_op` and `user_annotation`
alike.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from stallscope.errors import OutputError
from stallscope.trace.model import LOADER_NAME, STEP_NAME

# The file names the plugin reads (its consts.WORKER_PATTERN): worker, optional span, suffix.
PLUGIN_NAME = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")
ORIGINAL_SUFFIX = ".original.json.gz"
COPY_KEY = "stallscope_copy"
# What the renamed step markers are called: names that do not start with "ProfilerStep#", the
# prefix the plugin takes for a step (and parses the number after, so a suffix would break it).
GPU_STEP_PREFIX = "GPU "
SET_ASIDE_PREFIX = "set aside "
# The categories of a host step marker: torch 2.x, torch 1.10-1.13, torch 1.8-1.9.
HOST_STEP_CATS = ("user_annotation", "cpu_op", "Operator")


# Control characters (C0, DEL, C1) and bidirectional overrides: a trace from someone else's
# machine may carry them in its name, and a file name holding them rewrites the terminal that
# lists the folder or hides what the name says.
_UNSAFE_IN_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plugin_name(path: Path) -> str:
    """The name the copy gets: the original's, when the plugin already reads that name, else
    its stem with the plugin's suffix (`trace.json` -> `trace.pt.trace.json.gz`); a control
    character or direction override in it becomes `_`."""
    name = _UNSAFE_IN_NAME.sub("_", path.name)
    if PLUGIN_NAME.match(name):
        return name if name.endswith(".gz") else name + ".gz"
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return f"{name or 'trace'}.pt.trace.json.gz"


def _events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return []
    return [e for e in events if isinstance(e, dict) and isinstance(e.get("name"), str)]


def relabel_loader_events(trace: dict[str, Any]) -> int:
    """Give the DataLoader `__next__` annotations the `cpu_op` category the plugin counts;
    return how many were changed. Everything else is left as recorded."""
    changed = 0
    for event in _events(trace):  # one pass over dicts: the trace is already in memory
        if event.get("cat") == "user_annotation" and LOADER_NAME.match(event["name"]):
            event["cat"] = "cpu_op"
            changed += 1
    return changed


def rename_gpu_steps(trace: dict[str, Any]) -> int:
    """Rename the GPU lane's `ProfilerStep#N` spans (torch 2.x) `GPU ProfilerStep#N`, which the
    plugin would count as steps; return how many."""
    changed = 0
    for event in _events(trace):
        if event.get("cat") == "gpu_user_annotation" and STEP_NAME.match(event["name"]):
            event["name"] = GPU_STEP_PREFIX + event["name"]
            changed += 1
    return changed


def set_aside_steps(trace: dict[str, Any], judged: Collection[str]) -> list[str]:
    """Rename the host step markers that are not among the `judged` steps, and every later
    marker of a number already seen (the report keeps a number's first range): what the plugin
    averages is then what the report judged. Return the names renamed, in time order."""
    steps = sorted((e for e in _events(trace) if e.get("ph") == "X"
                    and e.get("cat") in HOST_STEP_CATS and STEP_NAME.match(e["name"])),
                   key=lambda e: float(e.get("ts") or 0.0))
    seen: set[str] = set()
    renamed = []
    for event in steps:
        name = event["name"]
        if name in judged and name not in seen:
            seen.add(name)
            continue
        event["name"] = SET_ASIDE_PREFIX + name
        renamed.append(name)
    return renamed


def plugin_ready(trace: dict[str, Any], judged: Collection[str] | None = None) -> list[str]:
    """Make `trace` read by the plugin as the report reads it (see the module's docstring);
    return what changed, one line each ([] when nothing did). `judged`: the report's step
    names for this trace, or None (or empty: steps it inferred) to keep every marker."""
    changes = []
    loader = relabel_loader_events(trace)
    if loader:
        changes.append(f"{loader} DataLoader __next__ event(s): cat user_annotation -> cpu_op, "
                       "the category torch-tb-profiler 0.4.3 counts as DataLoader time")
    gpu = rename_gpu_steps(trace)
    if gpu:
        changes.append(f"{gpu} gpu_user_annotation ProfilerStep#N span(s) renamed "
                       f"'{GPU_STEP_PREFIX}ProfilerStep#N': the plugin counted each as a step")
    aside = set_aside_steps(trace, judged) if judged else []
    if aside:
        changes.append(f"{len(aside)} step marker(s) the report does not judge renamed "
                       f"'{SET_ASIDE_PREFIX}ProfilerStep#N' ({', '.join(aside)}): the plugin "
                       "averages the steps the report judged")
    return changes


def _read(raw: bytes, path: Path) -> dict[str, Any]:
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = msgspec.json.decode(raw)
    if not isinstance(data, dict):
        raise OutputError(f"{path} is not a trace object; no TensorBoard copy written")
    return data


@dataclass(frozen=True)
class PluginCopy:
    """A copy written for the plugin: where, what changed, and the steps (name, start, end)
    its Overview averages (plugin_steps; [] when the trace has no step marker, and the plugin
    takes the whole trace for one step)."""

    path: Path
    changes: list[str]
    steps: list[tuple[str, float, float]]

    @property
    def step_time_us(self) -> float | None:
        """The plugin's Average Step Time."""
        if not self.steps:
            return None
        return sum(e - s for _, s, e in self.steps) / len(self.steps)


def write_plugin_copy(source: Path, run_dir: Path, name: str | None = None,
                      judged: Collection[str] | None = None) -> PluginCopy:
    """Write the plugin-ready copy of `source` into `run_dir` (as `name`, else plugin_name).
    `judged`: the step names the report judged in it (plugin_ready).

    When `source` already lies in `run_dir` under a name the plugin reads (`run` records
    there), the copy takes that name and the original's bytes move beside it to
    `<worker>[.<span>].original.json[.gz]`, so the plugin sees one file per worker. A trace that
    needs no change is copied as it is (gzip), or left alone when already in place.
    """
    in_place = (source.resolve().parent == run_dir.resolve()
                and PLUGIN_NAME.match(source.name) is not None)
    dest = source if in_place else run_dir / (name or plugin_name(source))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        raw = source.read_bytes()
        gz = raw[:2] == b"\x1f\x8b"
        trace = _read(raw, source)
        changes = plugin_ready(trace, judged)
        steps = plugin_steps(trace)
        if not changes:
            if not in_place:
                dest.write_bytes(raw if gz else gzip.compress(raw, compresslevel=6))
            return PluginCopy(dest, changes, steps)
        trace[COPY_KEY] = {"original": source.name, "changed": changes}
        data = msgspec.json.encode(trace)
        staging = dest.with_name(f".{dest.name}.tmp")
        staging.write_bytes(gzip.compress(data, compresslevel=6) if gz or not in_place else data)
        if in_place:
            suffix = ORIGINAL_SUFFIX if gz else ORIGINAL_SUFFIX.removesuffix(".gz")
            os.replace(source, run_dir / (PLUGIN_NAME.sub(r"\1\2", source.name) + suffix))
        os.replace(staging, dest)
    except OSError as exc:
        raise OutputError(f"cannot write the TensorBoard trace copy in {run_dir}: {exc}") from None
    return PluginCopy(dest, changes, steps)


# What the plugin (EventTypeMap in torch_tb_profiler/profiler/trace.py) reads as a runtime call
# and as GPU work, by lower-cased category. torch >= 1.10 writes `cuda_runtime`, which it does
# not read: on those traces its steps stay the host's.
PLUGIN_RUNTIME_CATS = ("runtime",)
PLUGIN_DEVICE_CATS = ("kernel", "memcpy", "gpu_memcpy", "memset", "gpu_memset")
PLUGIN_STEP_CATS = ("cpu_op", "operator", "user_annotation", "gpu_user_annotation")
TAIL_KEEP = 0.8  # the plugin drops a last step launching under 0.8x the GPU work of the one before


def plugin_steps(trace: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The steps (name, start, end) the plugin's Overview averages, as its StepParser
    (torch_tb_profiler/profiler/event_parser.py) computes them: each `ProfilerStep#N` in file
    order; where it reads runtime calls linked to GPU work, a step ends when the GPU finishes
    the work launched inside it and the next one starts no earlier, and trailing steps that
    launched no GPU work (or under 0.8x the one before) are dropped."""
    steps: list[tuple[float, float]] = []
    names: list[str] = []
    runtimes: list[tuple[float, float, Any]] = []
    device: dict[Any, list[tuple[float, float]]] = {}
    for e in _events(trace):
        if e.get("ph") != "X" or not isinstance(e.get("cat"), str):
            continue
        cat, ts, end = e["cat"].lower(), float(e.get("ts") or 0), float(e.get("ts") or 0) + float(
            e.get("dur") or 0)
        corr = (e.get("args") or {}).get("correlation")
        if cat in PLUGIN_STEP_CATS and e["name"].startswith("ProfilerStep#"):
            steps.append((ts, end))
            names.append(e["name"])
        elif cat in PLUGIN_RUNTIME_CATS:
            runtimes.append((ts, end, corr))
        elif cat in PLUGIN_DEVICE_CATS:
            device.setdefault(corr, []).append((ts, end))
    if not steps:
        return []
    matched: list[list[tuple[float, float]]] = [[] for _ in steps]
    for ts, end, corr in runtimes:  # a runtime call counts for the step holding it whole
        i = next((k for k, (s, e) in enumerate(steps) if s <= ts and end <= e), None)
        if i is not None and corr in device:
            matched[i] += device[corr]
    return [(n, s, e) for n, (s, e) in zip(names, _extend_to_gpu(steps, matched, device),
                                             strict=False)]


def _extend_to_gpu(steps: list[tuple[float, float]], matched: list[list[tuple[float, float]]],
                   device: dict[Any, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The plugin's _update_steps_duration over host `steps` and the GPU work each launched."""
    if not any(matched):
        return steps
    prev = steps[0][0]
    if matched[0]:  # GPU work of no step that ended before step 0's began: step 0 starts after
        first = min(s for s, _ in matched[0])
        mine = {w for m in matched for w in m}
        ends = [e for ws in device.values() for (s, e) in ws if (s, e) not in mine and e < first]
        prev = max([prev, *ends])
    out = []
    for (s, e), gpu in zip(steps, matched, strict=True):
        start = max(prev, s)
        end = max(e, max(g for _, g in gpu)) if gpu else max(e, start)
        out.append((start, max(end, start)))
        prev = out[-1][1]
    last = max(i for i, m in enumerate(matched) if m)
    keep = last + 1
    if last > 0 and len(matched[last - 1]) * TAIL_KEEP > len(matched[last]):
        keep = last
    return out[:keep] if len(out) > 1 else out
