"""Write the profiler's trace whole or not at all.

torch's `tensorboard_trace_handler` writes straight to the final name, so a full disk left a
half-written `.gz` that looked like a trace, and its OSError surfaced in the script's training
loop (blamed on the script, "0 steps recorded"). Here the trace goes to a hidden temporary file
in the same folder, renamed into place once complete; a failure removes the temporary file and
is returned as one sentence for stallscope's own exit-2 line.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from pathlib import Path
from typing import Any


def export_trace(prof: Any, trace_dir: Path, worker: str, steps: int) -> str | None:
    """Export `prof` as `<worker>.<ns>.pt.trace.json.gz` in `trace_dir` (the names TensorBoard
    and torch's handler use); None when written, else what was lost, where, and why."""
    name = f"{worker}.{time.time_ns()}.pt.trace.json.gz"
    raw = trace_dir / f".{name}.partial.json"
    tmp = trace_dir / f".{name}.partial.gz"
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
        # Kineto writes the JSON from C++ and says nothing when a write fails: a complete
        # trace ends with its closing brace. The compression is python's, which raises.
        prof.export_chrome_trace(str(raw))
        _check_complete(raw)
        with raw.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, trace_dir / name)
    except (OSError, RuntimeError) as exc:
        for path in (raw, raw.with_name(raw.name + ".tmp"), tmp):  # Kineto's own .tmp too
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        why = getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__
        return (f"could not write the trace of the {steps} recorded step(s) to {trace_dir} "
                f"({why}): those steps are lost and no partial file was left; free space there "
                "or use -o for another folder, then run again")
    with contextlib.suppress(OSError):
        raw.unlink(missing_ok=True)
    return None


def _check_complete(path: Path) -> None:
    """Raise OSError unless the JSON at `path` ends with its closing brace."""
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - 64))
        if not fh.read().rstrip().endswith(b"}"):
            raise OSError(f"the profiler wrote {size} bytes and stopped (is the disk full?)")
