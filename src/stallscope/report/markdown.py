"""report.md: the verdict, a findings table and the top recommendation, for a ticket."""

from __future__ import annotations

from stallscope.report.build import Report
from stallscope.text import md, md_code


def _fence_language(snippet: str) -> str:
    """`diff` for snippets written as -/+ lines, so ticket systems colour them; else python."""
    lines = snippet.split("\n")
    return "diff" if any(line.startswith(("-", "+")) for line in lines) else "python"


def render_markdown(report: Report) -> str:
    s = report.summary
    lines = ["# stallscope report", "", f"**Verdict:** {md(report.verdict)}", ""]
    run = report.run
    if run and run.get("overrides"):
        forced = ", ".join(f"`{md_code(f'{k}={v}')}`" for k, v in run["overrides"].items())
        lines += [
            f"> **Overridden run:** measured with DataLoader settings forced by `--set` "
            f"({forced}), not the script's own.",
            "",
        ]
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
            f"p90 {t['p90'] / 1000:.1f} ms over {s['steps']} step(s).",
            "",
            "| where the step's time goes | share |",
            "|---|---:|",
        ]
        lines += [f"| {md(k)} | {v:.1f}% |" for k, v in s["breakdown_pct"].items()]
        lines.append("")
    lines += ["## Findings", ""]
    if report.findings:
        lines += ["| severity | finding | can save | trace |", "|---|---|---:|---|"]
        for f in report.findings:
            lines.append(
                f"| {f.severity} | `{f.id}` {md(f.title)}"
                f"{f' (caused by `{f.caused_by}`)' if f.caused_by else ''} "
                f"| {f.estimated_saving_pct:.1f}% | "
                f"{md(f.trace)} |"
            )
        top = report.top_finding or report.findings[0]
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
            f"*Estimate:* up to {top.estimated_saving_pct:.1f}% of step time "
            f"({md(top.saving_basis)}).",
            "",
        ]
        if top.docs.startswith("https://"):
            lines += [f"*Docs:* <{top.docs}>", ""]
    else:
        lines += ["No findings.", ""]
    if len(report.traces) > 1:
        lines += [
            "## Per rank" if report.ranks else "## Per trace",
            "",
            "| trace | steps | median step | dataloader | sync | findings |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for t in report.traces:
            ts, share = t["summary"], t["summary"]["breakdown_pct"]
            median = f"{ts['step_time_us']['median'] / 1000:.1f} ms" if ts["step_time_us"] else ""
            lines.append(
                f"| {md(t['label'])} | {ts['steps']} | {median} "
                f"| {share.get('dataloader', 0):.1f}% | {share.get('sync', 0):.1f}% "
                f"| {md(', '.join(t['findings']))} |"
            )
        lines.append("")
    lines += ["## Reproduce", "", "```sh", md_code(report.reproduce_command)]
    if run:
        lines += [
            "# open the trace (PyTorch profiler TensorBoard plugin):",
            md_code(run["tensorboard_command"]),
        ]
    lines += [
        "```",
        "",
        # Escaped text, not code spans: a code span shows a file name's `<` and `&` only raw.
        "Or drag a trace file into ui.perfetto.dev: "
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
