"""Stream a Kineto trace (JSON, optionally gzip) into event columns, one chunk at a time.

Why streaming: a trace can be gigabytes. Decoding it whole would hold the text, every event as
an object and the columns at once (HolisticTraceAnalysis needs ~6 GB per 800 MB of JSON). Here
the text is read in blocks; the `traceEvents` array is cut at event boundaries into chunks of a
few megabytes; each chunk is decoded by msgspec into typed structs that keep only the fields the
analysis reads (unknown keys are skipped without being materialised); and the structs become
numpy columns before the next chunk is read. Peak memory is the columns plus one chunk.

A cut is a candidate `}, {` between two events. It is accepted only when the chunk before it
decodes as a complete list of events, so a `}, {` inside a string or a nested object can never
split an event: such a chunk fails to decode and an earlier candidate is tried.

Two forms are read (the Chrome trace event format allows both): the object form
`{"traceEvents": [...], ...metadata}` that torch.profiler writes, and the array form `[...]`
(older `export_chrome_trace`), which has no metadata and may lack its closing `]`. Anything else
(a top level that is neither, no `traceEvents` key) is handed to the caller as `None`, which then
decodes the whole document to say precisely what is wrong.

Odd fields cost only themselves. A chunk decodes into typed structs; only when that fails (an id
written as a hex string, `"stream": "0x0"` in ROCm traces) is it decoded again with the `args`
fields untyped and converted one by one, and only when that fails too is it read event by event,
where a field of the wrong type is dropped and the rest of the event kept.

Damaged text costs only the events it touches, in time as well (`_drain`). When a chunk is not
valid JSON before its cut, msgspec names the byte where it broke: the events before the last
boundary ahead of that byte are kept, the text up to the next boundary after it is skipped and
counted (or kept, when a lone surrogate escape mended in that event alone is all it needs),
and decoding resynchronises there, in the same buffer, without copying or decoding again the
text after it. Each pass stops at the next damage, so the time is linear in the text however
dense the damage (docs/robustness.md has the figures).

Limits (`Limits`) keep hostile input within seconds and a few hundred MB: the text a file may
expand to, the text held without finding an event boundary, and the nesting depth.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Protocol, TypeVar

import msgspec
import numpy as np

from stallscope.trace.header import LONE_SURROGATE as _LONE_SURROGATE
from stallscope.trace.header import MAX_VALUE_BYTES, KeyFinder, read_metadata
from stallscope.units import binary_size

# Text per decoded chunk: large enough to amortise each decode call, small enough that the chunk's
# text and its events as structs stay a small part of the peak (measured on the 302 MB trace:
# docs/performance.md, "Figures behind the code").
CHUNK_BYTES = 1 << 20
BLOCK_BYTES = 1 << 20  # text read per file read
_MAX_TRIES = 8  # failed cuts before more text is read in (a cut inside a huge event)
_TAIL_BYTES = 1 << 20  # the keys after the event list: Kineto writes a few hundred bytes there
_TAIL_TRIES = 256  # `]` tried as the end of the event list before the file is called cut off


# Deepest nesting `--max-depth` may allow: each level is a C frame of msgspec's; 10,000 levels
# decode on an 8 MB thread stack (measured), far deeper would risk the stack.
MAX_DEPTH = 10_000


@dataclass(frozen=True)
class Limits:
    """Bounds on what one trace file may cost to read; exceeding one is `LimitExceeded`.

    Defaults sit far above real traces (the largest Kineto traces we know expand to a few GB;
    an event is at most a few kB; nesting is 3-4 levels) and far below what hurts the machine.
    """

    max_text_bytes: int = 64 << 30  # text after decompression (a gzip bomb expands 1000x)
    max_buffer_bytes: int = 256 << 20  # text held without an event boundary in it
    # Nesting of arrays/objects (msgspec counts it against Python's recursion limit): a deeper
    # event is skipped as damage; deeper keys outside the event list are refused.
    max_depth: int = 1000


class LimitExceeded(Exception):
    """A `Limits` bound was passed; the message names the bound and the flag that raises it."""


@dataclass
class Damage:
    """Spans of text that were not JSON, skipped between event boundaries."""

    events: int = 0  # events lost in them (boundaries inside a span, plus one)
    offsets: list[int] = field(default_factory=list)  # byte offsets (in the text) of the spans

    def add(self, offset: int, events: int) -> None:
        self.events += events
        self.offsets.append(offset)

NAN = math.nan
T = TypeVar("T")


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` fields the analysis reads: they link runtime calls to GPU work and size copies.

    Read as floats (ids are far below 2**53); a missing field is NaN.
    """

    correlation: float = NAN
    device: float = NAN
    stream: float = NAN
    bytes: float = NAN
    # Kineto's per-kernel estimates, for the GPU summary (report/kernel_mix.py).
    blocks_per_sm: float = msgspec.field(default=NAN, name="blocks per SM")
    occupancy: float = msgspec.field(default=NAN, name="est. achieved occupancy %")
    # `[memory]` instant events' (profile_memory=True): kept by `Columns.add_memory` only.
    mem_bytes: float = msgspec.field(default=NAN, name="Bytes")
    mem_allocated: float = msgspec.field(default=NAN, name="Total Allocated")
    mem_reserved: float = msgspec.field(default=NAN, name="Total Reserved")
    mem_device_type: float = msgspec.field(default=NAN, name="Device Type")
    mem_device_id: float = msgspec.field(default=NAN, name="Device Id")


# The fields kept as columns of every complete event; the memory fields come after them.
ARG_FIELDS = tuple(f for f in Args.__struct_fields__ if not f.startswith("mem_"))
MEMORY_FIELDS = tuple(f for f in Args.__struct_fields__ if f.startswith("mem_"))
# Every field under the name the trace writes it with, in `Args`' order.
ARG_KEYS = tuple(Args.__struct_encode_fields__)
MEMORY_EVENT = "[memory]"
# Estimates kept at float32 (7 digits; they are percents and block ratios): half the memory of
# a column every event carries, where ids and sizes need float64.
ARG_DTYPES: dict[str, type] = {"blocks_per_sm": np.float32, "occupancy": np.float32}
_NO_ARGS = Args()


class LooseArgs(msgspec.Struct, frozen=True, gc=False):
    """`Args` as written, for a chunk where one is not a number: converted by `_number`."""

    correlation: Any = None
    device: Any = None
    stream: Any = None
    bytes: Any = None
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    mem_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    mem_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    mem_device_type: Any = msgspec.field(default=None, name="Device Type")
    mem_device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = NAN
    dur: float = 0.0  # Chrome's reading of a complete event without a duration
    args: Args = _NO_ARGS


class LooseEvent(msgspec.Struct, gc=False):
    """`Event` with untyped `args` fields; turned into an `Event` by `_tidy`."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = NAN
    dur: float = 0.0
    args: LooseArgs = LooseArgs()


class Metadata(msgspec.Struct):
    """The top-level keys other than `traceEvents` that the analysis reads."""

    schemaVersion: Any = None  # noqa: N815 (the file's own key)
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    traceName: Any = None  # noqa: N815
    stallscope: Any = None  # written by `stallscope run` (tool, step source, incomplete step)
    # Written by the scripts that recorded this project's sample traces: the torch, Python and
    # machine (`cpus`: os.cpu_count()) they were recorded with.
    stallscope_sample: Any = None
    stallscope_recording: Any = None
    host_name: Any = None  # Kineto's: the machine that recorded the trace


_COMPLETE = "X".__eq__
_get = {f: attrgetter(f) for f in (*Event.__struct_fields__, *ARG_FIELDS, *MEMORY_FIELDS)}
_INSTANT = "i"
_EVENTS = msgspec.json.Decoder(list[Event], strict=False)
_EVENT = msgspec.json.Decoder(Event, strict=False)
_LOOSE_EVENTS = msgspec.json.Decoder(list[LooseEvent], strict=False)
_LOOSE_EVENT = msgspec.json.Decoder(LooseEvent, strict=False)
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder()
_WS = b" \t\r\n"
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*(,)[ \t\r\n]*\{")
_AT_BYTE = re.compile(r"\(byte (\d+)\)")
_LIST_END = re.compile(rb"\][ \t\r\n]*[,}]")


class _Codes(dict):
    """Value -> code, a new value taking the next code as it is first looked up."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


class Interner:
    """Codes for repeated values (names, categories, ids) that stay stable across chunks.

    Codes are given in order of first appearance. The values are never missing (the event
    structs default every field), so no value needs a missing-value code."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = _Codes()

    def codes(self, values: Iterable[Any], count: int = -1) -> np.ndarray:
        """The code of each value (`count`: how many there are, when known). One dict look-up
        per value in C: a pd.factorize of them cost 2.5x as much."""
        return np.fromiter(map(self.index.__getitem__, values), dtype=np.int32, count=count)

    @property
    def values(self) -> list[Any]:
        return list(self.index)


@dataclass
class Columns:
    """Complete events (`ph: "X"`) of one file as growing per-chunk arrays."""

    cat: Interner = field(default_factory=Interner)
    name: Interner = field(default_factory=Interner)
    pid: Interner = field(default_factory=Interner)
    tid: Interner = field(default_factory=Interner)
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    unreadable: int = 0  # events with missing or wrong-typed fields that could not be read
    bad_times: int = 0  # complete events with a missing, negative or non-finite time
    seen: int = 0  # events of any phase read
    repaired: int = 0  # spans (a chunk, or one event) whose bad UTF-8 or escapes were mended
    damage: Damage = field(default_factory=Damage)  # text that was not JSON, skipped
    # `[memory]` instant events (`add_memory`): ts and the MEMORY_FIELDS, per chunk.
    memory: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, events: list[Event]) -> None:
        # map(attrgetter) rather than comprehensions: this is the per-event hot path.
        self.seen += len(events)
        phases = list(map(_get["ph"], events))
        xs = list(compress(events, map(_COMPLETE, phases)))
        if len(xs) < len(phases) and _INSTANT in phases:  # one scan; traces without: no more
            self.add_memory(events, phases)
        if not xs:
            return
        n = len(xs)
        ts = np.fromiter(map(_get["ts"], xs), dtype=np.float64, count=n)
        dur = np.fromiter(map(_get["dur"], xs), dtype=np.float64, count=n)
        ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
        if not ok.all():
            self.bad_times += int((~ok).sum())
            xs = [e for e, good in zip(xs, ok, strict=True) if good]
            ts, dur, n = ts[ok], dur[ok], len(xs)
        cols = {
            "cat": self.cat.codes(map(_get["cat"], xs), n),
            "name": self.name.codes(map(_get["name"], xs), n),
            "pid": self.pid.codes(map(_get["pid"], xs), n),
            "tid": self.tid.codes(map(_get["tid"], xs), n),
            "ts": ts,
            "dur": dur,
        }
        args = list(map(_get["args"], xs))
        for f in ARG_FIELDS:
            cols[f] = np.fromiter(map(_get[f], args), dtype=ARG_DTYPES.get(f, np.float64),
                                  count=n)
        for key, arr in cols.items():
            self.parts.setdefault(key, []).append(arr)

    def add_memory(self, events: list[Event], phases: list[str]) -> None:
        """Keep the allocator's `[memory]` instant events (torch.profiler's profile_memory):
        their time and the sizes they carry; every other instant event is dropped."""
        mem = [e for e, ph in zip(events, phases, strict=True)
               if ph == _INSTANT and e.name == MEMORY_EVENT and math.isfinite(e.ts)]
        if not mem:
            return
        n = len(mem)
        cols = {"ts": np.fromiter(map(_get["ts"], mem), dtype=np.float64, count=n)}
        args = list(map(_get["args"], mem))
        for f in MEMORY_FIELDS:
            cols[f] = np.fromiter(map(_get[f], args), dtype=np.float64, count=n)
        for key, arr in cols.items():
            self.memory.setdefault(key, []).append(arr)

    def memory_column(self, key: str) -> np.ndarray:
        """A `[memory]` column joined (empty when the trace has none)."""
        parts = self.memory.get(key)
        if not parts:
            return np.empty(0, dtype=np.float64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def column(self, key: str, dtype: type = np.float64) -> np.ndarray:
        """The column joined, its parts let go: read once (`load._build`), so the parts and
        the joined copy are never held together for every column at once."""
        parts = self.parts.pop(key, None)
        if not parts:
            return np.empty(0, dtype=dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass
class Decoded:
    columns: Columns
    metadata: Metadata
    truncated: bool = False  # the text ended inside `traceEvents`; the events before were kept
    array: bool = False  # the array form: a top-level list of events, no metadata
    unclosed: bool = False  # an array form without its closing `]`; every event in it was read
    notes: list[str] = field(default_factory=list)  # what reading the metadata left out


class Read1(Protocol):
    """What `stream_decode` reads: an open file (plain or gzip) or one part of one (split.py)."""

    def read1(self, size: int, /) -> bytes: ...


def stream_decode(fh: Read1, on_progress: Any = None,
                  limits: Limits = Limits(),  # noqa: B008 (frozen)
                  columns: Columns | None = None) -> Decoded | None:
    """Decode an open trace file chunk by chunk; None when it is not shaped like a Kineto trace.

    `on_progress(n_bytes)` is called after each block read, for progress display. Raises
    `LimitExceeded` when the file passes one of `limits`. `columns`: where the events go (a
    fresh `Columns` by default; trace/split.py passes one whose damage stops the read).
    """
    reader = _Reader(fh, on_progress, limits.max_text_bytes)
    blocks = iter(reader)
    head = bytearray()
    start = None
    finder = KeyFinder()
    with depth_allowed(limits.max_depth):
        try:
            for block in blocks:
                head += block
                start = _find_events(head, finder)
                if start is not None:
                    break
                if len(head) > limits.max_buffer_bytes:
                    raise LimitExceeded(
                        "no event list in its first "
                        f"{binary_size(limits.max_buffer_bytes)} of text (the limit on text held "
                        "at once; --max-buffer-mb raises it)")
            else:
                start = _find_events(head, finder, final=True)
        except _NotStreamable:
            return None
        if start is None:
            return None
        if finder.deepest > limits.max_depth:
            raise LimitExceeded(_too_deep("its keys before the event list"))
        cols = columns or Columns()
        buf = bytearray(b"[")
        buf += head[start.events:]
        del block  # not held through the whole read (two blocks: 16 MB of its peak)
        # The object form's metadata is read once, here; the array form has none (None).
        # The header's text is what `head` keeps, cut in place: no copy of it.
        header = None
        if not start.array:
            del head[start.prefix_end:]
            del head[:finder.start]
            header = _Header.read(head)
        del head
        decoded = _decode_events_from(buf, start.events, header, blocks, reader, limits, cols)
        if finder.bom:
            decoded.notes.insert(0, "starts with a UTF-8 byte-order mark, which was skipped")
        return decoded


def _decode_events_from(buf: bytearray, at: int, header: _Header | None,
                        blocks: Iterator[bytearray], reader: _Reader, limits: Limits,
                        cols: Columns) -> Decoded:
    """The events of `buf` (`[` and the text after the list's own `[`, which is at text
    offset `at - 1`) and of the `blocks` after it."""
    retry_at = CHUNK_BYTES  # after a failed cut, try again once this much text is held
    while True:
        while len(buf) < retry_at and (block := next(blocks, None)) is not None:
            buf += block
        block = None  # in `buf` now: not held through the decode as well
        if len(buf) < retry_at:
            break  # end of the file
        cut = _cut(buf, cols, at)
        if cut < 0:  # no clean cut in this much text: read more before trying again
            if len(buf) > limits.max_buffer_bytes:
                raise LimitExceeded(
                    f"{binary_size(limits.max_buffer_bytes)} of text at byte {at:,} without an "
                    "event boundary (the limit on text held at once; --max-buffer-mb raises it)")
            # Geometric (every byte is decoded a bounded number of times), but never more read
            # in than the limit allows: it holds before the memory is taken.
            retry_at = min(2 * len(buf), limits.max_buffer_bytes + 1)
            continue
        buf[cut] = 0x5B  # `[` in place of the comma, and the text before it let go, in place
        del buf[:cut]  # (a new buffer of the rest would hold both for a moment)
        at += cut
        retry_at = CHUNK_BYTES
    decoded = _finish(buf, header, cols, at)
    if header is not None:
        decoded.notes.extend(header.notes)
        cols.repaired += header.mended
    if reader.damaged:
        decoded.truncated = True
    return decoded


@contextlib.contextmanager
def depth_allowed(max_depth: int) -> Iterator[None]:
    """Allow nesting to `max_depth` levels: msgspec counts its levels against Python's
    recursion limit and raises RecursionError past it, which the callers treat as damage."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, max_depth + 200))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


class _Reader:
    """The file's text in blocks. A damaged gzip stream ends the text where it breaks."""

    def __init__(self, fh: Read1, on_progress: Any, max_bytes: int) -> None:
        self.fh = fh
        self.on_progress = on_progress
        self.max_bytes = max_bytes
        self.read = 0
        self.damaged: str | None = None

    def __iter__(self) -> Iterator[bytearray]:
        while True:
            block = bytearray()
            try:
                # read1: a damaged stream raises after the good pieces, which are kept.
                while len(block) < BLOCK_BYTES and (piece := self.fh.read1(BLOCK_BYTES)):
                    block += piece
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                self.damaged = str(exc) or type(exc).__name__
                if block:
                    yield block
                return
            if not block:
                return
            self.read += len(block)
            if self.read > self.max_bytes:
                raise LimitExceeded(
                    f"more than {binary_size(self.max_bytes)} of text (the limit on a file's size "
                    "after decompression; --max-text-gb raises it)")
            if self.on_progress is not None:
                self.on_progress(len(block))
            yield block


@dataclass
class _Start:
    """Where the events begin: just after the opening `[` of the event list."""

    events: int
    prefix_end: int = 0  # object form: the end of the text before `"traceEvents"`
    array: bool = False


def _find_events(head: bytearray, finder: KeyFinder, final: bool = False) -> _Start | None:
    """The start of the event list in the text read so far, or None if not read yet.

    Object form: the top-level `"traceEvents": [` (trace/header.py scans for it). Array form:
    the `[` that opens the file. A UTF-8 byte-order mark before either is skipped.
    """
    if not finder.opened:
        first = finder.open(head)
        if first is None:
            return None  # only whitespace so far
        if head[first] == ord("["):
            return _Start(events=first + 1, array=True)
        if head[first] != ord("{"):
            raise _NotStreamable
    match = finder.find(head, final)
    if match is None:
        return None
    return _Start(events=match.end(), prefix_end=match.start())


@dataclass
class _Header:
    """The object form's metadata, read once from the text before the event list."""

    values: dict[str, Any]
    notes: list[str]
    mended: bool

    @classmethod
    def read(cls, prefix: bytearray) -> _Header:
        """From `prefix`, the text before the event list, which it closes in place."""
        prefix += b'"traceEvents":null}'
        meta = read_metadata(prefix)
        notes = []
        if meta.unreadable:
            notes.append("its keys before the event list are not JSON: the trace's metadata "
                         "(devices, ranks, stallscope's own figures) was not read")
        if meta.dropped:
            notes.append(f"its metadata {', '.join(meta.dropped)} was not read (over "
                         f"{binary_size(MAX_VALUE_BYTES)}, or not JSON)")
        return cls(meta.values, notes, meta.mended)

    def metadata(self, tail: dict[str, Any] | None = None) -> Metadata:
        return Metadata(**{**self.values, **(tail or {})})


class _NotStreamable(Exception):
    pass


def _cut(buf: bytearray, cols: Columns, at: int) -> int:
    """Decode events from the front of `buf` (which starts with `[`) up to a clean cut.

    Returns the offset of the comma where decoding stopped (every event before it was read,
    damage skipped), or -1 if no candidate cut within `_MAX_TRIES` ended after a whole event.
    `at` is the text offset of `buf[1]`, for naming where damage is.
    """
    pos = len(buf)
    for _ in range(_MAX_TRIES):
        comma = _last_boundary(buf, pos)
        if comma < 0:
            return -1
        stop = _drain(buf, comma, cols, at, final=False)
        if stop > 0:
            return stop
        pos = comma  # a `}, {` inside a string: try an earlier one
    return -1


def _syntax_error(buf: bytearray, end: int, lo: int = 0) -> int | None:
    """Where the list `buf[lo:end]` + `]` stops being JSON: the byte msgspec names; `end` for
    text that merely ends early (a cut inside an event); -1 when the place is unknown (nesting
    too deep to parse); None when it is JSON after all (refused for its types or its UTF-8
    only). One pass over the text up to the place it names."""
    try:
        _on_list(buf, lo, end, _RAWS.decode)
    except msgspec.DecodeError as exc:
        match = _AT_BYTE.search(str(exc))
        return lo + int(match.group(1)) if match else end
    except (msgspec.ValidationError, UnicodeDecodeError):
        return None
    except RecursionError:
        return -1
    return None


def _on_list(buf: bytearray, lo: int, end: int, read: Callable[[memoryview], T]) -> T:
    """`read` of `buf[lo:end + 1]` as a JSON list: `[` at `lo` (the list's own `[`, or the
    comma of a boundary) and `]` at `end`, both put back after. No copy of the text."""
    first, last = buf[lo], buf[end]
    buf[lo], buf[end] = 0x5B, 0x5D  # [ ]
    try:
        with memoryview(buf) as view:
            return read(view[lo:end + 1])
    finally:
        buf[lo], buf[end] = first, last


def _drain(buf: bytearray, end: int, cols: Columns, at: int, lo: int = 0,
           final: bool = True) -> int:
    """Every readable event in the list `buf[lo + 1:end]`, damage skipped; where it stopped.

    `buf[lo]` is the `[` of the list or the comma of a boundary; `end` is where a `]` goes.
    The text is read in spans: a span from `lo` that decodes is kept; else msgspec names the
    byte where it breaks, the events before it are kept, the text up to the next boundary
    after it is skipped and counted (or, when a lone surrogate escape was all that was wrong
    with it, mended alone and kept), and the next span starts there. Each span costs passes
    over its own text only, so the time is linear in the text however dense the damage.

    Not `final` (a candidate cut): text that merely runs on past `end` is not damage but a cut
    inside an event; the offset of the boundary before it is returned (0: nothing was read),
    for the caller to read again with more text. Else `end`.
    """
    kept: list[Event] = []
    while lo < end:
        if (events := _span_events(buf, lo, end, cols, mend=False)) is not None:
            kept += events
            break
        broken = _syntax_error(buf, end, lo)
        if broken is None:  # JSON after all: odd UTF-8, or no field typed as expected
            kept += _span_events(buf, lo, end, cols, mend=True) or _lenient_span(buf, lo, end,
                                                                              cols)
            break
        if broken == end and not final:
            cols.add(kept)
            return lo
        if lo < broken < end:
            good = _last_whole(buf, lo, broken, cols, kept)
            after = _BOUNDARY.search(buf, max(broken, good) + 1, end)
        else:  # the place is unknown (too deep, or the text runs on to the end): searched
            good = _first_bad(buf, lo, end, cols, kept)
            after = _BOUNDARY.search(buf, good + 1, end)
        resume = after.start(1) if after else end
        _skip(buf, good, resume, cols, at, kept)
        lo = resume
    cols.add(kept)
    return end


def _span_events(buf: bytearray, lo: int, end: int, cols: Columns,
                 mend: bool) -> list[Event] | None:
    """The events of the list `buf[lo:end]` + `]` (see `_on_list`), or None if it is not a
    complete list of events. `mend`: repair bad UTF-8 and lone surrogates (a pass over the
    span); without it a span with either is None, for the caller to find where."""
    return _on_list(buf, lo, end, lambda text: _events_in(text, cols, mend))


def _lenient_span(buf: bytearray, lo: int, end: int, cols: Columns) -> list[Event]:
    """Events one by one, for a span that is JSON yet refused as a list of events."""
    try:
        raws = _on_list(buf, lo, end, _RAWS.decode)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return []
    return lenient_events(raws, cols)


def _skip(buf: bytearray, good: int, resume: int, cols: Columns, at: int,
          kept: list[Event]) -> None:
    """The damaged text between the boundaries `good` and `resume`: kept when mending its lone
    surrogate escapes (a name cut mid-character) is all it needs, else counted as damage.
    Only this text is searched and mended, never the text after it."""
    text = bytes(buf[good + 1:resume])
    if text.find(b"\\ud") >= 0 or text.find(b"\\uD") >= 0:
        repaired, n = _LONE_SURROGATE.subn(rb"\\ufffd", text)
        if n and (events := _events_in(b"[" + repaired + b"]", cols, mend=True)) is not None:
            kept += events
            cols.repaired += 1
            return
    lost = len(_boundaries(buf, good + 1, resume)) + 1
    cols.damage.add(at + good, lost)


def _last_whole(buf: bytearray, lo: int, before: int, cols: Columns,
                kept: list[Event]) -> int:
    """Decode into `kept` the events of `buf[lo:]` up to the last boundary before `before` up
    to which it reads as whole events; that boundary's offset, or `lo` when none does.

    The text is JSON up to `before` (msgspec stopped there), so the last boundary or one of
    the few before it (one inside a string) is the answer; else bisection over the
    boundaries from `lo` (a bounded number of passes over this span's text)."""
    pos = before
    for _ in range(3):
        comma = _last_boundary(buf, pos, lo)
        if comma <= lo:
            return lo
        if (events := _span_events(buf, lo, comma, cols, mend=True)) is not None:
            kept += events
            return comma
        pos = comma
    bounds = _boundaries(buf, lo + 1, pos)
    low, high, found = 0, len(bounds) - 1, None  # prefixes read as events up to the damage
    while low <= high:
        mid = (low + high) // 2
        events = _span_events(buf, lo, bounds[mid], cols, mend=True)
        if events is not None:
            found, low = (bounds[mid], events), mid + 1
        else:
            high = mid - 1
    if found is None:
        return lo
    kept += found[1]
    return found[0]


def _first_bad(buf: bytearray, lo: int, end: int, cols: Columns, kept: list[Event]) -> int:
    """For a span whose damage msgspec could not place: decode into `kept` the events up to
    the last boundary before the damage, and return it (`lo` when there is none).

    The boundaries from `lo` are tried at growing distances (1, 2, 4, ... boundaries on) until
    the text up to one is not JSON, then bisected: the passes cost a few times the text up to
    the damage, and nothing of the text after it."""
    found = _BOUNDARY.finditer(buf, lo + 1, end)
    bounds: list[int] = []
    good, bad, step = -1, None, 1  # indices into bounds; -1 stands for `lo`
    while bad is None:
        want = good + step
        while len(bounds) <= want and (match := next(found, None)) is not None:
            bounds.append(match.start(1))
        if len(bounds) <= want:  # past the last boundary: the damage is before `end`
            bad = len(bounds)
            break
        if _syntax_error(buf, bounds[want], lo) is None:
            good, step = want, step * 2
        else:
            bad = want
    while bad - good > 1:
        mid = (good + bad) // 2
        if _syntax_error(buf, bounds[mid], lo) is None:
            good = mid
        else:
            bad = mid
    if good < 0:
        return lo
    comma = bounds[good]
    kept += _span_events(buf, lo, comma, cols, mend=True) or _lenient_span(buf, lo, comma, cols)
    return comma


def _boundaries(buf: bytearray, lo: int, hi: int) -> list[int]:
    """Offsets of the commas of every `}, {` in `buf[lo:hi]`, in order."""
    return [m.start(1) for m in _BOUNDARY.finditer(buf, lo, hi)]


def _decode_events(buf: bytearray, end: int, cols: Columns) -> list[Event] | None:
    """The events in `buf[:end]` + `]`, or None if that is not a complete list of events
    whose text needs no mending (then `_drain` reads it)."""
    return _span_events(buf, 0, end, cols, mend=False)


def _events_in(text: bytes | memoryview, cols: Columns, mend: bool = True) -> list[Event] | None:
    try:
        return _typed_events(text, cols, mend)
    except RecursionError:  # nested deeper than the limit: damage, found by the caller
        return None


def _typed_events(text: bytes | memoryview, cols: Columns, mend: bool) -> list[Event] | None:
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:  # an odd field somewhere
        try:  # most often an id written as text ("0x0"): read the args untyped
            return list(map(_tidy, _LOOSE_EVENTS.decode(text)))
        except msgspec.ValidationError:
            pass
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # odd text too
            return _mended(text, exc, cols) if mend else None
        try:  # elsewhere: split, then read event by event
            raws = _RAWS.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            return None
        return lenient_events(raws, cols)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        return _mended(text, exc, cols) if mend else None


def _mended(text: bytes | memoryview, exc: Exception, cols: Columns) -> list[Event] | None:
    """The events of a span whose text msgspec refused, once mended; None if it cannot be.

    Called on a span known to hold no damage but this (or on one damaged event), so the
    pass over the text it costs is bounded by the span's own size."""
    if isinstance(exc, UnicodeDecodeError):  # a name with bytes that are not UTF-8: keep it
        repaired = bytes(text).decode("utf-8", "replace").encode("utf-8")
    else:
        # Not a whole list (a cut inside an event), or an escaped lone surrogate ("\ud800",
        # from a name cut mid-character), which msgspec refuses: mend that and try again.
        raw = bytes(text)
        if raw.find(b"\\ud") < 0 and raw.find(b"\\uD") < 0:  # no surrogate escape: no regex
            return None
        repaired, n = _LONE_SURROGATE.subn(rb"\\ufffd", raw)
        if not n:
            return None
    events = _events_in(repaired, cols)
    if events is not None:
        cols.repaired += 1
    return events


def lenient_events(items: list[Any], cols: Columns) -> list[Event]:
    """Events one by one, for a chunk where some field is odd: keep every event that reads.

    `items` are undecoded events (msgspec.Raw) or decoded JSON values. A field of the wrong type
    costs only itself (`_salvage`); an event that cannot be read at all is counted.
    """
    events = []
    for item in items:
        if isinstance(item, msgspec.Raw):
            try:
                events.append(_EVENT.decode(item))
                continue
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
                pass
            try:
                events.append(_tidy(_LOOSE_EVENT.decode(item)))
                continue
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
                pass
            try:
                item = _ANY.decode(item)
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError,
                    RecursionError):
                cols.unreadable += 1  # e.g. a number out of range (1e999)
                continue
        else:
            try:
                events.append(msgspec.convert(item, Event, strict=False))
                continue
            except (msgspec.ValidationError, TypeError):
                pass
        event = _salvage(item)
        if event is None:
            cols.unreadable += 1
        else:
            events.append(event)
    return events


def _number(value: Any) -> float:
    """An `args` id or size as a float: numbers, decimal or hex text (`"0x7"`); else NaN."""
    if isinstance(value, bool) or value is None:
        return NAN
    try:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            text = value.strip()
            try:
                return float(text)
            except ValueError:
                return float(int(text, 0))  # 0x.., 0o.., 0b..
    except (ValueError, OverflowError):
        pass
    return NAN


def _loose_args(values: Any) -> Args:
    return Args(*(_number(getattr(values, f)) for f in Args.__struct_fields__))


def _tidy(event: LooseEvent) -> Event:
    """A `LooseEvent` as an `Event`, its `args` converted to numbers."""
    return Event(event.ph, event.cat, event.name, event.pid, event.tid, event.ts, event.dur,
                 _loose_args(event.args))


_FIELD_TYPES: dict[str, Any] = {
    "ph": str, "cat": str, "name": str, "pid": int | str, "tid": int | str,
    "ts": float, "dur": float,
}
_NEEDED = frozenset({"ph", "pid", "tid"})  # without these an event has no phase or thread


def _salvage(item: Any) -> Event | None:
    """An event whose fields are read one by one: a field of the wrong type is dropped alone.

    A dropped name or category reads as "" (a number as its text); a dropped time or duration as
    NaN, so that a complete event is counted with the bad times; a dropped `args` field as NaN.
    An odd phase, process or thread leaves nothing to place the event by: None.
    """
    if not isinstance(item, dict):
        return None
    fields: dict[str, Any] = {}
    for key, kind in _FIELD_TYPES.items():
        if key not in item:
            continue
        value = item[key]
        try:
            fields[key] = msgspec.convert(value, kind, strict=False)
        except (msgspec.ValidationError, TypeError):
            if key in _NEEDED:
                return None
            if kind is float:
                fields[key] = NAN
            elif isinstance(value, int | float) and not isinstance(value, bool):
                fields[key] = str(value)
    args = item.get("args")
    if isinstance(args, dict):
        fields["args"] = Args(*(_number(args.get(f)) for f in ARG_KEYS))
    return Event(**fields)


def _last_boundary(buf: bytearray, before: int, floor: int = 0) -> int:
    """Offset of the last comma in `}, {` (whitespace allowed) that ends before `before` and
    starts at `floor` or after; -1 if there is none.

    Searched in windows growing back from `before`, so a long run of whitespace costs one
    regex pass, not a Python loop per byte."""
    width = 1 << 16
    while True:
        lo = max(floor, before - width)
        found = _boundaries(buf, lo, before)
        if found:
            return found[-1]
        if lo == floor:
            return -1
        width *= 4


def _finish(buf: bytearray, header: _Header | None, cols: Columns, at: int) -> Decoded:
    """The end of the file: the last events, the closing `]` and any keys after the array."""
    if header is None:
        return _finish_array(buf, cols, at)
    last = _end_of_text(buf, len(buf))
    if last and buf[last - 1] == ord("}"):
        # The `]` that closes the event list is followed by `}` or `, "key": ...}`; only the
        # last few such `]` within the tail are tried (each costs a decode of what follows it).
        for close in _list_ends_backwards(buf, max(0, len(buf) - _TAIL_BYTES), _TAIL_TRIES):
            tail = bytes(buf[close + 1:]).strip(_WS)
            body = tail[1:] if tail.startswith(b",") else tail
            if not (body == b"}" or (tail.startswith(b",") and body.endswith(b"}"))):
                continue
            try:  # only the keys after the list: the header was read once, at its end
                after = read_metadata(b"{" + body)
            except RecursionError:
                raise LimitExceeded(_too_deep("its keys after the event list")) from None
            if after.unreadable:
                continue
            if close > 1:
                # Most often the list is whole up to here: one decode reads it. Else, unless an
                # earlier `]` ends the list (this one is in the keys after it), read what reads.
                if (events := _decode_events(buf, close, cols)) is not None:
                    cols.add(events)
                elif _closes_early(buf, close):
                    continue
                else:
                    _drain(buf, close, cols, at)
            return Decoded(cols, header.metadata(after.values))
    # No closing bracket: the file was cut off. Keep every whole event before the cut.
    _keep_whole_events(buf, cols, at)
    return Decoded(cols, header.metadata(), truncated=True)


def _list_ends_backwards(buf: bytearray, lo: int, most: int) -> Iterator[int]:
    """Starts of the `_LIST_END` matches in `buf[lo:]`, last first, at most `most` of them.

    Searched in windows growing back from the end of the text, so only the tail that is tried
    is scanned (a 1 MB tail holds tens of thousands of `],` inside events' args). A match holds
    no `]` but its first byte, so the matches from any offset on are those of a scan from `lo`.
    """
    hi, width = len(buf), 1 << 12
    while hi > lo and most > 0:
        start = max(lo, hi - width)
        found = []
        for match in _LIST_END.finditer(buf, start):
            if match.start() >= hi:
                break
            found.append(match.start())
        yield from reversed(found[-most:])
        most -= len(found)
        hi, width = start, width * 4


def _closes_early(buf: bytearray, end: int) -> bool:
    """Whether `buf[:end]` + `]` is a whole list followed by more text (the list ended at an
    earlier `]`), as opposed to a list that is whole or damaged inside."""
    saved = buf[end]
    buf[end] = ord("]")
    try:
        with memoryview(buf) as view:
            _RAWS.decode(view[: end + 1])
    except msgspec.DecodeError as exc:
        return "trailing characters" in str(exc)
    except (msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return False
    finally:
        buf[end] = saved
    return False


def _finish_array(buf: bytearray, cols: Columns, at: int) -> Decoded:
    """The end of an array-form file: `]`, or none (which the Chrome format allows)."""
    end = _end_of_text(buf, len(buf))
    closed = end > 0 and buf[end - 1] == ord("]")
    if closed:
        del buf[end:]  # whitespace after the array
        if (events := _decode_events(buf, end - 1, cols)) is not None:
            cols.add(events)
            return Decoded(cols, Metadata(), array=True)
        end = _end_of_text(buf, end - 1)  # e.g. a trailing comma before `]`
    whole = _keep_whole_events(buf, cols, at, end)
    # A comma before `]` is forgiven; a missing `]` is said (the last step may be cut short).
    return Decoded(cols, Metadata(), truncated=not whole, array=True,
                   unclosed=whole and not closed)


def _keep_whole_events(buf: bytearray, cols: Columns, at: int, end: int | None = None) -> bool:
    """Every whole event in `buf[:end]`, text cut off at `end`. True if none was cut off.

    The text may end just after an event (with or without a comma): then every event is read,
    damage inside skipped. Otherwise the last event is incomplete, and the events before its
    `}, {` are kept.
    """
    end = _end_of_text(buf, len(buf) if end is None else end)
    if end > 0 and buf[end - 1] == ord(","):
        end = _end_of_text(buf, end - 1)
    lo = 0
    if end > 1 and buf[end - 1] == ord("}"):
        del buf[end:]
        buf += b"]"
        lo = _drain(buf, end, cols, at, final=False)
        if lo == end:  # whole to the end, damage inside skipped
            return True
    # The text from `lo` runs on past its end: the last event is cut off. The last boundary
    # may be inside that event (in a string): the few before it are tried.
    pos = end
    for _ in range(_MAX_TRIES):
        last = _last_boundary(buf, pos, lo)
        if last <= lo:
            break
        if _syntax_error(buf, last, lo) != last:  # whole, or damaged before it: read what reads
            _drain(buf, last, cols, at, lo)
            break
        pos = last
    return False


def _end_of_text(buf: bytearray, end: int) -> int:
    """`end` moved back over whitespace (in windows: a long run costs no Python loop)."""
    while end > 0:
        lo = max(0, end - (1 << 16))
        kept = bytes(buf[lo:end]).rstrip(_WS)
        if kept:
            return lo + len(kept)
        end = lo
    return 0


def _too_deep(where: str) -> str:
    return (f"{where} nest deeper than the limit (--max-depth raises it; the default is "
            f"{Limits().max_depth:,} levels)")
