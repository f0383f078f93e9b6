"""The ranks of a big job as the HTML page shows them: summarised beyond a few hundred rows.

Why: report.json keeps every rank (kilobytes each, so it grows linearly), but a page of 10,000
table rows, and of 20 checks x 10,000 ranks, is one nobody can read and few browsers open. The
page shows every rank up to ROWS_SHOWN; beyond that, the ranks that matter (the slowest by median
step, the stragglers the job rule named, and the fastest for contrast), the spread of the median
step over all ranks, and the per-trace checks counted per rule and result. The page runs no
script (it is self-contained and static), so the table is not sortable in the page: rows are in
rank order, and report.json's `ranks[]` is the table to sort.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope.diagnose.registry import spec_of
from stallscope.report.build import Report, world_size
from stallscope.report.rank_groups import rank_span

ROWS_SHOWN = 300  # every rank up to this many; beyond, SLOWEST + FASTEST and the stragglers
SLOWEST = 100
FASTEST = 20


def rank_view(report: Report) -> dict[str, Any]:
    """Rows to show, how many there are, and the spread of the ranks' median step (ms)."""
    rows = report.ranks
    medians = np.array([r["step_time_us"]["median"] if r.get("step_time_us") else np.nan
                        for r in rows], dtype=float)
    known = medians[~np.isnan(medians)]
    spread = ({q: round(float(np.percentile(known, p)) / 1000, 3)
               for q, p in (("min", 0), ("median", 50), ("p90", 90), ("max", 100))}
              if len(known) else None)
    # The job's size, when the traces say it and more ranks ran than were given.
    world = world_size(report.traces)
    world = world if world is not None and world > len(rows) else None
    if len(rows) <= ROWS_SHOWN:
        return {"rows": rows, "total": len(rows), "summarised": False, "spread": spread,
                "world": world}
    order = np.argsort(np.where(np.isnan(medians), -np.inf, medians), kind="stable")
    keep = set(order[::-1][:SLOWEST].tolist()) | set(order[:FASTEST].tolist())
    named = {b.get("trace") for f in report.findings if (key := _names_traces(f.id))
             for b in f.evidence.get(key, [])}
    keep |= {i for i, r in enumerate(rows) if r["label"] in named}
    return {"rows": [rows[i] for i in sorted(keep)], "total": len(rows), "summarised": True,
            "spread": spread, "world": world}


def check_rows(report: Report) -> list[dict[str, Any]]:
    """The all-checks table: one row per check, or beyond ROWS_SHOWN traces one row per rule
    and result with the traces it holds for (job-level checks stay as they are)."""
    if len(report.traces) <= ROWS_SHOWN:
        return [{**a, "where": a["trace"]} for a in report.assessments]
    rank_of = {t["label"]: t["rank"] for t in report.traces}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    out: list[dict[str, Any]] = []
    for a in report.assessments:
        if a["trace"] not in rank_of:
            out.append({**a, "where": a["trace"]})
        else:
            groups.setdefault((a["rule"], a["status"]), []).append(a)
    for (rule, status), rows in sorted(groups.items()):
        ranks = [rank_of[a["trace"]] for a in rows if rank_of[a["trace"]] is not None]
        where = (f"{len(rows)} traces" + (f" (ranks {rank_span(ranks)})" if ranks else "")
                 if len(rows) > 1 else rows[0]["trace"])
        detail = rows[0]["detail"] + (" (the first; each trace's own is in report.json)"
                                      if len(rows) > 1 else "")
        out.append({"rule": rule, "trace": rows[0]["trace"], "status": status,
                    "detail": detail, "where": where})
    return out


def _names_traces(rule_id: str) -> str:
    """The evidence key a rule lists the traces it names under ("" when it names none)."""
    spec = spec_of(rule_id)
    return spec.names_traces if spec is not None else ""
