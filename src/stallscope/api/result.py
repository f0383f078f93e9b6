"""The public `stallscope.Report`: one analysis, as a caller and a notebook see it.

It wraps the internal report (report/build.py), which every writer renders, and adds what a
Python caller needs: the verdict and findings as attributes, `to_json()` (the CLI's report.json,
byte for byte), `save(out_dir)` (the three files `analyze -o` writes), and `_repr_html_`, so a
notebook cell that ends with a report shows it. The notebook view is the full report.html page
in a sandboxed iframe's `srcdoc`: the page's styles stay inside the frame (none leak into the
notebook, none of the notebook's reach the page) and it loads nothing from outside, as on disk.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from stallscope.diagnose.finding import Finding
from stallscope.report.build import Report as _Report
from stallscope.text import plain

# The frame's height: about the first screen of the page (verdict, step chart, first finding);
# the rest scrolls inside it.
FRAME_HEIGHT_PX = 720


class Report:
    """What stallscope found in the traces: `.verdict` first, then `.findings`, ranked.

    Each finding has `id`, `title`, `severity` (high, medium, low, info), `evidence` (the
    measured numbers), `recommendation`, `snippet` (the change to paste), `precondition` and
    `estimated_saving_pct`."""

    def __init__(self, report: _Report) -> None:
        self._report = report

    @property
    def verdict(self) -> str:
        """The report's first line: the main bottleneck and what fixing it saves, or that none
        was seen."""
        return self._report.verdict

    @property
    def verdict_id(self) -> str:
        """What the verdict speaks of: a finding id, or `no-finding`, `no-bottleneck`,
        `too-little-to-judge`."""
        return self._report.verdict_id

    @property
    def findings(self) -> list[Finding]:
        """The findings, most worth fixing first (the replayed fix plan's order)."""
        return list(self._report.findings)

    @property
    def summary(self) -> dict[str, Any]:
        """Steps, step time (median, mean, p90, min, max in us) and where the time went."""
        return self._report.summary

    def to_dict(self) -> dict[str, Any]:
        """report.json as Python data."""
        return json.loads(self.to_json())

    def to_json(self) -> str:
        """The report.json the CLI writes for the same traces."""
        from stallscope.report.json_writer import render_json

        return render_json(self._report)

    def to_html(self) -> str:
        """The self-contained report.html page."""
        from stallscope.report.html import render_html

        return render_html(self._report)

    def save(self, out_dir: str | Path) -> Path:
        """Write report.json, report.html and report.md into `out_dir` (created if needed),
        all or none, replacing a report already there; returns the folder."""
        from stallscope.commands.common import write_report
        from stallscope.outputs import prepare_out_dir

        out = Path(out_dir).expanduser().resolve()
        prepare_out_dir(out, force=True)
        write_report(self._report, out, quiet=True)
        return out

    def _repr_html_(self) -> str:
        """The report in a notebook: the verdict as plain HTML (it survives a notebook viewer
        that strips frames), then the whole page in a sandboxed frame."""
        page = html.escape(self.to_html(), quote=True)
        return (
            '<div class="stallscope-report">'
            f'<p><strong>stallscope:</strong> {html.escape(plain(self.verdict))}</p>'
            f'<iframe title="stallscope report" sandbox srcdoc="{page}" '
            f'style="width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ccc">'
            "</iframe></div>"
        )

    def __repr__(self) -> str:
        findings = ", ".join(f"{f.id} ({f.severity})" for f in self._report.findings)
        return (f"<stallscope.Report: {plain(self.verdict)}"
                + (f" Findings: {findings}." if findings else "") + ">")
