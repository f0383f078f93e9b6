"""One run's step series: what `watch` measured per step, and its JSON Lines file.

The command appends one line per step while the script runs, so a run killed mid-write leaves a
torn last line: loading skips lines that do not decode (and counts them) rather than failing,
because every step before the tear is still worth analysing.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

FIELDS = ("step", "step_ms", "loader_wait_ms", "host_sync_ms", "cpu_ms", "epoch", "start_s",
          "runq_ms", "mem_mb", "others_cores", "probe_us", "profiled")


def _num(value: Any) -> float:
    """A finite float, or NaN for anything missing or unusable (None, text, inf)."""
    if isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


@dataclass
class StepSeries:
    """Per-step arrays of one run, index i being the i-th step recorded.

    `step_ms` NaN or <= 0 marks a step that was not measured (a torn record, a clock that did
    not move): it stays in the series, so step numbers keep their meaning, and `valid` leaves
    it out of every statistic. `host_sync_ms` and `cpu_ms` (the process's CPU time in the step,
    all threads: it tells a step that waited outside the process, on other load or I/O, from
    one that worked longer) and `runq_ms` (the stepping thread's time runnable but waiting for
    a core: time other load held it) are NaN where not measured; `epoch` is -1 where
    unknown; `start_s` (wall clock at the step's start) is NaN where unknown. `mem_mb` (the
    job's memory, MB: capture/steplog.py) is NaN on every step but those after a sweep of the
    memory sampler; `others_cores` and `probe_us` (the cores other processes held, and the CPU
    time of a fixed piece of work: capture/loadsampler.py) on every step but those after a
    sweep of the other-load sampler (`held` carries each sweep's forward).
    """

    step: np.ndarray
    step_ms: np.ndarray
    loader_wait_ms: np.ndarray
    host_sync_ms: np.ndarray
    cpu_ms: np.ndarray
    epoch: np.ndarray
    start_s: np.ndarray
    skipped_lines: int = field(default=0)
    # Steps recorded under the profiler (`watch` records a window once steady): slower by the
    # profiler's own cost, so kept in the series and the wall time but out of every statistic.
    profiled: np.ndarray | None = None
    runq_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mem_mb: np.ndarray = field(default_factory=lambda: np.zeros(0))
    others_cores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    probe_us: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.profiled is None:
            self.profiled = np.zeros(self.step.size, dtype=bool)
        for name in ("runq_ms", "mem_mb", "others_cores", "probe_us"):
            if getattr(self, name).size != self.step.size:  # not measured (an older file)
                setattr(self, name, np.full(self.step.size, np.nan))

    def held(self, name: str) -> np.ndarray:
        """A field written after each sweep (`others_cores`, `probe_us`) on every step: each
        step holds the last sweep's figure at or before it (NaN before the first)."""
        x = getattr(self, name)
        idx = np.where(np.isfinite(x), np.arange(x.size), -1)
        np.maximum.accumulate(idx, out=idx)
        return np.where(idx >= 0, x[np.maximum(idx, 0)], np.nan)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]],
                     skipped_lines: int = 0) -> StepSeries:
        """Build from dicts with the keys of FIELDS; missing keys take their 'unknown' value.

        `step` defaults to the record's position; a loader wait that is missing counts as 0
        (no wait measured), clipped to the step it is part of.
        """
        cols = _record_columns(list(records))
        return cls._from_columns(cols, cols.pop("profiled"), skipped_lines)

    @classmethod
    def _from_columns(cls, cols: dict[str, np.ndarray], profiled: np.ndarray,
                      skipped_lines: int) -> StepSeries:
        """The series from each field as floats (NaN: missing or unusable), as `_num` reads."""
        n = profiled.size
        for values in cols.values():
            values[~np.isfinite(values)] = np.nan
        position = np.arange(n, dtype=np.int64)
        given = cols["step"]
        usable = np.isfinite(given) & (np.abs(given) < 2.0**62)
        step = np.where(usable, np.nan_to_num(given).astype(np.int64), position)
        e = cols["epoch"]
        known = np.isfinite(e) & (e >= 0) & (e < 2.0**62)
        epoch = np.where(known, np.nan_to_num(e).astype(np.int64), -1)
        step_ms = cols["step_ms"]
        wait = np.where(np.isnan(cols["loader_wait_ms"]), 0.0,
                        np.maximum(cols["loader_wait_ms"], 0.0))
        ok = np.isfinite(step_ms) & (step_ms > 0)
        step_ms[~ok] = np.nan
        wait = np.where(ok, np.minimum(wait, np.where(ok, step_ms, 0.0)), 0.0)
        runq = np.where(cols["runq_ms"] >= 0, cols["runq_ms"], np.nan)
        mem = np.where(cols["mem_mb"] > 0, cols["mem_mb"], np.nan)
        others = np.where(cols["others_cores"] >= 0, cols["others_cores"], np.nan)
        probe = np.where(cols["probe_us"] > 0, cols["probe_us"], np.nan)
        return cls(step, step_ms, wait, cols["host_sync_ms"], cols["cpu_ms"], epoch,
                   cols["start_s"], skipped_lines, profiled, runq, mem, others, probe)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> StepSeries:
        """Read a JSON Lines file; undecodable or non-object lines are skipped and counted.

        Read in blocks of whole lines, each decoded at once into typed records (msgspec);
        only a block with an odd line (torn, text where a number goes, not UTF-8) is read line
        by line. A day of 10 ms steps is 8.6 million lines: line by line into dicts, 2 million
        of them took 18 s and 1.9 GB here.
        """
        parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
        skipped = 0
        with open(path, "rb") as fh:
            for block in _line_blocks(fh):
                got = _typed_block(block)
                if got is None:
                    got, bad = _lenient_block(block)
                    skipped += bad
                for f in FIELDS:
                    parts[f].append(got[f])
        cols = {f: np.concatenate(parts[f]) if parts[f] else np.zeros(0)
                for f in FIELDS if f != "profiled"}
        profiled = (np.concatenate(parts["profiled"]).astype(bool) if parts["profiled"]
                    else np.zeros(0, dtype=bool))
        return cls._from_columns(cols, profiled, skipped)

    def to_records(self, rows: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """One dict per step (or per step of `rows`, positions in the series), unknowns as
        None (JSON has no NaN)."""
        out = []
        for i in range(len(self)) if rows is None else rows:
            out.append({
                "step": int(self.step[i]),
                "step_ms": _opt(self.step_ms[i]),
                "loader_wait_ms": (_opt(self.loader_wait_ms[i]) if np.isfinite(self.step_ms[i])
                                   else None),
                "host_sync_ms": _opt(self.host_sync_ms[i]),
                "cpu_ms": _opt(self.cpu_ms[i]),
                "epoch": int(self.epoch[i]) if self.epoch[i] >= 0 else None,
                "start_s": _opt(self.start_s[i]),
                "runq_ms": _opt(self.runq_ms[i]),
                "profiled": bool(self.profiled[i]),  # type: ignore[index]
            })
        return out

    def to_jsonl(self, path: str | Path) -> None:
        """Write the whole series, one step per line (the same form `append_jsonl` writes)."""
        with open(path, "w", encoding="utf-8") as fh:
            for rec in self.to_records():
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def __len__(self) -> int:
        return int(self.step.size)

    @property
    def valid(self) -> np.ndarray:
        """Steps with a measured, positive duration, not recorded under the profiler."""
        return np.isfinite(self.step_ms) & ~self.profiled  # type: ignore[operator]

    @property
    def has_epochs(self) -> bool:
        return bool((self.epoch >= 0).any())

    def wall_ms(self) -> float:
        """The run's wall time over its steps: the step sum, or the start-time span when the
        start times show time outside the steps (evaluation between step timers)."""
        total = float(np.nansum(self.step_ms))
        ok = self.valid & np.isfinite(self.start_s)
        if ok.sum() >= 2:
            idx = np.flatnonzero(ok)
            span = (self.start_s[idx[-1]] - self.start_s[idx[0]]) * 1e3 + self.step_ms[idx[-1]]
            total = max(total, float(span))
        return total


def _opt(value: float) -> float | None:
    return None if not math.isfinite(value) else round(float(value), 4)


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one step's record as a line: what the command calls after each step."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in record.items()}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(clean, separators=(",", ":")) + "\n")


BLOCK_BYTES = 8 << 20  # step-file text decoded at once: about 80,000 lines


class _Line(msgspec.Struct, gc=False):
    """One step's line as `watch` writes it: numbers or null (anything else: read leniently)."""

    step: float | None = None
    step_ms: float | None = None
    loader_wait_ms: float | None = None
    host_sync_ms: float | None = None
    cpu_ms: float | None = None
    epoch: float | None = None
    start_s: float | None = None
    runq_ms: float | None = None
    mem_mb: float | None = None
    others_cores: float | None = None
    probe_us: float | None = None
    profiled: bool | None = None


_LINES = msgspec.json.Decoder(_Line)
_GET = {f: attrgetter(f) for f in FIELDS}


def _line_blocks(fh: Any) -> Iterator[bytes]:
    """The file's bytes in blocks that end at a line's end (the last may not)."""
    rest = b""
    while chunk := fh.read(BLOCK_BYTES):
        text = rest + chunk
        cut = text.rfind(b"\n") + 1
        if cut == 0:
            rest = text
            continue
        rest = text[cut:]
        yield text[:cut]
    if rest:
        yield rest


def _typed_block(block: bytes) -> dict[str, np.ndarray] | None:
    """Each field of every line as floats (`profiled` as 0/1), or None when a line is not a
    record of numbers (then the block is read line by line)."""
    try:
        lines = _LINES.decode_lines(block)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    cols = {f: np.array(list(map(_GET[f], lines)), dtype=np.float64)
            for f in FIELDS if f != "profiled"}
    # bool | None here: bool() is `is True`
    cols["profiled"] = np.fromiter(map(bool, map(_GET["profiled"], lines)), dtype=bool,
                                   count=len(lines))
    return cols


def _lenient_block(block: bytes) -> tuple[dict[str, np.ndarray], int]:
    """A block line by line, as JSON of any shape: a field that is not a number is unknown,
    a line that does not decode or is not an object is skipped and counted."""
    records: list[dict[str, Any]] = []
    skipped = 0
    # Lines as a text-mode file splits them (\n, \r\n or \r), not str.splitlines', which
    # also splits at characters JSON allows inside a string (U+2028).
    for line in io.StringIO(block.decode("utf-8", errors="replace"), newline=None):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            skipped += 1
    return _record_columns(records), skipped


def _record_columns(records: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Each field of `records` as floats (`_num`: NaN where missing or not a number), and
    `profiled` as booleans (true only for JSON true)."""
    cols = {f: np.array([_num(r.get(f)) for r in records], dtype=np.float64)
            for f in FIELDS if f != "profiled"}
    cols["profiled"] = np.array([r.get("profiled") is True for r in records], dtype=bool)
    return cols
