"""Progress lines on stderr for work long enough that silence would look like a hang.

One process-wide reporter, like `logging`: the capture hooks deep inside a user's training loop
report through it without every layer passing a callback down.

The rule (decided once per command by `configure`, refined by `consider_inputs`):

- `-q` silences progress, always; only the one-line error can still appear.
- `STALLSCOPE_PROGRESS=1` forces it on, `STALLSCOPE_PROGRESS=0` off (scripts, CI logs, tests).
- Otherwise `stallscope run` always reports its phases (it runs for as long as the user's
  script does), and `stallscope analyze` reports only when the work is long: several trace
  files, or one above `LARGE_TRACE_BYTES` on disk. A single small trace is analysed in about a
  second and its summary follows at once, so phase lines would only be noise there.

Lines start with `[stallscope] `, never with `stallscope:`, which is reserved for the error line
(scripts and tests count those).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from stallscope.units import percent, size_text

PREFIX = "[stallscope] "
ENV = "STALLSCOPE_PROGRESS"
# Above this size on disk one trace takes seconds to analyse (a gzip trace holds about ten times
# its size in JSON), so `analyze` says what it is doing. Measured (benchmarks/bench_analyze.py):
# the largest real trace, 3.0 MB of gzip holding 54 MB of JSON, takes 1.7 s end to end; a 302 MB
# JSON file takes 3.2 s (docs/performance.md).
LARGE_TRACE_BYTES = 20_000_000


class Progress:
    """Writes progress lines to stderr when enabled; `None` means 'decide from the inputs'."""

    def __init__(self, enabled: bool | None = False) -> None:
        self.enabled = enabled
        self._t0 = time.monotonic()

    @property
    def active(self) -> bool:
        return bool(self.enabled)

    def say(self, message: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._t0
        try:
            sys.stderr.write(f"{PREFIX}{message} [{elapsed:.1f} s]\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not fail the analysis
            pass


_current = Progress(False)
_quiet = False  # `-q`: warnings are silenced too


def configure(quiet: bool, default: bool | None) -> Progress:
    """Set the reporter for this command. `default`: True for `run`, None (decide from the
    inputs) for `analyze`. Returns it, for callers that prefer a handle."""
    global _current, _quiet
    _quiet = quiet
    forced = os.environ.get(ENV, "").strip()
    if quiet:
        enabled: bool | None = False
    elif forced in ("0", "1"):
        enabled = forced == "1"
    else:
        enabled = default
    _current = Progress(enabled)
    return _current


def consider_inputs(files: Iterable[Path]) -> None:
    """Settle an undecided reporter: on for several files or a large one, else off."""
    if _current.enabled is not None:
        return
    files = list(files)
    _current.enabled = len(files) > 1 or any(_size(f) > LARGE_TRACE_BYTES for f in files)


def say(message: str) -> None:
    """Report one step of the work (no-op unless progress is on)."""
    _current.say(message)


def warn(message: str) -> None:
    """A warning the user must see while the script runs: shown unless `-q`, even where
    progress lines are off by default."""
    if _quiet:
        return
    try:
        sys.stderr.write(f"{PREFIX}warning: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def active() -> bool:
    return _current.active


class Meter:
    """Reports how far through `total` bytes a long read is, every `every_s` seconds at most."""

    def __init__(self, label: str, total: int, every_s: float = 3.0) -> None:
        self.label, self.total, self.every_s = label, max(total, 1), every_s
        self.done = 0
        self._last = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            share = min(100.0, 100.0 * self.done / self.total)
            say(f"{self.label}: {percent(share, 0)} ({size_text(self.done)} of about "
                f"{size_text(self.total)})")


def total_size(files: Iterable[Path]) -> int:
    """Bytes on disk of `files` (unreadable ones count 0: loading will say why)."""
    return sum(_size(f) for f in files)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
