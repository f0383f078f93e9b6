"""`watch`'s step log survives what ends a run badly: a kill loses only the step it interrupts,
a full disk ends the log on a whole line with one warning (and no traceback of TensorBoard's
writer in the script's output), and `analyze` of the watch folder gives back the whole run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stallscope import progress
from stallscope.capture import steplog
from stallscope.capture.steplog import ScalarWriter, StepLog
from stallscope.wholerun.series import StepSeries
from tests.test_watch import TWO_EPOCHS

# Counts its optimizer steps into a file of its own after each one (fsync'd: the kill must not
# take the count back), slowly enough to be killed mid-run.
COUNTED = textwrap.dedent(
    """
    import os, sys, time, torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(4000, 8), torch.randn(4000, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    count = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    steps = 0
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
        os.pwrite(count, f"{steps:08d}".encode(), 0)
        time.sleep(0.05)
    """
)


@pytest.mark.slow
def test_a_sigkilled_watch_keeps_every_step_but_the_one_it_was_in(tmp_path: Path) -> None:
    script, count = tmp_path / "counted.py", tmp_path / "count"
    script.write_text(COUNTED)
    log = tmp_path / "out" / "watch" / "steps.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "watch", "-q", "-o", str(tmp_path / "out"),
         str(script), str(count)], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    # Past the recorded window (a few steps after the first 10 or so), killed mid-run.
    while time.monotonic() < deadline and (not count.exists() or count.read_text() < "00000040"):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: what a node failure leaves
    proc.wait()
    done = int(count.read_text())
    steps = StepSeries.from_jsonl(log).to_records()
    # A step's line is written when the next batch is taken, and the log's first step begins at
    # the script's second batch (the first step holds the start-up): of the script's `done`
    # steps, the first is no line and the one it was in when killed has none yet. Every other
    # step is in the log, in order (a log flushed each second lost about 20 of them here).
    assert done >= 40
    assert len(steps) >= done - 2
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert log.read_bytes().endswith(b"\n")


class FullDisk:
    """os.write as a disk that fills after `whole` calls: one more call writes part of its
    bytes, then every call fails with ENOSPC."""

    def __init__(self, whole: int) -> None:
        self.whole, self.calls, self.write = whole, 0, os.write

    def __call__(self, fd: int, data: bytes) -> int:
        self.calls += 1
        if self.calls <= self.whole:
            return self.write(fd, data)
        if self.calls == self.whole + 1:
            return self.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FailingScalars:
    """A TensorBoard writer on the same full disk."""

    def __init__(self) -> None:
        self.points = 0

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_ends_the_step_log_on_a_whole_line_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(steplog.os, "write", FullDisk(whole=7))
    monkeypatch.setattr(progress, "_quiet", False)
    path = tmp_path / "steps.jsonl"
    log = StepLog(path)
    for _ in range(30):  # the script runs on past the full disk: no exception reaches it
        log.boundary(100.0, 0, False)
    log.close()
    text = path.read_text()
    assert text.endswith("\n")  # the line written in part was cut off again
    steps = [json.loads(line) for line in text.splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 8))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stops at step 7" in err and "No space left" in err


def test_a_full_disk_under_tensorboard_is_one_warning_and_no_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(steplog, "SCALAR_S", 0.0)  # a point at every step
    monkeypatch.setattr(progress, "_quiet", False)
    log = StepLog(tmp_path / "steps.jsonl", FailingScalars())
    for _ in range(5):
        log.boundary(100.0, 0, False)
    monkeypatch.setattr(steplog.os, "write", FullDisk(whole=0))  # now the log's disk too
    for _ in range(5):
        log.boundary(100.0, 0, False)
    log.close()
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "TensorBoard" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 4


def test_the_scalar_writer_is_read_by_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = ScalarWriter(tmp_path / "tb")
    for step in (1, 2, 3):
        writer.add_scalar("watch/step_ms", 10.0 * step, step)
    writer.flush()  # readable mid-run, before close
    points = EventAccumulator(str(tmp_path / "tb")).Reload().Scalars("watch/step_ms")
    assert [(p.step, p.value) for p in points] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    writer.close()
    with pytest.raises(ValueError):
        writer.add_scalar("watch/step_ms", 1.0, 4)




def analyze(target: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(target), "-o",
                           str(out), "-q"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "report.json").read_text())


def planted_watch_folder(tmp_path: Path, name: str) -> Path:
    """A watch folder as a run killed after its first capture leaves it: the step log and the
    trace, no report.json (a committed H100 watch run's)."""
    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    out = tmp_path / "killed"
    (out / "watch").mkdir(parents=True)
    (out / "tensorboard" / "train").mkdir(parents=True)
    shutil.copy(samples / f"{name}.steps.jsonl", out / "watch" / "steps.jsonl")
    shutil.copy(samples / f"{name}.pt.trace.json.gz",
                out / "tensorboard" / "train" / "host.1.pt.trace.json.gz")
    return out


def test_analyze_of_a_killed_watch_folder_or_its_step_log_is_the_whole_run_report(
        tmp_path: Path) -> None:
    out = planted_watch_folder(tmp_path, "real-h100-watch-save")
    from_folder = analyze(out, tmp_path / "a")
    from_log = analyze(out / "watch" / "steps.jsonl", tmp_path / "b")
    logged = StepSeries.from_jsonl(out / "watch" / "steps.jsonl").to_records()
    watch = from_folder["watch"]
    assert watch["n_steps"] == len(logged)  # the whole run, not the recorded steps alone
    assert watch["periodic"]  # this run's save every N steps is found again
    first_profiled = next(s["step"] for s in logged if s["profiled"])
    assert watch["captures"][0]["first_step"] == first_profiled
    assert watch["captures"][0]["verdict"] == from_folder["verdict"]
    assert from_log["watch"] == watch
    assert "no report.json" in from_folder["notes"][-1]


@pytest.mark.slow
def test_analyze_of_a_watch_folder_gives_back_what_watch_wrote(tmp_path: Path) -> None:
    script = tmp_path / "two_epochs.py"
    script.write_text(TWO_EPOCHS)
    done = subprocess.run([sys.executable, "-m", "stallscope", "watch", "-q", "-o",
                           str(tmp_path / "out"), str(script), "0.002"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    wrote = json.loads((tmp_path / "out" / "report.json").read_text())
    again = analyze(tmp_path / "out", tmp_path / "again")
    assert again["watch"] == wrote["watch"]  # regimes, captures, headline, steps: all of it
    assert again["verdict"] == wrote["verdict"]
    assert again["run"] == wrote["run"]
