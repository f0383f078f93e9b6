"""Whether the rank files given together can be one job: never merged silently.

`analyze` of several files treats the files that carry a rank as one distributed job and
compares them rank by rank. Files of different jobs read as one job give a verdict about ranks
that never ran together: a 2-rank gloo file beside a file with no rank, world size 8 on nccl
beside 2 on gloo, or two runs of one job an hour apart ("4 of 4 ranks"). Such a set is refused
with the line that names the files that disagree; files without any rank (several recordings
of one process) are not a job and are not checked.
"""

from __future__ import annotations

from pathlib import Path

from stallscope.report.digest import TraceDigest
from stallscope.text import plain

# Ranks of one job start recording within one run: their first events on one machine lie
# minutes apart at most (a rank that waits for the others' start-up, a slow first step). Files
# from one machine further apart than this are different runs.
SAME_RUN_US = 30 * 60e6


def mixed_jobs(digests: list[TraceDigest]) -> str | None:
    """Why `digests` are not one job (a sentence naming the files), or None when they can be."""
    ranked = [d for d in digests if d.rank is not None]
    if not ranked or len(digests) < 2:
        return None
    unranked = [d for d in digests if d.rank is None]
    if unranked:
        return (f"{_names(unranked)} {_verb(unranked)} no rank while {_names(ranked)} "
                f"{_verb(ranked)} one: files of a distributed job beside other recordings")
    for key, what in (("world_size", "world size"), ("backend", "backend")):
        values = {str(v) for d in ranked if (v := d.distributed.get(key)) is not None}
        if len(values) > 1:
            return f"their {what}s disagree: {_by_value(ranked, key)}"
    return _runs_apart(ranked)


def _runs_apart(ranked: list[TraceDigest]) -> str | None:
    """Files of one machine whose first events lie further apart than one run."""
    by_host: dict[str, list[TraceDigest]] = {}
    for d in ranked:
        host = d.origin.get("host")
        if host and isinstance(d.origin.get("start_us"), int | float):
            by_host.setdefault(str(host), []).append(d)
    for host, files in sorted(by_host.items()):
        files.sort(key=lambda d: d.origin["start_us"])
        first, last = files[0], files[-1]
        apart = last.origin["start_us"] - first.origin["start_us"]
        if apart > SAME_RUN_US:
            return (f"{_name(first)} and {_name(last)} were recorded on {plain(host)} "
                    f"{apart / 60e6:,.0f} minutes apart: two runs, not one job's ranks")
    return None


def _by_value(ranked: list[TraceDigest], key: str) -> str:
    groups: dict[str, list[TraceDigest]] = {}
    for d in ranked:
        groups.setdefault(str(d.distributed.get(key)), []).append(d)
    return "; ".join(f"{value} in {_names(files)}" for value, files in sorted(groups.items()))


def _names(files: list[TraceDigest], most: int = 3) -> str:
    shown = ", ".join(_name(d) for d in files[:most])
    return shown + (f" and {len(files) - most:,} more" if len(files) > most else "")


def _verb(files: list[TraceDigest]) -> str:
    return "carries" if len(files) == 1 else "carry"


def _name(d: TraceDigest) -> str:
    return plain(Path(d.path).name)


def refusal(reason: str) -> str:
    """The one line `analyze` ends with."""
    return (f"these files are not one job: {reason}; analyze each job on its own (or compare "
            "them with `stallscope compare`)")
