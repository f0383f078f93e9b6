"""report.md: the verdict, the replayed fix plan, the findings in plan order and the top
recommendation, for a ticket.

Written to render the same in CommonMark and Python-Markdown and to read well raw (md_text.py
says how): lists, not tables; names in code spans; lines wrapped under 200 characters.
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose.finding import Finding
from stallscope.report.anatomy_view import loader_views
from stallscope.report.build import Report
from stallscope.report.kernel_mix import busiest
from stallscope.report.labels import (
    alone_phrase,
    baseline,
    category_name,
    floor_phrase,
    loader_story,
    measured_phrase,
    not_estimated,
    pct_of,
    plan_of,
    predicted,
    profiler_phrase,
    range_phrase,
    saving_label,
    shared_saving,
    steps_phrase,
    with_before,
)
from stallscope.report.md_text import bullets, code, command_lines, paragraph, prose, wrap
from stallscope.report.memory_view import device_items, host_item, worker_items
from stallscope.report.recording import recording_lines
from stallscope.report.watch_lead import (
    capture_items,
    counts,
    load_items,
    periodic_items,
    regime_items,
)
from stallscope.text import md_code, plural
from stallscope.units import millis, ms, percent, share_text

# A line in a fenced block is cut here: a ticket's raw view must not scroll sideways (a
# command is split at its arguments before that; only a hostile name runs so long).
_MAX_CODE_LINE = 199


def _fence_language(snippet: str) -> str:
    """`diff` for snippets written as -/+ lines, so ticket systems colour them; else python."""
    lines = snippet.split("\n")
    return "diff" if any(line.startswith(("-", "+")) for line in lines) else "python"


def _fence(language: str, text: str) -> list[str]:
    """A fenced code block; a line longer than a screen is cut, saying so."""
    body = [line if len(line) <= _MAX_CODE_LINE else line[: _MAX_CODE_LINE - 1] + "…"
            for line in md_code(text).split("\n")]
    return [f"```{language}", *body, "```", ""]


def _plan_lines(report: Report) -> list[str]:
    """The fix plan as an ordered list, each line measured-or-previous -> predicted, then the
    floor and what the replay could not model: a ticket reader sees which numbers are
    predictions and what they rest on."""
    plan = report.plan
    if not plan or not plan["entries"]:
        return []
    of = f" of {_trace_name(plan['trace'])}" if len(report.traces) > 1 else ""
    cost = profiler_phrase(plan)
    ranges = range_phrase(plan)
    lines = ["## Fix plan", ""]
    lines += paragraph(
        f"Replayed predictions{of}: the recorded steps replayed with each change applied, in "
        f"this order, each on top of the ones before; the order is each change's share of the "
        f"plan's saving (what it adds, averaged over every order of making the changes). "
        f"Medians over "
        f"{prose(steps_phrase(report, plan))}; {prose(measured_phrase(report, plan))}; the "
        f"unchanged replay gives {ms(plan['replayed_step_us'])} ms"
        + (f"; {prose(cost)}." if cost else ".") + (f" {prose(ranges)}." if ranges else ""))
    for i, (e, before) in enumerate(with_before(plan), 1):
        lines += wrap(f"{code(e['change'])} ({code(e['id'])}): {ms(before)} -> "
                      f"{predicted(e)} ({shared_saving(plan, e, before)})", first=f"{i}. ",
                      indent="    ")
        lines += bullets([f"assumes: {prose(a)}" for a in e["assumptions"]], level=1)
    lines += [""]
    lines += paragraph(f"Floor: {ms(plan['floor_us'])} ms per step, the {floor_phrase(plan)} "
                       "once every change is made; no change in this plan goes below it.")
    if plan["not_replayed"]:
        lines += ["Not replayed:", ""]
        lines += bullets([f"{code(k)}: {prose(v)}" for k, v in plan["not_replayed"].items()])
        lines.append("")
    left = [f for f in report.findings if f.trace == plan["trace"]
            and f.predicted_step_us is not None and f.plan_rank is None]
    if left:
        lines += paragraph(
            f"Replayed but not in the plan (under {plan['min_gain_pct']}% on top of it): "
            + ", ".join(f"{code(f.id)} (alone {ms(f.predicted_step_us)} ms)" for f in left)
            + ".")
    return lines


def _what_if_lines(report: Report) -> list[str]:
    """`--what-if`: each requested change alone and all together, against the measured step."""
    w = report.what_if
    if not w:
        return []
    lines = ["## What if", ""]
    lines += paragraph(
        f"Your changes ({code('--what-if')}), replayed on the same steps: measured "
        f"{ms(w['measured_step_us'])} ms per step (the unchanged replay: "
        f"{ms(w['replayed_step_us'])} ms).")
    rows = [(f"{code(c['change'])} alone", c) for c in w["each"]]
    if len(w["each"]) > 1:
        rows.append(("all together", w))
    items = []
    for label, c in rows:
        us = c.get("predicted_step_us")
        if us is None:
            items.append(f"{label}: not replayed "
                         f"({prose(c.get('not_replayed') or 'not modelled')})")
        else:
            items.append(f"{label}: {predicted(c)}, {percent(pct_of(w, us), signed=True)} against "
                         "the measured step")
    lines += [*bullets(items), ""]
    assumptions = list(dict.fromkeys(
        [*w.get("assumptions", []), *(a for c in w["each"] for a in c.get("assumptions", []))]))
    if assumptions:
        lines += ["Assumptions:", "", *bullets([prose(a) for a in assumptions]), ""]
    return lines


def _estimate_line(report: Report, f: Finding) -> str:
    """The top finding's estimate, saying whether it is a replayed prediction or a bound."""
    kind, _ = saving_label(f)
    entry = report.plan_entry(f)
    plan = plan_of(report, f.trace)
    basis = prose(f.saving_basis)
    if kind == "replayed" and entry is not None and plan is not None:
        alone = alone_phrase(plan, f)
        alone = f"; {alone}" if alone else ""
        before = next(b for e, b in with_before(plan) if e is entry)
        of_step = f" of the {ms(baseline(plan))} ms step"
        return (f"*Estimate (replayed prediction):* step {f.plan_rank} of the fix plan, "
                f"{shared_saving(plan, entry, before, unit=of_step)} (down to "
                f"{predicted(entry, inside=True)}){alone} ({basis}).")
    if kind == "replayed":
        return (f"*Estimate (replayed prediction):* {share_text(f.estimated_saving_pct)} of "
                f"step time ({basis}).")
    if kind == "counted":
        return f"*Estimate:* counted in {code(f.caused_by)}'s fix ({basis})."
    if not_estimated(f):
        return f"*Estimate:* not estimated ({basis})."
    return (f"*Estimate (upper bound, not replayed):* up to "
            f"{share_text(f.estimated_saving_pct)} of step time ({basis}).")


def _trace_name(label: str) -> str:
    """A recording's label: a file name in a code span; a rank ("rank 3") in words."""
    return label if label.startswith("rank ") and label[5:].isdigit() else code(label)


def _saves(report: Report, f: Finding) -> str:
    """What fixing a finding saves, as the findings list says it: its share of the fix plan,
    with its step in the plan; the step with its change alone only labelled as such."""
    kind, text = saving_label(f)
    if kind == "counted":
        return f"counted in {code(f.caused_by)}'s fix"
    if text == "not estimated":
        return f"saving {text}"
    plan = plan_of(report, f.trace)
    entry = report.plan_entry(f)
    if plan is not None and entry is not None:
        before = next(b for e, b in with_before(plan) if e is entry)
        return (f"saves {text}, step {f.plan_rank} of the fix plan: {ms(before)} -> "
                f"{ms(entry['predicted_step_us'])} ms")
    alone = alone_phrase(plan, f)
    return f"saves {text}" + (f"; {alone}" if alone else "")


def _finding_lines(report: Report) -> list[str]:
    """One item per cause (report.findings holds each once), in the fix plan's order, with the
    lead recording's figures; where other recordings show it too, one sub-item each."""
    lines = ["## Findings", ""]
    if not report.findings:
        return [*lines, "No findings.", ""]
    multi = len(report.traces) > 1
    whose = (f", with the figures of {_trace_name(report.figures_from)} (the fix plan's)"
             if report.figures_from and not report.ranks else "")
    lines += paragraph(f"In the fix plan's order{whose}; the saving is the change's share of "
                       "the fix plan's saving (a replayed prediction) or, where the replay "
                       "could not model the change, an upper bound.")
    for i, f in enumerate(report.findings, 1):
        caused = f" (an effect of {code(f.caused_by)})" if f.caused_by else ""
        # A finding grouped over ranks (`seen_on`) names its ranks in its title.
        where = (f" In {_trace_name(f.trace)}." if multi and "seen_on" not in f.evidence
                 and f.trace != report.figures_from else "")
        lines += wrap(f"**{f.severity}** {code(f.id)}{caused}: {prose(f.title)}; "
                      f"{_saves(report, f)}.{where}", first=f"{i}. ", indent="    ")
        others = [r for r in f.recordings if r["trace"] != f.trace]
        lines += bullets([f"also in {_trace_name(r['trace'])}: **{r['severity']}**, "
                          f"{prose(r['title'])}; {_other_saving(r)}" for r in others],
                         level=1)
    lines.append("")
    return lines + _top_lines(report)


def _other_saving(r: dict[str, Any]) -> str:
    """Another recording's saving of a cause, as the findings list says it."""
    if r["saving_kind"] == "counted":
        return f"counted in {code(r.get('caused_by') or '')}'s fix"
    kind = "replayed" if r["saving_kind"] == "replayed" else "upper bound"
    return (f"saves {share_text(r['estimated_saving_pct'])} ({kind}) of that recording's own "
            "step, by its own plan")


def _top_lines(report: Report) -> list[str]:
    """The lead finding (the verdict's) in full: what to do, the code, its precondition."""
    top = report.lead or report.findings[0]
    # The title goes below the heading: a heading cannot wrap, and titles run to 200 characters.
    lines = [f"### Top recommendation: {code(top.id)}", "", *paragraph(f"**{prose(top.title)}**")]
    if report.verdict_id == "no-bottleneck":
        lines += paragraph("*The largest finding, though the verdict finds nothing worth "
                           "fixing: its saving is small.*")
    lines += paragraph(prose(top.recommendation))
    lines += _fence(_fence_language(top.snippet), top.snippet)
    lines += paragraph(f"*Precondition:* {prose(top.precondition)}")
    lines += paragraph(_estimate_line(report, top))
    if top.docs.startswith("https://") and " " not in top.docs and ">" not in top.docs:
        lines += [f"*Docs:* <{top.docs}>", ""]
    return lines


def _summary_lines(report: Report) -> list[str]:
    """Step time, where it goes, the GPU's busy and idle shares, the loader's two figures."""
    s = report.shown_summary
    t = s["step_time_us"]
    if not t:
        return []
    cost = profiler_phrase(report.plan) if report.plan else ""
    figures = f"median {ms(t['median'])} ms, mean {ms(t['mean'])} ms, p90 {ms(t['p90'])} ms"
    lead = report.figures_from
    # Several recordings: one recording's figures (the fix plan's), named; the others' are
    # under "Per trace" / "Per rank", each under its own name.
    whose = "" if lead is None else (
        f"In {_whose(report)} (the {'rank' if report.ranks else 'recording'} of the fix plan; "
        f"the others under {'Per rank' if report.ranks else 'Per trace'}): ")
    lines = paragraph(f"{whose}{'step' if whose else 'Step'} time: {figures} over "
                      f"{plural(s['steps'], 'step')}"
                      + (f", recorded under the profiler; {prose(cost)}." if cost else "."))
    lines += ["Where the step's time goes:", ""]
    lines += bullets([f"{category_name(k)}: {percent(v)}" for k, v in s["breakdown_pct"].items()])
    lines.append("")
    for dev, parts in s["gpu_pct"].items():
        busy = 100.0 - parts.get("idle", 0.0)
        what = ", ".join(f"{category_name(k)} {percent(parts[k])}"
                         for k in ("kernel", "memcpy", "memset") if k in parts)
        lines += paragraph(f"GPU {prose(dev)}: busy {percent(busy)} of the step ({what}), idle "
                           f"{percent(parts.get('idle', 0.0))}.")
    story = loader_story(report)
    if story:
        lines += paragraph(prose(story))
    return lines


def _whose(report: Report) -> str:
    """The lead trace as the page names it: "rank 3" in a job, else its file name."""
    lead = report.lead_trace or {}
    if report.ranks and lead.get("rank") is not None:
        return f"rank {lead['rank']}"
    return _trace_name(str(report.figures_from))


def _watch_lines(report: Report) -> list[str]:
    """`stallscope watch`: the whole run (report/watch_lead.py): its steps, regimes, captures
    with each one's verdict and plan, and recurring stalls; which capture the rest describes."""
    w = report.watch
    if not w:
        return []
    lines = ["## The whole run", ""]
    lines += paragraph(
        f"{plural(w['n_steps'], 'step')} timed over {w['wall_ms'] / 1000:.1f} s, median step "
        f"{millis(w['median_step_ms'], 'tenths', missing='n/a')} ms (measured, outside the "
        f"recorded windows). The findings and fix plan below are capture "
        f"{w.get('diagnosed') or 1}'s; every step is in report.json ({code('watch.steps')}).")
    for label, items, ordered in (("Regimes", regime_items(w) if len(w["regimes"]) > 1
                                   else [], False),
                                  ("Captures", capture_items(w), True),
                                  ("Recurring stalls", periodic_items(w), False),
                                  ("Other load", load_items(w), False)):
        if items:
            lines += [f"{label}:", "", *bullets([prose(i) for i in items], ordered), ""]
    return lines


def _run_lines(report: Report) -> list[str]:
    """What the run itself says about its recording: forced settings, its own profiler, an
    early end."""
    run = report.run
    if not run:
        return []
    lines: list[str] = []
    if run.get("overrides"):
        forced = ", ".join(code(f"{k}={v}") for k, v in run["overrides"].items())
        lines += paragraph(f"**Overridden run:** measured with DataLoader settings forced by "
                           f"{code('--set')} ({forced}), not the script's own.")
    if run.get("trace_source") == "script-profiler" and run.get("script_profiler"):
        lines += paragraph(f"**The script's own profiler:** "
                           f"{prose(run['script_profiler']['note'])}")
    if run["partial"] or run["exit_status"]:
        lines += paragraph(
            f"**Partial run:** the script ended ({prose(run['ended'])}, exit status "
            f"{run['exit_status']}) with {run['steps_recorded']} of "
            f"{plural(run['steps_requested'], 'requested step')} recorded.")
    return lines


def _trace_lines(report: Report) -> list[str]:
    """Per recording (or rank): its steps, median step and the shares the verdict reads."""
    if len(report.traces) <= 1:
        return []
    items = []
    for t in report.traces:
        ts, share = t["summary"], t["summary"]["breakdown_pct"]
        median = f", median step {ms(ts['step_time_us']['median'])} ms" if (
            ts["step_time_us"]) else ""
        found = ", ".join(code(f) for f in t["findings"]) or "none"
        items.append(
            f"{_trace_name(t['label'])}: {plural(ts['steps'], 'step')}{median}, "
            f"{category_name('dataloader')} {percent(share.get('dataloader', 0))}, "
            f"{category_name('sync')} {percent(share.get('sync', 0))}"
            f"{_kernel_text(busiest(t.get('kernel_mix')) or t.get('host_comm'))}; "
            f"findings: {found}")
    return ["## Per rank" if report.ranks else "## Per trace", "", *bullets(items), ""]


def _recording_lines(report: Report) -> list[str]:
    """What recording cost, where the trace says (report/recording.py)."""
    shown = recording_lines(report.traces)
    if shown is None:
        return []
    text, others = shown
    if others:
        text += (f" The other {plural(others, 'trace')}' figures are in report.json "
                 "(`traces[].recording`).")
    return ["## Recording", "", *paragraph(prose(text))]


def _reproduce_lines(report: Report) -> list[str]:
    lines = ["## Reproduce", "", "```sh", md_code(command_lines(report.reproduce_command))]
    if report.run:
        lines += [
            "# stallscope's per-step charts, and the trace in the PyTorch profiler plugin",
            "# (its page needs internet access):",
            md_code(command_lines(report.run["tensorboard_command"])),
        ]
    lines += ["```", ""]
    lines += paragraph("Open a trace in ui.perfetto.dev (*Open trace file*; read in the "
                       "browser, not uploaded):")
    return [*lines, *bullets([code(t["path"], limit=190) for t in report.traces]), ""]


def _not_assessed_lines(report: Report) -> list[str]:
    """Rules that could not judge the input: one item per rule and reason, naming the
    recordings only when not all of them share it."""
    not_assessed = [a for a in report.assessments if a["status"] == "not_assessed"]
    if not not_assessed and not report.notes:
        return []
    grouped: dict[tuple[str, str], list[str]] = {}
    for a in not_assessed:
        grouped.setdefault((a["rule"], a["detail"]), []).append(a["trace"])
    labels = {t["label"] for t in report.traces}
    items = [prose(n) for n in report.notes]
    for (rule, detail), traces in grouped.items():
        every = len(labels) > 1 and set(traces) >= labels
        where = "" if every or len(labels) <= 1 and traces != ["job"] else (
            " (" + ", ".join("the job" if t == "job" else _trace_name(t) for t in traces) + ")")
        items.append(f"{code(rule)}{where}: {prose(detail)}")
    return ["## What could not be assessed", "", *bullets(items), ""]


def _anatomy_lines(report: Report) -> list[str]:
    """Inside each DataLoader, in words: where one batch's loading time goes (measured)."""
    views = loader_views(report.dataloaders)
    if not views:
        return []
    lines = ["## Inside the DataLoaders", ""]
    lines += paragraph("Measured in the workers and the training process, per batch, over the "
                       "recorded steps.")
    items = []
    for v in views:
        site = code(str(v["call_site"]))
        if not v["segments"]:
            items.append(f"{site}: not measured inside ({prose(str(v['lost']))}).")
            continue
        parts = ", ".join(f"{p['label']} {millis(p['ms'], 'hundredths')} ms" for p in v["segments"])
        klass = f" **{prose(v['bound'])}**" if v["bound"] else ""
        line = (f"{site}{klass}: one batch's loading takes {millis(v['total_ms'], 'hundredths')} "
                f"ms (measured in the {prose(str(v['where']))}): {prose(parts)}.")
        top = v["top"][:2]
        if top:
            line += " Top functions: " + "; ".join(
                f"{percent(100 * (t.get('share') or 0), 0)} {prose(str(t.get('category')))} at "
                f"{code(str(t.get('site')))}" for t in top) + "."
        items.append(line)
    return [*lines, *bullets(items), ""]


def _memory_lines(report: Report) -> list[str]:
    """Memory (report/memory_view.py): the sentence, then each device, host and worker. None
    where nothing was measured: `device-memory`'s line under what could not be assessed says
    why."""
    mem = report.memory
    if not mem or mem["status"] != "measured":
        return []
    several = len(report.traces) > 1
    items = [*device_items(mem, several), *filter(None, [host_item(mem)]),
             *worker_items(mem, several)]
    return ["## Memory", "", *paragraph(prose(mem["sentence"])),
            *bullets([prose(i) for i in items]), *([""] if items else [])]


def render_markdown(report: Report) -> str:
    """The whole report.md: plain Markdown a ticket system renders, trace text inert."""
    lines = ["# stallscope watch" if report.watch else "# stallscope report", ""]
    if report.watch and report.watch.get("headline"):
        lines += paragraph(f"**The whole run:** {counts(report.watch)}. "
                           f"{prose(report.watch['headline']['text'])}")
    lines += paragraph(f"**Verdict:** {prose(report.verdict)}")
    versions: list[Any] = report.environment.get("torch_versions") or []
    if versions:
        lines += paragraph(f"**Recorded with:** {prose('; '.join(versions))}")
    if report.workload_note:
        lines += paragraph(f"*{prose(report.workload_note)}*")
    # A job leads with its ranks (each one's step and shares), then the plan of one of them.
    ranks = _trace_lines(report) if report.ranks else []
    lines += _run_lines(report) + _watch_lines(report) + _summary_lines(report) + ranks
    lines += _plan_lines(report) + _what_if_lines(report) + _finding_lines(report)
    lines += _anatomy_lines(report) + _memory_lines(report)
    lines += [] if ranks else _trace_lines(report)
    lines += _recording_lines(report)
    lines += _reproduce_lines(report)
    lines += _not_assessed_lines(report)
    lines += [f"*stallscope {report.stallscope_version}*", ""]
    return "\n".join(lines)


def _kernel_text(mix: dict | None) -> str:
    """Compute and communication per step and the share of communication hidden under compute,
    of the trace's busiest GPU or of a CPU-only trace's host collectives
    (report/kernel_mix.py); nothing without either."""
    if mix is None:
        return ""
    us = mix["per_step_us"]
    hidden = mix["comm_hidden_pct"]
    compute = f"GPU compute {millis(us['compute'] / 1000)} ms, " if "compute" in us else ""
    shown = "" if hidden is None else f" ({percent(hidden)} hidden under compute)"
    return f", {compute}communication {millis(us['communication'] / 1000)} ms{shown}"
