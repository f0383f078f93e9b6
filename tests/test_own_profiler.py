"""`stallscope run` on scripts that start their own profiler, through real subprocesses.

Only one profiler session can exist in a process: before, such a script crashed the run with
signal 11. Now stallscope steps aside, never crashes, analyses its own steps or the trace the
script's profiler wrote, says which, and never touches the script's own trace files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The script's loop, shared by every scenario. Each script records what its profiler wrote
# (name -> sha256) in digests.json the moment it was written, so the test can tell that the
# files are still there, byte for byte.
PRELUDE = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(800, 8), torch.randn(800, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    digests = {}


    def written(path):
        digests[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
        json.dump(digests, open("digests.json", "w"))


    def train_step(x, y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


    def on_ready(prof):  # tensorboard_trace_handler, noting the file it wrote
        before = set(os.listdir("log")) if os.path.isdir("log") else set()
        tensorboard_trace_handler("./log")(prof)
        for name in sorted(set(os.listdir("log")) - before):
            written(os.path.join("log", name))
    """
)

# The PyTorch tutorial's pattern: a schedule, tensorboard_trace_handler, prof.step() per batch.
TUTORIAL = PRELUDE + textwrap.dedent(
    """
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=3), on_trace_ready=on_ready) as prof:
        for i, (x, y) in enumerate(loader):
            train_step(x, y)
            prof.step()
    print("SCRIPT FINISHED")
    """
)

# No schedule: the whole loop profiled, exported at the end.
EXPORT_AT_END = PRELUDE + textwrap.dedent(
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i, (x, y) in enumerate(loader):
            if i == 30:
                break
            train_step(x, y)
    prof.export_chrome_trace("own_trace.json")
    written("own_trace.json")
    print("SCRIPT FINISHED")
    """
)

# The legacy profiler as a context manager around every step; the script reads its table.
AUTOGRAD_IN_LOOP = PRELUDE + textwrap.dedent(
    """
    for i, (x, y) in enumerate(loader):
        if i == 10:
            break
        with torch.autograd.profiler.profile() as p:
            train_step(x, y)
    print("TABLE ROWS", len(p.key_averages()))
    print("SCRIPT FINISHED")
    """
)

# Training, then a final evaluation under the script's own profiler.
FINAL_EVAL = PRELUDE + textwrap.dedent(
    """
    for i, (x, y) in enumerate(loader):
        if i == 20:
            break
        train_step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        for x, y in loader:
            model(x)
    prof.export_chrome_trace("eval_trace.json")
    written("eval_trace.json")
    print("SCRIPT FINISHED")
    """
)

# The script's profiler starts while stallscope records (after its 2 skipped steps, its warm-up
# and 2 recorded steps): stallscope's running session must be stopped first.
STARTS_MID_RECORDING = PRELUDE + textwrap.dedent(
    """
    for i, (x, y) in enumerate(loader):
        if i == 6:
            prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=on_ready,
                           schedule=schedule(wait=0, warmup=1, active=4, repeat=1))
            prof.start()
        train_step(x, y)
        if 6 <= i < 20:
            prof.step()
        if i == 20:
            prof.stop()
    print("SCRIPT FINISHED")
    """
)

LIGHTNING = textwrap.dedent(
    """
    import torch, lightning as L
    from torch.utils.data import DataLoader, TensorDataset


    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)


    loader = DataLoader(TensorDataset(torch.randn(320, 8), torch.randn(320, 1)), batch_size=8)
    trainer = L.Trainer(profiler="pytorch", max_epochs=1, logger=False, accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=".")
    trainer.fit(Model(), loader)
    print("SCRIPT FINISHED")
    """
)


def run(tmp_path: Path, script: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(script)
    return subprocess.run(
        # The script starts its profiler at a known step: record right after --skip.
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--no-steady-wait", *options,
         "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )


def line_of(script: str, text: str) -> int:
    """The line of train.py that holds `text` (scripts start with a newline: line 1 is
    empty)."""
    return next(n for n, line in enumerate(script.splitlines(), 1) if text in line)


def run_section(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "report.json").read_text())["run"]


def assert_script_files_untouched(tmp_path: Path) -> dict[str, str]:
    """Every file the script's profiler wrote is still where it was, byte for byte."""
    digests = json.loads((tmp_path / "digests.json").read_text())
    assert digests
    for name, digest in digests.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest, name
    return digests


def assert_no_crash(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "disableProfiler called but no active" not in proc.stderr


def kept(copy: Path) -> Path:
    """The script's bytes as stallscope copied them. Where the TensorBoard plugin's copy took
    the file's name (its DataLoader events relabelled, report/tensorboard_trace.py), they sit
    beside it as `<worker>[.<span>].original.json[.gz]`, unchanged."""
    from stallscope.report.tensorboard_trace import ORIGINAL_SUFFIX, PLUGIN_NAME

    stem = PLUGIN_NAME.sub(r"\1\2", copy.name)
    for suffix in (ORIGINAL_SUFFIX, ORIGINAL_SUFFIX.removesuffix(".gz")):
        if (copy.parent / (stem + suffix)).exists():
            return copy.parent / (stem + suffix)
    return copy


@pytest.mark.slow
def test_tutorial_profiler_gives_a_report_of_the_script_trace(tmp_path: Path) -> None:
    proc = run(tmp_path, TUTORIAL)
    assert_no_crash(proc)
    digests = assert_script_files_untouched(tmp_path)
    run_info = run_section(tmp_path)
    assert run_info["trace_source"] == "script-profiler"
    script = run_info["script_profiler"]
    assert script["site"] == f"train.py:{line_of(TUTORIAL, 'with profile(')}"
    first = next(iter(digests))
    assert script["shown"][0] == first
    # The analysed trace is a copy of the script's, in stallscope's own trace folder.
    copy = Path(script["copy"])
    assert copy.parent == tmp_path / "out" / "tensorboard" / "train"
    assert hashlib.sha256(kept(copy).read_bytes()).hexdigest() == digests[first]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [t["path"] for t in report["traces"]] == [str(copy)]
    assert report["summary"]["steps"] >= 2  # the schedule's 3 active steps, less a one-off
    assert run_info["steps_recorded"] == report["summary"]["steps"]
    assert not run_info["partial"]
    # Said once, first, in the report and on the terminal.
    said = f"starts its own torch.profiler at train.py:{line_of(TUTORIAL, 'with profile(')}"
    assert said in report["notes"][0]
    # report.md wraps its lines and puts names (train.py:12) in code spans.
    assert said in " ".join((tmp_path / "out" / "report.md").read_text().replace("`", "").split())
    assert said in proc.stdout
    # Stopped once the script's trace was written, as after stallscope's own steps.
    assert run_info["ended"] == "stopped" and "SCRIPT FINISHED" not in proc.stdout


@pytest.mark.slow
def test_profiler_without_schedule_exported_at_the_end(tmp_path: Path) -> None:
    proc = run(tmp_path, EXPORT_AT_END, "--run-to-end")
    assert_no_crash(proc)
    assert "SCRIPT FINISHED" in proc.stdout
    digests = assert_script_files_untouched(tmp_path)
    run_info = run_section(tmp_path)
    assert run_info["trace_source"] == "script-profiler"
    assert run_info["ended"] == "finished"
    assert run_info["script_profiler"]["shown"] == ["own_trace.json"]
    copy = Path(run_info["script_profiler"]["copy"])
    assert hashlib.sha256(kept(copy).read_bytes()).hexdigest() == digests["own_trace.json"]


@pytest.mark.slow
def test_autograd_profiler_around_each_step(tmp_path: Path) -> None:
    proc = run(tmp_path, AUTOGRAD_IN_LOOP)
    assert_no_crash(proc)
    # The script's profiler worked as without stallscope: its table has rows.
    assert "SCRIPT FINISHED" in proc.stdout
    rows = next(line for line in proc.stdout.splitlines() if line.startswith("TABLE ROWS"))
    assert int(rows.split()[-1]) > 0
    run_info = run_section(tmp_path)
    script = run_info["script_profiler"]
    assert script["kind"] == "torch.autograd.profiler"
    assert script["site"] == f"train.py:{line_of(AUTOGRAD_IN_LOOP, 'autograd.profiler')}"
    # It wrote no file: stallscope analysed its last session, exported by stallscope.
    assert run_info["trace_source"] == "script-profiler"
    assert script["exported"] and Path(script["copy"]).is_file()
    assert "exported by stallscope" in json.loads(
        (tmp_path / "out" / "report.json").read_text())["notes"][0]


@pytest.mark.slow
def test_script_profiler_after_stallscope_recorded_its_steps(tmp_path: Path) -> None:
    proc = run(tmp_path, FINAL_EVAL, "--run-to-end")
    assert_no_crash(proc)
    assert "SCRIPT FINISHED" in proc.stdout
    assert_script_files_untouched(tmp_path)
    run_info = run_section(tmp_path)
    # stallscope had its 5 steps: it analysed those, and the script's evaluation ran as written.
    assert run_info["trace_source"] == "stallscope"
    assert run_info["steps_recorded"] == 5 and not run_info["partial"]
    script = run_info["script_profiler"]
    assert script["site"] == f"train.py:{line_of(FINAL_EVAL, 'with profile(')}"
    assert script["copy"] is None and script["shown"] == ["eval_trace.json"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "after stallscope had recorded its 5 step(s)" in report["notes"][0]
    assert all("script-profiler" not in t["path"] for t in report["traces"])


@pytest.mark.slow
def test_script_profiler_starting_while_stallscope_records(tmp_path: Path) -> None:
    proc = run(tmp_path, STARTS_MID_RECORDING)
    assert_no_crash(proc)
    assert_script_files_untouched(tmp_path)
    run_info = run_section(tmp_path)
    script = run_info["script_profiler"]
    # stallscope's session was stopped after its 2 complete steps and not restarted.
    assert script["own_steps"] == 2
    assert "stopped its own after 2 recorded step(s)" in proc.stderr
    assert proc.stderr.count("starting the profiler") == 1
    # 2 of 5 steps is too few: the script's trace was analysed.
    assert run_info["trace_source"] == "script-profiler"
    assert "stepped aside after 2 of 5 step(s)" in script["note"]


@pytest.mark.slow
def test_lightning_pytorch_profiler(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="lightning is not installed")
    proc = run(tmp_path, LIGHTNING)
    assert_no_crash(proc)
    run_info = run_section(tmp_path)
    assert run_info["trace_source"] == "script-profiler"
    script = run_info["script_profiler"]
    # The script's line that reached the profiler, then Lightning's own.
    assert script["site"].startswith(f"train.py:{line_of(LIGHTNING, 'trainer.fit(')} (through ")
    assert script["shown"] and all((tmp_path / p).is_file() for p in script["shown"])
    assert kept(Path(script["copy"])).read_bytes() == \
        (tmp_path / script["shown"][0]).read_bytes()
