"""Findings of a many-rank job, grouped: one card per finding, however many ranks show it.

Why: the rules run per trace, so a cause every rank shares (a slow DataLoader on all 16 ranks)
comes back as 16 findings; shown one card per rank, a 2,000-rank job made a 177 MB report.json
and a page nobody reads. A group keeps the finding of the rank where it saves the most (its
evidence, recommendation and fix plan are that rank's, so the verdict's replayed figures stay
measured), says in its title where it was seen ("on ranks 0-15 (16 of 16)"), and records the
spread of the saving across those ranks. When the traces are some of a bigger job's ranks
(distributedInfo's world_size), the title says how many were given and how many the job has.
A finding seen on one rank of several names that rank, so a rank-specific verdict says which
rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from stallscope.diagnose import Finding

JOB_LABEL = "job"


def rank_span(ranks: Iterable[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 7, 9, 10] -> '0-3, 7, 9-10'."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def where_seen(ranks: list[int], given: int, world: int | None = None) -> str:
    """'on rank 3', 'on ranks 0-15 (16 of 16)', or, when only some of the job's ranks were
    given, 'on ranks 0-1 (2 of 128 ranks given)' (every rank given shows it) and 'on ranks 0-2
    (3 of the 16 ranks given, of 128)': the ranks not given were not looked at, so a finding is
    never said to be on 2 of 128."""
    if len(ranks) == 1:
        return f"on rank {ranks[0]}"
    span = rank_span(ranks)
    if world is not None and world > given:
        if len(ranks) == given:
            return f"on ranks {span} ({given} of {world} ranks given)"
        return f"on ranks {span} ({len(ranks)} of the {given} ranks given, of {world})"
    return f"on ranks {span} ({len(ranks)} of {given})"


def group_findings(found: list[Finding], rank_of: dict[str, int | None],
                   world: int | None = None, lead: str | None = None) -> list[Finding]:
    """`found` in ranked order, each finding shared by several ranks made one (see above).

    `rank_of` maps each trace label to its rank (None for a trace without one); `world` is the
    job's number of ranks when the traces say it (distributedInfo's world_size). Only jobs of
    two or more ranked traces are grouped; findings of unranked traces and job-level findings
    are kept as they are. The order stays the ranked order of each group's first member. The
    member shown is the `lead` trace's (the one whose plan the report shows), so the plan, the
    cards and the table read one rank; else the largest saving."""
    ranked = {label: r for label, r in rank_of.items() if r is not None}
    if len(ranked) < 2:
        return found
    given = len(ranked)
    members: dict[str, list[Finding]] = {}
    for f in found:
        if f.trace in ranked:
            members.setdefault(f.id, []).append(f)
    out: list[Finding] = []
    for f in found:
        if f.trace not in ranked:
            out.append(f)
            continue
        group = members[f.id]
        if f is not group[0]:
            continue  # folded into the group's first (largest-saving) member
        shown = next((g for g in group if g.trace == lead), group[0])
        out.append(_grouped([shown, *(g for g in group if g is not shown)], ranked, given,
                            world))
    return out


def _grouped(group: list[Finding], rank_of: dict[str, int], given: int,
             world: int | None) -> Finding:
    lead = group[0]
    ranks = sorted(rank_of[f.trace] for f in group)
    savings = [f.estimated_saving_pct for f in group]
    seen: dict[str, Any] = {
        "ranks": rank_span(ranks),
        "count": len(ranks),
        "of": given,  # the ranks given; `world` the job's, when the traces say it
        "world": world,
        "shown": (lead.trace if len(group) == 1 else
                  f"{lead.trace} (the largest saving)" if lead is max(
                      group, key=lambda f: f.estimated_saving_pct)
                  else f"{lead.trace} (the rank whose fix plan the report shows)"),
    }
    if len(group) > 1:
        seen["saving_pct"] = {
            "min": round(min(savings), 1),
            "median": round(statistics.median(savings), 1),
            "max": round(max(savings), 1),
        }
    lead.title = f"{lead.title} {where_seen(ranks, given, world)}"
    lead.evidence = {"seen_on": seen, **lead.evidence}
    return lead


def cause_key(f: Finding, rank_of: dict[str, int | None]) -> tuple[str, str, str]:
    """What makes two findings one cause: the rule, the device it speaks of (a GPU's idle time
    on device 0 is not device 1's) and the rank (a job's own findings are keyed `job`)."""
    device = f.evidence.get("device")
    rank = rank_of.get(f.trace) if f.trace in rank_of else f.trace
    return f.id, "" if device is None else str(device), str(rank)


def merge_recordings(found: list[Finding], rank_of: dict[str, int | None],
                     lead: str | None) -> list[Finding]:
    """One finding per cause over several recordings of one process (or of one rank): the
    rules run per recording, so two recordings of one run gave every cause twice, and a page
    quoted one recording's figures in the plan and the other's in the cards. The finding kept
    is the `lead` recording's (the one whose plan the report shows), else the first in ranked
    order; it lists every recording's own figures in `recordings`, in report order. The lead
    recording's findings come first, in its plan's order; then causes the other recordings
    alone show, in ranked order."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in found:
        groups.setdefault(cause_key(f, rank_of), []).append(f)
    order = {label: i for i, label in enumerate(rank_of)}
    out: list[Finding] = []
    for members in groups.values():
        kept = next((f for f in members if f.trace == lead), members[0])
        if len(members) > 1:
            kept.recordings = [_recording(f) for f in
                               sorted(members, key=lambda f: order.get(f.trace, len(order)))]
        out.append(kept)
    return sorted(out, key=lambda f: f.trace != lead)  # stable: ranked order within each


def _recording(f: Finding) -> dict[str, Any]:
    """One recording's figures of a merged cause (see `merge_recordings`)."""
    return {"trace": f.trace, "title": f.title, "severity": f.severity,
            "estimated_saving_pct": f.estimated_saving_pct, "saving_kind": f.saving_kind,
            "predicted_step_us": f.predicted_step_us, "plan_rank": f.plan_rank,
            "caused_by": f.caused_by, "evidence": f.evidence}
