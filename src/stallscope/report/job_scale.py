"""What a report of a job of many ranks keeps per rank, so it grows by kilobytes per rank.

Up to JOB_SCALE_TRACES traces, report.json holds every trace's steps, checks, plan and notes.
Beyond, those would be most of a report of thousands of ranks (16 checks of a few hundred bytes,
a fix plan and every step, for each rank: about 8 kB a rank, 80 MB at 10,000) and no reader
goes through them one by one. So beyond it the report keeps, for every rank, its `traces[]`
entry (with its step-time summary and its findings) and its `ranks[]` row, and summarises the
rest:

- `steps[]` holds the steps of the drawn trace (rank 0's, see digest.pick_drawn); every step of
  every rank still went into `summary` and each trace's `summary`;
- `assessments[]` holds one check per rule and result, over the ranks it holds for ("ranks
  0-9999 (10000 traces)"), with the first rank's detail;
- `traces[].plan` is kept for the traces whose findings are shown (each grouped finding's card
  shows one rank's evidence and plan) and for the verdict's; the others are null;
- per-rank notes that read the same on several ranks are said once, naming the ranks.
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose.finding import Finding
from stallscope.report.rank_groups import rank_span

JOB_SCALE_TRACES = 300


def at_job_scale(traces: list[dict[str, Any]]) -> bool:
    return len(traces) > JOB_SCALE_TRACES


def keep_steps(steps: list[dict[str, Any]], drawn: str | None) -> list[dict[str, Any]]:
    """The steps of the drawn trace only."""
    return [s for s in steps if s.get("trace") == drawn]


def group_checks(assessments: list[dict[str, Any]],
                 rank_of: dict[str, int | None]) -> list[dict[str, Any]]:
    """One check per rule and result over the traces (job-level checks kept as they are)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    out: list[dict[str, Any]] = []
    for a in assessments:
        if a["trace"] in rank_of:
            groups.setdefault((a["rule"], a["status"]), []).append(a)
        else:
            out.append(a)
    grouped = []
    for (rule, status), rows in groups.items():
        if len(rows) == 1:
            grouped.append(rows[0])
            continue
        ranks = [r for r in (rank_of[a["trace"]] for a in rows) if r is not None]
        where = f"{len(rows)} traces" + (f" (ranks {rank_span(ranks)})" if ranks else "")
        first = rows[0]
        detail = (f"{first['trace']}: {first['detail']} (the first of {len(rows)}; each rank's "
                  "own figures are in its trace: analyse that file alone to see them)")
        grouped.append({"rule": rule, "trace": where, "status": status, "detail": detail})
    return grouped + out


def plans_shown(traces: list[dict[str, Any]], found: list[Finding], lead: str | None) -> None:
    """Keep `plan` only on the traces whose plan a card or the verdict shows."""
    shown = {f.trace for f in found} | {lead}
    for t in traces:
        if t["label"] not in shown:
            t["plan"] = None


def group_notes(notes: list[tuple[str, str]], rank_of: dict[str, int | None]) -> list[str]:
    """(trace label, note) pairs as lines: a note several ranks share is said once, naming
    them; a job's own notes (label "") stay as they are, first."""
    by_text: dict[str, list[str]] = {}
    own: list[str] = []
    for label, note in notes:
        if not label:
            own.append(note)
        else:
            by_text.setdefault(note, []).append(label)
    out = list(own)
    for note, labels in by_text.items():
        if len(labels) == 1:
            out.append(f"{labels[0]}: {note}")
            continue
        ranks = [r for r in (rank_of.get(x) for x in labels) if r is not None]
        who = (f"ranks {rank_span(ranks)}" if len(ranks) == len(labels)
               else f"{len(labels)} traces")
        out.append(f"{who}: {note}")
    return out
