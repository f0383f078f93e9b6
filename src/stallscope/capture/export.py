"""Write the profiler's trace whole or not at all.

torch's `tensorboard_trace_handler` writes straight to the final name, so a full disk left a
half-written `.gz` that looked like a trace, and its OSError surfaced in the script's training
loop (blamed on the script, "0 steps recorded"). Here the trace goes to a hidden temporary file
in the same folder, renamed into place once complete; a failure removes the temporary file and
is returned as one sentence for stallscope's own line (exit 2, or the script's own status when
it failed). Kineto's own "Failed to write to log file!" line says neither why nor what was lost:
it is kept off the terminal, and the cause is found by writing in the folder
(`_write_error`), so the line names ENOSPC rather than the missing file Kineto left.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from pathlib import Path
from typing import Any

from stallscope.capture.metadata import patch_head
from stallscope.capture.quiet import usdt_filtered
from stallscope.errors import os_error_text

# Kineto's line when it cannot write the trace (output_json.cpp, torch 2.x).
_KINETO_WRITE_FAILED = b"Failed to write to log file"
# Bytes written to find why Kineto could not write (an assumption, not measured: more than the
# last free blocks of a disk Kineto just filled, small enough to write in a moment).
_PROBE_BYTES = 1 << 20
# Bytes read to find stallscope's metadata line among the trace's top-level keys (an
# assumption, not measured: Kineto writes a few short keys and our line before the events; the
# line holds each loader's anatomy, a few KB per loader).
_HEAD_BYTES = 1 << 20


def export_trace(prof: Any, trace_dir: Path, worker: str, steps: int,
                 metadata: dict[str, Any] | None = None) -> str | None:
    """Export `prof` as `<worker>.<ns>.pt.trace.json.gz` in `trace_dir` (the names TensorBoard
    and torch's handler use); None when written, else what was lost, where, and why.
    `metadata`'s keys are set in stallscope's metadata as the trace is compressed."""
    name = f"{worker}.{time.time_ns()}.pt.trace.json.gz"
    raw = trace_dir / f".{name}.partial.json"
    tmp = trace_dir / f".{name}.partial.gz"
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
        # Kineto writes the JSON from C++ and says nothing when a write fails: a complete
        # trace ends with its closing brace. The compression is python's, which raises.
        with usdt_filtered(also=_KINETO_WRITE_FAILED):
            prof.export_chrome_trace(str(raw))
        try:
            _check_complete(raw)
        except OSError as exc:  # Kineto's own failure: find its cause by writing there
            raise _write_error(trace_dir) or exc from None
        with raw.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            if metadata:
                head = src.read(_HEAD_BYTES)
                dst.write(patch_head(head, metadata) or head)
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, trace_dir / name)
    except (OSError, RuntimeError) as exc:
        for path in (raw, raw.with_name(raw.name + ".tmp"), tmp):  # Kineto's own .tmp too
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        why = os_error_text(exc)
        return (f"could not write the trace of the {steps} recorded step(s) to {trace_dir}: "
                f"{why}; those steps are lost and no partial file was left; free space there "
                "or use -o for another folder, then run again")
    with contextlib.suppress(OSError):
        raw.unlink(missing_ok=True)
    return None


def _write_error(folder: Path) -> OSError | None:
    """The error writing `_PROBE_BYTES` in `folder` meets (ENOSPC on a full disk, EDQUOT, EFBIG
    past a file size limit), or None when they can be written."""
    probe = folder / f".stallscope-probe-{os.getpid()}"
    try:
        with probe.open("wb") as fh:
            for _ in range(_PROBE_BYTES >> 16):
                fh.write(b"\0" * (1 << 16))
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return None


def _check_complete(path: Path) -> None:
    """Raise OSError unless the JSON at `path` ends with its closing brace."""
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - 64))
        if not fh.read().rstrip().endswith(b"}"):
            raise OSError(f"the profiler wrote {size} bytes and stopped (is the disk full?)")
