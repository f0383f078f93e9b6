"""Errors a user can cause, each mapped to one documented exit code, and the one line that says so.

Every command prints `stallscope: <message>` for these and never a traceback; anything else is a
bug, said in one line too (`exit_line`).
Under `run`, a script that fails passes its own status through instead (1 for an exception, 130
for Ctrl-C, n for sys.exit(n)); `run --timeout` ends with EXIT_TIMEOUT, as coreutils `timeout`
does, so wrappers that already know that convention read it the same way. SIGTERM, while the
script runs or while stallscope analyses after it, ends with EXIT_TERMINATED (128 + 15, the
status a shell shows for a process SIGTERM ended). When stallscope itself fails to write under
`run` (a full disk), a script that failed keeps its own status; one that ended well gets
EXIT_USAGE.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_FINDINGS = 3
EXIT_NO_STEPS = 4
# `analyze` of a job: some trace files could not be read and were left out; the report covers
# the rest (a partial result, as `tune`'s own 5 says only its baseline ran).
EXIT_PARTIAL = 5
# `compare --fail-on`: AFTER measurably slower, a new cause, the step slower or a cause worse by
# more than the step gained, any cause worse by its measure
EXIT_SLOWER = 6
EXIT_NEW = 7
EXIT_WORSE = 8
EXIT_CAUSE_WORSE = 9
EXIT_TIMEOUT = 124  # `run --timeout`: the script was still running and was stopped
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM (a launcher stopping this rank) turned into an exception, so the run unwinds and
    the steps recorded so far are kept, or the analysis after the script stops with one line."""


class StallscopeError(Exception):
    """A problem with the user's input or environment, reported in one line."""

    exit_code = EXIT_USAGE


class InputError(StallscopeError):
    """The trace path is missing, unreadable or not a Kineto trace."""


class OutputError(StallscopeError):
    """The output folder exists already or cannot be written."""


class NoStepsError(StallscopeError):
    """`stallscope run` saw no training step to record; the message says why and what to try."""

    exit_code = EXIT_NO_STEPS


def fail(message: str, code: int) -> int:
    """Print the one `stallscope: ...` line for an error and return its exit code."""
    from stallscope.text import plain  # names from traces may hold escape sequences

    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"stallscope: {plain(first)}", file=sys.stderr)
    return code


def exit_line(exc: BaseException) -> int:
    """The one line for an exception that reached the edge of a command, and its exit code: a
    user error says itself, Ctrl-C is 130, anything else is a stallscope bug whose traceback is
    shown only with STALLSCOPE_DEBUG=1. Shared by the CLI and the `--timeout` clock thread,
    which ends the process itself."""
    if isinstance(exc, StallscopeError):
        return fail(str(exc), exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return fail("interrupted", EXIT_INTERRUPTED)
    if isinstance(exc, Terminated):
        return fail("terminated (SIGTERM)", EXIT_TERMINATED)
    if os.environ.get("STALLSCOPE_DEBUG"):
        traceback.print_exception(exc)
    return fail(
        f"internal error ({type(exc).__name__}: {exc}); rerun with STALLSCOPE_DEBUG=1 "
        "for the traceback and report it",
        EXIT_INTERNAL,
    )


def os_error_text(exc: BaseException) -> str:
    """An OSError as its words and errno name ("No space left on device (ENOSPC)"): the name is
    what a user searches for and what scripts match on."""
    words = getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__
    code = getattr(exc, "errno", None)
    name = errno.errorcode.get(code) if isinstance(code, int) else None
    return f"{words} ({name})" if name and name not in words else words
