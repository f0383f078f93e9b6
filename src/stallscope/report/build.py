"""The single Report object every writer renders: plain data, no trace access after this."""

from __future__ import annotations

import platform
import shlex
import statistics
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from stallscope import __version__
from stallscope.diagnose import Assessment, Finding, ranked_findings
from stallscope.diagnose.knobs import as_written
from stallscope.diagnose.plan import PER_EPOCH, Plan, profiler_bound_note
from stallscope.diagnose.registry import flagged, spec_of
from stallscope.diagnose.rules.gpu_bound import verdict_line as gpu_bound_verdict
from stallscope.report import job_scale
from stallscope.report.digest import TraceDigest, digest, pick_drawn
from stallscope.report.hotspots import HotTotals, summed, top_rows
from stallscope.report.kernel_mix import busiest
from stallscope.report.memory_view import report_memory
from stallscope.report.rank_groups import group_findings, merge_recordings
from stallscope.report.timeline import step_timeline
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import GPU_CATEGORIES, HOST_CATEGORIES, TraceModel
from stallscope.units import ms, percent, share_text

# An entry's share of the fix plan and the drop its prediction shows are one figure when they
# differ by less than this (points of the step): report/labels.py's SAME_PCT.
SAME_SHARE_PCT = 0.5
# 2: findings are ranked by the replayed fix plan (`plan`, `findings[].predicted_step_us`,
# `findings[].plan_rank`, `what_if`); estimated_saving_pct is a finding's share of that plan.
SCHEMA_VERSION = 2


@dataclass
class Report:
    schema_version: int
    stallscope_version: str
    source: dict[str, Any]
    environment: dict[str, Any]
    steps: list[dict[str, Any]]
    summary: dict[str, Any]
    findings: list[Finding]
    assessments: list[dict[str, Any]]
    traces: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    run: dict[str, Any] | None = None  # `stallscope run` only: how the script was run and ended
    ranks: list[dict[str, Any]] = field(default_factory=list)  # one row per rank, when known
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    # One typical step drawn lane by lane (see report/timeline.py); {} when there are no steps.
    timeline: dict[str, Any] = field(default_factory=dict)
    top_host_ops: list[dict[str, Any]] = field(default_factory=list)
    top_gpu_kernels: list[dict[str, Any]] = field(default_factory=list)
    # The fix plan of the trace the verdict comes from (diagnose/plan.py), and `--what-if`'s
    # predictions for it; every trace's own plan is in traces[].plan.
    plan: dict[str, Any] | None = None
    what_if: dict[str, Any] | None = None
    # `stallscope watch` only: the whole run's steps, regimes, periodic stalls and captures
    # (commands/watch.py); absent from other reports' JSON.
    watch: dict[str, Any] | None = None
    # Each device's peak against its capacity, the workers' RAM, the machine's memory; or why
    # not assessed (report/memory_view.py).
    memory: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["watch"] is None:
            del data["watch"]
        return data

    @property
    def top_finding(self) -> Finding | None:
        """The headline finding: a finding caused by another is not the headline, its cause is."""
        if not self.findings:
            return None
        return next((f for f in self.findings if not f.caused_by), self.findings[0])

    @property
    def reproduce_command(self) -> str:
        """The command that made this report: what `run` recorded, what the CLI recorded for
        `analyze` (source["command"]), else an equivalent `stallscope analyze` line."""
        if self.run and self.run.get("command"):
            return str(self.run["command"])
        if self.source.get("command"):
            return str(self.source["command"])
        return shlex.join(["stallscope", "analyze", *map(str, self.source.get("paths", []))])

    @property
    def workload_note(self) -> str | None:
        """One line when every trace is inference: its steps are batches of requests."""
        kinds = {t.get("workload") for t in self.traces}
        if kinds != {"inference"}:
            return None
        return ("Workload: inference (forward passes only, no backward pass in the trace): each "
                "step is one batch of requests.")

    @cached_property
    def lead(self) -> Finding | None:
        """The one finding the page leads with, chosen once: the verdict line, the HTML
        "Main bottleneck" and saving cards, the page title and report.md's top recommendation
        all read it. The top finding (the fix plan's first change unless that finding is
        another's effect); when its change was not replayed and its trace is GPU-bound, the
        GPU bound is the answer (it is what the first line says)."""
        top = self.top_finding
        if top is None:
            return None
        if self.plan_entry(top) is None:
            return self._gpu_bound(top) or top
        return top

    def _gpu_bound(self, top: Finding) -> Finding | None:
        """The gpu-bound finding of the headline's trace: when the GPU is the bound, the first
        line says so before naming the first fix."""
        return next((f for f in self.findings if flagged(f.id, "bound") and not f.caused_by
                     and f.trace == top.trace), None)

    @property
    def lead_trace(self) -> dict[str, Any] | None:
        """The trace the page's figures come from: the one whose fix plan it shows (the lead
        finding's), else the first. A page over several recordings quotes this one's step,
        shares and GPU time beside its plan and cards, and names it; the others' figures are
        in the per-trace table, each under its own name."""
        label = (self.plan or {}).get("trace") or (self.lead.trace if self.lead else None)
        return next((t for t in self.traces if t["label"] == label),
                    self.traces[0] if self.traces else None)

    @property
    def figures_from(self) -> str | None:
        """The lead trace's label when the report covers several traces (the page must say
        whose figures it quotes), else None."""
        lead = self.lead_trace
        return lead["label"] if lead is not None and len(self.traces) > 1 else None

    @property
    def shown_summary(self) -> dict[str, Any]:
        """The step-time summary the page quotes: the lead trace's own when there are several
        (pooling recordings of different speed gave a step no recording had), else the
        report's."""
        lead = self.lead_trace
        if self.figures_from is None or lead is None or not lead.get("summary"):
            return self.summary
        return dict(lead["summary"])

    @property
    def verdict_id(self) -> str:
        """What the verdict line speaks of, for machines: a finding id, or one of
        `too-little-to-judge`, `no-finding`, `no-bottleneck` (every finding is minor)."""
        top = self.lead
        if top is None:
            whole = [t for t in self.traces if t.get("too_little")]
            return ("too-little-to-judge" if whole and len(whole) == len(self.traces)
                    else "no-finding")
        bound = self._gpu_bound(top)
        if bound is not None:
            return bound.id
        return "no-bottleneck" if top.severity == "info" else top.id

    @property
    def verdict(self) -> str:
        """One sentence: the main bottleneck and what fixing it can save, or that none was seen."""
        top = self.lead
        too_little = [t["too_little"] for t in self.traces if t.get("too_little")]
        if top is None and too_little and len(too_little) == len(self.traces):
            return f"Too little to judge: {too_little[0]}."
        if top is None:
            return "No bottleneck found by the rules that could be assessed."
        entry = self.plan_entry(top)
        if entry is not None:  # the change as the user writes it (TrainingArguments' fields)
            entry = {**entry, "change": as_written(entry["change"], spec_of(top.id),
                                                      self.dataloaders)}
        start = self.plan.get("baseline_step_us") or self.plan["measured_step_us"] if (
            self.plan is not None) else 0.0
        rng = (entry or {}).get("predicted_range_us")
        about = (f"about {ms(entry['predicted_step_us'], 'tenths')} ms per step, range "
                 f"{ms(rng[0], 'tenths')}-{ms(rng[1], 'tenths')}" if rng and entry is not None else
                 f"{ms((entry or {}).get('predicted_step_us', 0.0), 'tenths')} ms per step")
        replayed = (f"the replay predicts {ms(start, 'tenths')} -> {about}"
                    if entry is not None and self.plan is not None else "")
        bound = self._gpu_bound(top)
        if bound is not None:
            # The GPU is the bound; the fix plan's first entry is still what to try first.
            first = (f" Fix first: {entry['change']} ({top.title[0].lower()}{top.title[1:]}); "
                     f"{replayed} ({share_text(top.estimated_saving_pct)} less)."
                     if replayed and entry is not None and top is not bound else "")
            return gpu_bound_verdict(bound) + first
        if top.severity == "info":
            said = ("is predicted to save" if entry else "can save at most"
                    if top.estimated_saving_pct >= 0.05 else "can save")
            how = f" ({entry['change']}: {replayed.removeprefix('the replay predicts ')})" if (
                replayed and entry is not None) else ""
            why = profiler_bound_note(self.plan) if self.plan is not None else None
            largest = (f"the largest finding ({top.title.lower()}) {said} "
                       f"{share_text(top.estimated_saving_pct)} of step time{how}")
            plan = self.plan or {}
            pace = plan.get("rounds") or {}
            if pace.get("note") and not pace.get("waited_steps"):
                return (
                    f"The DataLoader sets the pace once the profiler's cost is gone: its "
                    f"{plural(pace['workers'], 'worker')} each take "
                    f"{ms(pace['worker_load_us'], 'tenths')} ms a batch, one batch every "
                    f"{ms(pace['pace_us'], 'tenths')} ms, and the step without the profiler "
                    f"({ms(plan['baseline_step_us'], 'tenths')} ms) waits for them; only a "
                    "change to the loader (more workers where cores are free, cheaper loading "
                    f"per batch) takes it lower, and {largest}.")
            return (
                f"No bottleneck worth fixing: {largest}"
                + (f"; {why}." if why and flagged(top.id, "idle_time") else ".")
            )
        if replayed and entry is not None:  # replayed: there is an entry
            return (f"{top.title}. Fix first: {entry['change']}; {replayed} "
                    f"({self._less(top, entry)}).")
        change = first_change_line(top.snippet)
        named = f". Try first: {change} (its card has the whole change)" if change else ""
        plan = self.plan or {}
        if flagged(top.id, "idle_time") and plan.get("floor_us") and not plan.get("entries"):
            # Its bound is the idle time itself: said as the floor the step cannot pass.
            return (f"{top.title}{named}; the replay could not model it, so there is no "
                    f"prediction: no change takes {self._step_named(top)} below the GPU's own "
                    f"work, {ms(plan['floor_us'], 'tenths')} ms (the floor).")
        return (
            f"{top.title}{named}; fixing it can save up to "
            f"{share_text(top.estimated_saving_pct)} of {self._step_named(top)} (an upper "
            "bound: the replay could not model this change)" + self._first_change(top) + "."
        )

    def _less(self, top: Finding, entry: dict[str, Any]) -> str:
        """How much less the lead's step is: its share of the fix plan's saving, which is also
        the drop its own prediction shows unless it pays off beside the plan's other changes;
        then both, and where the whole plan ends."""
        plan = self.plan or {}
        base = plan.get("baseline_step_us") or plan.get("measured_step_us") or 0.0
        entries = plan.get("entries") or []
        rank = next((i for i, e in enumerate(entries) if e["id"] == entry["id"]), 0)
        before = entries[rank - 1]["predicted_step_us"] if rank else base
        share = top.estimated_saving_pct
        drop = 100.0 * (before - entry["predicted_step_us"]) / base if base > 0 else share
        if abs(drop - share) < SAME_SHARE_PCT:
            return f"{share_text(share)} less"
        end = entries[-1]["predicted_step_us"]
        return (f"{share_text(drop)} less; its share of the fix plan's saving is "
                f"{share_text(share)} of the step: all {len(entries)} of its changes, about "
                f"{ms(end, 'tenths')} ms, {share_text(100.0 * (base - end) / base)} less")

    def _step_named(self, top: Finding) -> str:
        """What a lead's bound is a share of: the plan's baseline, said as such, or for a cost
        paid once an epoch the run's time over an epoch (diagnose/plan.py PER_EPOCH)."""
        plan = self.plan
        if top.id in PER_EPOCH:
            return "the run's time (it is paid once an epoch, in steps the median step leaves out)"
        if not plan or not plan.get("baseline_step_us"):
            return "step time"
        base, step = plan["baseline_step_us"], plan["measured_step_us"]
        how = " without the profiler's cost" if step - base >= 0.01 * step else ""
        return f"the {ms(base, 'tenths')} ms step{how}"

    def _first_change(self, top: Finding) -> str:
        """After an unreplayed lead, the fix plan's first change, which the replay did model."""
        plan = self.plan or {}
        entries = plan.get("entries") or []
        if not entries or self.plan_entry(top) is not None:
            return ""
        first = entries[0]
        base = plan["baseline_step_us"] or plan["measured_step_us"]
        return (f"; the first change the replay models: {first['change']}, "
                f"{ms(base, 'tenths')} -> about {ms(first['predicted_step_us'], 'tenths')} ms "
                "per step")

    def plan_entry(self, finding: Finding) -> dict[str, Any] | None:
        """The fix-plan entry of `finding`, when it is in the plan of its trace."""
        plan = next((t.get("plan") for t in self.traces if t["label"] == finding.trace), None)
        if not plan:
            return None
        return next((e for e in plan["entries"] if e["id"] == finding.id), None)


def build_report(
    models: list[TraceModel], assessments: list[list[Assessment]], paths: list[str],
    plans: list[Plan | None] | None = None,
) -> Report:
    """The report of traces whose models are at hand (one process): see `report_from`."""
    plans = plans if plans is not None else [None] * len(models)
    digests = [digest(m, p, draw=False) for m, p in zip(models, plans, strict=True)]
    drawn = pick_drawn(digests)
    if drawn is not None:
        drawn.timeline = step_timeline(models)
    return report_from(digests, assessments, paths)


def report_from(
    digests: list[TraceDigest], assessments: list[list[Assessment]], paths: list[str],
    hot: tuple[HotTotals, HotTotals] | None = None,
) -> Report:
    """The report of traces from their digests (report/digest.py), in report order, with every
    trace's assessments and the job's. The drawn trace (`pick_drawn`) carries the timeline.
    `hot`: the host-op and kernel totals already summed over the digests (a job sums them as
    its files finish, and drops each file's), else they are summed here."""
    if hot is None:
        hot = (summed(d.host_ops for d in digests), summed(d.gpu_kernels for d in digests))
    all_steps: list[dict[str, Any]] = []
    traces = []
    trace_notes: list[tuple[str, str]] = []  # (label, note): the label is said before it
    multi = len(digests) > 1
    for d in digests:
        steps = [{**s, "trace": d.label} for s in d.steps] if multi else d.steps
        all_steps.extend(steps)
        traces.append({**d.entry, "summary": _summary(d.steps)})
        trace_notes.extend((d.label if multi else "", n) for n in d.notes)
    flat = [a for group in assessments for a in group]
    ranked = causes_first(ranked_findings(flat))
    by_trace: dict[str, list[str]] = {}
    for f in ranked:
        by_trace.setdefault(f.trace, []).append(f.id)
    for entry in traces:
        entry["findings"] = by_trace.get(entry["label"], [])
    memory = report_memory(traces)
    for entry in traces:
        entry.pop("memory", None)
    ranks = [
        {
            "rank": t["rank"],
            "label": t["label"],
            "steps": t["summary"]["steps"],
            "step_time_us": t["summary"]["step_time_us"],
            "breakdown_pct": t["summary"]["breakdown_pct"],
            "gpu_pct": t["summary"]["gpu_pct"],
            # The kernel-type split of the GPU the rank's step waits on (report/kernel_mix.py).
            "kernel_mix": busiest(t.get("kernel_mix")),
            "host_comm": t.get("host_comm"),  # a CPU-only rank's collectives (gloo, MPI)
            "findings": t["findings"],
        }
        for t in traces
        if t["rank"] is not None
    ]
    world = world_size(traces)
    top = next((f for f in ranked if not f.caused_by), ranked[0] if ranked else None)
    lead = next((t for t in traces if top and t["label"] == top.trace), traces[0] if traces
                else None)
    lead_label = lead["label"] if lead else None
    # One card per finding across the ranks of a job, and one finding per cause across
    # recordings of one process (report/rank_groups.py), the lead trace's first, causes first.
    rank_of = {t["label"]: t["rank"] for t in traces}
    found = causes_first(merge_recordings(
        group_findings(ranked, rank_of, world, lead_label), rank_of, lead_label))
    lead_plan = lead["plan"] if lead else None
    drawn = pick_drawn(digests)
    checks = [{"rule": a.rule, "trace": a.trace, "status": a.status, "detail": a.detail}
              for a in flat]
    summary = _summary(all_steps)
    if job_scale.at_job_scale(traces):  # kilobytes per rank (report/job_scale.py)
        rank_of = {t["label"]: t["rank"] for t in traces}
        all_steps = job_scale.keep_steps(all_steps, drawn.label if drawn else None)
        checks = job_scale.group_checks(checks, rank_of)
        job_scale.plans_shown(traces, found, lead["label"] if lead else None)
        notes = job_scale.group_notes(trace_notes, rank_of)
        notes.append(
            f"{len(traces)} traces: steps[] holds the steps of {drawn.label if drawn else '-'} "
            "only and the checks are one per rule and result; each rank's step times are in "
            "ranks[] and traces[].summary, and its findings in traces[].findings."
        )
    else:
        notes = [f"{label}: {n}" if label else n for label, n in trace_notes]
    given = len({r["rank"] for r in ranks})
    if world is not None and 1 < given < world:  # one rank alone is a trace, not a job
        notes.insert(0, f"{given} of {world} ranks given (the job's size, from the traces' "
                     "distributed info): the job-level figures (rank-imbalance, the spread "
                     f"over the ranks) are over these {given} only.")
    return Report(
        schema_version=SCHEMA_VERSION,
        stallscope_version=__version__,
        # As typed, but in one order: the same inputs in another order are the same job (traces
        # are ordered by rank, then path), so they make the same report.json.
        source={"paths": sorted(set(paths)), "files": [d.path for d in digests]},
        environment=_environment(digests),
        steps=all_steps,
        summary=summary,
        findings=found,
        assessments=checks,
        traces=traces,
        notes=notes,
        ranks=ranks,
        timeline=(drawn.timeline or {}) if drawn is not None else {},
        top_host_ops=top_rows(hot[0]),
        top_gpu_kernels=top_rows(hot[1]),
        plan=lead_plan,
        what_if=lead_plan.get("what_if") if lead_plan else None,
        memory=memory,
    )


CHANGE_CHARS = 70  # a change named in the verdict; its card has it whole


def first_change_line(snippet: str) -> str:
    """The first line of a finding's snippet that changes code (not a comment), without its
    trailing comment, cut to CHANGE_CHARS: the change a verdict names for an unreplayed lead."""
    for line in snippet.splitlines():
        if line.startswith("-"):  # a diff's removed line; its added lines are the change
            continue
        code = line.removeprefix("+").split("  #")[0].strip()
        if code and not code.startswith(("#", "...")):
            return code if len(code) <= CHANGE_CHARS else code[: CHANGE_CHARS - 1] + "\u2026"
    return ""


def world_size(traces: list[dict[str, Any]]) -> int | None:
    """The job's number of ranks as the ranked traces' distributedInfo gives it (world_size),
    when they agree and it is at least the number of ranks given; else None."""
    sizes = {t.get("world_size") for t in traces if t["rank"] is not None}
    given = len({t["rank"] for t in traces if t["rank"] is not None})
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if isinstance(size, int) and size >= given > 0 else None


def causes_first(findings: list[Finding]) -> list[Finding]:
    """`findings` with each effect moved just after its cause when it was ranked above it (an
    effect's saving is its cause's, so they tie, and the tie fell to the ids' order): a reader
    meets the cause, then what it causes. Linear: a job's findings number in the thousands."""
    present = {(f.id, f.trace) for f in findings}
    emitted: set[tuple[str, str]] = set()
    waiting: dict[tuple[str, str], list[Finding]] = {}  # cause -> effects held until it
    out: list[Finding] = []

    def emit(f: Finding) -> None:
        out.append(f)
        emitted.add((f.id, f.trace))
        for effect in reversed(waiting.pop((f.id, f.trace), [])):
            emit(effect)

    for f in findings:
        cause = (f.caused_by, f.trace) if f.caused_by else None
        if cause is not None and cause in present and cause not in emitted:
            waiting.setdefault(cause, []).append(f)
        else:
            emit(f)
    return out


def analyze_command(paths: list[str], fail_on: str | None, tensorboard: bool,
                    what_if: list[str] | None = None) -> str:
    """The `stallscope analyze` command line that reproduces a report, as report.json records
    it: the paths (sorted) and the options that change what the command does (--fail-on,
    --tensorboard, --what-if), without -o, --force, -q or --jobs, which only choose where the
    files go, whether an old report may be replaced, what is printed and how fast. So a report
    does not depend on the folder it was written to, or on being written again with --force."""
    options = (["--fail-on", fail_on] if fail_on else []) + (["--tensorboard"] if tensorboard
                                                              else [])
    for change in what_if or []:
        options += ["--what-if", change]
    return shlex.join(["stallscope", "analyze", *paths, *options])


def attach_run(
    report: Report, contexts: list[RunContext], trace_dir: Path, logdir: Path
) -> None:
    """Add what `stallscope run` captured in-process: the run, its DataLoaders, its machine."""
    first = contexts[0]
    failed = [c for c in contexts if c.exit_status != 0]
    status = failed[0].exit_status if failed else 0
    report.run = {
        "command": shlex.join(first.command),
        "target": first.target,
        "exit_status": status,
        "ended": first.ended if not failed else failed[0].ended,
        "partial": any(c.partial for c in contexts),
        "step_source": first.step_source,
        "steps_requested": first.steps_requested,
        "steps_recorded": min(c.steps_recorded for c in contexts),
        # The skipped steps, timed with no profiler running (what `tune` compares): rank 0's.
        "unprofiled_steps_us": list(first.unprofiled_steps_us),
        "unprofiled_load": dict(first.unprofiled_load),
        # Which steps were recorded and why those (capture/steady.py): rank 0's.
        "window": first.window,
        # "stallscope", or "script-profiler" when the script started its own profiler and
        # the trace analysed is the one it wrote (script_profiler: where, which files).
        "trace_source": first.trace_source,
        "script_profiler": first.script_profiler,
        "world_size": first.world_size,
        # `run --set`: DataLoader arguments forced for this run; {} when the script's own.
        "overrides": dict(first.overrides),
        # `run --record-shapes`: ops' input shapes recorded (off by default: no rule reads
        # them); what the recording cost is each trace's `recording`.
        "record_shapes": first.record_shapes,
        # The memory budget ended recording early on some rank (capture/budget.py), or None.
        "recording_cut": next((c.recording_cut for c in contexts if c.recording_cut), None),
        "trace_dir": str(trace_dir),
        "tensorboard_command": f"tensorboard --logdir {shlex.quote(str(logdir))}",
        "ranks": [
            {
                "rank": c.rank,
                "ended": c.ended,
                "exit_status": c.exit_status,
                "steps_recorded": c.steps_recorded,
                "partial": c.partial,
            }
            for c in contexts
        ],
    }
    if first.trace_source != "stallscope":  # the steps are those of the script's trace
        report.run["steps_recorded"] = report.summary["steps"]
    report.dataloaders = [
        {"rank": c.rank, **asdict(d)} for c in contexts for d in c.dataloaders
    ]
    env = {k: v for k, v in first.environment.items() if k != "run_id"}
    report.environment = {**report.environment, "captured": env}
    for c in contexts:
        report.notes.extend(c.notes)
    if report.run["partial"]:
        why = (f"the script {_ended_phrase(report.run)}" if not report.run["recording_cut"]
               else "the memory budget (--max-record-mb) ended recording")
        report.notes.insert(
            0,
            f"Partial: {why} after "
            f"{report.run['steps_recorded']} of "
            f"{plural(first.steps_requested, 'recorded step')}.",
        )
    if first.script_profiler and first.script_profiler.get("note"):
        report.notes.insert(0, first.script_profiler["note"])  # which trace this report is of
    recorded = (report.summary.get("step_time_us") or {}).get("median")
    if first.trace_source == "stallscope" and recorded:
        note = profiler_cost_note(list(first.unprofiled_steps_us), float(recorded))
        if note:
            report.notes.append(note)


# Recorded steps this much longer than the unprofiled ones (the same process, seconds before) are
# said: a run's two halves of steps differed by up to 6% in 10 of the 12 runs measured for
# compare's floor (commands/compare.py).
PROFILER_COST_PCT = 10.0
# The unprofiled steps compared: the later half, at least this many (the first skipped steps
# hold start-up and batches the workers prefetched).
UNPROFILED_MIN = 4


def profiler_cost_note(unprofiled_us: list[float], recorded_median_us: float) -> str | None:
    """What the profiler cost the recorded steps, when the steps `run` skipped (timed without
    it) show it: the replay predicts from the recorded steps, so a fix that shortens GPU work
    may save more than predicted once the profiler's host cost is gone (docs/replay.md)."""
    later = unprofiled_us[len(unprofiled_us) // 2:]
    if len(later) < UNPROFILED_MIN or recorded_median_us <= 0:
        return None
    plain = statistics.median(later)
    extra = 100.0 * (recorded_median_us / plain - 1.0) if plain > 0 else 0.0
    if extra < PROFILER_COST_PCT:
        return None
    return ("The profiler's own cost: the recorded steps' median "
            f"({ms(recorded_median_us, 'tenths')} ms, measured) is {percent(extra, 0)} above that "
            f"of the last {len(later)} steps before recording, timed without it "
            f"({ms(plain, 'tenths')} ms, measured). Predictions are for the recorded steps: a fix "
            "that shortens GPU work can save more than predicted once the profiler is off "
            "(docs/replay.md, \"The profiler's cost on the host\").")


def _ended_phrase(run: dict[str, Any]) -> str:
    return {
        "finished": "finished",
        "exit": f"exited with status {run['exit_status']}",
        "exception": "raised an exception",
        "interrupted": "was interrupted",
        "terminated": "was terminated",
    }.get(run["ended"], run["ended"])


def _summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    if not steps:
        return {"steps": 0, "step_time_us": None, "breakdown_pct": {}, "gpu_pct": {}}
    durations = [s["duration_us"] for s in steps]
    total = sum(durations)
    breakdown = {  # steps of zero length (damaged markers) have no shares
        c: round(100.0 * sum(s["breakdown_us"][c] for s in steps) / total, 2) if total else 0.0
        for c in HOST_CATEGORIES
    }
    gpu: dict[str, dict[str, float]] = {}
    for s in steps:
        for dev, parts in s["gpu_us"].items():
            acc = gpu.setdefault(dev, dict.fromkeys(GPU_CATEGORIES, 0.0))
            for k in GPU_CATEGORIES:
                acc[k] += parts[k]
    gpu_window = {
        dev: sum(s["duration_us"] for s in steps if dev in s["gpu_us"]) for dev in gpu
    }
    return {
        "steps": len(steps),
        "step_time_us": {
            "median": round(statistics.median(durations), 3),
            "mean": round(statistics.fmean(durations), 3),
            "p90": round(float(np.percentile(durations, 90)), 3),
            "min": round(min(durations), 3),
            "max": round(max(durations), 3),
        },
        "breakdown_pct": breakdown,
        "gpu_pct": {
            dev: {k: round(100.0 * v / gpu_window[dev], 2) if gpu_window[dev] else 0.0
                  for k, v in parts.items()}
            for dev, parts in gpu.items()
        },
    }


def _environment(digests: list[TraceDigest]) -> dict[str, Any]:
    devices = []
    for d in digests:
        for entry in d.devices:
            if entry and entry not in devices:
                devices.append(entry)
    dist = next((d.distributed for d in digests if d.distributed), {})
    return {
        "devices": devices,
        "distributed": {k: dist.get(k) for k in ("backend", "world_size") if k in dist},
        "trace_schemas": sorted({d.schema for d in digests}),
        # The torch that recorded the traces, and how it is known: advice is spelled for it.
        "torch_versions": sorted({d.torch_label for d in digests}),
        "analyzed_with": {"python": platform.python_version()},
    }
