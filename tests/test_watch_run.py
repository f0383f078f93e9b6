"""`stallscope watch` end to end, as a user runs it, on the two runs its whole-run analysis
must get right: a loader that turns slow halfway beside a periodic save (one boundary at the
change, the save a period, no false profiler note), and a steady run beside two processes
burning the CPU (the machine's load: no regime, no capture)."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# Steps of well under a millisecond whose loader sleeps 35 ms a batch from step 200 of 400, and
# a 0.3 s save every 75 steps: the change is large, whatever else the machine runs.
SLOWS = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slows(Dataset):
        def __len__(self):
            return 400
        def __getitem__(self, i):
            if i >= 200:
                time.sleep(0.035)
            return torch.randn(8), torch.randn(1)

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(DataLoader(Slows(), batch_size=1)):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if (i + 1) % 75 == 0:
            time.sleep(0.3)  # the save
    """
)

# The same work every step: an MLP of about 10 ms on one intra-op thread, and a 2 ms sleep.
# One thread, and steps of several scheduler slices: beside the burners, two threads of the
# script switch now and then, with nothing else changed, into steps several times as long
# whose CPU time grows with them (each spins at its barriers while the other waits for a
# core), which no figure of the step log tells from more work (docs/watch.md, "Other load");
# and steps shorter than a slice are stretched by the slices other processes take in turn, a
# spike every few steps that recurs like a period. tests/test_watch_regimes.py covers spinning.
STEADY = textwrap.dedent(
    """
    import time, torch
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 512)
    for i in range(100000):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        time.sleep(0.002)
    """
)


def watch(tmp_path: Path, source: str, *args: str) -> tuple[dict[str, Any], str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-o", str(tmp_path / "out"), *args,
         str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    return report, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.alone
def test_a_loader_that_turns_slow_is_one_boundary_at_the_change_and_the_save_a_period(
        tmp_path: Path) -> None:
    report, said = watch(tmp_path, SLOWS)
    w = report["watch"]
    starts = [r["first_step"] for r in w["regimes"]]
    assert len(starts) == 2 and abs(starts[1] - 200) <= 5, w["regimes"]
    assert w["regimes"][1]["median_step_ms"] > 10 * w["regimes"][0]["median_step_ms"]
    periods = [p for p in w["periodic"] if p["kind"] == "periodic"]
    assert [p["every_steps"] for p in periods] == [75], (w["periodic"], w["outliers"])
    assert periods[0]["cost_ms"] > 3 * 250 and 1 not in periods[0]["steps"]
    # the script starts no profiler: the session's later captures are its own
    assert "its own" not in said, said[-3000:]
    assert report.get("run", {}).get("script_profiler") is None


def _spin() -> None:
    while True:
        pass


@pytest.mark.slow
@pytest.mark.alone
def test_a_steady_run_beside_two_cpu_burning_processes_has_no_regime_and_no_capture(
        tmp_path: Path) -> None:
    burners = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(2)]
    for p in burners:
        p.start()
    try:
        report, _ = watch(tmp_path, STEADY, "--duration", "15")
    finally:
        for p in burners:
            p.kill()
            p.join()
    w = report["watch"]
    # the figures whole (a repr would be cut short): what a failure needs to be understood
    assert len(w["regimes"]) == 1, json.dumps({"regimes": w["regimes"], "load": w["load"]})
    assert [c["kind"] for c in w["captures"]] == ["first"], json.dumps(w["captures"])
