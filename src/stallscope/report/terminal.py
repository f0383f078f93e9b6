"""The one-screen summary printed after a run."""

from __future__ import annotations

from stallscope.report.build import Report
from stallscope.text import MAX_TERMINAL, plain

MAX_FINDINGS = 6


def _p(text: object) -> str:
    """Trace-derived text for one terminal line: no escape sequences, no screenful of name."""
    return plain(text, MAX_TERMINAL)


def render_terminal(report: Report, outputs: dict[str, str] | None = None) -> str:
    s = report.summary
    out = [f"stallscope: {_p(report.verdict)}"]
    if s["step_time_us"]:
        t = s["step_time_us"]
        across = f" across {len(report.traces)} traces" if len(report.traces) > 1 else ""
        shares = ", ".join(f"{k} {v:.0f}%" for k, v in s["breakdown_pct"].items() if v >= 0.5)
        out.append(
            f"  steps: {s['steps']}{across}, median {t['median'] / 1000:.1f} ms "
            f"(p90 {t['p90'] / 1000:.1f} ms); host time: {shares}"
        )
        for dev, parts in s["gpu_pct"].items():
            out.append(
                f"  GPU {_p(dev)}: kernels {parts['kernel']:.0f}%, "
                f"memcpy {parts['memcpy']:.0f}%, idle {parts['idle']:.0f}%"
            )
    if len(report.traces) > 1:
        for t in report.traces:
            ts = t["summary"]
            if ts["step_time_us"]:
                out.append(
                    f"  {_p(t['label'])}: median {ts['step_time_us']['median'] / 1000:.1f} ms, "
                    f"dataloader {ts['breakdown_pct']['dataloader']:.0f}%, "
                    f"sync {ts['breakdown_pct']['sync']:.0f}%"
                )
    for f in report.findings[:MAX_FINDINGS]:
        where = f" [{_p(f.trace)}]" if len(report.traces) > 1 else ""
        out.append(
            f"  {f.severity.upper():<6} {f.id}{where}: {_p(f.title)} "
            f"(can save up to {f.estimated_saving_pct:.1f}%)"
        )
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
