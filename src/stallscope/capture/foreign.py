"""Scripts that start their own profiler: stallscope steps aside instead of crashing the process.

Only one Kineto session can exist in a process. A script that starts `torch.profiler.profile`
(the PyTorch tutorials do, and so does Lightning's `Trainer(profiler="pytorch")`) or
`torch.autograd.profiler.profile` while stallscope's own session runs, or that stops the session
it finds running, ends in "disableProfiler called but no active profiling session found" and a
segmentation fault. So for the length of the run the profilers' entry points are wrapped: the
first time the script starts a profiler of its own, stallscope stops its own session (keeping
the complete steps recorded so far) and never starts it again, and the script's session runs
undisturbed. The files the script's profilers write (`export_chrome_trace`, which
`tensorboard_trace_handler` calls too) are noted and the first is copied into the run's trace
folder, so that `run` can analyse it when stallscope's own steps are too few; the script's
files are only read, never moved or rewritten. `record_function` alone starts no session and
needs nothing.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from stallscope import progress
from stallscope.runfacts import RunContext

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_STALLSCOPE_DIR = str(Path(__file__).resolve().parent.parent)
# Python's own library: contextlib and runpy frames are never the script's line.
_STDLIB = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) + os.sep
                 for k in ("stdlib", "platstdlib")})
_GZIP_MAGIC = b"\x1f\x8b"

STALLSCOPE = "stallscope"
SCRIPT_PROFILER = "script-profiler"


class Owner(Protocol):
    """What the watcher needs of stallscope's own capture session."""

    def owns(self, prof: Any) -> bool:
        """`prof` is stallscope's own profiler (either layer of it)."""

    def own_running(self) -> bool:
        """stallscope's own session is started and not yet stopped."""

    def step_aside(self, site: str, kind: str) -> None:
        """Stop stallscope's own session for good (the script starts one at `site`)."""

    def wants_script_trace(self) -> bool:
        """stallscope recorded fewer steps than asked for: the script's trace may stand in."""


@dataclass
class ScriptProfiler:
    """The script's own profiler, as the run saw it (plain data for RunContext)."""

    kind: str  # "torch.profiler" or "torch.autograd.profiler"
    site: str  # the script's line that first started it: "train.py:42"
    own_steps: int = 0  # complete steps stallscope had recorded when it first saw it
    # Files the script's profilers wrote, in order, as absolute paths; and as the script named
    # them (relative to its working folder when inside it), for messages.
    traces: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    copy: str | None = None  # stallscope's copy of the first of `traces` (or its own export)
    # The script's profiler wrote no file: `copy` is stallscope's export of the last session
    # the script's profiler recorded.
    exported: bool = False
    note: str = ""  # the one line the report and the terminal show first
    notes: list[str] = field(default_factory=list)  # what went wrong copying or exporting

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ForeignProfilers:
    """Wraps the profilers' entry points for the run; `install()` then `uninstall()`."""

    def __init__(self, owner: Owner, copy_dir: Path, worker: str) -> None:
        self.owner = owner
        self.copy_dir = copy_dir
        self.worker = worker
        self.seen: ScriptProfiler | None = None
        self._pid = os.getpid()
        self._saved: list[tuple[Any, str, Any]] = []
        self._exporting = 0  # inside the script's torch.profiler export (it calls the lower one)
        self._last: Any = None  # the script's last finished autograd-level session

    # ------------------------------------------------------------------ hooks

    def install(self) -> None:
        from torch.autograd import profiler as autograd_profiler
        from torch.profiler import profiler as torch_profiler

        low = autograd_profiler.profile
        self._patch(torch_profiler.profile, "start", self._wrap_start)
        # Where every Kineto session begins (torch.profiler's cycles and the autograd
        # profiler's `__enter__` both call it); `__enter__` itself where it is not there.
        if not self._patch(low, "_prepare_trace", self._wrap_prepare):
            self._patch(low, "__enter__", self._wrap_prepare)
        self._patch(low, "__exit__", self._wrap_exit)
        self._patch(torch.autograd, "_disable_profiler", self._wrap_disable)
        self._patch(torch_profiler._KinetoProfile, "export_chrome_trace", self._wrap_export_high)
        self._patch(low, "export_chrome_trace", self._wrap_export_low)

    def uninstall(self) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()

    def _patch(self, owner: Any, name: str, wrap: Callable[[Any], Any]) -> bool:
        original = vars(owner).get(name)
        if original is None:  # another torch: that entry point does not exist there
            return False
        self._saved.append((owner, name, original))
        setattr(owner, name, wrap(original))
        return True

    def _foreign(self, prof: Any) -> bool:
        return os.getpid() == self._pid and not self.owner.owns(prof)

    def _wrap_start(self, original: Any) -> Any:
        watch = self

        def start(prof: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._foreign(prof):
                watch._notice("torch.profiler")
            return original(prof, *args, **kwargs)

        return start

    def _wrap_prepare(self, original: Any) -> Any:
        watch = self

        def prepare(prof: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._foreign(prof):
                watch._notice("torch.autograd.profiler")
            return original(prof, *args, **kwargs)

        return prepare

    def _wrap_exit(self, original: Any) -> Any:
        watch = self

        def __exit__(prof: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            result = original(prof, *args, **kwargs)
            if watch._foreign(prof):
                watch._last = prof  # kept for `export_last`, should the script write no file
            return result

        return __exit__

    def _wrap_disable(self, original: Any) -> Any:
        watch = self

        def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
            # Lightning stops "a profiler left running" before starting its own: that would be
            # stallscope's, and stopping it under the profiler object crashes the process.
            if os.getpid() == watch._pid and watch.owner.own_running():
                watch._notice("torch.profiler")
                if not torch.autograd._profiler_enabled():
                    return None
            return original(*args, **kwargs)

        return _disable_profiler

    def _wrap_export_high(self, original: Any) -> Any:
        watch = self

        def export_chrome_trace(prof: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if not watch._foreign(prof):
                return original(prof, path, *args, **kwargs)
            watch._exporting += 1
            try:
                result = original(prof, path, *args, **kwargs)
            finally:
                watch._exporting -= 1
            watch._wrote(path)
            return result

        return export_chrome_trace

    def _wrap_export_low(self, original: Any) -> Any:
        watch = self

        def export_chrome_trace(prof: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._exporting or not watch._foreign(prof):
                return original(prof, path, *args, **kwargs)
            result = original(prof, path, *args, **kwargs)
            watch._wrote(path)
            return result

        return export_chrome_trace

    # ------------------------------------------------------------------ what was seen

    def _notice(self, kind: str) -> None:
        if self.seen is None:
            self.seen = ScriptProfiler(kind, _site())
        self.owner.step_aside(self.seen.site, self.seen.kind)

    def recording(self) -> bool:
        """A profiler session is on (stallscope's is stopped once the script's was seen)."""
        return bool(torch.autograd._profiler_enabled())

    def _wrote(self, path: Any) -> None:
        """The script's profiler wrote `path`: note it, and copy the first one stallscope
        may analyse, now, before the script can overwrite or remove it."""
        try:
            full = os.path.abspath(os.fspath(path))
        except TypeError:
            return
        seen = self.seen
        if seen is None:  # exported from a session started before the hooks: still the script's
            seen = self.seen = ScriptProfiler("torch.profiler", _site())
        if full in seen.traces:
            seen.traces.remove(full)  # written again: keep the latest position
        seen.traces.append(full)
        seen.shown = [_display(p) for p in seen.traces]
        if seen.copy is None and self.owner.wants_script_trace():
            self._copy(full)

    def _copy(self, source: str) -> None:
        seen = self.seen
        assert seen is not None
        try:
            with open(source, "rb") as f:
                gz = f.read(2) == _GZIP_MAGIC
            dest = self.copy_dir / f"{self.worker}.script-profiler.pt.trace.json{'.gz' * gz}"
            self.copy_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
        except OSError as exc:
            seen.notes.append(f"stallscope could not copy the script's trace {_display(source)}: "
                              f"{exc.strerror or exc}.")
            return
        seen.copy = str(dest)
        progress.say(f"the script's profiler wrote {_display(source)}: copied for the analysis")

    def export_last(self) -> None:
        """The script's profiler wrote no file stallscope could copy (a profiler read with
        `key_averages()`, say): export its last finished session into the trace folder, so
        the run still has a trace to analyse. Call after `uninstall()`."""
        seen, prof, self._last = self.seen, self._last, None
        if seen is None or prof is None or seen.copy is not None:
            return
        dest = self.copy_dir / f"{self.worker}.script-profiler.pt.trace.json"
        try:
            self.copy_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(dest))
        except Exception as exc:  # a session with no results (never started, another torch)
            seen.notes.append(f"stallscope could not export the script's profiler session: "
                              f"{type(exc).__name__}: {exc}.")
            return
        if dest.is_file():
            seen.copy, seen.exported = str(dest), True


def describe(context: RunContext, own: list[str], own_steps: int, wanted: int,
             seen: ScriptProfiler | None) -> None:
    """Fill in which trace `context` analyses (`traces`, `trace_source`) and what the script's
    profiler did (`script_profiler`, with the one line that says so in its `note`)."""
    context.trace_source, context.traces = choose_traces(own, own_steps, wanted, seen)
    if seen is None:
        return
    seen.own_steps = own_steps
    seen.note = source_note(context.trace_source, seen, wanted)
    context.script_profiler = seen.to_dict()
    context.notes.extend(seen.notes)


def choose_traces(own: list[str], own_steps: int, wanted: int, seen: ScriptProfiler | None
                  ) -> tuple[str, list[str]]:
    """Which trace `run` analyses, and where it came from: stallscope's own when it recorded
    the steps asked for, else the first trace the script's profiler wrote, else stallscope's
    partial steps, else stallscope's export of the script's last session."""
    if seen is None or seen.copy is None or own_steps >= wanted:
        return STALLSCOPE, own
    if seen.exported and own_steps > 0:
        return STALLSCOPE, own
    return SCRIPT_PROFILER, [seen.copy]


def source_note(source: str, seen: ScriptProfiler, wanted: int) -> str:
    """The one line that says the script has its own profiler and which trace was analysed."""
    head = f"The script starts its own {seen.kind} at {seen.site}"
    before = seen.own_steps
    aside = ("; only one profiler can run in a process, so stallscope stepped aside "
             + (f"after {before} of {wanted} step(s)" if before else "before recording a step"))
    if source == SCRIPT_PROFILER and seen.exported:
        return (f"{head}{aside}; the script's profiler wrote no trace file, so stallscope "
                "analysed the last session it recorded, exported by stallscope.")
    if source == SCRIPT_PROFILER:
        return (f"{head}{aside} and analysed the trace the script's profiler wrote to "
                f"{seen.shown[0]} (a copy; the file is untouched).")
    if before >= wanted:
        return (f"{head}, after stallscope had recorded its {wanted} step(s): stallscope "
                "analysed its own and left the script's profiler undisturbed.")
    wrote = (f"; the script's profiler wrote {', '.join(seen.shown)}" if seen.shown else
             "; the script's profiler wrote no trace file stallscope could find")
    return f"{head}{aside}{wrote}. The report covers stallscope's own step(s)."


def _site() -> str:
    """The script's line that started the profiler: the first frame outside torch and
    stallscope and, when a library started it (Lightning), the script's line that called
    the library, with the library's line after it."""
    frame: Any = sys._getframe(2)
    first: str | None = None
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH_DIR, _STALLSCOPE_DIR, "<")):
            here = f"{_display(name)}:{frame.f_lineno}"
            first = first or here
            if not _in_library(name):
                return here if here == first else f"{here} (through {first})"
        frame = frame.f_back
    return first or "unknown"


def _in_library(filename: str) -> bool:
    """An installed package's file or Python's own, not the script's."""
    parts = Path(filename).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return str(Path(filename).resolve()).startswith(_STDLIB)


def _display(filename: str) -> str:
    """A path as the user would write it: relative to the working folder when inside it, a
    library file from its package on."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return str(Path(*parts[parts.index(marker) + 1:]))
    return str(path)
