"""A script that ends or crashes before the recording window: what `run` saw is kept (report.md,
run.json), and the error line gives the exact command that records the steps it did run."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest

from stallscope.report import unrecorded
from stallscope.report.unrecorded import Window, rerun_command
from stallscope.runfacts import RunContext
from tests.conftest import run_process


def test_the_window_fits_the_steps_the_script_ran():
    assert Window.fitting(1, 5) is None  # no step ran whole after the start-up
    assert Window.fitting(2, 5) == Window(0, 0, 1)
    assert Window.fitting(3, 5) == Window(0, 1, 1)
    assert Window.fitting(4, 5) == Window(0, 1, 2)
    assert Window.fitting(40, 5) == Window(0, 1, 5)  # never more than asked


def test_the_command_replaces_the_window_flags_and_keeps_everything_else():
    command = ["stallscope", "run", "-o", "out dir", "--skip", "4", "--warmup=2",
               "--no-steady-wait", "--steps", "9", "train.py", "--skip", "3", "--lr", "0.1"]
    again = shlex.split(rerun_command(command, 5, Window(1, 1, 2)))
    assert again == ["stallscope", "run", "-o", "out dir", "--skip", "1", "--warmup", "1",
                     "--steps", "2", "--no-steady-wait", "--force", "train.py", "--skip", "3",
                     "--lr", "0.1"]
    module = ["torchrun", "--nproc-per-node", "2", "-m", "stallscope", "run", "-m", "pkg.train"]
    assert rerun_command(module, 1, Window(0, 0, 1)) == (
        "torchrun --nproc-per-node 2 -m stallscope run --skip 0 --warmup 0 --steps 1 "
        "--no-steady-wait --force -m pkg.train")
    ended = ["stallscope", "run", "--steps", "3", "--", "train.py", "--", "x"]
    assert rerun_command(ended, 3, Window(1, 1, 1)) == (
        "stallscope run --skip 1 --warmup 1 --steps 1 --no-steady-wait --force -- train.py -- x")


def test_what_was_seen_is_written_with_the_command(tmp_path: Path):
    ctx = RunContext(command=[], target="train.py", boundaries_seen=3,
                     unprofiled_steps_us=[91_000.0, 12_500.0], notes=["a note"])
    unrecorded.write(tmp_path, ctx, "raised an exception", "stallscope run --skip 1 x.py")
    md = (tmp_path / "report.md").read_text()
    assert "The script `train.py` raised an exception after 3 steps" in md
    assert "```sh\nstallscope run --skip 1 x.py\n```" in md
    assert "- step 2: 91.0 ms\n- step 3: 12.5 ms" in md and "Median 51.8 ms" in md
    assert "- a note" in md
    assert json.loads((tmp_path / "run.json").read_text())["boundaries_seen"] == 3


CRASH_AT_4 = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(512, 16), torch.randn(512, 1)), batch_size=8)
    for i, (x, y) in enumerate(loader):
        if i == 4:
            raise RuntimeError("bad batch 4")
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
""")


@pytest.mark.slow
def test_a_crash_before_the_window_keeps_what_ran_and_the_flags_that_record_it(
        tmp_path: Path):
    train = tmp_path / "train.py"
    train.write_text(CRASH_AT_4)
    out = tmp_path / "out"
    proc = run_process("run", "-o", str(out), str(train), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the script's own status
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("stallscope: no step recorded: the script ")
    assert "RuntimeError: bad batch 4" in proc.stderr  # the script's traceback, as python's
    assert "; this records 2 of the steps it ran: " in line, line
    md = " ".join((out / "report.md").read_text().replace("`", "").split())  # unwrapped
    assert "after 4 steps" in md and "## The steps timed without the profiler" in md
    assert "num_workers 0, pin_memory False; 5 batches drawn" in md
    command = shlex.split(line.split("steps it ran: ", 1)[1].rsplit(" (what ran:", 1)[0])
    assert command[:2] == ["stallscope", "run"] and command[-1] == str(train)
    again = run_process(*command[1:], cwd=tmp_path)  # as printed: it replaces report.md
    assert again.returncode == 0, again.stderr  # stopped after recording, before the crash
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["steps_recorded"] == 2 == int(command[command.index("--steps") + 1])
