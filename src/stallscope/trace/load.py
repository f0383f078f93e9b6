"""Load Kineto traces (torch.profiler JSON, optionally gzipped) into columnar event tables.

Both forms of the Chrome trace event format are read: an object with `traceEvents` (what
torch.profiler writes) and a bare array of events (older `export_chrome_trace`, no metadata).

Files are streamed through `decode` (a chunk of events at a time) so that memory follows the
columns, not the text. Only complete events (`ph: "X"`) and the few `args` fields the analysis
reads become columns; legacy category names (2020-21 traces: `Operator`, `Runtime`, `Kernel`,
...) are mapped to the modern ones so nothing downstream needs to know the schema.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from stallscope import heap
from stallscope.errors import InputError
from stallscope.trace import split
from stallscope.trace.decode import (
    ARG_FIELDS,
    Columns,
    Damage,
    Decoded,
    LimitExceeded,
    Limits,
    Metadata,
    depth_allowed,
    lenient_events,
    stream_decode,
)
from stallscope.trace.version import TorchVersion, read_torch_version

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")

# Legacy Kineto categories -> modern ones (docs/architecture.md, "Kineto trace facts").
LEGACY_CATEGORIES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
}


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
    # What the script that recorded it wrote about itself and its machine (this project's
    # sample traces: `stallscope_sample`, `stallscope_recording`), if anything.
    recording: dict[str, Any] = field(default_factory=dict)
    skipped_events: int = 0
    truncated: bool = False  # the file ends early; the events before the cut were analysed
    notes: list[str] = field(default_factory=list)  # what reading left out or repaired
    # `args` fields of each event, same index as `events`: correlation, device, stream, bytes
    # (NaN where absent). They link runtime calls to GPU work and size the copies.
    args: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    host: str = ""  # the machine that recorded it, where the trace says (Kineto's host_name)
    # The allocator's `[memory]` instant events (torch.profiler's profile_memory), in time
    # order: ts (microseconds relative to `t0_us`), device_type, device_id, bytes (this
    # allocation's, negative when freed), allocated and reserved (the device's totals after it,
    # NaN where the trace writes only the delta). Empty without them.
    memory: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    # Set when another file of the job has the same rank: the label then names the file too,
    # so the two are kept apart (see commands/pipeline.py `_label_same_ranks`).
    alias: str = ""

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        size = self.distributed.get("world_size")
        return size if isinstance(size, int) else None

    @property
    def torch_info(self) -> TorchVersion:
        """The torch that recorded this trace, and how that is known (trace/version.py)."""
        return read_torch_version(self.capture, self.schema, self.recording)

    @property
    def torch_version(self) -> tuple[int, int] | None:
        """(major, minor) of the torch that recorded this trace; None when unknown."""
        return self.torch_info.version

    @property
    def label(self) -> str:
        """A short name for this trace: its rank when known, else its file name."""
        if self.alias:
            return self.alias
        return f"rank {self.rank}" if self.rank is not None else self.path.name


def discover(path: Path) -> list[Path]:
    """The trace files at `path`: the file itself, or every Kineto trace below a folder.

    Below a folder, anything named like a trace but a folder is listed, a link to a missing
    file included: a job's rank that crashed leaves such entries, and `load_trace` says why
    each cannot be read (so the job's report lists it instead of passing over it)."""
    if not path.exists():
        raise InputError(f"no such file or folder: {path}")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"not a file or folder: {path}")
    found = sorted(
        p for p in path.rglob("*") if p.name.endswith(TRACE_SUFFIXES) and not p.is_dir()
    )
    if not found:
        raise InputError(f"no *.pt.trace.json or *.pt.trace.json.gz files under {path}")
    return found


def _open_text(path: Path) -> Any:
    """The file opened for its JSON text: gunzipped as it is read when it is gzip."""
    with path.open("rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else path.open("rb")


def load_trace(path: Path, on_progress: Any = None,
               limits: Limits = Limits(), cores: int = 1,  # noqa: B008 (frozen)
               reading: split.Reading | None = None) -> Trace:
    """Decode one trace file into a `Trace`, streaming it; odd files get a precise error.

    `limits` bound what the file may cost (decode.Limits); passing one is an InputError.
    `cores`: processes a large plain file may be read with (trace/split.py); `reading`: that
    file's parts already being read (split.start), used when it is this path's."""
    if not path.is_file():  # never opened: a pipe would block the read
        raise InputError(f"{path}: {_not_a_file(path)}")
    try:
        if reading is not None and reading.path.resolve() == path.resolve():
            decoded = reading.result(on_progress)
        else:
            decoded = split.decode_parallel(path, cores, on_progress, limits) if cores > 1 \
                else None
        if decoded is None:
            with _open_text(path) as fh:
                decoded = stream_decode(fh, on_progress, limits)
        if decoded is None:
            decoded = _whole_document(path, limits)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except LimitExceeded as exc:
        raise InputError(f"{path}: {exc}") from None
    damage = decoded.columns.damage
    if damage.events and decoded.columns.seen == 0:
        raise InputError(f"{path}: no readable event: {_damage_text(damage)}")
    if decoded.truncated and decoded.columns.seen == 0:
        raise InputError(f"{path}: truncated: the file ends before its first complete event")
    if decoded.array and decoded.columns.seen == 0:
        raise InputError(f"{path}: not a trace (top level is a list holding no events)")
    trace = _build(path, decoded)
    del decoded
    heap.trim()  # the events' structs are freed: give their memory back for the analysis
    return trace


def _not_a_file(path: Path) -> str:
    """Why an entry named like a trace is not one to read."""
    if path.is_symlink() and not path.exists():
        return f"cannot read (a link to a missing file: {os.readlink(path)})"
    return "cannot read (not a regular file: a pipe, socket or device)"


def _whole_document(path: Path, limits: Limits = Limits()) -> Decoded:  # noqa: B008
    """Decode the file in one piece: the path for anything not shaped like a Kineto trace.

    Bounded like the stream: at most `limits.max_buffer_bytes` of text is read; beyond that
    the reason is taken from the start of the text (where a file that is not JSON says so)."""
    _refuse_if_not_json(path, _read_at_most(path, 1 << 16))  # say so before reading on
    data = _read_at_most(path, limits.max_buffer_bytes)
    if not data.strip():
        raise InputError(f"{path}: file is empty")
    if len(data) > limits.max_buffer_bytes:
        raise LimitExceeded(
            f"not a Kineto trace in its first {limits.max_buffer_bytes >> 20} MB (no event "
            "list found; --max-buffer-mb raises the limit on text held at once)")
    repaired = False
    try:
        with depth_allowed(limits.max_depth):
            try:
                obj = msgspec.json.decode(data)
            except UnicodeDecodeError:  # invalid UTF-8 in a string: keep the text, marked
                obj = msgspec.json.decode(data.decode("utf-8", "replace").encode("utf-8"))
                repaired = True
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise LimitExceeded(f"nested deeper than {limits.max_depth:,} levels (the limit; "
                            "--max-depth raises it)") from None
    if isinstance(obj, list):  # the array form: events only
        obj = {"traceEvents": obj}
        array = True
    elif isinstance(obj, dict):
        array = False
    else:
        raise InputError(f"{path}: not a Kineto trace (top level is a {type(obj).__name__})")
    if not isinstance(obj.get("traceEvents"), list):
        raise InputError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    # Shaped like a trace after all (the streaming reader gave up on its layout): decode it.
    cols = Columns(repaired=int(repaired))
    cols.add(lenient_events(obj.pop("traceEvents"), cols))
    meta = msgspec.convert(
        {k: obj.get(k) for k in Metadata.__struct_fields__}, Metadata, strict=False
    )
    return Decoded(cols, meta, array=array)


def _refuse_if_not_json(path: Path, head: bytes) -> None:
    """InputError when the start of the text already is not JSON (binary, zeros, text)."""
    try:
        msgspec.json.decode(head)
    except msgspec.DecodeError as exc:
        if "truncated" not in str(exc) and head.strip():
            raise InputError(f"{path}: not valid JSON ({exc})") from None
    except (msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        pass


def _read_at_most(path: Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of the file's text (one more says it is longer)."""
    try:
        with _open_text(path) as fh:
            return fh.read(limit + 1)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"{path}: damaged or truncated gzip file ({exc})") from None


# A duration longer than this many times the span of all event starts (and over a minute) is
# corrupt: a profiler records seconds to minutes, and every event starts inside that span.
IMPLAUSIBLE_SPAN_FACTOR = 10.0
IMPLAUSIBLE_MIN_US = 60e6
# An event that starts more than a day from the median start is corrupt (a flipped digit, a
# number out of range): a recording lasts seconds to hours, and it would stretch every span.
FAR_FROM_THE_REST_US = 86_400e6


def _build(path: Path, decoded: Decoded) -> Trace:
    cols, meta = decoded.columns, decoded.metadata
    ts, dur = cols.column("ts"), cols.column("dur")
    keep = slice(None)
    implausible = far = 0
    if len(ts):
        with np.errstate(over="ignore", invalid="ignore"):
            near = np.abs(ts - np.median(ts)) <= FAR_FROM_THE_REST_US
        far = int((~near).sum())
        limit = max(IMPLAUSIBLE_SPAN_FACTOR * float(ts[near].max() - ts[near].min()),
                    IMPLAUSIBLE_MIN_US) if near.any() else IMPLAUSIBLE_MIN_US
        plausible = near & (dur <= limit)
        implausible = int((~plausible).sum()) - far
        if implausible or far:
            keep = plausible
            ts, dur = ts[keep], dur[keep]
    t0 = float(ts.min()) if len(ts) else 0.0
    cats = _categorical(cols.column("cat", np.int32)[keep], cols.cat.values)
    legacy = any(c in LEGACY_CATEGORIES for c in cats.categories)
    if legacy:
        # pandas takes a list of new names (documented list-like); pandas-stubs wants a mapping
        cats = cats.rename_categories(
            _merge_names(cats.categories, LEGACY_CATEGORIES))  # type: ignore[arg-type]
    rel = ts - t0
    frame = pd.DataFrame(
        {
            "cat": cats,
            "name": _categorical(cols.column("name", np.int32)[keep], cols.name.values),
            "pid": _categorical(cols.column("pid", np.int32)[keep], cols.pid.values),
            "tid": _categorical(cols.column("tid", np.int32)[keep], cols.tid.values),
            "ts": rel,
            "dur": dur,
            "end": rel + dur,
        },
        copy=False,
    )
    args = pd.DataFrame({f: cols.column(f)[keep] for f in ARG_FIELDS}, copy=False)
    listed = meta.deviceProperties if isinstance(meta.deviceProperties, list) else []
    devices = [d for d in listed if isinstance(d, dict)]
    dist = meta.distributedInfo if isinstance(meta.distributedInfo, dict) else {}
    return Trace(
        path=path,
        events=frame,
        t0_us=t0,
        schema="legacy" if legacy else "modern",
        devices=devices,
        distributed=dist,
        capture=meta.stallscope if isinstance(meta.stallscope, dict) else {},
        recording=next((m for m in (meta.stallscope_sample, meta.stallscope_recording)
                        if isinstance(m, dict)), {}),
        skipped_events=cols.unreadable + cols.bad_times + implausible + far
        + cols.damage.events,
        truncated=decoded.truncated or decoded.unclosed,
        host=meta.host_name if isinstance(meta.host_name, str) else "",
        notes=_load_notes(path, decoded, implausible, len(frame), far),
        args=args,
        memory=_memory_events(cols, t0),
    )


def _memory_events(cols: Columns, t0: float) -> pd.DataFrame:
    """The `[memory]` events as `Trace.memory`, in time order; empty where there are none."""
    ts = cols.memory_column("ts")
    if not len(ts):
        return pd.DataFrame()
    frame = pd.DataFrame({"ts": ts - t0, **{name: cols.memory_column(f) for f, name in (
        ("mem_device_type", "device_type"), ("mem_device_id", "device_id"),
        ("mem_bytes", "bytes"), ("mem_allocated", "allocated"),
        ("mem_reserved", "reserved"))}})
    return frame.sort_values("ts", kind="stable", ignore_index=True)


def _load_notes(path: Path, decoded: Decoded, implausible: int, kept: int,
                far: int = 0) -> list[str]:
    """What was left out or repaired while reading, in words for the report."""
    cols, notes = decoded.columns, []
    if decoded.truncated:
        notes.append(
            f"{path.name} ends early (cut off while being written or copied): the {kept:,} "
            "complete events before the cut were analysed, so the last step may be missing "
            "work."
        )
    if decoded.unclosed:
        notes.append(
            f"{path.name} is a list of events without its closing ']' (the Chrome trace format "
            f"allows it; a profiler stopped while writing leaves the same): its {kept:,} "
            "complete events were analysed, so the last step may be missing work."
        )
    if cols.damage.events:
        notes.append(f"{path.name} is damaged: {_damage_text(cols.damage)}; "
                     f"the {kept:,} complete events around the damage were analysed.")
    if cols.unreadable:
        notes.append(f"{_events(cols.unreadable)} of {path.name} were left out: missing, "
                     "wrong-typed or out-of-range fields.")
    if cols.bad_times:
        notes.append(f"{_events(cols.bad_times)} of {path.name} were left out: a "
                     "missing, negative or non-numeric time or duration.")
    if implausible:
        notes.append(f"{_events(implausible)} of {path.name} were left out: durations longer "
                     f"than {IMPLAUSIBLE_SPAN_FACTOR:.0f} times the whole recording.")
    if far:
        notes.append(f"{_events(far)} of {path.name} were left out: they start more than a "
                     "day away from the rest of the recording (a corrupt time).")
    notes.extend(f"{path.name} {note}." for note in decoded.notes)
    if cols.repaired:
        notes.append(f"{path.name} holds text that is not valid UTF-8 (stray bytes, or half of "
                     "a surrogate pair); it was replaced by U+FFFD, so some names show \ufffd.")
    return notes


def _damage_text(damage: Damage) -> str:
    """"3 events unreadable at byte 1,024" (and where else, the first few places)."""
    shown = ", ".join(f"{o:,}" for o in damage.offsets[:3])
    more = f" and {len(damage.offsets) - 3:,} more places" if len(damage.offsets) > 3 else ""
    return f"{_events(damage.events)} unreadable (text that is not JSON) at byte {shown}{more}"


def _events(n: int) -> str:
    return f"{n:,} event" + ("" if n == 1 else "s")


def _categorical(codes: np.ndarray, values: list[Any]) -> pd.Categorical:
    """Codes into interned values -> a categorical of strings (ids may be ints or strings)."""
    names = [v if isinstance(v, str) else str(v) for v in values]
    unique = dict.fromkeys(names)
    if len(unique) != len(names):  # 5 and "5" are one id: merge their codes
        position = {n: i for i, n in enumerate(unique)}
        codes = np.array([position[n] for n in names], dtype=np.int32)[codes]
        names = list(unique)
    # pandas takes index-like categories (a list); pandas-stubs wants an Index
    return pd.Categorical.from_codes(  # type: ignore[call-overload]
        codes, categories=names, validate=False)


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


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def infer_rank(trace: Trace) -> None:
    """A trace of a multi-file job without distributedInfo: take the rank from its file name."""
    if trace.rank is None:
        match = _RANK_IN_NAME.search(trace.path.name)
        if match:
            trace.distributed = {**trace.distributed, "rank": int(match.group(1))}


def rank_order(trace: Trace) -> tuple[bool, int, str]:
    """Sort key: by rank when known, then by file name."""
    return (trace.rank is None, trace.rank or 0, str(trace.path))


def load_paths(paths: list[Path]) -> list[Trace]:
    """Every trace under `paths`, ordered by rank (when known) then by file name."""
    files: list[Path] = []
    for p in paths:
        files.extend(discover(p))
    traces = [load_trace(f) for f in dict.fromkeys(files)]
    if len(traces) > 1:
        for t in traces:
            infer_rank(t)
    return sorted(traces, key=rank_order)
