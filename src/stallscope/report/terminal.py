"""The one-screen summary printed after a run: verdict, step time, the replayed fix plan and
the findings, each saving labelled as a replayed prediction or an upper bound."""

from __future__ import annotations

from stallscope.diagnose.finding import Finding
from stallscope.report.build import Report
from stallscope.report.kernel_mix import busiest
from stallscope.report.labels import (
    LOADER_TIME,
    category_name,
    floor_phrase,
    loader_story,
    measured_phrase,
    not_estimated,
    pct_of,
    predicted,
    profiler_phrase,
    saving_label,
    shared_saving,
    with_before,
)
from stallscope.report.watch_lead import capture_items, counts
from stallscope.text import MAX_TERMINAL, plain
from stallscope.units import ms, percent, share_text

MAX_FINDINGS = 6
MAX_PLAN_ENTRIES = 5
MAX_VERDICT = 1000  # characters of the first line; other lines are cut at MAX_TERMINAL


def _p(text: object) -> str:
    """Trace-derived text for one terminal line: no escape sequences, no screenful of name."""
    return plain(text, MAX_TERMINAL)


def render_terminal(report: Report, outputs: dict[str, str] | None = None) -> str:
    """The summary lines, newline-terminated; trace text made inert and cut per line."""
    s = report.shown_summary
    # The verdict whole (up to MAX_VERDICT): its end holds the fix and the predicted step,
    # what the user acts on (up to 525 characters on the committed traces).
    out = [f"stallscope: {plain(report.verdict, MAX_VERDICT)}", *_watch_lines(report)]
    if s["step_time_us"]:
        t = s["step_time_us"]
        across = ""
        if report.figures_from:  # one trace's (the fix plan's), named; each one's own below
            lead = report.lead_trace or {}
            who = (f"rank {lead['rank']}" if report.ranks and lead.get("rank") is not None
                   else _p(report.figures_from))
            across = f" in {who} (the fix plan's; each trace's own below)"
        shares = ", ".join(f"{category_name(k)} {percent(v)}" for k, v in s["breakdown_pct"].items()
                           if v >= 0.5)
        out.append(
            f"  steps: {s['steps']}{across}, median {ms(t['median'], 'tenths')} ms "
            f"(p90 {ms(t['p90'], 'tenths')} ms); host time: {shares}"
        )
        if report.plan and profiler_phrase(report.plan):
            out.append(f"  recorded under the profiler; {profiler_phrase(report.plan)}")
        for dev, parts in s["gpu_pct"].items():
            out.append(
                f"  GPU {_p(dev)}: kernels {percent(parts['kernel'])}, copies "
                f"{percent(parts['memcpy'])}, idle {percent(parts['idle'])}"
            )
        story = loader_story(report)
        if story:
            out.append(f"  {story}")
    if len(report.traces) > 1:
        for t in report.traces:
            ts = t["summary"]
            if ts["step_time_us"]:
                out.append(
                    f"  {_p(t['label'])}: median {ms(ts['step_time_us']['median'], 'tenths')} ms, "
                    f"{LOADER_TIME} {percent(ts['breakdown_pct']['dataloader'])}, sync "
                    f"{percent(ts['breakdown_pct']['sync'])}" + _comm_text(t)
                )
    out += _plan_lines(report) + _what_if_lines(report)
    for f in report.findings[:MAX_FINDINGS]:
        others = len([r for r in f.recordings if r["trace"] != f.trace])
        where = (f" [{_p(f.trace)}" + (f" and {others} more" if others else "") + "]"
                 if len(report.traces) > 1 else "")
        out.append(f"  {f.severity.upper():<6} {f.id}{where}: {_p(f.title)} ({_saving(f)})")
    if len(report.findings) > MAX_FINDINGS:
        out.append(f"  ... and {len(report.findings) - MAX_FINDINGS} more in the report")
    skipped = sum(1 for a in report.assessments if a["status"] == "not_assessed")
    if skipped:
        out.append(f"  {skipped} check(s) could not be assessed: see the report")
    for n in report.notes[:3]:
        out.append(f"  note: {_p(n)}")
    if outputs:
        out.append("  wrote: " + ", ".join(_p(v) for v in outputs.values()))
    return "\n".join(out) + "\n"




def _watch_lines(report: Report) -> list[str]:
    """`stallscope watch`: the stretch the verdict speaks for, then the whole run: its counts
    and each capture's verdict and plan."""
    w = report.watch
    if not w or not w.get("headline"):
        return []
    out = [f"  the whole run: {counts(w)}",
           f"  {plain(w['headline']['text'], MAX_VERDICT)}"]
    out += [f"  {_p(item.replace('`', ''))}" for item in capture_items(w, verdicts=False)]
    return out


def _saving(f: Finding) -> str:
    """A finding's saving as the terminal says it: a replayed share, time counted in its
    cause's fix, or a rule's bound, so a bound is never read as a prediction."""
    kind, _ = saving_label(f)
    pct = share_text(f.estimated_saving_pct)
    if kind == "replayed":
        return f"replayed: saves {pct}"
    if kind == "counted":
        return f"counted in {f.caused_by}'s fix"
    if not_estimated(f):
        return "not estimated"
    return f"upper bound {pct}"


def _plan_lines(report: Report) -> list[str]:
    """The fix plan, one line per change (cumulative predicted step), then its floor."""
    plan = report.plan
    if not plan or not plan["entries"]:
        return []
    of = f" for {_p(plan['trace'])}" if len(report.traces) > 1 else ""
    out = [f"  fix plan{of} (replayed predictions, medians of {len(plan['steps_used'])} "
           f"step(s), {measured_phrase(report, plan)}"
           + (f"; {profiler_phrase(plan)}" if profiler_phrase(plan) else "") + "):"]
    for i, (e, before) in enumerate(with_before(plan)[:MAX_PLAN_ENTRIES], 1):
        out.append(f"    {i}. {_p(e['change'])} ({e['id']}): {ms(before)} -> {predicted(e)} "
                   f"({shared_saving(plan, e, before)})")
    if len(plan["entries"]) > MAX_PLAN_ENTRIES:
        out.append(f"    ... and {len(plan['entries']) - MAX_PLAN_ENTRIES} more in the report")
    out.append(f"    floor {ms(plan['floor_us'])} ms ({floor_phrase(plan)})")
    return out


def _what_if_lines(report: Report) -> list[str]:
    """`--what-if`: each change alone and all together, as predicted step times."""
    w = report.what_if
    if not w:
        return []
    rows = [(c["change"], c) for c in w["each"]]
    if len(w["each"]) > 1:
        rows.append(("all together", w))
    out = [f"  what if (replayed, measured {ms(w['measured_step_us'])} ms):"]
    for label, c in rows:
        us = c.get("predicted_step_us")
        said = (f"not replayed ({c.get('not_replayed') or 'not modelled'})" if us is None
                else f"{predicted(c)} ({percent(pct_of(w, us), signed=True)})")
        out.append(_p(f"    {label}: {said}"))
    return out


def _comm_text(trace: dict) -> str:
    """", communication 198.1 ms per step (14.9% hidden under compute)" for a trace whose
    busiest GPU, or (CPU-only) whose process, communicates (report/kernel_mix.py); "" else."""
    mix = busiest(trace.get("kernel_mix")) or trace.get("host_comm")
    if mix is None or mix["comm_hidden_pct"] is None:
        return ""
    return (f", communication {ms(mix['per_step_us']['communication'], 'tenths')} ms per step "
            f"({percent(mix['comm_hidden_pct'])} hidden under compute)")
