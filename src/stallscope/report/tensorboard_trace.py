"""The trace as the PyTorch profiler TensorBoard plugin reads it, so its Overview agrees with us.

torch-tb-profiler 0.4.3 (deprecated, the last release) counts DataLoader time only from
`enumerate(DataLoader)#...__next__` events it turns into operators: its `create_trace_event`
(torch_tb_profiler/profiler/trace.py) keeps a `user_annotation` event only when it is a
`ProfilerStep#N` or a collective, and drops the rest before `EventParser._parse_step` could count
it as DataLoader. torch 2.x records the loader's `__next__` as `user_annotation`, so the plugin's
Overview says "DataLoader 0%" on a run whose report says the loader is 90% of the step; torch 1.x
recorded it as `cpu_op` (then `Operator`), which the plugin counts.

So the plugin gets a copy in which those loader events, and only those, carry `cpu_op`; every
other byte of meaning is kept (timestamps, threads, GPU events), and the copy's metadata says so
(`stallscope_copy`). The original trace is never modified: `analyze --tensorboard` copies it
into the logdir; `run`, whose trace was recorded inside the logdir's run folder, keeps the
original beside the copy as `<worker>[.<span>].original.json[.gz]`, a name the plugin does not
read (it reads `*.pt.trace.json[.gz]` only, and would show two files as two spans of one
worker), nor does stallscope when given the folder.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from stallscope.errors import OutputError
from stallscope.trace.model import LOADER_NAME

# The file names the plugin reads (its consts.WORKER_PATTERN): worker, optional span, suffix.
PLUGIN_NAME = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")
ORIGINAL_SUFFIX = ".original.json.gz"
COPY_KEY = "stallscope_copy"


def plugin_name(path: Path) -> str:
    """The name the copy gets: the original's, when the plugin already reads that name, else
    its stem with the plugin's suffix (`trace.json` -> `trace.pt.trace.json.gz`)."""
    name = path.name
    if PLUGIN_NAME.match(name):
        return name if name.endswith(".gz") else name + ".gz"
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return f"{name or 'trace'}.pt.trace.json.gz"


def relabel_loader_events(trace: dict[str, Any]) -> int:
    """Give the DataLoader `__next__` annotations the `cpu_op` category the plugin counts;
    return how many were changed. Everything else is left as recorded."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return 0
    changed = 0
    for event in events:  # one pass over dicts: the trace is already in memory as objects
        if (isinstance(event, dict) and event.get("cat") == "user_annotation"
                and isinstance(event.get("name"), str) and LOADER_NAME.match(event["name"])):
            event["cat"] = "cpu_op"
            changed += 1
    return changed


def _read(raw: bytes, path: Path) -> dict[str, Any]:
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = msgspec.json.decode(raw)
    if not isinstance(data, dict):
        raise OutputError(f"{path} is not a trace object; no TensorBoard copy written")
    return data


def write_plugin_copy(source: Path, run_dir: Path, name: str | None = None) -> Path:
    """Write the plugin-ready copy of `source` into `run_dir` (as `name`, else plugin_name);
    return its path.

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
        changed = relabel_loader_events(trace)
        if not changed:
            if not in_place:
                dest.write_bytes(raw if gz else gzip.compress(raw, compresslevel=6))
            return dest
        trace[COPY_KEY] = {
            "original": source.name,
            "changed": f"{changed} DataLoader __next__ event(s): cat user_annotation -> cpu_op, "
                       "the category torch-tb-profiler 0.4.3 counts as DataLoader time",
        }
        data = msgspec.json.encode(trace)
        staging = dest.with_name(f".{dest.name}.tmp")
        staging.write_bytes(gzip.compress(data, compresslevel=6) if gz or not in_place else data)
        if in_place:
            suffix = ORIGINAL_SUFFIX if gz else ORIGINAL_SUFFIX.removesuffix(".gz")
            os.replace(source, run_dir / (PLUGIN_NAME.sub(r"\1\2", source.name) + suffix))
        os.replace(staging, dest)
    except OSError as exc:
        raise OutputError(f"cannot write the TensorBoard trace copy in {run_dir}: {exc}") from None
    return dest
