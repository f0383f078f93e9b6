"""`stallscope analyze PATH...`: diagnose traces recorded elsewhere (files, folders, ranks).

The parser is built at start-up with every command's, so this module imports only what the
parser needs; the pipeline (pandas, the rules, the writers) loads when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from stallscope import progress
from stallscope.commands import COMMANDS
from stallscope.commands.common import add_what_if_argument, gate, whole_number, write_report
from stallscope.errors import EXIT_OK, EXIT_PARTIAL

NAME = "analyze"
TAKES_SCRIPT = False  # every argument is stallscope's own


def add_parser(sub: Any) -> argparse.ArgumentParser:
    an = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        description="Diagnose torch.profiler traces: a .json/.json.gz file, or a folder "
        "(TensorBoard logdir or run folder) holding *.pt.trace.json[.gz] files; several files "
        "are analysed as ranks or spans of one job. A `stallscope watch` output folder (or "
        "its watch/steps.jsonl) gives the whole-run report again: its first capture's traces "
        "beside the step log and the later captures.",
    )
    an.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    an.add_argument("-o", "--out", type=Path, help="output folder (default: ./stallscope-<input>)")
    an.add_argument("--force", action="store_true", help="overwrite an existing report")
    an.add_argument(
        "-j",
        "--jobs",
        type=whole_number(1),
        metavar="N",
        help="analyse up to N trace files at once in separate processes (default: as many as "
        "the cores and the available memory allow; 1 for small inputs)",
    )
    an.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="send the per-file work to a Dask distributed cluster at ADDRESS "
        "(tcp://host:8786; default: $DASK_SCHEDULER_ADDRESS, else a local process pool), or "
        "local:N to start a local Dask cluster of N processes; the workers read the files, so "
        "they must see the same paths. Needs `pip install 'stallscope[dask]'`",
    )
    an.add_argument(
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit 3 when a finding at or above this severity exists (CI gate)",
    )
    an.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write per-step scalars, the findings as text and a copy of each trace the "
        "PyTorch profiler plugin reads to OUT/tensorboard/<trace name>/ (open with "
        "`tensorboard --logdir OUT/tensorboard`); opt-in because it imports torch, "
        "which adds about 2 s to a command that otherwise starts in under 1 s",
    )
    add_what_if_argument(an)
    limits = an.add_argument_group(
        "limits", "what one trace file may cost to read; passing one is exit 2 with one line "
        "(the defaults sit far above real traces and far below what hurts the machine)")
    limits.add_argument("--max-text-gb", type=whole_number(1), default=64, metavar="N",
                        help="the most text a file may hold once decompressed (default: 64)")
    limits.add_argument("--max-buffer-mb", type=whole_number(16), default=256, metavar="N",
                        help="the most text held at once without finding an event boundary "
                        "(default: 256; an event is a few hundred bytes)")
    limits.add_argument("--max-depth", type=_depth, default=1000, metavar="N",
                        help="the deepest nesting of lists and objects read (default: 1000, "
                        "at most 10000)")
    an.add_argument("-q", "--quiet", action="store_true",
                    help="print nothing on success: no summary, no progress lines")
    return an


def _depth(text: str) -> int:
    """--max-depth: 10 to MAX_DEPTH (deeper nesting would risk the C stack)."""
    from stallscope.trace.decode import MAX_DEPTH

    value = whole_number(10)(text)
    if value > MAX_DEPTH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DEPTH}, got {value}")
    return value


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    """Analyse the paths into OUT/report.{json,html,md}; the exit status (3 for --fail-on, else
    5 when files of a job could not be read and were left out)."""
    from stallscope.commands.watch_folder import find_watch
    from stallscope.outputs import default_out_dir, prepare_out_dir
    from stallscope.trace import split
    from stallscope.trace.decode import Limits

    what_if = _what_if(args.what_if)  # a typo is refused before any work
    scheduler = _scheduler(args.scheduler)  # likewise
    progress.configure(args.quiet, None)  # on when the inputs turn out to be long work
    out = args.out or default_out_dir(args.paths)
    prepare_out_dir(out, args.force)  # before the work, so a refusal costs nothing
    limits = Limits(max_text_bytes=args.max_text_gb << 30,
                    max_buffer_bytes=args.max_buffer_mb << 20,
                    max_depth=args.max_depth)
    # A watch folder (or its step log): its first capture's traces, then the whole-run report.
    watched = find_watch(args.paths)
    paths = watched.traces if watched is not None else args.paths
    # One large file: its parts are read while the analysis below is imported (trace/split.py).
    reading = (split.start(paths[0], args.jobs or _cores(), limits)
               if len(paths) == 1 and not scheduler else None)
    try:
        from stallscope.commands.pipeline import analyze_paths
        from stallscope.report.build import analyze_command

        report = analyze_paths(paths, jobs=args.jobs, what_if=what_if,
                               scheduler=scheduler, limits=limits, reading=reading)
    finally:
        if reading is not None:
            reading.close()
    if watched is not None:
        report = watched.report(report)
    # How to reproduce this report; where it was written is left out (see analyze_command).
    asked = [str(p) for p in args.paths] if watched is not None else report.source["paths"]
    report.source["command"] = analyze_command(asked, args.fail_on,
                                               args.tensorboard,
                                               [c.text for c in what_if])
    write_report(report, out, args.quiet, tensorboard_run(out, report) if args.tensorboard
                 else None)
    code = gate(report, args.fail_on)
    left_out = report.source.get("left_out")
    if left_out:  # said even under -q: the exit status alone would not say which files
        _say_partial(left_out, len(left_out) + len(report.source["files"]), out)
        if code == EXIT_OK:  # a --fail-on finding is said by its own status first
            code = EXIT_PARTIAL
    return code


def _what_if(items: list[str] | None) -> list[Any]:
    """The parsed --what-if changes; none given, the rules' package (pandas) is not imported
    here, so a large file's reading can start before it (split.start)."""
    if not items:
        return []
    from stallscope.diagnose.fixes import parse_what_if

    return parse_what_if(items)


def _scheduler(given: str | None) -> str | None:
    """--scheduler, else $DASK_SCHEDULER_ADDRESS, else None; a malformed one is exit 2 in one
    line naming where it came from."""
    from stallscope.errors import StallscopeError
    from stallscope.fanout import scheduler_error

    env = os.environ.get("DASK_SCHEDULER_ADDRESS")
    address, where = (given, "--scheduler") if given else (env, "$DASK_SCHEDULER_ADDRESS")
    if not address:
        return None
    why = scheduler_error(address)
    if why is not None:
        raise StallscopeError(f"{where} {address!r} is not a Dask scheduler address: {why}")
    return address


def _cores() -> int:
    from stallscope.fanout import usable_cores

    return usable_cores()


def _say_partial(left_out: list[dict[str, str]], total: int, out: Path) -> None:
    """One line for a report that covers only the files that could be read."""
    from stallscope.text import plain

    first = left_out[0]
    others = f" and {len(left_out) - 1:,} more" if len(left_out) > 1 else ""
    sys.stderr.write(
        f"stallscope: partial report (exit {EXIT_PARTIAL}): {len(left_out):,} of {total:,} "
        f"trace files could not be read and were left out ({plain(Path(first['path']).name)}: "
        f"{plain(first['reason'])}{others}); {plain(out / 'report.md')} covers the other "
        f"{total - len(left_out):,} and lists them\n")


def tensorboard_run(out: Path, report: Any) -> Path:
    """The run folder below OUT/tensorboard (one run name for TensorBoard and its profiler
    plugin: report/tensorboard.py)."""
    from stallscope.report.tensorboard import run_name

    return out / "tensorboard" / run_name(report.source.get("paths", []))
