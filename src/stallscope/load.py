"""Load Kineto traces (torch.profiler JSON, optionally gzipped) into columnar event tables.

Only the fields the analysis reads are decoded (msgspec typed structs skip the rest), complete
events (`ph: "X"`) become one pandas DataFrame per file, and each event's `args` object is kept
undecoded until a caller asks for a few fields of a chosen subset (`Trace.args`). Legacy
category names (2020-21 traces: `Operator`, `Runtime`, `Kernel`, ...) are mapped to the modern
ones so nothing downstream needs to know the schema.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from stallscope.errors import InputError

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")

# Legacy Kineto categories -> modern ones (GUIDE §3).
LEGACY_CATEGORIES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
}


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw(b"null")


class _TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None  # noqa: N815 (the file's own key)
    schemaVersion: int | str | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] = []  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    traceName: str | None = None  # noqa: N815
    stallscope: Any = None  # written by `stallscope run` (tool, step source, incomplete step)


class _Metadata(msgspec.Struct):
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    traceName: Any = None  # noqa: N815
    stallscope: Any = None


@dataclass
class Trace:
    """One trace file: complete events as columns, plus the file-level metadata."""

    path: Path
    events: pd.DataFrame  # ph == "X" only; ts/dur/end in microseconds relative to `t0_us`
    t0_us: float
    schema: str  # "modern" or "legacy"
    devices: list[dict[str, Any]] = field(default_factory=list)
    distributed: dict[str, Any] = field(default_factory=dict)
    capture: dict[str, Any] = field(default_factory=dict)  # stallscope's own metadata, if any
    skipped_events: int = 0
    _raw_args: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object), repr=False)

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        size = self.distributed.get("world_size")
        return size if isinstance(size, int) else None

    @property
    def label(self) -> str:
        """A short name for this trace: its rank when known, else its file name."""
        return f"rank {self.rank}" if self.rank is not None else self.path.name

    def args(self, index: pd.Index | np.ndarray, spec: type[msgspec.Struct]) -> pd.DataFrame:
        """Decode the fields of `spec` from the `args` of the events at `index`, in one pass.

        Unknown keys are skipped without being materialised; a field of the wrong type becomes
        missing rather than an error, so one odd event cannot spoil the whole table.
        """
        index = np.asarray(index)
        names = [f for f in spec.__struct_fields__]
        if len(index) == 0:
            return pd.DataFrame({n: pd.Series(dtype="float64") for n in names}, index=index)
        raws = self._raw_args[index]
        blob = b"[" + b",".join(bytes(r) for r in raws) + b"]"
        try:
            decoded = msgspec.json.decode(blob, type=list[spec | None])
        except (msgspec.DecodeError, msgspec.ValidationError):
            decoded = [_decode_one(bytes(r), spec) for r in raws]
        columns = {
            n: pd.to_numeric(
                pd.Series([getattr(a, n, None) if a is not None else None for a in decoded],
                          index=index, dtype=object),
                errors="coerce",
            )
            for n in names
        }
        return pd.DataFrame(columns, index=index)


def _decode_one(raw: bytes, spec: type[msgspec.Struct]) -> msgspec.Struct | None:
    try:
        return msgspec.json.decode(raw, type=spec | None)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class GpuArgs(msgspec.Struct):
    """The `args` fields that link runtime calls to GPU work and size the copies."""

    correlation: int | float | str | None = None
    device: int | float | str | None = None
    stream: int | float | str | None = None
    bytes: int | float | str | None = None


def discover(path: Path) -> list[Path]:
    """The trace files at `path`: the file itself, or every Kineto trace below a folder."""
    if not path.exists():
        raise InputError(f"no such file or folder: {path}")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"not a file or folder: {path}")
    found = sorted(
        p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
    )
    if not found:
        raise InputError(f"no *.pt.trace.json or *.pt.trace.json.gz files under {path}")
    return found


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, decompressed when it is gzip (by magic number, not by name)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read()
            return fh.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"{path}: damaged or truncated gzip file ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def load_trace(path: Path) -> Trace:
    """Decode one trace file into a `Trace`."""
    data = read_bytes(path)
    if not data.strip():
        raise InputError(f"{path}: file is empty")
    skipped = 0
    try:
        parsed = msgspec.json.decode(data, type=_TraceFile)
        events = parsed.traceEvents
        meta = _Metadata(
            parsed.schemaVersion,
            parsed.deviceProperties,
            parsed.distributedInfo,
            parsed.traceName,
            parsed.stallscope,
        )
    except msgspec.ValidationError:
        events, meta, skipped = _lenient_decode(path, data)
    except msgspec.DecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if events is None:
        raise InputError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    del data
    return _build(path, events, meta, skipped)


def _lenient_decode(path: Path, data: bytes) -> tuple[list[_Event] | None, _Metadata, int]:
    """Slow path for files with odd field types: keep every event that can be read."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: not a Kineto trace (top level is a {type(obj).__name__})")
    raw_events = obj.get("traceEvents")
    if not isinstance(raw_events, list):
        return None, _Metadata(), 0
    events: list[_Event] = []
    skipped = 0
    for raw in raw_events:
        try:
            events.append(msgspec.convert(raw, _Event, strict=False))
        except (msgspec.ValidationError, TypeError):
            skipped += 1
    devices = obj.get("deviceProperties")
    dist = obj.get("distributedInfo")
    meta = _Metadata(
        obj.get("schemaVersion"),
        devices if isinstance(devices, list) else [],
        dist if isinstance(dist, dict) else None,
        obj.get("traceName"),
        obj.get("stallscope"),
    )
    return events, meta, skipped


def _build(path: Path, events: list[_Event], meta: _Metadata, skipped: int) -> Trace:
    complete = [e for e in events if e.ph == "X"]
    ts = np.fromiter((e.ts for e in complete), dtype=np.float64, count=len(complete))
    dur = np.fromiter((e.dur for e in complete), dtype=np.float64, count=len(complete))
    usable = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
    if not usable.all():
        skipped += int((~usable).sum())
        complete = [e for e, ok in zip(complete, usable, strict=True) if ok]
        ts, dur = ts[usable], dur[usable]
    t0 = float(ts.min()) if len(ts) else 0.0
    cats = pd.Categorical([e.cat for e in complete])
    legacy = any(c in LEGACY_CATEGORIES for c in cats.categories)
    if legacy:
        cats = cats.rename_categories(_merge_names(cats.categories, LEGACY_CATEGORIES))
    frame = pd.DataFrame(
        {
            "cat": cats,
            "name": pd.Categorical([e.name for e in complete]),
            "pid": _id_column([e.pid for e in complete]),
            "tid": _id_column([e.tid for e in complete]),
            "ts": ts - t0,
            "dur": dur,
        }
    )
    frame["end"] = frame["ts"] + frame["dur"]
    raw_args = np.empty(len(complete), dtype=object)
    raw_args[:] = [e.args for e in complete]
    devices = [d for d in (meta.deviceProperties or []) if isinstance(d, dict)]
    dist = meta.distributedInfo if isinstance(meta.distributedInfo, dict) else {}
    return Trace(
        path=path,
        events=frame,
        t0_us=t0,
        schema="legacy" if legacy else "modern",
        devices=devices,
        distributed=dist,
        capture=meta.stallscope if isinstance(meta.stallscope, dict) else {},
        skipped_events=skipped,
        _raw_args=raw_args,
    )


def _merge_names(categories: pd.Index, mapping: dict[str, str]) -> list[str]:
    # Two source names may map to one (a file mixing both schemas): keep them distinct.
    out, seen = [], set()
    for c in categories:
        new = mapping.get(c, c)
        if new in seen or (new != c and new in set(categories)):
            new = c
        seen.add(new)
        out.append(new)
    return out


def _id_column(values: list[int | str]) -> pd.Categorical:
    """pid/tid are ints or strings depending on the row; compare them as strings."""
    codes = pd.Categorical(values)
    names = [str(c) for c in codes.categories]
    if len(set(names)) == len(names):
        return codes.rename_categories(names)
    return pd.Categorical([str(v) for v in values])


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def load_paths(paths: list[Path]) -> list[Trace]:
    """Every trace under `paths`, ordered by rank (when known) then by file name."""
    files: list[Path] = []
    for p in paths:
        files.extend(discover(p))
    traces = [load_trace(f) for f in dict.fromkeys(files)]
    for t in traces:
        if t.rank is None and len(traces) > 1:
            match = _RANK_IN_NAME.search(t.path.name)
            if match:
                t.distributed = {**t.distributed, "rank": int(match.group(1))}
    return sorted(traces, key=lambda t: (t.rank is None, t.rank or 0, str(t.path)))
