"""Decode one large plain trace file on several cores: its event list cut into byte ranges at
event boundaries, each range read by the streaming decoder (trace/decode.py) in its own
process, the columns joined in file order.

Why: msgspec and the column building hold the GIL, so one file reads at one core's pace (about
150-250 MB of text a second here); a 3 GB trace took 34 s. A part costs the same work per byte
as the whole, so N cores read a file about N times as fast, less one process's start.

Why it is exact: a part is given to a process as a document of its own (`{"traceEvents":[` +
its bytes + `]}`). A part that decodes without damage is a whole number of complete list
elements, so where it ends the file's text is between two events of the list, exactly as at its
start: by induction from the first part, which begins at the top of the file, every cut is a
true event boundary and the parts together read the events the sequential decoder reads. A
part with damage (text that is not JSON, bad UTF-8 mended) proves nothing about its end, so
then the whole file is read again sequentially, where recovery is defined (`None` here).
Truncation in the last part is the file's own end and is kept as the sequential reader says it.
"""

from __future__ import annotations

import pickle
import signal
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from stallscope import heap
from stallscope.trace.decode import (
    _BOUNDARY,
    Columns,
    Damage,
    Decoded,
    Interner,
    Limits,
    Metadata,
    _find_events,
    stream_decode,
)
from stallscope.trace.header import KeyFinder

# Smallest file read in parts: below it the processes' start and the join of their columns are
# not repaid (a whole attempt that stopped at damage cost 0.08-0.10 s on 64 MB, sequential read
# 1.38 s: docs/performance.md). Each part is at least MIN_PART_BYTES.
PARALLEL_MIN_BYTES = 64 << 20
MIN_PART_BYTES = 32 << 20
# Text searched after a nominal cut for the next `}, {`: an event is rarely over a few kB.
SEARCH_BYTES = 1 << 20
# Text searched for where the event list starts: Kineto writes a few kB of metadata before it.
HEAD_BYTES = 4 << 20
# A part's peak memory per byte of its text, plus a process's own: a margin over what the 302 MB
# tiled trace measured (its events and args tables 31 MB, 0.10x the text; one process's peak
# 0.86x the text with pandas and the analysis, which a part does not hold).
PART_PEAK_PER_BYTE = 0.3
PART_BASE_BYTES = 40 << 20
_CODED = ("cat", "name", "pid", "tid")


@dataclass(frozen=True)
class Part:
    """`lead` + the file's bytes `[lo, hi)` + `trail`: one part as a document of its own."""

    lo: int
    hi: int
    lead: bytes
    trail: bytes


class _PartFile:
    """A part read like the open file `stream_decode` expects (it only calls `read1`)."""

    def __init__(self, path: Path, part: Part) -> None:
        self._fh = path.open("rb")
        self._fh.seek(part.lo)
        self._left = part.hi - part.lo
        self._pending = [part.lead, None, part.trail]  # None: the file's bytes

    def read1(self, size: int) -> bytes:
        while self._pending:
            head = self._pending[0]
            if head is None:
                if self._left > 0:
                    data = self._fh.read(min(size, self._left))
                    if data:
                        self._left -= len(data)
                        return data
                self._pending.pop(0)  # the file ended (or was cut) early: the trail next
                continue
            self._pending.pop(0)
            if head:
                return head
        return b""

    def close(self) -> None:
        self._fh.close()


def plan_parts(path: Path, size: int, count: int) -> list[Part] | None:
    """`count` parts of about equal size cut at `}, {` boundaries in the event list; None when
    the file is not an object or array of events with such boundaries where the cuts fall."""
    with path.open("rb") as fh:
        head = bytearray(fh.read(min(size, HEAD_BYTES)))
        try:
            start = _find_events(head, KeyFinder(), final=len(head) == size)
        except Exception:  # not shaped like a trace: the sequential reader says why
            return None
        if start is None:
            return None
        cuts: list[int] = []
        for k in range(1, count):
            at = max(start.events, size * k // count, cuts[-1] + 1 if cuts else 0)
            fh.seek(at)
            found = _BOUNDARY.search(fh.read(SEARCH_BYTES))
            if found is None:
                return None
            cuts.append(at + found.start(1))
    if len(set(cuts)) != len(cuts) or cuts[-1] >= size - 1:
        return None
    lead, close = (b"[", b"]") if start.array else (b'{"traceEvents":[', b"]}")
    bounds = [(0, cuts[0], b"")] + [(c + 1, d, lead) for c, d in pairwise(cuts)]
    parts = [Part(lo, hi, head_text, close) for lo, hi, head_text in bounds]
    return [*parts, Part(cuts[-1] + 1, size, lead, b"")]


def part_count(size: int, cores: int) -> int:
    """Processes to read a `size`-byte file with: the cores, parts of at least MIN_PART_BYTES,
    and as many part peaks as fit in 80% of the memory available now."""
    if cores < 2 or size < PARALLEL_MIN_BYTES:
        return 1
    import multiprocessing  # a large file only: a small one's start pays for neither import

    import psutil

    if multiprocessing.current_process().daemon:
        return 1
    by_size = size // MIN_PART_BYTES
    per_part = PART_BASE_BYTES + PART_PEAK_PER_BYTE * size / cores
    fits = int(psutil.virtual_memory().available * 0.8 // per_part)
    return max(1, min(cores, by_size, fits))


def _clean(decoded: Decoded | None, last: bool) -> bool:
    """Whether a part proves its end is an event boundary (see the module's docstring)."""
    if decoded is None:
        return False
    cols = decoded.columns
    if cols.damage.events or cols.repaired:
        return False
    return last or not (decoded.truncated or decoded.unclosed)


class _Damaged(Exception):
    """Raised in a worker at a part's first damage: the part can prove nothing (see above)."""


class _StopAtDamage(Damage):
    """A part's damage record that ends the part's read at once: the whole file is read again
    sequentially, so every second spent on a damaged part is lost (a densely damaged 64 MB
    file would otherwise cost one part's read more than the sequential read alone)."""

    def add(self, offset: int, events: int) -> None:
        raise _Damaged


def _worker(conn: Any, path: str, part: Part, limits: Limits, counter: Any,
            damaged: Any) -> None:
    """One part, in its own process: its `Decoded` sent back (None if it could not be read),
    its bytes read added to the shared `counter` for the progress line. Ctrl-C reaches the
    whole process group: the parent handles it and stops the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def count(nbytes: int) -> None:
        with counter.get_lock():
            counter.value += nbytes

    try:
        result = _read(Path(path), part, count, limits, Columns(damage=_StopAtDamage()))
    except Exception:  # damage, or what the sequential reader meets again and says
        result = None
    if result is None:
        damaged.value = 1  # the parent stops waiting for the other parts
    _send(conn, result)
    conn.close()


def _send(conn: Any, value: Any) -> None:
    """`value` pickled with its arrays out of band, each written straight from its memory: a
    plain `send` would hold the whole pickle beside the arrays here (16 MB of a 150 MB part),
    and the receiver the pickle beside the arrays it unpickles."""
    heap.trim()  # the part's events as structs are freed: their memory back before the send
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    conn.send([len(head), *(v.nbytes for v in views)])
    conn.send_bytes(head)
    for view in views:
        conn.send_bytes(view)


def _receive(conn: Any) -> Any:
    """What `_send` sent; each array's memory received into a buffer of its own (writable, as
    the columns are later used)."""
    sizes = conn.recv()
    head = bytearray(sizes[0])
    conn.recv_bytes_into(head)
    buffers = []
    for size in sizes[1:]:
        buf = bytearray(size)
        conn.recv_bytes_into(buf)
        buffers.append(buf)
    return pickle.loads(head, buffers=buffers)


def _read(path: Path, part: Part, on_progress: Any, limits: Limits,
          columns: Columns | None = None) -> Decoded | None:
    fh = _PartFile(path, part)
    try:
        return stream_decode(fh, on_progress, limits, columns)
    finally:
        fh.close()


class Reading:
    """One file's parts being read, each in a worker process started at once.

    Started early (`start`), the workers read while this process imports the analysis (pandas,
    the rules: about 0.7 s), and they are forked while it is small, so each costs little memory.
    """

    def __init__(self, path: Path, parts: list[Part], limits: Limits) -> None:
        from stallscope import fanout  # psutil only; here so the module stays light to import

        self.path = path
        context = fanout._context()
        self._counter = context.Value("q", 0)
        self._damaged = context.Value("b", 0, lock=False)  # set by a worker at damage
        self._seen = 0
        self._workers: list[tuple[Any, Any]] = []
        try:
            for part in parts:
                mine, theirs = context.Pipe(duplex=False)
                proc = context.Process(target=_worker, daemon=True,
                                       args=(theirs, str(path), part, limits, self._counter,
                                             self._damaged))
                proc.start()
                theirs.close()
                self._workers.append((proc, mine))
        except BaseException:
            self.close()
            raise

    def result(self, on_progress: Any = None) -> Decoded | None:
        """The file's events, or None when a part is not clean or a worker died (then the
        caller reads the file sequentially). `on_progress(n)` is fed the bytes read."""
        decoded = []
        last = len(self._workers) - 1
        try:
            for i, (proc, conn) in enumerate(self._workers):
                while not conn.poll(0.1):
                    self._progress(on_progress)
                    if self._damaged.value:
                        return None  # a part is damaged: stop them all now
                    if not proc.is_alive() and not conn.poll(0):
                        return None  # killed (out of memory, a signal)
                part = _receive(conn)
                if not _clean(part, last=i == last):
                    return None
                decoded.append(part)
        except (EOFError, OSError):
            return None
        finally:
            self._progress(on_progress)
            self.close()
        return join(decoded)

    def _progress(self, on_progress: Any) -> None:
        done = self._counter.value
        if on_progress is not None and done > self._seen:
            on_progress(done - self._seen)
        self._seen = done

    def close(self) -> None:
        """Stop the workers (those still reading when a part was damaged or the caller gave
        up); idempotent."""
        for proc, conn in self._workers:
            conn.close()
            if proc.is_alive():
                proc.terminate()
            proc.join()
        self._workers = []


def start(path: Path, cores: int, limits: Limits = Limits()) -> Reading | None:  # noqa: B008
    """Start reading `path` in parts on up to `cores` processes; None when it is not worth it
    (gzip, which cannot be entered mid-stream; small; no boundaries where the cuts fall) or the
    sequential reader must say why it cannot be read (over the size limit)."""
    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        with path.open("rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
        if size > limits.max_text_bytes:
            return None
        count = part_count(size, cores)
        parts = plan_parts(path, size, count) if count > 1 else None
        return Reading(path, parts, limits) if parts else None
    except OSError:
        return None


def decode_parallel(path: Path, cores: int, on_progress: Any = None,
                    limits: Limits = Limits()) -> Decoded | None:  # noqa: B008 (frozen)
    """The file's events read in parts on up to `cores` processes; None when not worth it or a
    part is not clean: then the caller reads it sequentially."""
    reading = start(path, cores, limits)
    return reading.result(on_progress) if reading is not None else None


def join(parts: list[Decoded]) -> Decoded:
    """One `Decoded` from parts in file order: codes remapped to the first part's interners,
    columns concatenated, counts summed, metadata from the keys before the events (first part)
    and after them (last part)."""
    cols = Columns()
    arrays: dict[str, list[np.ndarray]] = {}
    for part in parts:
        pc = part.columns
        for key in list(pc.parts):
            chunks = pc.parts.pop(key)  # let each part's chunks go once joined
            if not chunks:
                continue
            joined = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
            if key in _CODED:
                joined = _recode(getattr(cols, key), getattr(pc, key), joined)
            arrays.setdefault(key, []).append(joined)
        cols.unreadable += pc.unreadable
        cols.bad_times += pc.bad_times
        cols.seen += pc.seen
        for key, chunks in pc.memory.items():  # `[memory]` events, in file order
            cols.memory.setdefault(key, []).extend(chunks)
    cols.parts = arrays
    first, last = parts[0], parts[-1]
    meta = Metadata(**{f: _first(getattr(last.metadata, f), getattr(first.metadata, f))
                       for f in Metadata.__struct_fields__})
    notes = [*first.notes, *(n for n in last.notes if n not in first.notes)]
    return Decoded(cols, meta, truncated=last.truncated, array=first.array,
                   unclosed=last.unclosed, notes=notes)


def _recode(into: Interner, own: Interner, codes: np.ndarray) -> np.ndarray:
    """`codes` of `own`'s values as codes of `into` (values new to it appended in order)."""
    lookup = np.fromiter(map(into.index.__getitem__, own.values), dtype=np.int32,
                         count=len(own.index))
    return lookup[codes] if len(codes) else codes


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)

