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

Anything the streaming path does not understand (a top level that is not an object, no
`traceEvents` key) is handed to the caller as `None`, which then decodes the whole document to
say precisely what is wrong.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, BinaryIO

import msgspec
import numpy as np
import pandas as pd

CHUNK_BYTES = 8 << 20  # text per decoded chunk: large enough to amortise, small enough to cache
BLOCK_BYTES = 8 << 20  # text read per file read
_MAX_TRIES = 8  # failed cuts before more text is read in (a cut inside a huge event)

NAN = math.nan


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` fields the analysis reads: they link runtime calls to GPU work and size copies.

    Read as floats (ids are far below 2**53); a missing field is NaN.
    """

    correlation: float = NAN
    device: float = NAN
    stream: float = NAN
    bytes: float = NAN


ARG_FIELDS = tuple(Args.__struct_fields__)
_NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = NAN
    dur: float = 0.0  # Chrome's reading of a complete event without a duration
    args: Args = _NO_ARGS


class Metadata(msgspec.Struct):
    """The top-level keys other than `traceEvents` that the analysis reads."""

    schemaVersion: Any = None  # noqa: N815 (the file's own key)
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    traceName: Any = None  # noqa: N815
    stallscope: Any = None  # written by `stallscope run` (tool, step source, incomplete step)


_COMPLETE = "X".__eq__
_get = {f: attrgetter(f) for f in (*Event.__struct_fields__, *ARG_FIELDS)}
_EVENTS = msgspec.json.Decoder(list[Event], strict=False)
_EVENT = msgspec.json.Decoder(Event, strict=False)
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder()
_META = msgspec.json.Decoder(Metadata)
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"


class Interner:
    """Codes for repeated values (names, categories, ids) that stay stable across chunks."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def codes(self, values: list[Any]) -> np.ndarray:
        if not values:
            return np.empty(0, dtype=np.int32)
        local, uniques = pd.factorize(np.array(values, dtype=object))
        table = np.fromiter(
            (self.index.setdefault(u, len(self.index)) for u in uniques),
            dtype=np.int32,
            count=len(uniques),
        )
        return table[local]

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
    repaired: int = 0  # chunks whose invalid UTF-8 was replaced by U+FFFD

    def add(self, events: list[Event]) -> None:
        # map(attrgetter) rather than comprehensions: this is the per-event hot path.
        self.seen += len(events)
        xs = list(compress(events, map(_COMPLETE, map(_get["ph"], events))))
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
            "cat": self.cat.codes(list(map(_get["cat"], xs))),
            "name": self.name.codes(list(map(_get["name"], xs))),
            "pid": self.pid.codes(list(map(_get["pid"], xs))),
            "tid": self.tid.codes(list(map(_get["tid"], xs))),
            "ts": ts,
            "dur": dur,
        }
        args = list(map(_get["args"], xs))
        for f in ARG_FIELDS:
            cols[f] = np.fromiter(map(_get[f], args), dtype=np.float64, count=n)
        for key, arr in cols.items():
            self.parts.setdefault(key, []).append(arr)

    def column(self, key: str, dtype: type = np.float64) -> np.ndarray:
        parts = self.parts.get(key)
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


@dataclass
class Decoded:
    columns: Columns
    metadata: Metadata
    truncated: bool = False  # the text ended inside `traceEvents`; the events before were kept


def stream_decode(fh: BinaryIO, on_progress: Any = None) -> Decoded | None:
    """Decode an open trace file chunk by chunk; None when it is not shaped like a Kineto trace.

    `on_progress(n_bytes)` is called after each block read, for progress display.
    """
    reader = _Reader(fh, on_progress)
    blocks = iter(reader)
    head = bytearray()
    match = None
    try:
        for block in blocks:
            search_from = max(0, len(head) - 32)
            head += block
            match = _find_events_key(head, search_from)
            if match is not None:
                break
    except _NotStreamable:
        return None
    if match is None:
        return None
    prefix = bytes(head[: match.start()])
    buf = bytearray(b"[")
    buf += head[match.end():]
    del head
    cols = Columns()
    while True:
        while len(buf) < CHUNK_BYTES and (block := next(blocks, None)) is not None:
            buf += block
        if len(buf) < CHUNK_BYTES:
            break  # end of the file
        cut = _cut(buf, cols)
        if cut < 0:  # no clean cut in this much text: read more before trying again
            block = next(blocks, None)
            if block is None:
                break
            buf += block
            continue
        buf = bytearray(b"[") + buf[cut + 1:]
    decoded = _finish(buf, prefix, cols)
    if reader.damaged:
        decoded.truncated = True
    return decoded


class _Reader:
    """The file's text in blocks. A damaged gzip stream ends the text where it breaks."""

    def __init__(self, fh: BinaryIO, on_progress: Any) -> None:
        self.fh = fh
        self.on_progress = on_progress
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
            if self.on_progress is not None:
                self.on_progress(len(block))
            yield block


def _find_events_key(head: bytearray, search_from: int) -> re.Match[bytes] | None:
    """The top-level `"traceEvents": [` in the text read so far, or None if not read yet."""
    lead = bytes(head[:64]).lstrip(_WS)
    if lead and not lead.startswith(b"{"):
        raise _NotStreamable
    for match in _KEY.finditer(head, search_from):
        prefix = bytes(head[: match.start()])
        try:  # the key is top level exactly when the text before it is an open object
            _ANY.decode(prefix + b'"traceEvents":null}')
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            continue
        return match
    return None


class _NotStreamable(Exception):
    pass


def _cut(buf: bytearray, cols: Columns) -> int:
    """Decode events from the front of `buf` (which starts with `[`) up to a clean cut.

    Returns the offset of the comma that ended the decoded events, or -1 if no candidate cut
    within `_MAX_TRIES` gave a complete list of events.
    """
    pos = len(buf)
    for _ in range(_MAX_TRIES):
        comma = _last_boundary(buf, pos)
        if comma < 0:
            return -1
        events = _decode_events(buf, comma, cols)
        if events is not None:
            cols.add(events)
            return comma
        pos = comma
    return -1


def _decode_events(buf: bytearray, end: int, cols: Columns) -> list[Event] | None:
    """The events in `buf[:end]` + `]`, or None if that is not a complete JSON list."""
    saved = buf[end]
    buf[end] = ord("]")
    try:
        with memoryview(buf) as view:
            return _events_in(view[: end + 1], cols)
    finally:
        buf[end] = saved


def _events_in(text: bytes | memoryview, cols: Columns) -> list[Event] | None:
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:  # an odd field somewhere: split, then read event by event
        try:
            raws = _RAWS.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            return None
        return lenient_events(raws, cols)
    except UnicodeDecodeError:  # a name with bytes that are not UTF-8: keep it, marked
        repaired = bytes(text).decode("utf-8", "replace").encode("utf-8")
    except msgspec.DecodeError:
        # Not a whole list (a cut inside an event), or an escaped lone surrogate ("\ud800",
        # from a name cut mid-character), which msgspec refuses: mend that and try again.
        repaired, n = _LONE_SURROGATE.subn(rb"\\ufffd", bytes(text))
        if not n:
            return None
    events = _events_in(repaired, cols)
    if events is not None:
        cols.repaired += 1
    return events


def lenient_events(items: list[Any], cols: Columns) -> list[Event]:
    """Events one by one, for a chunk where some field is odd: keep every event that reads.

    `items` are undecoded events (msgspec.Raw) or decoded JSON values. An event whose `args`
    alone are odd is kept without them; one that cannot be read at all is counted.
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
                item = _ANY.decode(item)
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
                cols.unreadable += 1  # e.g. a number out of range (1e999)
                continue
        try:
            events.append(msgspec.convert(item, Event, strict=False))
            continue
        except (msgspec.ValidationError, TypeError):
            pass
        if isinstance(item, dict) and "args" in item:  # keep the event, drop its odd args
            try:
                bare = {k: v for k, v in item.items() if k != "args"}
                events.append(msgspec.convert(bare, Event, strict=False))
                continue
            except (msgspec.ValidationError, TypeError):
                pass
        cols.unreadable += 1
    return events


def _last_boundary(buf: bytearray, before: int) -> int:
    """Offset of the last comma in `}, {` (whitespace allowed) that starts before `before`."""
    pos = before
    while True:
        brace = buf.rfind(b"{", 0, pos)
        if brace <= 0:
            return -1
        j = brace - 1
        while j > 0 and buf[j] in _WS:
            j -= 1
        if buf[j] == ord(","):
            k = j - 1
            while k > 0 and buf[k] in _WS:
                k -= 1
            if buf[k] == ord("}"):
                return j
        pos = brace


def _finish(buf: bytearray, prefix: bytes, cols: Columns) -> Decoded:
    """The end of the file: the last events, the closing `]` and any keys after the array."""
    pos = len(buf)
    while True:
        close = buf.rfind(b"]", 0, pos)
        if close <= 0:
            break
        tail = bytes(buf[close + 1:]).strip(_WS)
        body = tail[1:] if tail.startswith(b",") else tail
        if body.endswith(b"}") and (body == b"}" or tail.startswith(b",")):
            try:
                meta = _META.decode(prefix + b'"traceEvents":null' + (b"," if body != b"}"
                                                                     else b"") + body)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                meta = None
            if meta is not None:
                events = _decode_events(buf, close, cols) if close > 1 else []
                if events is not None:
                    cols.add(events)
                    return Decoded(cols, meta)
        pos = close
    # No closing bracket: the file was cut off. Keep every whole event before the cut.
    _cut(buf, cols)
    return Decoded(cols, _prefix_metadata(prefix), truncated=True)


def _prefix_metadata(prefix: bytes) -> Metadata:
    try:
        return _META.decode(prefix + b'"traceEvents":null}')
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return Metadata()
