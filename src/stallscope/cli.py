"""Command-line front door: builds the top-level parser from the commands and dispatches.

Each command is a module in `stallscope.commands` with `NAME`, `TAKES_SCRIPT`, `add_parser(sub)`
and `main(args, script_args, command)`; this module owns only what is common to all of them:
`--version`, splitting a script's own arguments off, and turning whatever escapes a command into
one `stallscope:` line and its exit code.

Exit codes (stallscope.errors; docs/usage.md's table lists the same, tests/test_docs_parser.py
checks both): 0 analysed; 1 internal error (a stallscope bug); 2 usage error or unreadable input
or output; 3 `--fail-on` threshold met; 4 no step to analyse (`run` recorded none, or `analyze`
found none); 5 a partial result (`analyze`: files of a job that could not be read were left out;
`tune`: only the baseline ran); 6, 7, 8, 9 `compare --fail-on`: AFTER measurably slower (6), a
new cause (7), the step slower or a cause worse by more than the step gained (8), any cause
worse by what it measures (9); 124 `run --timeout` stopped the script (as coreutils `timeout`);
130 interrupted; 143 terminated by SIGTERM (while the script runs, or while `run` analyses after
it: the line then names the trace kept). Under `run`, a script that ends with a non-zero status
passes that status through (1 for an exception), also when stallscope then fails to write (a
full disk: one line naming the errno); `tune` passes through the status of a baseline (or of
every candidate) that failed.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

from stallscope import __version__
from stallscope.commands import COMMANDS
from stallscope.commands.common import Parser, split_run_argv
from stallscope.errors import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, Terminated, exit_line
from stallscope.outputs import release_out_dirs, remove_empty_made_dirs


def command_module(name: str) -> ModuleType:
    """The module of command `name`, imported now: the CLI imports only the command it runs, so
    `--version`, `--help` and a small `analyze` do not pay for pandas, numpy or torch."""
    return importlib.import_module(f"stallscope.commands.{name}")


def build_parser(only: str | None = None) -> Parser:
    """The top-level parser: every command's own parser, or only `only`'s (the others listed by
    name and one-line help, which is all `--help` and an unknown command's error show)."""
    parser = Parser(
        prog="stallscope",
        description="Find why a PyTorch training step stalls, from its torch.profiler trace.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, summary in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=summary, add_help=False)
            continue
        module = command_module(name)
        added = module.add_parser(sub)
        if module.TAKES_SCRIPT:
            parser.script_parsers[name] = added
    return parser


def _quiet_numeric_warnings() -> None:
    """numpy/pandas RuntimeWarnings (overflow, invalid value on out-of-range numbers in a trace)
    are not the user's business: the report says what was unusable. Only warnings raised from
    stallscope's own, numpy's or pandas' code are hidden; a `run` script's own stay visible."""
    for module in (r"stallscope(\.|$)", r"numpy(\.|$)", r"pandas(\.|$)"):
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=module)


def main(argv: list[str] | None = None) -> int:
    _quiet_numeric_warnings()
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=name or "")
    script_args: list[str] = []
    if name is not None and name in parser.script_parsers:
        own, script_args = split_run_argv(argv[1:], parser.script_parsers[name])
        args = parser.parse_args([name, *own])
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    status = EXIT_INTERNAL
    try:
        status = command_module(args.command).main(args, script_args, ["stallscope", *argv])
        return status
    except (Exception, KeyboardInterrupt, Terminated) as exc:
        return exit_line(exc)
    finally:
        release_out_dirs()
        remove_empty_made_dirs(remove=status != EXIT_OK)
