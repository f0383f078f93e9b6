"""What a command leaves behind: the report files and summary, its exit status, the error line.

Shared by `analyze` (cli) and `run` (whose report may be written from the capture's clock
thread under --timeout), so it sits below both rather than in the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from stallscope import progress
from stallscope.errors import EXIT_FINDINGS, EXIT_OK


def fail(message: str, code: int) -> int:
    """Print the one `stallscope: ...` line for an error and return its exit code."""
    from stallscope.report.text import plain  # names from traces may hold escape sequences

    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"stallscope: {plain(first)}", file=sys.stderr)
    return code


def write_report(report: Any, out: Path, quiet: bool, tensorboard: Path | None = None) -> None:
    """Write report.json/html/md (all or none), then the TensorBoard views when asked,
    into `tensorboard`; then print the summary."""
    from stallscope.outputs import write_files
    from stallscope.report.html import render_html
    from stallscope.report.json_writer import render_json
    from stallscope.report.markdown import render_markdown
    from stallscope.report.terminal import render_terminal
    from stallscope.report.text import plain

    rendered = {
        "report.json": render_json(report),
        "report.html": render_html(report),
        "report.md": render_markdown(report),
    }
    progress.say(f"writing the report to {plain(out)}")
    write_files(out, rendered)
    outputs = {k: str(out / k) for k in rendered}
    if tensorboard is not None:
        progress.say(f"writing TensorBoard scalars and findings to {tensorboard}")
        from stallscope.report.tensorboard import write_tensorboard

        write_tensorboard(report, tensorboard)
        outputs["tensorboard"] = f"{tensorboard}{os.sep}"
    if not quiet:
        sys.stdout.write(render_terminal(report, outputs))


def gate(report: Any, fail_on: str | None) -> int:
    """EXIT_FINDINGS when `--fail-on` is met, else EXIT_OK."""
    from stallscope.diagnose.finding import severity_rank

    if fail_on:
        limit = severity_rank(fail_on)
        if any(severity_rank(f.severity) <= limit for f in report.findings):
            return EXIT_FINDINGS
    return EXIT_OK
