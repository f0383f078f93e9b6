"""Command-line front door. Each command composes the pipeline; errors end in one line.

Exit codes: 0 analysed; 1 internal error (a stallscope bug); 2 usage error or unreadable input
or output; 3 `--fail-on` threshold met; 4 `run` recorded no step; 124 `run --timeout` stopped
the script (as coreutils `timeout`); 130 interrupted. Under `run`, a script that ends with a
non-zero status passes that status through (1 for an exception).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallscope import __version__, progress
from stallscope.errors import EXIT_INTERNAL, EXIT_USAGE, StallscopeError
from stallscope.outcome import fail, gate, write_report


class _Parser(argparse.ArgumentParser):
    run_parser: argparse.ArgumentParser | None = None  # set on the top-level parser
    tune_parser: argparse.ArgumentParser | None = None

    def error(self, message: str) -> None:  # one line, exit 2, like every other user error
        self.print_usage(sys.stderr)
        raise SystemExit(fail(f"{message}", EXIT_USAGE))


def build_parser() -> _Parser:
    parser = _Parser(
        prog="stallscope",
        description="Find why a PyTorch training step stalls, from its torch.profiler trace.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    an = sub.add_parser(
        "analyze",
        help="diagnose traces recorded elsewhere",
        description="Diagnose torch.profiler traces: a .json/.json.gz file, or a folder "
        "(TensorBoard logdir or run folder) holding *.pt.trace.json[.gz] files; several files "
        "are analysed as ranks or spans of one job.",
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
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit 3 when a finding at or above this severity exists (CI gate)",
    )
    an.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write per-step scalars and the findings as text to OUT/tensorboard/ "
        "(open with `tensorboard --logdir OUT/tensorboard`); opt-in because it imports torch, "
        "which adds about 2 s to a command that otherwise starts in under 1 s",
    )
    an.add_argument("-q", "--quiet", action="store_true",
                    help="print nothing on success: no summary, no progress lines")
    parser.run_parser = _add_run_parser(sub)
    from stallscope.compare import add_compare_parser

    add_compare_parser(sub)
    from stallscope.tune import add_tune_parser

    parser.tune_parser = add_tune_parser(sub)
    return parser


def _add_run_parser(sub: Any) -> _Parser:
    run = sub.add_parser(
        "run",
        help="profile a training script for a few steps and diagnose it",
        usage="stallscope run [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]",
        description="Run an unmodified training script (as `python SCRIPT ARGS` or `python -m "
        "MODULE ARGS` would) under torch.profiler, record a few training steps, stop the "
        "script, and diagnose the trace. Everything after SCRIPT or MODULE goes to the script.",
    )
    add_target_arguments(run, "./stallscope-<script name>", "overwrite an existing report")
    run.add_argument("--skip", type=whole_number(0), default=2, metavar="N",
                     help="steps to let pass first, for one-off start-up costs (default 2)")
    run.add_argument("--warmup", type=whole_number(0), default=1, metavar="N",
                     help="steps the profiler warms up on, not recorded (default 1)")
    run.add_argument("--steps", type=whole_number(1), default=5, metavar="N",
                     help="steps to record (default 5)")
    run.add_argument(
        "--step-on",
        choices=("auto", "optimizer", "dataloader"),
        default="auto",
        help="what ends a training step: optimizer.step(), or each DataLoader batch; auto uses "
        "the optimizer, and batches when no optimizer steps (default auto)",
    )
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="pass KEY=VALUE to every DataLoader the script builds, instead of the script's own "
        f"value, without editing it; repeatable; KEY is one of {', '.join(OVERRIDE_KEYS)}, "
        "VALUE a whole number or true/false",
    )
    run.add_argument("--run-to-end", action="store_true",
                     help="let the script finish after recording instead of stopping it")
    run.add_argument(
        "--timeout", type=seconds, metavar="SECONDS",
        help="stop the script if it is still running this many seconds after it started "
        "(stallscope's own start-up and the analysis after do not count), keep the steps "
        "recorded so far, write a partial report and exit 124; a script that does not stop "
        "within min(10, SECONDS) s more is ended with what was written",
    )
    run.add_argument("--fail-on", choices=("high", "medium", "low"),
                     help="exit 3 when a finding at or above this severity exists")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="print nothing on success: no summary, no progress lines")
    return run


# `run --set`: the DataLoader arguments that can be overridden, each with its value parser.
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _bool_value(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("true or false (also 1/0, yes/no)")


def _int_value(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ValueError(f"a whole number >= {minimum}")
        return value

    return parse


OVERRIDE_KEYS: dict[str, Callable[[str], Any]] = {
    "batch_size": _int_value(1),
    "drop_last": _bool_value,
    "num_workers": _int_value(0),
    "persistent_workers": _bool_value,
    "pin_memory": _bool_value,
    "prefetch_factor": _int_value(1),
}


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` options as typed values, checked before anything runs: a typo found
    after a minute of training would waste that minute. The last of a repeated key wins."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise StallscopeError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_workers=4")
        parse = OVERRIDE_KEYS.get(key)
        if parse is None:
            raise StallscopeError(f"--set {item!r}: unknown DataLoader option {key!r}; one of "
                                  f"{', '.join(OVERRIDE_KEYS)}")
        try:
            out[key] = parse(text)
        except ValueError as exc:
            raise StallscopeError(f"--set {item!r}: {key} takes {exc}") from None
    return out


def add_target_arguments(parser: argparse.ArgumentParser, default_out: str, force_help: str
                         ) -> None:
    """The arguments every script-running command takes (`run`, `tune`): -m, SCRIPT, -o, --force.
    """
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run a library module as a script, like python -m")
    parser.add_argument("target", metavar="SCRIPT", help="the script (or module, with -m)")
    parser.add_argument("-o", "--out", type=Path, help=f"output folder (default: {default_out})")
    parser.add_argument("--force", action="store_true", help=force_help)


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    script_args: list[str] = []
    if argv[:1] in (["run"], ["tune"]):
        sub_parser = parser.run_parser if argv[0] == "run" else parser.tune_parser
        assert sub_parser is not None
        own, script_args = split_run_argv(argv[1:], sub_parser)
        args = parser.parse_args([argv[0], *own])
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "run":
            return _run(args, script_args, ["stallscope", *argv])
        if args.command == "tune":
            from stallscope.tune import run_tune

            return run_tune(args, script_args, ["stallscope", *argv])
        if args.command == "compare":
            from stallscope.compare import run_compare

            return run_compare(args)
        return _analyze(args, ["stallscope", *argv])
    except StallscopeError as exc:
        return fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except Exception as exc:  # a bug in stallscope: say so in one line, keep the detail opt-in
        if os.environ.get("STALLSCOPE_DEBUG"):
            traceback.print_exc()
        return fail(
            f"internal error ({type(exc).__name__}: {exc}); rerun with STALLSCOPE_DEBUG=1 "
            "for the traceback and report it",
            EXIT_INTERNAL,
        )


def _analyze(args: argparse.Namespace, command: list[str]) -> int:
    from stallscope.analyze import analyze_paths
    from stallscope.outputs import default_out_dir, prepare_out_dir
    from stallscope.report.build import analyze_command

    progress.configure(args.quiet, None)  # on when the inputs turn out to be long work
    out = args.out or default_out_dir(args.paths)
    prepare_out_dir(out, args.force)  # before the work, so a refusal costs nothing
    report = analyze_paths(args.paths, jobs=args.jobs)
    # How to reproduce this report; where it was written is left out (see analyze_command).
    report.source["command"] = analyze_command(report.source["paths"], args.fail_on,
                                               args.tensorboard)
    write_report(report, out, args.quiet, out / "tensorboard" if args.tensorboard else None)
    return gate(report, args.fail_on)


def _run(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    from stallscope.capture.target import Target, check_target
    from stallscope.outputs import default_run_out_dir, prepare_out_dir
    from stallscope.run import Launch, RunPlan, clear_previous

    overrides = parse_overrides(args.overrides)
    target = Target(args.target, tuple(script_args), args.module)
    check_target(target)
    # Absolute now: the script may change the working folder.
    out = (args.out or default_run_out_dir(target.stem)).resolve()
    prepare_out_dir(out, args.force)
    launch = Launch.from_env()
    # Rank 0 speaks for the job (it also says when it waits for the others); every rank
    # reporting each step would interleave N copies of the same lines.
    progress.configure(args.quiet, launch.rank == 0)
    command = launch.command_prefix() + command
    plan = RunPlan(target, out, command, args.force)
    clear_previous(plan, launch)

    from stallscope.capture.runner import CaptureOptions, capture
    from stallscope.capture.session import Schedule
    from stallscope.context import RunContext
    from stallscope.run import conclude, trace_dir

    ctx = RunContext(
        command=command,
        target=target.name,
        rank=launch.rank if launch.distributed else None,
        world_size=launch.world_size if launch.distributed else None,
    )
    options = CaptureOptions(Schedule(args.skip, args.warmup, args.steps), args.step_on,
                             args.run_to_end, overrides, args.timeout)
    progress.say(
        f"running {target.name} under the profiler: {args.skip} step(s) skipped, "
        f"{args.warmup} warm-up, {args.steps} recorded"
    )
    if overrides:
        progress.say("DataLoader overrides: " + _overrides_text(overrides))
    # The report is written by `conclude`, which the capture calls once the script has ended
    # (from its clock thread when a --timeout script would not stop).
    return capture(target, options, trace_dir(plan), launch.worker, ctx,
                   lambda c, why: conclude(plan, launch, args.quiet, args.fail_on, c, why))


def _overrides_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in overrides.items())
