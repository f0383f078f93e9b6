"""tune.json's result rendered for people: the terminal summary, tune.md and tune.html (one
self-contained page, same CSP as report.html). Pure functions of the result dict."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from stallscope.capture.overrides import set_arguments
from stallscope.text import md, md_code, plain

TUNE_FILES = ("tune.json", "tune.md", "tune.html")


def _ms(us: float | None) -> str:
    return "" if us is None else f"{us / 1000:.1f} ms"


def _spread(c: dict[str, Any]) -> str:
    s = c.get("spread_us")
    return f"{s[0] / 1000:.1f}-{s[1] / 1000:.1f} ms" if s else ""


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def headline(result: dict[str, Any]) -> str:
    """One sentence: what to change and what it measured, or that nothing beat the script."""
    best = result["best"]
    if not result["change"]:
        return (f"No candidate beat the script's own DataLoader settings (mean step "
                f"{_ms(result['baseline']['step_us'])}).")
    rng = result["speedup_range"]
    spread = f", {rng[0]:.2f}x-{rng[1]:.2f}x across runs" if rng else ""
    return (f"{best['label']}: {_x(result['speedup'])} faster steps (mean "
            f"{_ms(best['step_us'])} vs {_ms(result['baseline']['step_us'])}"
            f"{spread}).")


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{**result["baseline"], "speedup": 1.0}]
    return rows + list(result["candidates"])


def render_terminal(result: dict[str, Any], out: Path) -> str:
    lines = [f"stallscope tune: {plain(headline(result))}"]
    if result["change"]:
        lines.append(f"  change at {plain(result['call_site'])}: {plain(result['change'])}")
    for c in _rows(result):
        if c["status"] == "measured":
            figures = f"{_ms(c['step_us']):>10}  [{_spread(c)}]  {_x(c.get('speedup'))}"
        else:
            figures = c["status"]
        lines.append(f"  {plain(c['label']):<62} {figures}")
    lines += [f"  note: {plain(n)}" for n in result["notes"]]
    lines.append(f"  wrote: {', '.join(str(out / f) for f in TUNE_FILES)}")
    return "\n".join(lines) + "\n"


def render_markdown(result: dict[str, Any]) -> str:
    lines = [f"# stallscope tune: {md(result['script'])}", "", md(headline(result)), ""]
    if result["change"]:
        lines += [f"Change at `{md_code(result['call_site']).replace('`', '')}`:", "", "```diff",
                  f"# {md_code(result['call_site'])}", f"-{md_code(result['before'])}",
                  f"+{md_code(result['change'])}", "```", ""]
    lines += [
        f"Each configuration ran {result['repeats']} time(s) in a fresh process, "
        f"{result['steps_per_run']} recorded steps each (more with workers: two rounds of "
        "them); the median over runs of each run's mean step, spread = lowest-highest per-run "
        "mean.", "",
        "| configuration | status | mean step | spread | speedup |",
        "|---|---|---:|---:|---:|",
    ]
    for c in _rows(result):
        lines.append(f"| {md(c['label'])} | {c['status']} | {_ms(c['step_us'])} | "
                     f"{_spread(c)} | {_x(c.get('speedup'))} |")
    lines.append("")
    lines += [f"- {md(n)}" for n in result["notes"]]
    lines += ["", f"Reproduce: `{md_code(result['command']).replace('`', '')}`", ""]
    return "\n".join(lines)


def render_html(result: dict[str, Any]) -> str:
    """tune.html: self-contained (inline CSS, no scripts, no network), autoescaped."""
    from stallscope.report.html import jinja_env

    env = jinja_env()
    env.filters["ms"] = _ms
    env.filters["x"] = _x
    rows = [dict(c) for c in _rows(result)]
    slowest = max((c["step_us"] or 0.0 for c in rows), default=0.0) or 1.0
    for c in rows:
        c["bar_pct"] = round(100.0 * (c["step_us"] or 0.0) / slowest, 1)
        c["spread_text"] = _spread(c)
        c["is_best"] = c["label"] == result["best"]["label"]
    return env.get_template("tune.html.j2").render(
        result=result, rows=rows, headline=headline(result),
        run_command=shlex.join(["stallscope", "run", *set_arguments(result["best"]["overrides"]),
                                result["script"]]),
    )


# ---------------------------------------------------------------------------- standalone
