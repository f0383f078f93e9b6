"""`stallscope run` on scripts that fail in the ways tests/test_run.py does not cover: a
DataLoader worker dying, a script that hangs (`--timeout`), workers started with fork and with
spawn. Through real subprocesses, as a user would run them.

Every failure must keep a documented exit status, leave the trace of the steps recorded so far
and a report marked partial that says why, print one `stallscope:` line (and the script's own
traceback where python would print one, never stallscope's), and leave no worker running.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import stallscope
from stallscope.capture.runner import failure_cause

PACKAGE = str(Path(stallscope.__file__).resolve().parent)

# A training loop over a map-style dataset. argv: MODE AT WORKERS CONTEXT PIDS.
# MODE says what goes wrong at batch AT: a worker kills itself (worker-kill), exits
# (worker-exit) or hangs (worker-hang); the main thread sleeps (sleep), sleeps and swallows
# every exception (swallow), or deadlocks in C with the GIL released (mutex); or nothing (none).
# CONTEXT: fork or spawn (DataLoader(multiprocessing_context=...)), global (set_start_method
# spawn), default. Every process that fetches a sample leaves its pid in the folder PIDS.
SCRIPT = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    MODE, AT, WORKERS, CONTEXT, PIDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        sys.argv[4], sys.argv[5]


    class Samples(Dataset):
        def __len__(self):
            return 8000

        def __getitem__(self, i):
            open(os.path.join(PIDS, str(os.getpid())), "a").close()
            if i == AT * 8 and torch.utils.data.get_worker_info() is not None:
                if MODE == "worker-kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if MODE == "worker-exit":
                    os._exit(1)
                if MODE == "worker-hang":
                    time.sleep(1000)
            return torch.randn(8), torch.randn(1)


    def deadlock():
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # waits forever, in C, without the GIL


    def main():
        kwargs = {}
        if CONTEXT == "global":
            torch.multiprocessing.set_start_method("spawn")
        elif CONTEXT != "default":
            kwargs["multiprocessing_context"] = CONTEXT
        loader = DataLoader(Samples(), batch_size=8, num_workers=WORKERS, **kwargs)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x, y) in enumerate(loader):
            if i == AT and MODE == "sleep":
                time.sleep(1000)  # HANGS HERE
            if i == AT and MODE == "swallow":
                while True:
                    try:
                        time.sleep(1000)
                    except BaseException:
                        pass
            if i == AT and MODE == "mutex":
                deadlock()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        print("SCRIPT FINISHED")


    if __name__ == "__main__":
        main()
    """
)


def run(tmp_path: Path, *options: str, mode: str, at: int = 12, workers: int = 2,
        context: str = "default", module: bool = False
        ) -> tuple[subprocess.CompletedProcess[str], float]:
    """`stallscope run OPTIONS train.py MODE ...` in tmp_path; the process and its wall time."""
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    if module:
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / "__init__.py").write_text("")
        (tmp_path / "pkg" / "train.py").write_text(SCRIPT)
        target = ["-m", "pkg.train"]
    else:
        (tmp_path / "train.py").write_text(SCRIPT)
        target = ["train.py"]
    t0 = time.monotonic()
    proc = subprocess.run(
        # The failures happen at known iterations: record right after --skip, as the
        # iteration numbers assume (the steady wait is tested in test_steady.py).
        [sys.executable, "-m", "stallscope", "run", "-o", "out", "--no-steady-wait", *options,
         *target,
         mode, str(at), str(workers), context, str(pids)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    return proc, time.monotonic() - t0


def stallscope_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one `stallscope:` line; and no frame of stallscope's in whatever traceback there is."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert len(lines) == 1, proc.stderr
    assert PACKAGE not in proc.stderr.replace(lines[0], ""), proc.stderr
    return lines[0]


def report_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "report.json").read_text())


def traces(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out" / "tensorboard" / "train").glob("*.pt.trace.json.gz"))


def output_files(tmp_path: Path) -> list[str]:
    """What was written under OUT, with the trace's and event file's varying names masked."""
    out = tmp_path / "out"
    names = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = str(path.relative_to(out))
        if name.endswith(".pt.trace.json.gz"):
            name = "TRACE"
        elif name.endswith(".original.json.gz"):  # kept beside the TensorBoard plugin's copy
            name = "ORIGINAL TRACE"
        elif "events.out.tfevents." in name:
            name = "EVENTS"
        names.append(name)
    return sorted(names)


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie has ended), read from /proc: no psutil."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_no_process_left(tmp_path: Path) -> None:
    """Every process that fetched a sample (stallscope itself, its DataLoader workers) ended."""
    pids = [int(p.name) for p in (tmp_path / "pids").iterdir()]
    assert pids
    deadline = time.monotonic() + 5  # a SIGKILLed worker needs a moment to be gone
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if running(p)]


def assert_partial_report(tmp_path: Path, status: int, ended: str) -> dict:
    report = report_of(tmp_path)
    run_ = report["run"]
    assert (run_["exit_status"], run_["ended"], run_["partial"]) == (status, ended, True)
    # Every recorded step is judged, or set aside with its reason (a one-off first step).
    aside = sum(len(t.get("set_aside_steps") or []) for t in report["traces"])
    assert run_["steps_recorded"] >= 1
    assert report["summary"]["steps"] + aside == run_["steps_recorded"]
    assert "Partial run" in (tmp_path / "out" / "report.html").read_text()
    assert "Partial run" in (tmp_path / "out" / "report.md").read_text()
    assert len(traces(tmp_path)) == 1
    return report


# ------------------------------------------------------------------ a DataLoader worker dies


@pytest.mark.parametrize(
    ("context", "mode", "cause"),
    # torch words a worker's exit "(pid N) exited unexpectedly with exit code 1" or, when its
    # queue timeout notices first, "(pid(s) N) exited unexpectedly": a race inside torch, where
    # stallscope adds the exit status (a SIGKILL then read "exited unexpectedly" in CI).
    [
        ("fork", "worker-kill", "killed by signal: Killed"),
        ("fork", "worker-exit", "exited unexpectedly"),
        ("spawn", "worker-kill", "killed by signal: Killed"),
        ("global", "worker-exit", "exited unexpectedly"),
    ],
)
@pytest.mark.slow
def test_a_dying_worker_keeps_status_1_a_partial_report_and_names_the_cause(
    tmp_path: Path, context: str, mode: str, cause: str
) -> None:
    # The worker dies at batch 30: well after recording begins (--skip 2, the steady wait of a
    # few steps, the one-thread probe's 5 and a warm-up); at batch 12 it once died before.
    proc, _ = run(tmp_path, "--steps", "50", mode=mode, context=context, at=30)
    assert proc.returncode == 1, proc.stderr
    line = stallscope_line(proc)
    # Mostly torch's RuntimeError; sometimes the death breaks the batch being received first
    # (ConnectionResetError), and torch's account of the dead worker is added.
    assert "ended with status 1 (" in line and "DataLoader worker (pid" in line and cause in line
    assert "the report covers" in line
    # The script's own traceback, as python prints it: torch's error, the script's loop line.
    assert f'File "{tmp_path / "train.py"}", line' in proc.stderr
    report = assert_partial_report(tmp_path, 1, "exception")
    assert any(n.startswith("A DataLoader worker process died mid-run") and cause in n
               for n in report["notes"])
    assert "SCRIPT FINISHED" not in proc.stdout
    # The workers wrote nothing: the report, one trace, stallscope's TensorBoard views.
    assert output_files(tmp_path) == ["EVENTS", "ORIGINAL TRACE", "TRACE", "report.html",
                                      "report.json",
                                      "report.md"]
    assert_no_process_left(tmp_path)


def _dead_child(how: str) -> multiprocessing.Process:
    """A real child process, ended by SIGKILL or by exit code 3."""
    child = multiprocessing.get_context("fork").Process(
        target=time.sleep if how == "kill" else sys.exit, args=(30 if how == "kill" else 3,))
    child.start()
    if how == "kill":
        os.kill(child.pid, signal.SIGKILL)
    return child


@pytest.mark.parametrize("reaped", [False, True], ids=["unreaped", "reaped-by-is_alive"])
def test_torchs_vaguer_wording_of_a_worker_death_gets_its_exit_status(reaped: bool) -> None:
    """When torch's queue timeout notices a dead worker before its SIGCHLD handler, it says only
    "exited unexpectedly"; stallscope adds how the worker ended (here a real SIGKILL), whether
    or not the worker's Process has reaped it yet, and so names the OOM killer's signal."""
    killed, exited = _dead_child("kill"), _dead_child("exit")
    if reaped:
        killed.join(10), exited.join(10)
    else:
        for child in (killed, exited):
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    error = RuntimeError(f"DataLoader worker (pid(s) {killed.pid}, {exited.pid}) exited "
                         "unexpectedly")
    cause, note = failure_cause(error)
    assert cause.startswith("RuntimeError: DataLoader worker (pid(s)")
    assert f"pid {killed.pid} was killed by signal: Killed" in cause
    assert f"pid {exited.pid} exited with exit code 3" in cause
    assert "out-of-memory killer" in note
    # torch's precise wording is kept as it is.
    precise = RuntimeError(f"DataLoader worker (pid {killed.pid}) is killed by signal: Killed.")
    assert failure_cause(precise)[0] == f"RuntimeError: {precise}"
    killed.join(10), exited.join(10)


# ------------------------------------------------------------------ fork and spawn workers


@pytest.mark.slow
@pytest.mark.parametrize(
    ("context", "module"),
    [("fork", False), ("spawn", False), ("global", False), ("spawn", True)],
    ids=["fork", "spawn", "set_start_method-spawn", "spawn-python-m"],
)
def test_fork_and_spawn_workers_run_and_write_nothing(tmp_path: Path, context: str,
                                                      module: bool) -> None:
    proc, _ = run(tmp_path, "-q", mode="none", context=context, module=module)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("stallscope:") == 0
    report = report_of(tmp_path)
    assert (report["run"]["ended"], report["run"]["steps_recorded"]) == ("stopped", 5)
    assert report["dataloaders"][0]["num_workers"] == 2
    # Spawned workers import the script again (as __mp_main__): they must find it, and write
    # nothing of stallscope's.
    assert output_files(tmp_path) == ["EVENTS", "ORIGINAL TRACE", "TRACE", "report.html",
                                      "report.json",
                                      "report.md"]
    assert len(list((tmp_path / "pids").iterdir())) >= 2  # the workers did fetch
    assert_no_process_left(tmp_path)


# ------------------------------------------------------------------ --timeout


# The script must reach its hang before the timeout: python, torch and the profiler start in
# 2-3 s on a quiet 2-core machine but took over 4 s with other work on both cores, when the
# timeout then landed before the hang (at another line) and the test failed.
HANG_S = "10"


def _hang_line() -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if "HANGS HERE" in text)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "workers"), [("sleep", 0), ("worker-hang", 2)])
def test_timeout_stops_a_hung_script_with_124_and_a_partial_report(
    tmp_path: Path, mode: str, workers: int
) -> None:
    # Hangs at batch 30, after recording began (see the dying worker's test).
    proc, wall = run(tmp_path, "--steps", "50", "--timeout", HANG_S, mode=mode, workers=workers,
                     at=30)
    assert proc.returncode == 124, proc.stderr
    line = stallscope_line(proc)
    assert "Traceback" not in proc.stderr  # python prints none for a timeout
    assert f"still running at --timeout {HANG_S} s (at train.py:" in line
    if mode == "sleep":
        assert f"(at train.py:{_hang_line()})" in line  # the line it hung on
    else:  # waiting for the batch the hung worker never sends
        assert "in torch.utils.data.dataloader.__next__" in line
    report = assert_partial_report(tmp_path, 124, "timed out")
    assert any(f"--timeout {HANG_S} s" in n for n in report["notes"])
    assert any("was cut short" in n for n in report["notes"])  # as after Ctrl-C
    assert wall < 60
    assert_no_process_left(tmp_path)


@pytest.mark.slow
def test_timeout_ends_a_script_that_catches_the_stop_and_keeps_its_steps(tmp_path: Path
                                                                         ) -> None:
    proc, _ = run(tmp_path, "--steps", "50", "--timeout", HANG_S, mode="swallow", at=30)
    assert proc.returncode == 124, proc.stderr
    line = stallscope_line(proc)
    assert "did not stop within" in line and " s more (" in line and "the report covers" in line
    report = assert_partial_report(tmp_path, 124, "timed out")
    assert any("caught the stop exception and ran on" in n for n in report["notes"])
    assert_no_process_left(tmp_path)  # its two workers were idle, waiting: killed


@pytest.mark.slow
def test_timeout_ends_a_script_stuck_in_c_code_without_a_report(tmp_path: Path) -> None:
    proc, wall = run(tmp_path, "--steps", "50", "--timeout", HANG_S, mode="mutex")
    assert proc.returncode == 124, proc.stderr
    line = stallscope_line(proc)
    # No exception can land there and the profiler can only be stopped from that thread: the
    # steps it holds cannot be written, and the line says so rather than hang.
    assert line.startswith("stallscope: no step recorded: the script was still running at "
                           f"--timeout {HANG_S} s (at train.py:")
    assert "(it waits in C code that no exception can interrupt)" in line
    assert "were still in the profiler's memory and are lost" in line
    assert not (tmp_path / "out" / "report.json").exists() and traces(tmp_path) == []
    assert wall < 60
    assert_no_process_left(tmp_path)


@pytest.mark.slow
def test_a_timeout_not_reached_changes_nothing(tmp_path: Path) -> None:
    proc, _ = run(tmp_path, "-q", "--timeout", "120", mode="none", workers=0)
    assert proc.returncode == 0, proc.stderr
    assert (report_of(tmp_path)["run"]["ended"], report_of(tmp_path)["run"]["partial"]) == (
        "stopped", False)


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_bad_timeout_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    proc, _ = run(tmp_path, "--timeout", value, mode="none")
    assert proc.returncode == 2
    assert "--timeout" in stallscope_line(proc)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tune_timeout_stops_a_hung_baseline(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "pids").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "tune", "-o", "tune", "--timeout", "3", "train.py",
         "sleep", "4", "0", "default", str(tmp_path / "pids")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 124, proc.stderr
    line = stallscope_line(proc)
    assert "the baseline run failed" in line and "--timeout 3 s" in line


def test_a_worker_death_signalled_after_the_script_ended_never_raises_in_stallscope(
        tmp_path: Path) -> None:
    """Torch's SIGCHLD handler raises `DataLoader worker (pid(s) N) exited unexpectedly` in the
    main thread; once the script has ended (here: failed on a first death), a second signal
    must land nowhere. `_run` mutes the handler before it returns: a SIGCHLD after it is
    ignored, and the script's own failure is what it reports (CI once saw the late one escape
    as an internal error)."""
    from stallscope.capture.runner import _handler, _run
    from stallscope.capture.target import Target

    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent("""
        import signal
        def _worker_died(signum, frame):
            raise RuntimeError("DataLoader worker (pid(s) 1) exited unexpectedly")
        signal.signal(signal.SIGCHLD, _worker_died)
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly with exit code 1")
    """))
    before = _handler(signal.SIGCHLD)
    try:
        ended, status, error = _run(Target(str(script), (), False), before)
        assert (ended, status) == ("exception", 1) and "exited unexpectedly" in str(error)
        os.kill(os.getpid(), signal.SIGCHLD)  # a second worker's death, after the script
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGCHLD, before or signal.SIG_DFL)
