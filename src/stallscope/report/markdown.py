"""report.md: the verdict, a findings table and the top recommendation, for a ticket."""

from __future__ import annotations

from stallscope.report.build import Report
from stallscope.report.text import md, md_code


def render_markdown(report: Report) -> str:
    s = report.summary
    lines = ["# stallscope report", "", f"**Verdict:** {md(report.verdict)}", ""]
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
        lines += ["| severity | finding | can save (upper bound) | trace |", "|---|---|---:|---|"]
        for f in report.findings:
            lines.append(
                f"| {f.severity} | `{f.id}` {md(f.title)} | {f.estimated_saving_pct:.1f}% | "
                f"{md(f.trace)} |"
            )
        top = report.findings[0]
        lines += [
            "",
            f"### Top recommendation: {md(top.title)}",
            "",
            md(top.recommendation),
            "",
            "```python",
            md_code(top.snippet),
            "```",
            "",
            f"*Precondition:* {md(top.precondition)}",
            "",
            f"*Estimate:* {md(top.saving_basis)}.",
            "",
        ]
    else:
        lines += ["No findings.", ""]
    not_assessed = [a for a in report.assessments if a["status"] == "not_assessed"]
    if not_assessed or report.notes:
        lines += ["## What could not be assessed", ""]
        lines += [f"- {md(n)}" for n in report.notes]
        lines += [f"- `{a['rule']}` ({md(a['trace'])}): {md(a['detail'])}" for a in not_assessed]
        lines.append("")
    lines += [f"*stallscope {report.stallscope_version}*", ""]
    return "\n".join(lines)
