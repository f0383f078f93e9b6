"""compare.html, compare.md and the terminal summary of `stallscope compare`.

Input is the plain data of `commands.compare.compare_data`. Paths, trace labels and finding titles
come from other people's files: HTML relies on jinja2 autoescaping, Markdown on `md`, the
terminal on `plain`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from stallscope.report.compare_charts import breakdown_chart, findings_chart, step_chart
from stallscope.report.html import COLORS, LEGEND, jinja_env
from stallscope.text import md, plain, speedup_range_text, speedup_text
from stallscope.units import ms, percent, points

# How each group is judged; the rule in full is in docs/usage.md ("compare") and compare_metrics.py.
JUDGED_BY = ("Each cause (rule, device, rank) once, whatever the files are called. Judged by "
             "what it measures (its time per step), not by its severity or saving: those are "
             "shares of the step, and grow for every finding a faster step leaves behind. A "
             "side of several recordings gives the median over the recordings that found it.")
# The `--fail-on` gates in their order, with their exit status and what fires them.
GATES = (
    ("slower", 6, "AFTER's step is measurably slower"),
    ("new", 7, "a cause is new"),
    ("worse", 8, "the step is measurably slower, or a cause's time per step grew by more than "
     "the mean step gained"),
    ("cause-worse", 9, "any cause got worse by what it measures, however much the step gained"),
)
GROUPS = (
    ("resolved", "Resolved", "found before, assessed clear after"),
    ("new", "New", "found after only"),
    ("worse", "Worse", "found on both sides; what it measures grew past the run-to-run floor"),
    ("better", "Better", "found on both sides; what it measures fell past the run-to-run floor"),
    ("unchanged", "Unchanged", "found on both sides; what it measures moved less than the "
     "run-to-run floor (or was not measured)"),
    ("unsteady", "In some recordings", "found in some of one side's recordings, not most, and "
     "in none of the other's: near its threshold; no gate counts it"),
    ("not_assessed", "Not comparable", "found on one side, not assessable on the other"),
)


def noise_text(noise: float | None) -> str:
    """The A/A noise (a fraction; null when not measured) for people, as commands/stats.py
    writes it into the verdict (the report layer cannot import the commands)."""
    return "not measured" if noise is None else f"{percent(100 * noise)}"


def spread(stats: dict[str, float]) -> str:
    return f"p10-p90 {ms(stats['p10'])}-{ms(stats['p90'])} ms, min-max {ms(stats['min'])}-" \
        f"{ms(stats['max'])} ms"


def category_name(category: str) -> str:
    return LEGEND.get(category, category)


def render_compare_html(data: dict[str, Any]) -> str:
    env = jinja_env()
    # A figure the data lacks reads "n/a" on compare's page; its step figures never lack one.
    env.filters.update(ms=partial(ms, missing="n/a"),
                       signed_ms=partial(ms, missing="n/a", signed=True),
                       pct=percent, signed_pct=points, spread=spread, category=category_name,
                       noise=noise_text, speedup=speedup_text)
    env.globals.update(saving_cell=saving_cell, speedup_range=speedup_range_text,
                       severity_cell=severity_cell, pooled_cell=pooled_cell,
                       step_reading=step_reading, gate_lines=gate_lines)
    return env.get_template("compare.html.j2").render(
        c=data, groups=GROUPS, gates=GATES, judged_by=JUDGED_BY, colors=COLORS, legend=LEGEND,
        step_chart=step_chart(data), breakdown_chart=breakdown_chart(data),
        findings_chart=findings_chart(data))


def severity_cell(row: dict[str, Any]) -> str:
    """AFTER's severity, BEFORE's beside it when it differs: "high (was info)"."""
    b, a = row.get("severity_before"), row.get("severity_after")
    if a is None:
        return f"gone (was {b})" if b else "-"
    return a if b in (None, a) else f"{a} (was {b})"


def pooled_cell(row: dict[str, Any]) -> str:
    """How each side's figure was made: "median over 2 recordings", "one recording of 2",
    "found in 0 of 2" for a side that did not find the cause; with several recordings, the
    one whose words (title, severity, saving) the row quotes."""
    parts = []
    for side in ("before", "after"):
        how = row.get(f"pooled_{side}")
        n = row.get(f"recordings_{side}") or 0
        words = row.get(f"trace_{side}")
        if how and len(row.get(f"figures_{side}") or []) + n > 2 and words:
            how += f", words from {words}"  # several recordings: say whose title is quoted
        parts.append(f"{side}: {how}" if how else f"{side}: found in 0 of {n}" if n else
                     f"{side}: not found")
    return "; ".join(parts)


def saving_cell(value: float | None, kind: str | None) -> str:
    """A finding's saving with what it is: replayed, counted in its cause, or an upper bound."""
    if value is None:
        return percent(value)
    return f"{percent(value)} ({(kind or 'upper_bound').replace('_', ' ')})"


def _saves(row: dict[str, Any]) -> str:
    """AFTER's saving (BEFORE's for a resolved finding, which AFTER no longer has)."""
    if row["saving_after_pct"] is not None:
        return saving_cell(row["saving_after_pct"], row.get("saving_after_kind"))
    return "-"


def _finding_line(row: dict[str, Any]) -> str:
    # md() writes every ">" as an entity; an arrow cannot open a tag, so it stays plain.
    measured = md(row.get("change") or "not measured").replace("-&gt;", "->")
    return (f"| `{md(row['id'])}` {md(row['title'])} | {md(row['trace'])} | {measured} | "
            f"{md(pooled_cell(row))} | {md(severity_cell(row))} | {_saves(row)} |")


def step_reading(st: dict[str, Any]) -> str:
    """Both readings of the step with their intervals, what decided the verdict, and the one
    step that decides or pulls the mean (plain text; the callers escape it)."""
    iv, med = st["interval"], st["median"]
    text = (f"Mean step (throughput): {speedup_text(st['speedup'])}, 95% bootstrap interval "
            f"{speedup_range_text(iv['low'], iv['high'])}, A/A noise "
            f"{noise_text(st['aa_noise'])} ({st['aa_noise_from']}): {st['mean_verdict']}. "
            f"Median step: {med['speedup_text']}, 95% bootstrap interval "
            f"{speedup_range_text(med['interval']['low'], med['interval']['high'])}, A/A noise "
            f"{noise_text(med['aa_noise'])} (halves' medians): {med['verdict']}. Seeded, steps "
            "resampled in whole rounds of the loader's workers; a reading counts only when its "
            "interval clears its A/A noise and its speedup the run-to-run floor of "
            f"{percent(100 * st['noise_floor'], None)}. Verdict: {st['verdict']}")
    decided = {"both": "both readings agree",
               "median": "the median's, since one step decided the mean",
               "disagree": "the readings disagree"}[st["decided_by"]]
    text += f" ({decided})."
    if st.get("note"):
        note = st["note"]
        text += f" {note[0].upper()}{note[1:]}."
    return text


def gate_lines(data: dict[str, Any]) -> list[tuple[str, int, str, str | None]]:
    """(gate, exit status, what fires it, the line that fires it or None) for each gate."""
    lines = data.get("gates") or {}
    return [(name, status, what, lines.get(name)) for name, status, what in GATES]


def _side_text(side: dict[str, Any]) -> str:
    traces = ", ".join(md(t) for t in side["traces"])
    text = f"{side['steps']} step{'' if side['steps'] == 1 else 's'}, {md(side['kind'])}"
    return text + (f"; traces: {traces}" if traces else "")


def render_compare_markdown(data: dict[str, Any]) -> str:
    b, a, st = data["before"], data["after"], data["step_time"]
    tb, ta = b["step_time_us"], a["step_time_us"]
    lines = [
        "# stallscope comparison",
        "",
        f"**Verdict:** {md(data['verdict'])}",
        "",
        f"- **Before:** {md(b['path'])} ({_side_text(b)})",
        f"- **After:** {md(a['path'])} ({_side_text(a)})",
        *[f"- **Busy machine ({name}):** {md('; '.join(side['busy']))}; the figures are less "
          "certain, re-record on a quiet machine" for name, side in (("before", b), ("after", a))
          if side.get("busy")],
        "",
        "## Step time",
        "",
        "| | before | after |",
        "|---|---:|---:|",
        f"| median | {ms(tb['median'])} ms | {ms(ta['median'])} ms |",
        f"| mean | {ms(tb['mean'])} ms | {ms(ta['mean'])} ms |",
        f"| p10-p90 | {ms(tb['p10'])}-{ms(tb['p90'])} ms | {ms(ta['p10'])}-{ms(ta['p90'])} ms |",
        f"| min-max | {ms(tb['min'])}-{ms(tb['max'])} ms | {ms(ta['min'])}-{ms(ta['max'])} ms |",
        "",
        md(step_reading(st)),
        "",
        "## Where the step's time goes",
        "",
        "| host category | share before | share after | change | ms/step before | "
        "ms/step after | change |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["breakdown"]:
        lines.append(
            f"| {md(category_name(r['category']))} | {percent(r['before_pct'])} | "
            f"{percent(r['after_pct'])} | {points(r['delta_pct'])} | {ms(r['before_us'])} | "
            f"{ms(r['after_us'])} | {ms(r['delta_us'], signed=True)} |"
        )
    if data["gpu"]:
        lines += ["", "| GPU | busy before | busy after | change |", "|---|---:|---:|---:|"]
        for g in data["gpu"]:
            lines.append(f"| {md(g['device'])} | {percent(g['before_busy_pct'])} | "
                         f"{percent(g['after_busy_pct'])} | {points(g['delta_busy_pct'])} |")
    lines += ["", "## Findings", "", JUDGED_BY, ""]
    for key, title, meaning in GROUPS:
        rows = data["findings"][key]
        if not rows and key in ("not_assessed", "better"):
            continue
        lines += [f"### {title} ({len(rows)})", "", f"*{meaning}*", ""]
        if rows:
            lines += ["| cause (as AFTER states it) | where | measured, before -> after | "
                      "each side's figure | severity | saves (after) |",
                      "|---|---|---|---|---|---:|"]
            lines += [_finding_line(r) for r in rows]
        else:
            lines.append("None.")
        lines.append("")
    lines += ["## CI gates (`--fail-on`)", "", "| gate | exit | fires when | now |",
              "|---|---:|---|---|"]
    for name, status, what, line in gate_lines(data):
        now = f"fires: {md(line)}".replace("-&gt;", "->") if line else "passes"
        lines.append(f"| `{name}` | {status} | {what} | {now} |")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_compare_terminal(data: dict[str, Any], outputs: dict[str, str]) -> str:
    tb, ta = data["before"]["step_time_us"], data["after"]["step_time_us"]
    f = data["findings"]
    lines = [
        plain(data["verdict"]),
        f"  step: mean {ms(tb['mean'])} -> {ms(ta['mean'])} ms "
        f"({speedup_text(data['step_time']['speedup'])}), median {ms(tb['median'])} -> "
        f"{ms(ta['median'])} ms",
    ]
    for name in ("before", "after"):
        if data[name].get("busy"):
            lines.append(f"  busy machine ({name}): {plain('; '.join(data[name]['busy']))}")
    for key, title, _ in GROUPS:
        if f[key]:
            ids = ", ".join(plain(r["id"]) for r in f[key])
            lines.append(f"  {title.lower()}: {ids}")
    lines += [f"    {plain(r['id'])}: {plain(r['change'])}" for r in f["worse"]]
    if data["step_time"].get("note"):
        lines.append(f"  {plain(data['step_time']['note'])}")
    lines += [f"  --fail-on {name} would exit {status}: {plain(line)}"
              for name, status, _, line in gate_lines(data) if line]
    lines += [f"  {name}: {plain(path)}" for name, path in outputs.items()]
    return "\n".join(lines) + "\n"
