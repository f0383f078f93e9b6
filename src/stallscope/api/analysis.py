"""`stallscope.analyze(...)`: the `analyze` command as a function, for traces and profiles.

Paths go through the same pipeline as `stallscope analyze PATH...`, so the report is the one
the CLI would write. A finished `torch.profiler.profile` is exported to a trace file first
(its own `export_chrome_trace`, gzip), kept in `out_dir` when one is given and deleted after
the analysis otherwise; torch exports a profile only once, so its bytes are remembered for as
long as the profile lives, to analyse it again.

Every error a caller can cause (a bad path, a damaged trace, a profile never started or still
recording) is a `StallscopeError` raised from here, without the frames of the pipeline under
it: the message says what is wrong, the traceback where the call was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from stallscope.api.result import Report
from stallscope.commands.pipeline import analyze_paths
from stallscope.errors import InputError, StallscopeError
from stallscope.report.build import analyze_command
from stallscope.runfacts import RunContext

# Each profile's exported trace (gzip bytes), by profile: torch exports a profile once, and a
# caller may analyse the same profile again (another cell, or with out_dir the second time).
_EXPORTED: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()


def analyze(source: str | os.PathLike[str] | Any, *more: str | os.PathLike[str] | Any,
            out_dir: str | os.PathLike[str] | None = None) -> Report:
    """Diagnose traces: each argument a trace file, a folder of `*.pt.trace.json[.gz]` files
    (several files are ranks or spans of one job, as for the CLI), or a finished
    `torch.profiler.profile`. With `out_dir`, report.json/html/md are written there (and the
    profiles' exported traces kept there); returns the Report."""
    out = Path(out_dir).expanduser().resolve() if out_dir is not None else None
    try:
        items = (source, *more)
        with _trace_files(items, out) as paths:
            report = analyze_paths(paths, contexts=_live_contexts(items, paths))
            report.source["command"] = analyze_command(report.source["paths"], None, False)
            result = Report(report)
        if out is not None:
            result.save(out)
    except StallscopeError as exc:
        raise exc.with_traceback(None) from None
    return result


def _live_contexts(items: Sequence[Any], paths: list[Path]) -> dict[str, RunContext]:
    """The facts of this process for each profile recorded in it: the cores it may use and its
    intra-op threads, as `run` records them. Without them a loader's advice had no core count
    to cap the workers at, and the advice changed from one run to the next.
    A trace file may come from another machine: it keeps only what it holds itself."""
    if not any(_is_profile(item) for item in items):
        return {}
    from stallscope.capture.facts import environment  # torch: a profile means it is loaded

    facts = environment()
    return {str(path.resolve()): RunContext(command=[], target="a torch.profiler.profile",
                                            environment=facts)
            for item, path in zip(items, paths, strict=True) if _is_profile(item)}


@contextlib.contextmanager
def _trace_files(items: Sequence[Any], out: Path | None) -> Iterator[list[Path]]:
    """The trace path of each item: paths as given, profiles exported into `out` or into a
    temporary folder removed on exit."""
    profiles = [i for i, item in enumerate(items) if _is_profile(item)]
    with contextlib.ExitStack() as stack:
        folder = out
        if profiles and folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stallscope-")))
        paths = []
        for i, item in enumerate(items):
            if i in profiles:
                assert folder is not None
                name = "profile" if len(profiles) == 1 else f"profile-{profiles.index(i) + 1}"
                paths.append(_export(item, folder / f"{name}.pt.trace.json.gz"))
            elif isinstance(item, (str, os.PathLike)):
                paths.append(Path(item).expanduser())
            else:
                raise InputError(
                    f"cannot analyse a {type(item).__name__}: give a trace file or folder, or "
                    "a finished torch.profiler.profile"
                )
        yield paths


def _is_profile(item: Any) -> bool:
    """A torch profiler object (torch.profiler.profile, or the older autograd one), told by
    what it can do, so that analysing paths never imports torch."""
    return not isinstance(item, (str, os.PathLike)) and hasattr(item, "export_chrome_trace")


def _export(prof: Any, path: Path) -> Path:
    """Write the profile's trace to `path` (gzip, by its name); refuse one that has not run
    to its end."""
    inner = prof.profiler if hasattr(prof, "profiler") else prof
    if inner is None:
        raise InputError(
            "this torch.profiler.profile was never started: run your steps inside "
            "`with torch.profiler.profile(...) as prof:` (or between prof.start() and "
            "prof.stop()), then analyse prof"
        )
    if getattr(inner, "kineto_results", None) is None:
        raise InputError(
            "this torch.profiler.profile is still recording: call stallscope.analyze(prof) "
            "after its `with` block ends (or after prof.stop())"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if prof in _EXPORTED:
            path.write_bytes(_EXPORTED[prof])
            return path
        prof.export_chrome_trace(str(path))
        _EXPORTED[prof] = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot write the profile's trace to {path}: "
                         f"{exc.strerror or exc}") from None
    except RuntimeError as exc:  # torch saves a profile's trace once ("Trace is already saved")
        raise InputError(
            f"torch could not export this profile's trace ({exc}): it allows one export per "
            "profile, so analyse the file it was exported to instead"
        ) from None
    return path
