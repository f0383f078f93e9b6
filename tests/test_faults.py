"""`stallscope run` under the faults a training job really has (issue 36): a script that forks
children, a disk that fills while stallscope writes, SIGTERM while it analyses.

Through real subprocesses, as a user would meet them: the parent's report intact, the child
ended as under plain python with nothing of stallscope's printed or written, the script's exit
status kept, one `stallscope:` line for stallscope's own failure.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_run_failures import running

# argv: HOW AT. At batch AT the script starts children: `fork-return` forks with os.fork() and
# the child leaves the loop, so the script returns normally in it; `fork-exit` forks and the
# child calls sys.exit(0), the parent waiting for it; `mp` starts a multiprocessing Process with
# each start method (fork, spawn, forkserver) and joins them. Every child leaves its pid in
# children/, and the parent each child's exit status in statuses/.
SCRIPT = textwrap.dedent(
    """
    import atexit, multiprocessing, os, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def mark(folder, name):
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, str(name)), "w").close()


    def little_work():
        mark("children", os.getpid())
        return sum(range(10000))


    def main():
        how, at = sys.argv[1], int(sys.argv[2])
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
        for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
            if i == at and how.startswith("fork"):
                pid = os.fork()
                if pid == 0:
                    atexit.register(mark, "atexit", os.getpid())
                    little_work()
                    print("CHILD DONE", flush=True)
                    if how == "fork-exit":
                        sys.exit(0)
                    return  # the script ends normally in the child
                if how == "fork-exit":
                    mark("statuses", f"{pid}-{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
            if i == at and how == "mp":
                for method in ("fork", "spawn", "forkserver"):
                    child = multiprocessing.get_context(method).Process(target=little_work)
                    child.start()
                    child.join(60)
                    mark("statuses", f"{method}-{child.exitcode}")
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        print("PARENT FINISHED")


    if __name__ == "__main__":
        main()
    """
)


def run_script(tmp_path: Path, how: str, at: int, *options: str
               ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--no-steady-wait", *options,
         "train.py", how, str(at)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)


def children_alive(tmp_path: Path) -> list[int]:
    """The children the script started that still run 2 s after stallscope exited."""
    pids = [int(p.name) for p in (tmp_path / "children").iterdir()]
    assert pids, "no child ran"
    deadline = time.monotonic() + 2
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if running(p)]


def assert_parents_report(tmp_path: Path, proc: subprocess.CompletedProcess[str]) -> None:
    """One report, of the parent's 5 recorded steps, one trace, one summary; nothing of
    stallscope's from a child (a second summary, a second "the script ..." line)."""
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["run"]["ended"], report["run"]["steps_recorded"]) == ("stopped", 5)
    assert report["summary"]["steps"] + sum(
        len(t.get("set_aside_steps") or []) for t in report["traces"]) == 5
    assert len(list((tmp_path / "out").rglob("*.pt.trace.json.gz"))) == 1
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("stallscope:")].__len__() == 1
    assert proc.stdout.rstrip().endswith("(the profiler plugin's page needs internet access)")
    assert proc.stderr.count("[stallscope] the script ") == 1, proc.stderr
    assert "stallscope:" not in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fork-return", "fork-exit"])
def test_a_child_forked_at_a_recorded_step_ends_as_under_python(tmp_path: Path, how: str):
    # Batch 4: after --skip 2 and the warm-up, in the second recorded step.
    proc = run_script(tmp_path, how, 4)
    assert_parents_report(tmp_path, proc)
    # The child's own output is flushed as python would flush it, before the parent's summary.
    assert proc.stdout.count("CHILD DONE") == 1 and proc.stdout.startswith("CHILD DONE")
    assert children_alive(tmp_path) == []  # before: hung in the profiler's teardown
    # The child's atexit functions ran, as python runs them.
    assert [p.name for p in (tmp_path / "atexit").iterdir()] == [
        p.name for p in (tmp_path / "children").iterdir()]
    if how == "fork-exit":
        statuses = [p.name.split("-")[1] for p in (tmp_path / "statuses").iterdir()]
        assert statuses == ["0"]


@pytest.mark.slow
def test_multiprocessing_children_with_each_start_method_end_as_under_python(tmp_path: Path):
    proc = run_script(tmp_path, "mp", 4)
    assert_parents_report(tmp_path, proc)
    statuses = sorted(p.name for p in (tmp_path / "statuses").iterdir())
    assert statuses == ["fork-0", "forkserver-0", "spawn-0"]
    assert len(list((tmp_path / "children").iterdir())) == 3
    assert children_alive(tmp_path) == []


@pytest.mark.slow
def test_a_child_forked_during_skip_says_nothing(tmp_path: Path):
    """Before: the child ran stallscope's finish path and printed a false "no step recorded"
    line seconds after the parent had exited 0."""
    proc = run_script(tmp_path, "fork-return", 1, "--skip", "3")
    assert_parents_report(tmp_path, proc)
    assert "no step recorded" not in proc.stderr + proc.stdout
    assert children_alive(tmp_path) == []


# ------------------------------------------------------------------ a full disk

# A short training loop that ends with status 3; with argv[1] a folder, it first fills that
# folder's file system (as a checkpoint would), after stallscope has written its trace.
EXIT_3 = textwrap.dedent(
    """
    import errno, os, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if len(sys.argv) > 1:
        with open(os.path.join(sys.argv[1], "checkpoint"), "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"x" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    sys.exit(3)
    """
)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs at tmp_path/disk, unmounted afterwards; skipped where it cannot be mounted
    (not root, or a container without CAP_SYS_ADMIN)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                           capture_output=True, text=True, check=False)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mount.stderr.strip() or mount.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(folder: Path) -> None:
    with (folder / "filler").open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"x" * 4096)
        except OSError:
            pass


def _run_exit_3(tmp_path: Path, out: Path, *script_args: str
                ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "exit3.py").write_text(EXIT_3)
    return subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-o", str(out), "--run-to-end",
         "--no-steady-wait", "exit3.py", *script_args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.slow
def test_a_full_disk_keeps_the_scripts_status_and_names_enospc(tmp_path: Path, small_disk: Path):
    """Before: exit 2, after Kineto's raw "Failed to write to log file!" line and a line blaming
    "No such file or directory"."""
    _fill(small_disk)
    proc = _run_exit_3(tmp_path, small_disk / "out")
    assert proc.returncode == 3, proc.stderr
    line = _one_line(proc)
    assert line.startswith("stallscope: the script ended with status 3")
    assert "could not write the trace of the 5 recorded step(s)" in line
    assert "No space left on device (ENOSPC)" in line
    assert "Failed to write to log file" not in proc.stderr
    assert "No such file" not in proc.stderr


@pytest.mark.slow
def test_a_disk_that_fills_before_the_report_keeps_the_trace_and_says_so(tmp_path: Path,
                                                                          small_disk: Path):
    """The trace is written at the end of the recorded steps; the script's checkpoint then
    fills the disk. Before: exit 2, and no word that the trace was kept."""
    out = small_disk / "out"
    proc = _run_exit_3(tmp_path, out, str(small_disk))
    assert proc.returncode == 3, proc.stderr
    line = _one_line(proc)
    assert line.startswith("stallscope: the script ended with status 3; could not write its "
                           "output ("), line
    assert "No space left on device (ENOSPC)" in line
    trace_dir = out / "tensorboard" / "exit3"
    assert f"the trace is kept: {trace_dir}, analyse it again with `stallscope analyze " in line
    assert not (out / "report.json").exists()
    (small_disk / "checkpoint").unlink()  # space again: the kept trace is analysed whole
    again = subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(trace_dir), "-o",
                            str(tmp_path / "again")], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads((tmp_path / "again" / "report.json").read_text())
    assert report["summary"]["steps"] >= 4


class _KinetoOnAFullDisk:
    """A profiler whose export fails as Kineto's does on a full disk: its line on descriptor 2,
    no file."""

    def export_chrome_trace(self, path: str) -> None:
        os.write(2, b"ERROR:2026-11-26 20:17:13 24785:24785 output_json.cpp:977] Failed to "
                    b"write to log file!\n")


def test_a_trace_kineto_could_not_write_is_one_sentence_naming_enospc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]):
    """Where no small file system can be mounted: the write that finds the cause fails as a
    full disk's would (ENOSPC), in-process. Kineto's own line is kept off the terminal."""
    from stallscope.capture import export

    monkeypatch.setattr(export, "_write_error",
                        lambda _folder: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    failed = export.export_trace(_KinetoOnAFullDisk(), tmp_path / "tb", "host", 5)
    assert failed is not None
    assert failed.startswith(f"could not write the trace of the 5 recorded step(s) to "
                             f"{tmp_path / 'tb'}: No space left on device (ENOSPC); ")
    assert "Failed to write to log file" not in capfd.readouterr().err
    assert [p.name for p in (tmp_path / "tb").iterdir()] == []  # no partial file left


def test_an_os_error_names_its_errno():
    from stallscope.errors import os_error_text

    assert os_error_text(OSError(errno.ENOSPC, "No space left on device")) == (
        "No space left on device (ENOSPC)")
    assert os_error_text(OSError(errno.EDQUOT, "Disk quota exceeded")) == (
        "Disk quota exceeded (EDQUOT)")
    assert os_error_text(OSError("the profiler wrote 10 bytes and stopped")) == (
        "the profiler wrote 10 bytes and stopped")


# ------------------------------------------------------------------ signals while analysing


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "how"), [
    (signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_analysing_is_one_line_naming_the_trace_kept(
        tmp_path: Path, signum: int, status: int, how: str):
    """Sent once the progress line says the analysis began (the script has ended). Before:
    SIGTERM ended the process with status 143 and no word."""
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--no-steady-wait", "train.py",
         "none", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[stallscope] analysing "):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=300)
    err = "".join(seen) + err
    assert proc.returncode == status, err
    lines = [ln for ln in err.splitlines() if ln.startswith("stallscope:")]
    trace_dir = tmp_path / "out" / "tensorboard" / "train"
    assert lines == [f"stallscope: {how} while analysing the recorded steps; the trace is kept: "
                     f"{trace_dir}, analyse it again with `stallscope analyze {trace_dir} -o "
                     "FOLDER`"], err
    assert "Traceback" not in err
    assert len(list(trace_dir.glob("*.pt.trace.json.gz"))) == 1
