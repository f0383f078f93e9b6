"""Shared helpers: where the real traces live, and running the CLI as a user would."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "real_traces"
SAMPLES = ROOT / "sample_traces"


def real_trace(relative: str) -> Path:
    """A trace from ../shared/real_traces, or skip when that folder is not beside the checkout."""
    path = REAL / relative
    if not path.exists():
        pytest.skip(f"real trace not available: {path}")
    return path


def all_real_traces() -> list[Path]:
    if not REAL.is_dir():
        return []
    return sorted(p for p in REAL.rglob("*") if p.is_file() and ".json" in p.name)


def recorded_gpu_samples() -> list[Path]:
    """The real GPU traces this project recorded itself (sample_traces/real-*: committed, so
    never skipped), for the tests every real trace goes through."""
    return sorted(SAMPLES.glob("real-*.pt.trace.json.gz"))


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallscope", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def write_trace(path: Path, events: list[dict], **meta: object) -> Path:
    """Write a small Kineto-shaped trace (gzip when the name ends in .gz)."""
    doc = {"schemaVersion": 1, "deviceProperties": [], **meta, "traceEvents": events}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
