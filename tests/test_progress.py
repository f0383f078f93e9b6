"""Progress on stderr: shown for long work (several traces, a large one, `run`), never with -q,
and never mistaken for the one `stallscope:` error line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from stallscope import progress
from tests.conftest import ROOT, SAMPLES, run_cli

TWO = [SAMPLES / "cpu-worker-startup.pt.trace.json.gz",
       SAMPLES / "cpu-persistent-workers.pt.trace.json.gz"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`stallscope ARGS` with `env` and without any STALLSCOPE_PROGRESS of the caller's: in
    this process for `analyze`, in its own for `run` (see conftest.run_cli)."""
    environ = {k: v for k, v in os.environ.items() if k != progress.ENV}
    with mock.patch.dict(os.environ, {**environ, **(env or {})}, clear=True):
        return run_cli(*args)


def progress_lines(stderr: str) -> list[str]:
    return [ln.removeprefix(progress.PREFIX) for ln in stderr.splitlines()
            if ln.startswith(progress.PREFIX)]


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("stallscope:")]


def test_two_trace_analyze_reports_each_phase(tmp_path: Path):
    proc = cli("analyze", "-o", str(tmp_path / "out"), *map(str, TWO))
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    expected = ["analysing 2 trace files", "analysed", "(1/2)", "(2/2)",
                "diagnosing the job (2 traces)", "writing the report to"]
    text = "\n".join(lines)
    positions = [text.find(e) for e in expected]
    assert -1 not in positions, text
    assert positions == sorted(positions)  # in the order the work happens
    assert error_lines(proc.stderr) == []  # progress never looks like an error


def test_quiet_silences_progress_and_summary(tmp_path: Path):
    proc = cli("analyze", "-q", "--tensorboard", "-o", str(tmp_path / "out"), *map(str, TWO),
               env={progress.ENV: "1"})  # -q wins even over the variable
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout == ""


def test_a_small_single_trace_stays_quiet_unless_forced(tmp_path: Path):
    sample = str(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")
    plain = cli("analyze", "-o", str(tmp_path / "a"), sample)
    assert plain.returncode == 0 and progress_lines(plain.stderr) == []
    forced = cli("analyze", "-o", str(tmp_path / "b"), sample, env={progress.ENV: "1"})
    assert forced.returncode == 0
    assert any(ln.startswith("diagnosing") for ln in progress_lines(forced.stderr))
    off = cli("analyze", "-o", str(tmp_path / "c"), *map(str, TWO), env={progress.ENV: "0"})
    assert off.returncode == 0 and progress_lines(off.stderr) == []


def test_an_error_after_progress_still_ends_in_one_error_line(tmp_path: Path):
    # A file cut before its first event beside a good one: the job is analysed without it
    # (issue 36), and the last word is the one line saying so, with the partial status.
    broken = tmp_path / "broken.pt.trace.json"
    broken.write_text('{"traceEvents": [')
    proc = cli("analyze", "-o", str(tmp_path / "out"), str(TWO[0]), str(broken))
    assert proc.returncode == 5
    assert progress_lines(proc.stderr)  # it had started: several files
    assert len(error_lines(proc.stderr)) == 1
    assert proc.stderr.splitlines()[-1].startswith("stallscope: partial report (exit 5)")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_run_reports_recording_step_by_step_and_q_silences_it(tmp_path: Path):
    script = [str(ROOT / "examples" / "balanced.py"), "--samples", "2048", "--width", "8"]
    proc = cli("run", "-o", str(tmp_path / "a"), "--steps", "3", *script)
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(progress_lines(proc.stderr))
    expected = ["running", "step(s) skipped: starting the profiler", "recording 3 step(s)",
                "recorded step 1/3", "recorded step 2/3", "recorded step 3/3",
                "trace written", "stopping the script", "the script stopped after recording",
                "analysing 1 trace(s)", "writing the report to"]
    positions = [text.find(e) for e in expected]
    assert -1 not in positions, text
    assert positions == sorted(positions)
    assert error_lines(proc.stderr) == []
    quiet = cli("run", "-q", "-o", str(tmp_path / "b"), "--steps", "3", *script)
    assert quiet.returncode == 0, quiet.stderr
    assert progress_lines(quiet.stderr) == [] and quiet.stdout == ""


@pytest.mark.slow
def test_run_of_a_failing_script_ends_in_one_error_line(tmp_path: Path):
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(20):\n"
        "    model(torch.randn(8, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    if i == 6:\n"
        "        raise RuntimeError('boom')\n"
    )
    proc = cli("run", "-o", str(tmp_path / "out"), "--no-steady-wait", str(train))
    assert proc.returncode == 1
    assert "recorded step 1/5" in proc.stderr
    assert len(error_lines(proc.stderr)) == 1
    assert proc.stderr.splitlines()[-1].startswith("stallscope:")


def test_a_large_trace_turns_progress_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    small = tmp_path / "small.pt.trace.json.gz"
    small.write_bytes(b"x")
    large = tmp_path / "large.pt.trace.json.gz"
    with large.open("wb") as fh:  # sparse: the size on disk is what counts, not the content
        fh.truncate(progress.LARGE_TRACE_BYTES + 1)
    progress.configure(quiet=False, default=None)
    progress.consider_inputs([small])
    assert not progress.active()
    progress.configure(quiet=False, default=None)
    progress.consider_inputs([large])
    assert progress.active()
    progress.configure(quiet=True, default=None)
    progress.consider_inputs([large])
    assert not progress.active()  # -q wins
    progress.configure(quiet=False, default=False)
