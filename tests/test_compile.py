"""torch.compile under `stallscope run`: recording waits for compilation to settle (the
recompiles it records are compile-in-steps', tests/rules/test_compile_in_steps.py). The eager
backend keeps dynamo's compile and region ranges without inductor's C++ build."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

COMPILED = textwrap.dedent(
    """
    import sys, torch
    if len(sys.argv) > 1:  # room for every new shape: no fallback to eager while recording
        torch._dynamo.config.recompile_limit = int(sys.argv[1])
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    fast = torch.compile(model, backend="eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(30):
        n = 8 if step < 12 else 8 + step  # from step 12 a new batch size each step
        x, y = torch.randn(n, 16), torch.randn(n, 1)
        opt.zero_grad()
        torch.nn.functional.mse_loss(fast(x), y).backward()
        opt.step()
    """
)


def _run(tmp_path: Path, *args: str, script_args: tuple[str, ...] = ()) -> dict:
    script = tmp_path / "train.py"
    script.write_text(COMPILED)
    out = tmp_path / "out"
    # The shapes change at a known step: record right after --skip (and the compile wait).
    proc = subprocess.run([sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out),
                           "--no-steady-wait", "--steps", "4", *args, str(script),
                           *script_args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text())


def _assessment(report: dict) -> dict:
    return next(a for a in report["assessments"] if a["rule"] == "compile-in-steps")


@pytest.mark.slow
def test_recording_waits_for_the_first_compilation(tmp_path: Path) -> None:
    report = _run(tmp_path, "--skip", "1")
    # The first step compiled: recording waited one more step, and nothing compiled inside.
    assert any("torch.compile was still compiling" in n for n in report["notes"])
    a = _assessment(report)
    assert a["status"] == "clear" and "compiled nothing there" in a["detail"]
