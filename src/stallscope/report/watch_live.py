"""The page `stallscope watch` rewrites while the run goes (OUT/watch/live.html and live.json):
the whole run so far, from the step log, so a run of days can be read mid-run.

Run as `python -m stallscope.report.watch_live STEP_LOG` by the step log itself
(capture/steplog.py), in its own process every LIVE_S seconds: the analysis (ruptures, the
template) then never holds the training process's GIL, and a failure here costs the live page
only. Both files are replaced atomically, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stallscope.outputs import write_files
from stallscope.report.html import jinja_env
from stallscope.report.watch_chart import watch_chart
from stallscope.report.watch_view import run_section


def render_live(section: dict, target: str, every_s: float) -> str:
    chart = watch_chart(section)
    return jinja_env().get_template("watch_live.html.j2").render(
        ws=section, wc=chart, target=target, every_s=f"{every_s:g}",
        written=time.strftime("%Y-%m-%d %H:%M:%S"))


def write_live(step_log: Path, every_s: float) -> None:
    """OUT/watch/live.json and live.html from OUT/watch/steps.jsonl (both, or neither)."""
    section = run_section(step_log)  # no capture yet: none is analysed mid-run
    target = step_log.parent.parent.name
    files = {"live.json": json.dumps(section, allow_nan=False)}
    if section["steps"] and len([s for s in section["steps"] if s.get("step_ms")]) >= 2:
        files["live.html"] = render_live(section, target, every_s)
    write_files(step_log.parent, files)


def main(argv: list[str]) -> int:
    """`python -m stallscope.report.watch_live STEP_LOG EVERY_S`; its status is never the
    run's (the step log ignores it)."""
    try:
        write_live(Path(argv[0]), float(argv[1]))
    except Exception as exc:  # noqa: BLE001 (the live page is lost, the run goes on)
        sys.stderr.write(f"stallscope watch: live page not written ({type(exc).__name__}: "
                         f"{exc})\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
