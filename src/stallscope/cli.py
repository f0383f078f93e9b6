"""Command-line front door. Each command composes the pipeline; errors end in one line.

Exit codes: 0 analysed; 1 internal error (a stallscope bug); 2 usage error or unreadable input
or output; 3 `--fail-on` threshold met; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from stallscope import __version__
from stallscope.errors import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, StallscopeError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other user error
        self.print_usage(sys.stderr)
        raise SystemExit(_fail(f"{message}", EXIT_USAGE))


def build_parser() -> argparse.ArgumentParser:
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
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit 3 when a finding at or above this severity exists (CI gate)",
    )
    an.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return _analyze(args)
    except StallscopeError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # a bug in stallscope: say so in one line, keep the detail opt-in
        if os.environ.get("STALLSCOPE_DEBUG"):
            traceback.print_exc()
        return _fail(
            f"internal error ({type(exc).__name__}: {exc}); rerun with STALLSCOPE_DEBUG=1 "
            "for the traceback and report it",
            EXIT_INTERNAL,
        )


def _fail(message: str, code: int) -> int:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"stallscope: {first}", file=sys.stderr)
    return code


def _analyze(args: argparse.Namespace) -> int:
    from stallscope.analyze import analyze_paths
    from stallscope.diagnose.finding import severity_rank
    from stallscope.outputs import default_out_dir, prepare_out_dir, write_atomic
    from stallscope.report.html import render_html
    from stallscope.report.json_writer import render_json
    from stallscope.report.markdown import render_markdown
    from stallscope.report.terminal import render_terminal

    out = args.out or default_out_dir(args.paths)
    prepare_out_dir(out, args.force)  # before the work, so a refusal costs nothing
    report = analyze_paths(args.paths)
    rendered = {
        "report.json": render_json(report),
        "report.html": render_html(report),
        "report.md": render_markdown(report),
    }
    for name, text in rendered.items():
        write_atomic(out / name, text)
    if not args.quiet:
        sys.stdout.write(render_terminal(report, {k: str(out / k) for k in rendered}))
    if args.fail_on:
        limit = severity_rank(args.fail_on)
        if any(severity_rank(f.severity) <= limit for f in report.findings):
            return EXIT_FINDINGS
    return EXIT_OK
