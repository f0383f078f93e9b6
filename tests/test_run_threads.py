"""`stallscope run` always ends: a script's non-daemon threads (loggers, metric uploaders) are
waited for THREAD_GRACE_S at most once the script has ended or been stopped, then the process
ends anyway with one `stallscope:` line and a note in the report. Python would wait for them
forever, and a script stopped after its recorded steps never reaches the code that stops them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stallscope.capture.runner import THREAD_GRACE_S

# A training loop with a non-daemon logger thread. argv: STOPS (the script stops its thread in
# a finally block: `yes`, or never: `no`).
SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    stop = threading.Event()

    def log():
        while not stop.is_set():
            time.sleep(0.05)

    logger = threading.Thread(target=log, name="metrics-logger")
    logger.start()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=8)
    try:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        if sys.argv[1] == "yes":
            stop.set()
            logger.join()
    """
)


def run(tmp_path: Path, stops: str) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "train.py").write_text(SCRIPT)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--steps", "5", "train.py",
         stops], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_a_thread_that_never_stops_ends_after_the_grace_with_a_line_and_a_note(tmp_path: Path):
    proc, wall = run(tmp_path, "no")  # before: never ended (the subprocess timeout fired)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert len(lines) == 1 and "'metrics-logger'" in lines[0], proc.stderr
    assert f"{THREAD_GRACE_S:g} s" in lines[0]
    assert wall >= THREAD_GRACE_S
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["steps_recorded"] == 5
    assert any("metrics-logger" in n for n in report["notes"]), report["notes"]


@pytest.mark.slow
def test_a_thread_the_script_stops_is_waited_for_without_a_word(tmp_path: Path):
    proc, wall = run(tmp_path, "yes")
    assert proc.returncode == 0, proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    # torch's own profiler_start/stop lines (written by Kineto to descriptor 2) are kept off
    # the terminal; stallscope's progress lines still come through.
    assert "USDT" not in proc.stderr and "5 step(s) recorded" in proc.stderr, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert not any("non-daemon" in n for n in report["notes"])


pytestmark = pytest.mark.filterwarnings("ignore")
