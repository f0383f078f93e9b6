"""tune.json's result rendered for people: the terminal summary, tune.md and tune.html (one
self-contained page, same CSP as report.html). Pure functions of the result dict."""

from __future__ import annotations

import shlex
from functools import partial
from pathlib import Path
from typing import Any

from stallscope.capture.overrides import set_arguments
from stallscope.report.compare_writers import noise_text
from stallscope.text import md, md_code, plain
from stallscope.units import ms

TUNE_FILES = ("tune.json", "tune.md", "tune.html")


# A candidate's step as tune's pages print it: "12.3 ms" at 0.1 ms, nothing where it has none.
_ms = partial(ms, precision="tenths", missing="", unit=True)


def _spread(c: dict[str, Any]) -> str:
    s = c.get("spread_us")
    return f"{ms(s[0], 'tenths')}-{_ms(s[1])}" if s else ""


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _noise(result: dict[str, Any]) -> str:
    st = result.get("statistics") or {}
    return noise_text(st.get("aa_noise"))


def _interval(c: dict[str, Any]) -> str:
    iv = c.get("interval")
    return f"{iv['low']:.2f}-{iv['high']:.2f}x" if iv else ""


def headline(result: dict[str, Any]) -> str:
    """One sentence: what to change and what it measured, that nothing was measurably faster,
    or that nothing but the baseline ran."""
    best, base = result["best"], result["baseline"]
    busy = " The machine was busy: see the notes." if result.get("busy") else ""
    if result.get("outcome") == "baseline only":
        runs = len(base["runs"])
        return (f"Only the baseline ran ({runs} run(s), mean step {_ms(base['step_us'])}): the "
                f"{result['budget_s']:.0f} s budget fitted no candidate, so nothing was "
                f"compared and nothing is claimed; raise --budget.{busy}")
    if not result["change"]:
        return (f"No measurable difference: no candidate's 95% interval cleared the "
                f"baseline's own run-to-run noise ({_noise(result)}); keep the script's "
                f"DataLoader settings (mean step {_ms(base['step_us'])}).{busy}")
    rng = result["speedup_range"]
    spread = f", 95% interval {rng[0]:.2f}x-{rng[1]:.2f}x" if rng else ""
    return (f"{best['label']}: {_x(result['speedup'])} faster steps (mean "
            f"{_ms(best['step_us'])} vs {_ms(base['step_us'])}{spread}, beyond the "
            f"baseline's run-to-run noise of {_noise(result)}).{busy}")


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{**result["baseline"], "speedup": 1.0, "verdict": "baseline"}]
    return rows + list(result["candidates"])


def _mb(value: Any) -> str:
    return f"{round(value / (1 << 20))} MB" if isinstance(value, int | float) else ""


def batch_rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """tune.json's `batch_sizes` rows as text cells, one per batch size: samples per second
    (measured) with its interval, the ratio to the reference's with its interval and verdict,
    the peak memory (measured) and the prediction or the refusal."""
    section = result.get("batch_sizes") or {}
    out = []
    for r in section.get("rows") or []:
        rng, vs = r.get("samples_per_s_range"), r.get("vs_reference")
        peak = r.get("peak_memory") or {}
        pred = [p for p in r.get("predicted_memory") or [] if p.get("fits")]
        out.append({
            "batch": str(r["batch_size"]) + (" (script's)" if r["batch_size"] ==
                                            section.get("batch_size") else ""),
            "status": r["status"],
            "rate": f"{r['samples_per_s']:.1f}/s" if r.get("samples_per_s") else "",
            "rate_range": f"{rng[0]:.1f}-{rng[1]:.1f}/s" if rng else "",
            "ratio": f"{vs['speedup']:.2f}x ({vs['low']:.2f}-{vs['high']:.2f}x)" if vs else "",
            "verdict": r.get("verdict") or "",
            # a run that recorded no trace (it ended before its recorded steps) has no peak
            "peak": (_mb(peak.get("host_bytes")) + (f", device {_mb(peak['device_bytes'])}"
                                                    if peak.get("device_bytes") else "")
                     if peak else "not measured"),
            "why": r.get("refused") or r.get("skipped") or (pred[0]["text"] if pred else ""),
        })
    return out


def batch_summary(result: dict[str, Any]) -> list[str]:
    """What the batch sizes measured, in sentences: the best, or that none was measurably
    faster, or why none was tried; then the learning-rate caveat."""
    section = result.get("batch_sizes")
    if not section:
        return []
    if section.get("why_not"):
        return [section["why_not"]]
    lines = [f"Batch sizes, on {section['reference']}: samples per second (measured), each "
             "against the script's batch size's, 95% bootstrap intervals; peak memory measured "
             "(the training process's resident high-water mark plus its workers' own memory)."]
    if section.get("change"):
        lines.append(f"Most samples per second, measurably: batch size {section['best']} "
                     f"({section['change']}).")
    else:
        lines.append("No batch size gave measurably more samples per second than the "
                     "script's.")
    lines.append(f"Caveat: {section['caveat']}.")
    return lines


def render_terminal(result: dict[str, Any], out: Path) -> str:
    lines = [f"stallscope tune: {plain(headline(result))}"]
    if result["change"]:
        lines.append(f"  change at {plain(result['call_site'])}: {plain(result['change'])}")
    for c in _rows(result):
        if c["status"] == "measured":
            figures = (f"{_ms(c['step_us']):>10}  [{_spread(c)}]  {_x(c.get('speedup'))} "
                       f"{_interval(c)}  {c.get('verdict') or ''}")
        else:
            figures = c["status"]
        lines.append(f"  {plain(c['label']):<62} {figures}")
    summary = batch_summary(result)
    if summary:
        lines.append(f"  {plain(summary[0])}")
        for b in batch_rows(result):
            figures = (f"{b['rate']:>12} [{b['rate_range']}]  {b['ratio']}  {b['verdict']}  "
                       f"peak {b['peak']}" if b["rate"] else b["status"])
            lines.append(f"    batch_size={plain(b['batch']):<18} {figures}")
            if b["status"] in ("refused", "skipped"):
                lines.append(f"      {plain(b['why'])}")
        lines += [f"  {plain(s)}" for s in summary[1:]]
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
        "them), budget permitting, the repeats interleaved; the median over runs of each run's "
        "mean step, spread = lowest-highest per-run mean. Speedup interval: "
        f"{md((result.get('statistics') or {}).get('interval', ''))}; a candidate is faster "
        f"only when its interval's low end exceeds 1 + the baseline's run-to-run noise "
        f"({_noise(result)}, from {md((result.get('statistics') or {}).get('aa_noise_from', ''))}"
        ").", "",
        "| configuration | status | runs | mean step | spread | speedup | 95% interval | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in _rows(result):
        lines.append(f"| {md(c['label'])} | {c['status']} | {len(c['runs'])} | "
                     f"{_ms(c['step_us'])} | {_spread(c)} | {_x(c.get('speedup'))} | "
                     f"{_interval(c)} | {c.get('verdict') or ''} |")
    lines.append("")
    summary = batch_summary(result)
    if summary:
        lines += ["## Batch sizes", "", md(summary[0]), ""]
        if len(summary) > 1:
            lines += ["| batch size | status | samples/s | 95% interval | vs script's batch | "
                      "verdict | peak memory | memory |", "|---:|---|---:|---:|---:|---|---:|---|"]
            lines += [f"| {md(b['batch'])} | {b['status']} | {b['rate']} | {b['rate_range']} | "
                      f"{b['ratio']} | {b['verdict']} | {b['peak']} | {md(b['why'])} |"
                      for b in batch_rows(result)]
            lines.append("")
        lines += [md(s) for s in summary[1:]] + [""]
    lines += [f"- {md(n)}" for n in result["notes"]]
    lines += ["", f"Reproduce: `{md_code(result['command']).replace('`', '')}`", ""]
    return "\n".join(lines)


def render_html(result: dict[str, Any]) -> str:
    """tune.html: self-contained (inline CSS, no scripts, no network), autoescaped."""
    from stallscope.report.html import jinja_env

    env = jinja_env()
    env.filters["ms"] = _ms
    env.filters["x"] = _x
    env.filters["noise"] = noise_text
    rows = [dict(c) for c in _rows(result)]
    slowest = max((c["step_us"] or 0.0 for c in rows), default=0.0) or 1.0
    for c in rows:
        c["bar_pct"] = round(100.0 * (c["step_us"] or 0.0) / slowest, 1)
        c["spread_text"] = _spread(c)
        c["interval_text"] = _interval(c)
        c["is_best"] = c["label"] == result["best"]["label"]
    return env.get_template("tune.html.j2").render(
        result=result, rows=rows, headline=headline(result),
        batch_rows=batch_rows(result), batch_summary=batch_summary(result),
        run_command=shlex.join(["stallscope", "run", *set_arguments(result["best"]["overrides"]),
                                result["script"]]),
    )


# ---------------------------------------------------------------------------- standalone
