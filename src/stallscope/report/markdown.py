"""report.md: the verdict, the replayed fix plan, a findings table and the top recommendation,
for a ticket."""

from __future__ import annotations

from stallscope.diagnose.finding import Finding
from stallscope.report.anatomy_view import loader_views
from stallscope.report.build import Report
from stallscope.report.kernel_mix import busiest
from stallscope.report.labels import (
    baseline,
    category_name,
    floor_phrase,
    loader_story,
    ms,
    not_estimated,
    pct_of,
    plan_of,
    predicted,
    profiler_phrase,
    range_phrase,
    saving_label,
    share_text,
    steps_phrase,
    with_before,
)
from stallscope.text import md, md_code


def _fence_language(snippet: str) -> str:
    """`diff` for snippets written as -/+ lines, so ticket systems colour them; else python."""
    lines = snippet.split("\n")
    return "diff" if any(line.startswith(("-", "+")) for line in lines) else "python"


def _plan_lines(report: Report) -> list[str]:
    """The fix plan as an ordered list, each line measured-or-previous -> predicted, then the
    floor and what the replay could not model: a ticket reader sees which numbers are
    predictions and what they rest on."""
    plan = report.plan
    if not plan or not plan["entries"]:
        return []
    of = f" of {md(plan['trace'])}" if len(report.traces) > 1 else ""
    lines = [
        "## Fix plan",
        "",
        f"Replayed predictions{of}: the recorded steps replayed with each change applied, in "
        "this order, each on top of the ones before. Medians over "
        f"{md(steps_phrase(report, plan))}; "
        f"measured {ms(plan['measured_step_us'])} ms per step (the unchanged replay: "
        f"{ms(plan['replayed_step_us'])} ms)"
        + (f"; {md(profiler_phrase(plan))}." if profiler_phrase(plan) else ".")
        + (f" {md(range_phrase(plan))}." if range_phrase(plan) else ""),
        "",
    ]
    for i, (e, before) in enumerate(with_before(plan), 1):
        lines.append(f"{i}. {md(e['change'])} ({md(e['id'])}): {ms(before)} -> "
                     f"{predicted(e)} (-{e['saving_pct']:.1f}%)")
        lines += [f"   - assumes: {md(a)}" for a in e["assumptions"]]
    lines += ["", f"Floor: {ms(plan['floor_us'])} ms per step, the "
              f"{floor_phrase(plan)} once every change is made; no change in this "
              "plan goes below it.", ""]
    if plan["not_replayed"]:
        lines += ["Not replayed:", ""]
        lines += [f"- `{md_code(k)}`: {md(v)}" for k, v in plan["not_replayed"].items()]
        lines.append("")
    left = [f for f in report.findings if f.trace == plan["trace"]
            and f.predicted_step_us is not None and f.plan_rank is None]
    if left:
        lines += [f"Replayed but not in the plan (under {plan['min_gain_pct']}% on top of it): "
                  + ", ".join(f"`{md_code(f.id)}` (alone {ms(f.predicted_step_us)} ms)"
                              for f in left), ""]
    return lines


def _what_if_lines(report: Report) -> list[str]:
    """`--what-if`: each requested change alone and all together, against the measured step."""
    w = report.what_if
    if not w:
        return []
    lines = [
        "## What if",
        "",
        f"Your changes (`--what-if`), replayed on the same steps: measured "
        f"{ms(w['measured_step_us'])} ms per step (the unchanged replay: "
        f"{ms(w['replayed_step_us'])} ms).",
        "",
        "| change | predicted step | vs measured |",
        "|---|---:|---:|",
    ]
    rows = [(f"{c['change']} alone", c) for c in w["each"]]
    if len(w["each"]) > 1:
        rows.append(("all together", w))
    for label, c in rows:
        us = c.get("predicted_step_us")
        if us is None:
            why = c.get("not_replayed") or "not modelled"
            lines.append(f"| {md(label)} | not replayed: {md(why)} | |")
        else:
            lines.append(f"| {md(label)} | {predicted(c)} | {pct_of(w, us):+.1f}% |")
    assumptions = list(dict.fromkeys(
        [*w.get("assumptions", []), *(a for c in w["each"] for a in c.get("assumptions", []))]))
    if assumptions:
        lines += ["", "Assumptions:", ""] + [f"- {md(a)}" for a in assumptions]
    lines.append("")
    return lines


def _estimate_line(report: Report, f: Finding) -> str:
    """The top finding's estimate, saying whether it is a replayed prediction or a bound."""
    kind, _ = saving_label(f)
    entry = report.plan_entry(f)
    plan = plan_of(report, f.trace)
    if kind == "replayed" and entry is not None and plan is not None:
        alone = f"; this change alone: {ms(f.predicted_step_us)} ms" if (
            f.predicted_step_us is not None) else ""
        return (f"*Estimate (replayed prediction):* step {f.plan_rank} of the fix plan, "
                f"-{share_text(f.estimated_saving_pct)} of the "
                f"{ms(baseline(plan))} ms step (down to "
                f"{predicted(entry, inside=True)}){alone} ({md(f.saving_basis)}).")
    if kind == "replayed":
        return (f"*Estimate (replayed prediction):* {share_text(f.estimated_saving_pct)} of "
                "step time "
                f"({md(f.saving_basis)}).")
    if kind == "counted":
        return f"*Estimate:* counted in `{md_code(f.caused_by)}`'s fix ({md(f.saving_basis)})."
    if not_estimated(f):
        return f"*Estimate:* not estimated ({md(f.saving_basis)})."
    return (f"*Estimate (upper bound, not replayed):* up to "
            f"{share_text(f.estimated_saving_pct)} of step time ({md(f.saving_basis)}).")


def render_markdown(report: Report) -> str:
    """The whole report.md: plain Markdown a ticket system renders, trace text escaped."""
    s = report.summary
    lines = ["# stallscope report", "", f"**Verdict:** {md(report.verdict)}", ""]
    versions = report.environment.get("torch_versions") or []
    if versions:
        lines += [f"**Recorded with:** {md('; '.join(versions))}", ""]
    if report.workload_note:
        lines += [f"*{md(report.workload_note)}*", ""]
    run = report.run
    if run and run.get("overrides"):
        forced = ", ".join(f"`{md_code(f'{k}={v}')}`" for k, v in run["overrides"].items())
        lines += [
            f"> **Overridden run:** measured with DataLoader settings forced by `--set` "
            f"({forced}), not the script's own.",
            "",
        ]
    if run and run.get("trace_source") == "script-profiler" and run.get("script_profiler"):
        lines += [f"> **The script's own profiler:** {md(run['script_profiler']['note'])}", ""]
    if run and (run["partial"] or run["exit_status"]):
        lines += [
            f"> **Partial run:** the script ended ({md(run['ended'])}, exit status "
            f"{run['exit_status']}) with {run['steps_recorded']} of {run['steps_requested']} "
            "requested step(s) recorded.",
            "",
        ]
    if s["step_time_us"]:
        t = s["step_time_us"]
        lines += [
            f"Step time: median {t['median'] / 1000:.1f} ms, mean {t['mean'] / 1000:.1f} ms, "
            f"p90 {t['p90'] / 1000:.1f} ms over {s['steps']} step(s)"
            + (f", recorded under the profiler; {md(profiler_phrase(report.plan))}."
               if report.plan and profiler_phrase(report.plan) else "."),
            "",
            "| where the step's time goes | share |",
            "|---|---:|",
        ]
        lines += [f"| {md(category_name(k))} | {v:.1f}% |" for k, v in s["breakdown_pct"].items()]
        lines.append("")
        for dev, parts in s["gpu_pct"].items():
            busy = 100.0 - parts.get("idle", 0.0)
            what = ", ".join(f"{category_name(k)} {parts[k]:.1f}%"
                             for k in ("kernel", "memcpy", "memset") if k in parts)
            lines.append(f"GPU {md(dev)}: busy {busy:.1f}% of the step ({what}), idle "
                         f"{parts.get('idle', 0.0):.1f}%.")
        if s["gpu_pct"]:
            lines.append("")
        story = loader_story(report)
        if story:
            lines += [md(story), ""]
    lines += _plan_lines(report) + _what_if_lines(report)
    lines += ["## Findings", ""]
    if report.findings:
        # The predicted-step column only when some change was replayed: else it is all blank.
        replayed = any(f.predicted_step_us is not None for f in report.findings)
        head = "| severity | finding | saves |" + (" predicted step alone |" if replayed else "")
        lines += [f"{head} trace |", "|---|---|---:|" + ("---:|" if replayed else "") + "---|"]
        for f in report.findings:
            alone = ""
            if replayed:
                step = f"{ms(f.predicted_step_us)} ms" if f.predicted_step_us is not None else ""
                alone = f" {step} |"
            lines.append(
                f"| {f.severity} | `{f.id}` {md(f.title)}"
                f"{f' (caused by `{f.caused_by}`)' if f.caused_by else ''} "
                f"| {saving_label(f)[1]} |{alone} "
                f"{md(f.trace)} |"
            )
        top = report.lead or report.findings[0]
        lines += [
            "",
            f"### Top recommendation: {md(top.title)}",
            "",
            md(top.recommendation),
            "",
            f"```{_fence_language(top.snippet)}",
            md_code(top.snippet),
            "```",
            "",
            f"*Precondition:* {md(top.precondition)}",
            "",
            _estimate_line(report, top),
            "",
        ]
        if top.docs.startswith("https://"):
            lines += [f"*Docs:* <{top.docs}>", ""]
    else:
        lines += ["No findings.", ""]
    lines += _anatomy_lines(report)
    if len(report.traces) > 1:
        kernels = any(t.get("kernel_mix") or t.get("host_comm") for t in report.traces)
        lines += [
            "## Per rank" if report.ranks else "## Per trace",
            "",
            "| trace | steps | median step | dataloader | sync "
            + ("| GPU compute | comm. | comm. hidden " if kernels else "") + "| findings |",
            "|---|---:|---:|---:|---:|" + ("---:|---:|---:|" if kernels else "") + "---|",
        ]
        for t in report.traces:
            ts, share = t["summary"], t["summary"]["breakdown_pct"]
            median = f"{ts['step_time_us']['median'] / 1000:.1f} ms" if ts["step_time_us"] else ""
            lines.append(
                f"| {md(t['label'])} | {ts['steps']} | {median} "
                f"| {share.get('dataloader', 0):.1f}% | {share.get('sync', 0):.1f}% "
                + (_kernel_cells(busiest(t.get("kernel_mix")) or t.get("host_comm"))
                   if kernels else "")
                + f"| {md(', '.join(t['findings']))} |"
            )
        lines.append("")
    lines += ["## Reproduce", "", "```sh", md_code(report.reproduce_command)]
    if run:
        lines += [
            "# stallscope's per-step charts, and the trace in the PyTorch profiler plugin"
            " (its page needs internet access):",
            md_code(run["tensorboard_command"]),
        ]
    lines += [
        "```",
        "",
        # Escaped text, not code spans: a code span shows a file name's `<` and `&` only raw.
        "Open a trace in ui.perfetto.dev (*Open trace file*; read in the browser, not "
        "uploaded): "
        + ", ".join(md(t["path"]) for t in report.traces),
        "",
    ]
    not_assessed = [a for a in report.assessments if a["status"] == "not_assessed"]
    if not_assessed or report.notes:
        lines += ["## What could not be assessed", ""]
        lines += [f"- {md(n)}" for n in report.notes]
        lines += [f"- `{a['rule']}` ({md(a['trace'])}): {md(a['detail'])}" for a in not_assessed]
        lines.append("")
    lines += [f"*stallscope {report.stallscope_version}*", ""]
    return "\n".join(lines)


def _anatomy_lines(report: Report) -> list[str]:
    """Inside each DataLoader, in words: where one batch's loading time goes (measured)."""
    views = loader_views(report.dataloaders)
    if not views:
        return []
    lines = ["## Inside the DataLoaders", "",
             "Measured in the workers and the training process, per batch, over the recorded "
             "steps.", ""]
    for v in views:
        site = f"`{md_code(str(v['call_site']))}`"
        if not v["segments"]:
            lines.append(f"- {site}: not measured inside ({md(str(v['lost']))}).")
            continue
        parts = ", ".join(f"{p['label']} {p['ms']:.2f} ms" for p in v["segments"])
        klass = f" **{md(v['bound'])}**" if v["bound"] else ""
        line = (f"- {site}{klass}: one batch's loading takes {v['total_ms']:.2f} ms "
                f"(measured in the {md(str(v['where']))}): {md(parts)}.")
        top = v["top"][:2]
        if top:
            line += " Top functions: " + "; ".join(
                f"{100 * (t.get('share') or 0):.0f}% {md(str(t.get('category')))} at "
                f"`{md_code(str(t.get('site')))}`" for t in top) + "."
        lines.append(line)
    return lines + [""]


def _kernel_cells(mix: dict | None) -> str:
    """Compute and communication ms per step and the share of communication hidden under
    compute, of the trace's busiest GPU, or of a CPU-only trace's host collectives
    (report/kernel_mix.py); blank without either."""
    if mix is None:
        return "|  |  |  "
    us = mix["per_step_us"]
    hidden = mix["comm_hidden_pct"]
    compute = f"{us['compute'] / 1000:.1f} ms" if "compute" in us else "CPU only"
    return (f"| {compute} | {us['communication'] / 1000:.1f} ms "
            f"| {'-' if hidden is None else f'{hidden:.1f}%'} ")
