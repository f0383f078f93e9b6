"""Keep torch's own `USDT: ... profiler_start` / `profiler_stop` lines, and its warning about
clearing events between profiler cycles, off the user's terminal.

Kineto writes them from C++ straight to file descriptor 2 whenever tracing starts or stops, with
no setting to silence them (KINETO_LOG_LEVEL and TORCH_CPP_LOG_LEVEL leave them): they read as
stallscope's output and say nothing a user can act on. Around the few profiler calls that start
or stop tracing, descriptor 2 goes to a temporary file; every other line written meanwhile (the
script's own threads may write) is passed on to the real stderr afterwards, in order.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import BinaryIO

_NOISE = b"USDT:"
# torch.profiler warns once per process when a profiler cycle is prepared after another (seen
# on every real GPU recording with torch 2.11+CUDA): stallscope keeps the one cycle it records,
# so the advice in it (acc_events=True) is nothing a user can act on.
_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"


def quiet_profiler_warnings() -> None:
    """Ignore torch.profiler's cycle warning; every other warning, the script's too, is shown
    as before (the filter matches that message alone, and adding it twice changes nothing)."""
    warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning)


@contextlib.contextmanager
def usdt_filtered(also: bytes | None = None) -> Iterator[None]:
    """Run the body with descriptor 2 captured; pass on everything but Kineto's USDT lines (and
    lines holding `also`). Where descriptor 2 cannot be captured (closed, no memory file nor
    temporary folder) the body runs as is."""
    try:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        buf = _buffer()
    except OSError:
        os.close(saved)
        yield
        return
    os.dup2(buf.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        buf.seek(0)
        data = buf.read()
        buf.close()
        kept = b"".join(line for line in data.splitlines(keepends=True)
                        if not line.startswith(_NOISE) and not (also and also in line))
        if kept:
            with contextlib.suppress(OSError):
                os.write(2, kept)


def _buffer() -> BinaryIO:
    """A file in memory where Linux has them (the disk, /tmp included, may be full: that is
    when Kineto's lines are captured to be folded into stallscope's own), else on disk."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return os.fdopen(os.memfd_create("stallscope-stderr"), "w+b")
    return tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
