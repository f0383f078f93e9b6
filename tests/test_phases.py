"""Steps follow whichever optimizer or DataLoader drives the loop now (scripts that run
experiment A, then B), and a loop with neither is told at once how to mark its steps."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.capture.steps import PHASE_OPTIMIZER_STEPS, StepDriver

TWO_PHASES = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def experiment(opt_cls, batches, lr):
        model = torch.nn.Linear(8, 1)
        opt = opt_cls(model.parameters(), lr=lr)
        data = TensorDataset(torch.randn(batches * 4, 8), torch.randn(batches * 4, 1))
        for x, y in DataLoader(data, batch_size=4):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    experiment(torch.optim.SGD, 10, 0.1)   # phase A: 10 steps
    experiment(torch.optim.Adam, 20, 0.01)  # phase B: 20 steps
    """
)

NO_STEPS = textwrap.dedent(
    """
    import time, torch
    x = torch.ones(8)
    end = time.monotonic() + 8
    while time.monotonic() < end:
        x = x * 1.0
        time.sleep(0.05)
    """
)


def _run(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", str(tmp_path / "out"), *args,
         str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )


@pytest.mark.slow
def test_second_phase_is_recorded_when_skip_passes_the_first(tmp_path: Path) -> None:
    proc = _run(tmp_path, TWO_PHASES, "--skip", "14", "--steps", "4", "--no-steady-wait")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["steps_recorded"] == 4
    notes = " ".join(report["notes"])
    assert "2 phases" in notes and "optimizer SGD" in notes and "optimizer Adam" in notes
    assert "in the phase of optimizer Adam" in notes


@pytest.mark.slow
def test_loop_with_no_step_is_told_how_to_mark_steps_while_it_runs(tmp_path: Path) -> None:
    proc = _run(tmp_path, NO_STEPS, "--no-step-warning", "2")
    assert "warning: no training step seen after 2 s" in proc.stderr
    assert "stallscope.step()" in proc.stderr
    assert proc.returncode == 4  # no step recorded, as documented


def test_alternating_optimizers_keep_the_first_driving() -> None:
    seen: list[int] = []
    d = StepDriver("auto", lambda: seen.append(1))
    gen, disc = object(), object()
    for _ in range(10):  # a GAN: D then G each iteration, direct boundaries (no loader)
        d.on_optimizer_step(disc)
        d.on_optimizer_step(gen)
    assert len(d.phases) == 1 and d.phases[0][0] == "optimizer object"
    # A new optimizer that steps on its own takes over after PHASE_OPTIMIZER_STEPS steps.
    fresh = object()
    for _ in range(PHASE_OPTIMIZER_STEPS + 3):
        d.on_optimizer_step(fresh)
    assert len(d.phases) == 2


def test_a_new_optimizer_at_a_freed_ones_address_is_a_new_phase() -> None:
    """Experiment A's optimizer is freed and B's is allocated at the same address (CPython
    reuses it at once): B is still a new phase, seen in the same steps whatever the ids."""

    class SGD:
        pass

    class Adam:
        pass

    d = StepDriver("auto", lambda: None)
    first = SGD()
    address = id(first)
    for _ in range(5):
        d.on_optimizer_step(first)
    del first
    keep = []
    second = Adam()
    while id(second) != address and len(keep) < 1000:  # find the reused address
        keep.append(second)
        second = Adam()
    for _ in range(PHASE_OPTIMIZER_STEPS + 1):
        d.on_optimizer_step(second)
    assert [name for name, _ in d.phases] == ["optimizer SGD", "optimizer Adam"]


SLOW_FIRST_STEP = textwrap.dedent(
    """
    import time, torch
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.LBFGS([w], max_iter=3)
    def closure():
        opt.zero_grad(); time.sleep(1.5); loss = (w - 1).pow(2).sum(); loss.backward()
        return loss
    for _ in range(3):
        opt.step(closure)
    """
)


@pytest.mark.slow
def test_a_long_first_step_is_not_mistaken_for_a_loop_without_steps(tmp_path: Path) -> None:
    proc = _run(tmp_path, SLOW_FIRST_STEP, "--no-step-warning", "2", "--skip", "0",
                "--steps", "1")
    assert "the first optimizer.step() has not returned after 2 s" in proc.stderr
    assert "mark each iteration" not in proc.stderr
