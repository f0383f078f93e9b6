"""Errors a user can cause, each mapped to one documented exit code.

The CLI prints `stallscope: <message>` for these and never a traceback; anything else is a bug.
Under `run`, a script that fails passes its own status through instead (1 for an exception, 130
for Ctrl-C, n for sys.exit(n)); `run --timeout` ends with EXIT_TIMEOUT, as coreutils `timeout`
does, so wrappers that already know that convention read it the same way.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_FINDINGS = 3
EXIT_NO_STEPS = 4
EXIT_TIMEOUT = 124  # `run --timeout`: the script was still running and was stopped
EXIT_INTERRUPTED = 130


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
