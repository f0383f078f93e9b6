"""Rank files of different jobs are never merged silently: `analyze` refuses a set whose
ranks disagree on world size or backend, that mixes rank files with recordings that carry no
rank, or whose ranks were recorded on one machine far apart in time, with one line naming the
files (exit 2). Files without ranks (several recordings of one process) stay one report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

GLOO = [SAMPLES / "cpu-gloo-ddp-rank0.pt.trace.json.gz",
        SAMPLES / "cpu-gloo-ddp-rank1.pt.trace.json.gz"]
NCCL = SAMPLES / "public" / "hta" / "a100_rank0of2_nccl.pt.trace.json.gz"


def _edited(src: Path, dst: Path, shift_us: float = 0.0, **dist: object) -> Path:
    """`src` with its distributedInfo fields set and every event moved by `shift_us`."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["distributedInfo"] = {**doc.get("distributedInfo", {}), **dist}
    for ev in doc["traceEvents"]:
        if isinstance(ev.get("ts"), int | float):
            ev["ts"] += shift_us
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def _refused(tmp_path: Path, *paths: Path) -> str:
    done = run_cli("analyze", *map(str, paths), "-o", str(tmp_path / "out"), "-q")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "these files are not one job" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()
    return done.stderr


def test_one_jobs_ranks_are_one_report(tmp_path: Path) -> None:
    done = run_cli("analyze", *map(str, GLOO), "-o", str(tmp_path / "out"), "-q")
    assert done.returncode == 0, done.stderr


def test_a_rank_file_beside_a_recording_without_a_rank_is_refused(tmp_path: Path) -> None:
    line = _refused(tmp_path, *GLOO, SAMPLES / "real-h100-r1-w0.pt.trace.json.gz")
    assert "real-h100-r1-w0.pt.trace.json.gz carries no rank" in line


def test_ranks_of_different_backends_or_world_sizes_are_refused(tmp_path: Path) -> None:
    assert "backends disagree: gloo in cpu-gloo-ddp-rank0" in _refused(tmp_path, GLOO[0], NCCL)
    eight = _edited(GLOO[1], tmp_path / "rank1-of-8.pt.trace.json.gz", world_size=8)
    line = _refused(tmp_path, GLOO[0], eight)
    assert "world sizes disagree: 2 in cpu-gloo-ddp-rank0" in line and "8 in rank1-of-8" in line


@pytest.mark.parametrize("minutes", [60])
def test_two_runs_of_one_job_on_one_machine_are_refused(tmp_path: Path, minutes: int) -> None:
    later = _edited(GLOO[1], tmp_path / "rank1-later.pt.trace.json.gz", minutes * 60e6)
    line = _refused(tmp_path, GLOO[0], later)
    assert f"{minutes} minutes apart: two runs" in line
    # Minutes apart, as ranks that start one after another: one job.
    soon = _edited(GLOO[1], tmp_path / "rank1-soon.pt.trace.json.gz", 2 * 60e6)
    done = run_cli("analyze", str(GLOO[0]), str(soon), "-o", str(tmp_path / "ok"), "-q")
    assert done.returncode == 0, done.stderr
