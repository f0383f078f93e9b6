"""One run's step series: what `watch` measured per step, and its JSON Lines file.

The command appends one line per step while the script runs, so a run killed mid-write leaves a
torn last line: loading skips lines that do not decode (and counts them) rather than failing,
because every step before the tear is still worth analysing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIELDS = ("step", "step_ms", "loader_wait_ms", "host_sync_ms", "cpu_ms", "epoch", "start_s",
          "profiled")


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
    one that worked longer) are NaN where not measured; `epoch` is -1 where
    unknown; `start_s` (wall clock at the step's start) is NaN where unknown.
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

    def __post_init__(self) -> None:
        if self.profiled is None:
            self.profiled = np.zeros(self.step.size, dtype=bool)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]],
                     skipped_lines: int = 0) -> StepSeries:
        """Build from dicts with the keys of FIELDS; missing keys take their 'unknown' value.

        `step` defaults to the record's position; a loader wait that is missing counts as 0
        (no wait measured), clipped to the step it is part of.
        """
        rows = list(records)
        n = len(rows)
        step = np.arange(n, dtype=np.int64)
        step_ms = np.full(n, np.nan)
        wait = np.zeros(n)
        sync = np.full(n, np.nan)
        cpu = np.full(n, np.nan)
        epoch = np.full(n, -1, dtype=np.int64)
        start = np.full(n, np.nan)
        profiled = np.zeros(n, dtype=bool)
        for i, row in enumerate(rows):
            profiled[i] = row.get("profiled") is True
            s = _num(row.get("step"))
            if not math.isnan(s):
                step[i] = int(s)
            step_ms[i] = _num(row.get("step_ms"))
            w = _num(row.get("loader_wait_ms"))
            wait[i] = 0.0 if math.isnan(w) else max(w, 0.0)
            sync[i] = _num(row.get("host_sync_ms"))
            cpu[i] = _num(row.get("cpu_ms"))
            e = _num(row.get("epoch"))
            if not math.isnan(e) and e >= 0:
                epoch[i] = int(e)
            start[i] = _num(row.get("start_s"))
        ok = np.isfinite(step_ms) & (step_ms > 0)
        step_ms[~ok] = np.nan
        wait = np.where(ok, np.minimum(wait, np.where(ok, step_ms, 0.0)), 0.0)
        return cls(step, step_ms, wait, sync, cpu, epoch, start, skipped_lines, profiled)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> StepSeries:
        """Read a JSON Lines file; undecodable or non-object lines are skipped and counted."""
        records: list[dict[str, Any]] = []
        skipped = 0
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
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
        return cls.from_records(records, skipped_lines=skipped)

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per step, unknowns as None (JSON has no NaN)."""
        out = []
        for i in range(len(self)):
            out.append({
                "step": int(self.step[i]),
                "step_ms": _opt(self.step_ms[i]),
                "loader_wait_ms": (_opt(self.loader_wait_ms[i]) if np.isfinite(self.step_ms[i])
                                   else None),
                "host_sync_ms": _opt(self.host_sync_ms[i]),
                "cpu_ms": _opt(self.cpu_ms[i]),
                "epoch": int(self.epoch[i]) if self.epoch[i] >= 0 else None,
                "start_s": _opt(self.start_s[i]),
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
