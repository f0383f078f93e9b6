"""What the commands share: the parser class and argument types, the split of a script's own
arguments, and what a command leaves behind (the report files, the summary, the exit status).

Every command module imports this; it imports no command, so nothing needs `cli`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from stallscope import progress
from stallscope.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, fail


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error ends like every other user error: one line, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # On the top-level parser: the sub-parsers of commands that run a script, whose
        # arguments after SCRIPT are split off before parsing (`split_run_argv`).
        self.script_parsers: dict[str, argparse.ArgumentParser] = {}

    @property
    def run_parser(self) -> argparse.ArgumentParser | None:
        return self.script_parsers.get("run")

    def error(self, message: str) -> NoReturn:
        # One line, no usage block: the usage is one `--help` away, and a wrapper that reads
        # stderr sees the same single `stallscope:` line as for every other user error.
        raise SystemExit(fail(f"{message} (see {self.prog} --help)", EXIT_USAGE))


# ---------------------------------------------------------------------------- argument types


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int of at least `minimum`, refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a duration in seconds above 0 (`--timeout 90`, `--timeout 2.5`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (`tune --budget`, `tune --timeout`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def add_what_if_argument(parser: argparse.ArgumentParser) -> None:
    """`--what-if KEY=VALUE` (analyze, run): replay a change and predict the step after it."""
    parser.add_argument(
        "--what-if", dest="what_if", action="append", default=[], metavar="KEY=VALUE",
        help="predict the step time after a change, alone and with the others given, by "
        "replaying the recorded steps with it: num_workers=N, torch_threads=1 (CPU runs "
        "recorded by run, which times one-thread steps), pin_memory=true, "
        "non_blocking=true, amp=bf16|fp16|tf32, sync=off, optimizer=foreach|fused, "
        "zero_grad=none, cuda_graphs=true, compile=true, allocator=steady, comm=overlap; "
        "repeatable",
    )


# ---------------------------------------------------------------------------- script commands


def add_target_arguments(parser: argparse.ArgumentParser, default_out: str, force_help: str
                         ) -> None:
    """The arguments every script-running command takes (`run`, `tune`): -m, SCRIPT, -o, --force.
    """
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run a library module as a script, like python -m")
    parser.add_argument("target", metavar="SCRIPT", help="the script (or module, with -m)")
    parser.add_argument("-o", "--out", type=Path, help=f"output folder (default: {default_out})")
    parser.add_argument("--force", action="store_true", help=force_help)


def split_run_argv(argv: list[str], run: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Split `run` arguments into stallscope's own (ending with the target) and the script's.

    Everything after SCRIPT, or after `-m MODULE`, belongs to the script verbatim, `--` included,
    exactly as python passes them; a `--` before the target only ends stallscope's options.
    """
    takes_value = {o for a in run._actions for o in a.option_strings if a.nargs != 0}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i] + argv[i + 1 : i + 2], argv[i + 2 :]
        if tok == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if tok.startswith("-m") and not tok.startswith("--"):
            return [*argv[:i], "-m", tok[2:]], argv[i + 1 :]
        if tok.startswith("-") and tok != "-":
            i += 2 if tok in takes_value else 1
            continue
        return argv[: i + 1], argv[i + 1 :]
    return argv, []


# ---------------------------------------------------------------------------- what is left behind


def write_report(report: Any, out: Path, quiet: bool, tensorboard: Path | None = None) -> None:
    """Write report.json/html/md (all or none), then the TensorBoard views when asked,
    into `tensorboard`; then print the summary."""
    from stallscope.outputs import write_files
    from stallscope.report.html import render_html
    from stallscope.report.json_writer import render_json
    from stallscope.report.markdown import render_markdown
    from stallscope.report.terminal import render_terminal
    from stallscope.text import plain

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
        # A cause seen in several recordings gates on each one's severity, not only the
        # recording the report leads with.
        severities = [r["severity"] for f in report.findings for r in f.recordings]
        if any(severity_rank(s) <= limit
               for s in [*(f.severity for f in report.findings), *severities]):
            return EXIT_FINDINGS
    return EXIT_OK
