"""`stallscope analyze` of a `watch` output folder, or of its step log: the whole-run report
again, not the captures merged as one job.

A watch folder holds the step log (OUT/watch/steps.jsonl, or steps-rank-N.jsonl per rank), the
later captures listed beside it (steps.captures.jsonl) and every capture's traces under
OUT/tensorboard/. The first capture is the traces no later capture lists; the report is theirs,
with the whole-run section rebuilt from the step log and the later captures (report/
watch_view.py `watch_report`, as `watch` built it). How the script ran (report.json's `run`) is
taken from the report `watch` wrote when there is one: a run killed before it wrote one has no
`run` section, and its first capture's step is read from the step log (its first profiled step).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope.errors import InputError

STEP_LOG = re.compile(r"steps(-rank-(\d+))?\.jsonl")


@dataclass(frozen=True)
class WatchInput:
    log: Path  # rank 0's step log (or the only one)
    out: Path  # the watch output folder
    traces: list[Path]  # the first capture's

    def report(self, report: Any) -> Any:
        """`report` (the first capture's traces analysed) as the whole-run report."""
        from stallscope.commands.run import later_captures
        from stallscope.report.watch_view import watch_report

        written = _written_report(self.out)
        if written and isinstance(written.get("run"), dict):
            report.run = written["run"]
        report = watch_report(self.log, report, later_captures(self.log))
        first = report.watch["captures"][0]
        if first["first_step"] is None:
            first["first_step"] = next((s["step"] for s in report.watch["steps"]
                                        if s.get("profiled")), None)
        report.notes.append(f"Rebuilt from the watch folder {self.out}: the step log "
                            f"{self.log.name} and {len(self.traces)} trace(s) of its first "
                            "capture" + ("" if written else "; no report.json (the run did "
                                         "not end), so how the script ran is not known"))
        return report


def find_watch(paths: list[Path]) -> WatchInput | None:
    """The watch folder `paths` names (one folder holding watch/steps*.jsonl, or one step log
    file), or None for any other input."""
    if len(paths) != 1:
        return None
    path = paths[0].resolve()
    if path.is_file() and STEP_LOG.fullmatch(path.name) and path.parent.name == "watch":
        out = path.parent.parent
        log = _rank0_log(path.parent) or path
    elif path.is_dir() and (path / "watch").is_dir():
        out = path
        found = _rank0_log(path / "watch")
        if found is None:
            return None
        log = found
    else:
        return None
    later: set[str] = set()
    for log_file in (out / "watch").glob("steps*.captures.jsonl"):
        later |= {Path(t).name for t in _listed_traces(log_file)}
    traces = sorted(p for p in (out / "tensorboard").rglob("*.pt.trace.json*")
                    if p.is_file() and p.name not in later)
    if not traces:
        raise InputError(f"{path}: a watch folder with no trace of its first capture (the run "
                         "ended before one was written); its step log alone is no report")
    return WatchInput(log=log, out=out, traces=traces)


def _rank0_log(folder: Path) -> Path | None:
    """The step log of the process that writes the report: steps.jsonl, else rank 0's."""
    for name in ("steps.jsonl", "steps-rank-0.jsonl"):
        if (folder / name).is_file():
            return folder / name
    return None


def _listed_traces(log_file: Path) -> list[str]:
    try:
        lines = log_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    traces: list[str] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            traces += [t for t in rec.get("traces") or [] if isinstance(t, str)]
    return traces


def _written_report(out: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("watch"), dict) else None
