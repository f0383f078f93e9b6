"""report.html: one self-contained page (inline CSS and SVG, no network), rendered by jinja2.

Every trace-derived string goes through autoescaping; the data block is embedded with `tojson`,
which escapes `<`, `>` and `&` so a kernel name cannot close the script element.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from stallscope.model import HOST_CATEGORIES
from stallscope.report.build import Report
from stallscope.report.json_writer import report_data

COLORS = {
    "dataloader": "#d62728",
    "sync": "#ff7f0e",
    "h2d_copy": "#9467bd",
    "other_copy": "#8c564b",
    "host_compute": "#1f77b4",
}


def templates_dir() -> Path:
    """Inside an installed wheel the templates ship in the package; in a checkout (editable
    install) they live at the repository's top level."""
    packaged = Path(__file__).resolve().parent.parent / "templates"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "templates"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("stallscope's report templates are missing from this installation")


def render_html(report: Report) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    template = env.get_template("report.html.j2")
    steps = report.steps
    longest = max((s["duration_us"] for s in steps), default=1.0) or 1.0
    bars = []
    for s in steps:
        x = 0.0
        parts = []
        for c in HOST_CATEGORIES:
            w = 100.0 * s["breakdown_us"][c] / longest
            parts.append({"category": c, "x": x, "width": w, "us": s["breakdown_us"][c]})
            x += w
        bars.append({"name": s["name"], "trace": s.get("trace", ""), "parts": parts,
                     "duration_us": s["duration_us"]})
    return template.render(
        report=report,
        data=report_data(report),
        bars=bars,
        colors=COLORS,
        categories=HOST_CATEGORIES,
    )
