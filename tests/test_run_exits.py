"""`stallscope run` on scripts that leave in ways python runs no exit handler for: `os._exit(n)`
keeps the steps recorded so far (written from a hook on os._exit) and the script's status."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=8)
    for i, (x, y) in enumerate(loader):
        if i == 20:
            os._exit(3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    """
)


@pytest.mark.slow
def test_os_exit_keeps_the_steps_recorded_and_the_status(tmp_path: Path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--no-steady-wait", "--steps",
         "50", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    traces = list((tmp_path / "out").rglob("*.pt.trace.json.gz"))
    assert len(traces) == 1, proc.stderr  # before: nothing written and no word
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["steps_recorded"] >= 10
    assert any("os._exit(3)" in n for n in report["notes"])
    assert "os._exit(3)" in proc.stderr


CLOSES = SCRIPT.replace("if i == 20:", "if i == 3:").replace(
    "os._exit(3)", "sys.stdout.close()\n        sys.stderr.close()"
).replace("import os\n", "import os, sys\n")


@pytest.mark.slow
def test_a_script_that_closes_stdout_and_stderr_still_gets_its_report_and_status_0(
        tmp_path: Path):
    assert "sys.stderr.close()" in CLOSES
    (tmp_path / "train.py").write_text(CLOSES)
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--steps", "5", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr  # before: exit 1, "lost sys.stderr"
    assert "lost sys.stderr" not in proc.stderr
    assert "report.json" in proc.stdout  # the summary still reaches the terminal
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["steps_recorded"] == 5


@pytest.mark.slow
def test_a_full_disk_while_the_trace_is_written_is_stallscopes_exit_2(tmp_path: Path):
    """Disk full simulated as in test_outputs.py (RLIMIT_FSIZE: writes past it fail as ENOSPC
    would). Before: exit 1 blamed on the script, "0 steps recorded", a half-written .gz left."""
    from tests.test_outputs import file_size_limit

    (tmp_path / "train.py").write_text(SCRIPT.replace("if i == 20:", "if i == 999:"))
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--steps", "5", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        preexec_fn=file_size_limit(4000))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert len(lines) == 1, proc.stderr
    assert "5 recorded step(s)" in lines[0] and "could not write the trace" in lines[0]
    assert "Traceback" not in proc.stderr and "0 steps" not in proc.stderr
    left = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not [p for p in left if ".gz" in p.name], left
