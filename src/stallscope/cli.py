"""Command-line front door: builds the top-level parser from the commands and dispatches.

Each command is a module in `stallscope.commands` with `NAME`, `TAKES_SCRIPT`, `add_parser(sub)`
and `main(args, script_args, command)`; this module owns only what is common to all of them:
`--version`, splitting a script's own arguments off, and turning whatever escapes a command into
one `stallscope:` line and its exit code.

Exit codes: 0 analysed; 1 internal error (a stallscope bug); 2 usage error or unreadable input
or output; 3 `--fail-on` threshold met; 4 `run` recorded no step; 124 `run --timeout` stopped
the script (as coreutils `timeout`); 130 interrupted. Under `run`, a script that ends with a
non-zero status passes that status through (1 for an exception).
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

from stallscope import __version__
from stallscope.commands import analyze, compare, run, tune
from stallscope.commands.common import Parser, split_run_argv
from stallscope.errors import EXIT_USAGE, exit_line
from stallscope.outputs import release_out_dirs

# In the order `stallscope --help` lists them.
COMMANDS: dict[str, ModuleType] = {m.NAME: m for m in (analyze, run, compare, tune)}


def build_parser() -> Parser:
    parser = Parser(
        prog="stallscope",
        description="Find why a PyTorch training step stalls, from its torch.profiler trace.",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module in COMMANDS.items():
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
    parser = build_parser()
    script_args: list[str] = []
    module = COMMANDS.get(argv[0]) if argv else None
    if module is not None and module.TAKES_SCRIPT:
        own, script_args = split_run_argv(argv[1:], parser.script_parsers[argv[0]])
        args = parser.parse_args([argv[0], *own])
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command].main(args, script_args, ["stallscope", *argv])
    except (Exception, KeyboardInterrupt) as exc:
        return exit_line(exc)
    finally:
        release_out_dirs()
