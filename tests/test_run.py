"""`stallscope run` end to end, through real subprocesses, as a user would call it.

Each test runs a small CPU training script. The script must see what plain python shows it,
keep its exit status, and leave its trace and a (partial) report behind.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.cli import build_parser
from stallscope.commands.common import split_run_argv

from .conftest import ROOT

EXAMPLES = ROOT / "examples"
CONSOLE = Path(sys.executable).parent / "stallscope"
ENTRY_POINTS = {
    "console-script": [str(CONSOLE)],
    "python -m": [sys.executable, "-m", "stallscope"],
}

# Prints what a script can see of how it was started, then trains a few steps so that
# stallscope has something to record.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    print("PROBE " + json.dumps({"argv": sys.argv, "name": __name__, "cwd": os.getcwd(),
                                 "path0": sys.path[0], "file": __file__}), flush=True)
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    """
)

# A training loop that fails on request at iteration `at`: raise, sys.exit(3), a Ctrl-C, or
# never.
FAILING = textwrap.dedent(
    """
    import os, signal, sys, torch
    from torch.utils.data import DataLoader, TensorDataset
    mode, at = sys.argv[1], int(sys.argv[2])
    loader = DataLoader(TensorDataset(torch.randn(4000, 8), torch.randn(4000, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader):
        if i == at and mode == "raise":
            raise RuntimeError(f"boom at iteration {i}")
        if i == at and mode == "colour":  # a message coloured for the terminal, and a title
            raise RuntimeError(f"\\x1b[1;31mboom\\x1b[0m at \\x1b]0;pwned\\x07iteration {i}")
        if i == at and mode == "exit":
            sys.exit(3)
        if i == at and mode == "interrupt":
            # A job started in the background (`.ci/run &`) inherits SIGINT ignored, and python
            # then leaves it ignored: a terminal's Ctrl-C reaches a foreground process.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C delivers
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print("SCRIPT FINISHED")
    """
)


def stallscope(*args: str, cwd: Path, entry: str = "python -m", timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
    if entry == "console-script" and not CONSOLE.exists():
        pytest.skip(f"console script not installed beside {sys.executable}")
    return subprocess.run([*ENTRY_POINTS[entry], *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def probe_output(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def report_of(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_script_sees_what_plain_python_shows(tmp_path: Path, entry: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    script_args = ["a", "--flag", "--", "-o", "x y"]
    plain = subprocess.run([sys.executable, "sub/probe.py", *script_args], cwd=tmp_path,
                           capture_output=True, text=True, check=True)
    # stallscope's own options come first; everything after the script belongs to the script,
    # even tokens that look like stallscope options.
    proc = stallscope("run", "-q", "--skip", "1", "--steps", "2", "sub/probe.py", *script_args,
                      cwd=tmp_path, entry=entry)
    assert proc.returncode == 0, proc.stderr
    assert probe_output(proc.stdout) == probe_output(plain.stdout)
    assert probe_output(proc.stdout)["name"] == "__main__"
    assert (tmp_path / "stallscope-probe" / "report.json").is_file()


@pytest.mark.slow
def test_module_with_arguments_like_python_m(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(PROBE)
    plain = subprocess.run([sys.executable, "-m", "pkg.train", "x", "--y", "3"], cwd=tmp_path,
                           capture_output=True, text=True, check=True)
    proc = stallscope("run", "--steps", "2", "-o", "out", "-m", "pkg.train", "x", "--y", "3",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert probe_output(proc.stdout) == probe_output(plain.stdout)
    run = report_of(tmp_path / "out")["run"]
    assert run["command"].endswith("run --steps 2 -o out -m pkg.train x --y 3")
    assert run["steps_recorded"] == 2 and run["ended"] == "stopped"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nonexistent.py"], "no such script: nonexistent.py"),
        (["-m", "no_such_module_xyz"], "no module named no_such_module_xyz"),
        (["--steps", "0", "train.py"], "must be at least 1"),
    ],
)
def test_bad_target_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str
                                           ) -> None:
    proc = stallscope("run", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in one_line_error(proc)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_exception_keeps_status_1_and_a_partial_report(tmp_path: Path, entry: str) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    # skip 2 + warmup 1, then iteration 6 raises inside the third recorded step.
    proc = stallscope("run", "--no-steady-wait", "train.py", "raise", "6", cwd=tmp_path,
                      entry=entry)
    assert proc.returncode == 1
    assert "RuntimeError: boom at iteration 6" in proc.stderr  # the user's own traceback
    assert 'File "' + str(tmp_path / "train.py") + '", line' in proc.stderr
    assert "stallscope/capture" not in proc.stderr  # and not ours
    out = tmp_path / "stallscope-train"
    report = report_of(out)
    assert report["run"]["exit_status"] == 1 and report["run"]["ended"] == "exception"
    assert report["run"]["partial"] is True
    assert report["run"]["steps_recorded"] == 2 == report["summary"]["steps"]
    assert any("cut short" in n for n in report["notes"])
    assert "Partial run" in (out / "report.html").read_text()
    assert len(list((out / "tensorboard" / "train").glob("*.pt.trace.json.gz"))) == 1


@pytest.mark.slow
def test_colour_codes_in_the_scripts_exception_are_not_repeated(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "--no-steady-wait", "train.py", "colour", "6", cwd=tmp_path)
    assert proc.returncode == 1
    # stallscope's own line and the report say the message without the escape sequences: no
    # ESC byte, and no "[31m" left behind by dropping only that byte. (The traceback above it
    # is the script's, printed as python prints it.)
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("stallscope:")]
    assert "(RuntimeError: boom at iteration 6)" in line
    report = report_of(tmp_path / "stallscope-train")
    assert "The script raised RuntimeError: boom at iteration 6" in report["notes"]
    md = (tmp_path / "stallscope-train" / "report.md").read_text()
    for text in (line, json.dumps(report), md):
        assert "\x1b" not in text and "\\u001b" not in text
        assert "[1;31m" not in text and "[0m" not in text and "pwned" not in text


@pytest.mark.slow
def test_sys_exit_3_keeps_status_3(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "--no-steady-wait", "train.py", "exit", "7", cwd=tmp_path)
    assert proc.returncode == 3
    assert "ended with status 3" in proc.stderr
    run = report_of(tmp_path / "stallscope-train")["run"]
    assert (run["exit_status"], run["ended"], run["partial"]) == (3, "exit", True)
    assert run["steps_recorded"] == 3


@pytest.mark.slow
def test_ctrl_c_keeps_status_130_and_a_partial_report(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "--no-steady-wait", "train.py", "interrupt", "6", cwd=tmp_path)
    assert proc.returncode == 130
    run = report_of(tmp_path / "stallscope-train")["run"]
    assert (run["exit_status"], run["ended"], run["partial"]) == (130, "interrupted", True)


@pytest.mark.slow
def test_stops_the_script_once_steps_are_recorded(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "train.py", "never", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "SCRIPT FINISHED" not in proc.stdout  # 500 iterations were not all run
    run = report_of(tmp_path / "stallscope-train")["run"]
    assert (run["ended"], run["partial"], run["steps_recorded"]) == ("stopped", False, 5)
    assert "tensorboard --logdir" in proc.stdout and "ui.perfetto.dev" in proc.stdout


@pytest.mark.slow
def test_run_to_end_lets_the_script_finish(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING.replace("4000", "400"))
    proc = stallscope("run", "--run-to-end", "train.py", "never", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "SCRIPT FINISHED" in proc.stdout
    run = report_of(tmp_path / "stallscope-train")["run"]
    assert (run["ended"], run["partial"], run["steps_recorded"]) == ("finished", False, 5)


@pytest.mark.slow
def test_no_step_seen_says_why_and_exits_4(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nprint(torch.ones(3).sum().item())\n")
    proc = stallscope("run", "train.py", cwd=tmp_path)
    assert proc.returncode == 4
    line = one_line_error(proc)
    assert "no step recorded" in line and "optimizer.step()" in line
    assert not (tmp_path / "stallscope-train" / "report.json").exists()


@pytest.mark.slow
def test_steps_from_dataloader_batches_without_torch_optim(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        w = torch.zeros(8, 1, requires_grad=True)
        loader = DataLoader(TensorDataset(torch.randn(800, 8), torch.randn(800, 1)), batch_size=4)
        for x, y in loader:  # hand-written SGD: no torch.optim
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad.zero_()
        """
    ))
    for mode in ("auto", "dataloader"):
        out = tmp_path / mode
        proc = stallscope("run", "-q", "--step-on", mode, "-o", str(out), "train.py",
                          cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        run = report_of(out)["run"]
        assert (run["step_source"], run["steps_recorded"]) == ("dataloader", 5)
    proc = stallscope("run", "--step-on", "optimizer", "-o", "opt", "train.py", cwd=tmp_path)
    assert proc.returncode == 4
    assert "--step-on dataloader" in one_line_error(proc)


def _call_site(script: Path) -> str:
    lines = script.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "DataLoader(" in text and "=" in text)
    return f"examples/{script.name}:{line}"


@pytest.mark.slow
def test_loader_bound_example_names_its_dataloader(tmp_path: Path) -> None:
    proc = stallscope("run", "-o", str(tmp_path / "out"), "examples/loader_bound.py", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = report_of(tmp_path / "out")
    top = report["findings"][0]
    # high on a quiet machine; under other load the step without the profiler (the plan's
    # baseline) is measured loaded too, and the saving's share can fall to medium
    assert top["id"] == "dataloader-bound" and top["severity"] in ("high", "medium")
    site = _call_site(EXAMPLES / "loader_bound.py")
    assert top["recommendation"].startswith(f"{site} DataLoader(num_workers=0, pin_memory=False)")
    cores = report["environment"]["captured"]["cpu"]["cores_per_process"]
    workers = top["evidence"]["suggested_num_workers"]
    assert 1 <= workers <= cores  # from the measured ratio, capped at this process's cores
    assert f"num_workers={workers}, persistent_workers=True" in top["snippet"]
    [loader] = report["dataloaders"]
    assert loader["call_site"] == site
    assert (loader["num_workers"], loader["pin_memory"], loader["batch_size"]) == (0, False, 32)
    assert loader["dataset"] == "SyntheticImages (1024 items)"
    assert loader["batches_recorded"] == 5
    # What the replay needs and the profiler cannot show: each fetch's cost, measured in-process
    # (this loader computes, so its thread's CPU time is measured and never exceeds the wall
    # time; how much of the wall it is depends on what else takes the cores), 32 images.
    assert loader["fetch_wall_us"] > 0
    assert 0 < loader["fetch_cpu_us"] <= 1.05 * loader["fetch_wall_us"]
    assert loader["fetch_bytes"] == 5 * (32 * 3 * 64 * 64 * 4 + 32 * 8)
    # ...and the trace itself carries it, so `analyze` of the trace alone knows it too.
    (trace,) = (tmp_path / "out" / "tensorboard").rglob("*.pt.trace.json.gz")
    meta = json.loads(gzip.decompress(trace.read_bytes()))["stallscope"]
    assert meta["host"]["cores_per_process"] == cores
    assert meta["host"]["recorded_cpu_us"] > 0
    assert meta["loaders"][0]["fetch_wall_us"] == pytest.approx(loader["fetch_wall_us"], abs=1)
    # The plan replays the suggested workers on the recorded cores; where the workers take the
    # step's cores and the one-thread steps were timed, with one intra-op thread as one change.
    # Under other load the one-thread steps may not fit the recorded ones: the workers are
    # then replayed alone, and the prediction says the threads were left out and why.
    one = top["evidence"].get("suggested_torch_threads") == 1
    first = report["plan"]["entries"][0]
    if one and first["change"] == f"num_workers={workers}":
        assert any(a.startswith("torch_threads=1 is not replayed") for a in first["assumptions"])
    else:
        assert first["change"] == (
            f"torch_threads=1 + num_workers={workers}" if one else f"num_workers={workers}")
    said = f"{cores} core{'' if cores == 1 else 's'}"
    assert any(said in a for a in report["plan"]["entries"][0]["assumptions"])


@pytest.mark.slow
def test_balanced_example_is_not_dataloader_bound(tmp_path: Path) -> None:
    proc = stallscope("run", "-o", str(tmp_path / "out"), "examples/balanced.py", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = report_of(tmp_path / "out")
    assert "dataloader-bound" not in [f["id"] for f in report["findings"]]
    [check] = [a for a in report["assessments"] if a["rule"] == "dataloader-bound"]
    assert check["status"] == "clear"


@pytest.mark.slow
def test_worker_processes_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = stallscope("run", "-o", str(out), "examples/loader_bound.py", "--num-workers", "2",
                      "--samples", "512", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files[:3] == ["report.html", "report.json", "report.md"]
    # Beside the reports: the main process's trace (the profiler plugin's copy, and the recorded
    # original beside it: report/tensorboard_trace.py) and stallscope's TensorBoard views.
    rest = [f.removeprefix("tensorboard/loader_bound/") for f in files[3:]]
    assert len(rest) == 3 and all(f.startswith("tensorboard/loader_bound/") for f in files[3:])
    assert rest[0].startswith("events.out.tfevents.") and rest[1].endswith(".original.json.gz")
    assert rest[2] == rest[1].removesuffix(".original.json.gz") + ".pt.trace.json.gz"
    assert report_of(out)["dataloaders"][0]["num_workers"] == 2


# Persistent workers, each leaving a file when it exits normally (a multiprocessing finalizer
# runs at a worker's normal exit, not when torch terminates a worker that did not stop).
PERSISTENT = textwrap.dedent(
    """
    import sys, time
    from multiprocessing.util import Finalize
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    class Data(Dataset):
        def __len__(self):
            return 512

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.full((4,), float(i))

    def init(worker_id):
        done = Path(sys.argv[1]) / f"worker-{worker_id}-exited"
        Finalize(None, done.touch, exitpriority=0)

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Data(), batch_size=8, num_workers=3, persistent_workers=True,
                        worker_init_fn=init)
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    """
)


@pytest.mark.slow
def test_persistent_workers_of_a_stopped_script_are_stopped_not_killed(tmp_path: Path) -> None:
    """A script stopped mid-loop keeps its iterator in a reference cycle; the workers must be
    told to stop (as when a loop ends), not left to torch's 5 s join timeout and SIGTERM."""
    (tmp_path / "train.py").write_text(PERSISTENT)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = stallscope("run", "-q", "-o", "out", "train.py", str(marks), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_of(tmp_path / "out")["run"]["ended"] == "stopped"
    assert sorted(p.name for p in marks.iterdir()) == [f"worker-{i}-exited" for i in range(3)]


@pytest.mark.slow
def test_refuses_to_overwrite_a_report_without_force(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    assert stallscope("run", "-q", "train.py", "never", "0", cwd=tmp_path).returncode == 0
    again = stallscope("run", "train.py", "never", "0", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in one_line_error(again)
    forced = stallscope("run", "-q", "--force", "train.py", "never", "0", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    # The earlier run's trace is replaced, not analysed alongside the new one.
    run_dir = tmp_path / "stallscope-train/tensorboard/train"
    assert len(list(run_dir.glob("*.pt.trace.json*"))) == 1
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # views replaced too
    # and the recorded original kept beside the TensorBoard plugin's copy: one, this run's
    assert len(list(run_dir.glob("*.original.json*"))) == 1
    assert len(list(run_dir.iterdir())) == 3


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed beside this python")
def test_torchrun_two_gloo_ranks_give_two_traces_and_one_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2",
         "-m", "stallscope", "run", "-o", str(out), str(EXAMPLES / "ddp_gloo.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    traces = sorted((out / "tensorboard" / "ddp_gloo").glob("*.pt.trace.json.gz"))
    assert [t.name.split(".")[0].rsplit("_", 1)[1] for t in traces] == ["rank-0", "rank-1"]
    reports = list(out.rglob("report.json"))
    assert reports == [out / "report.json"]
    report = report_of(out)
    assert [t["rank"] for t in report["traces"]] == [0, 1]
    # 5 steps each, judged or set aside with a reason (a first step carrying DDP's start-up)
    assert all(t["summary"]["steps"] + len(t["set_aside_steps"]) == 5 for t in report["traces"])
    assert [r["rank"] for r in report["run"]["ranks"]] == [0, 1]
    assert report["run"]["command"].startswith("torchrun --nproc-per-node 2 -m stallscope run")
    assert "Per trace" in (out / "report.html").read_text()


@pytest.mark.parametrize(
    ("argv", "own", "script"),
    [
        (["train.py", "--epochs", "3"], ["train.py"], ["--epochs", "3"]),
        (["-o", "x", "--steps", "3", "train.py", "-o", "y"], ["-o", "x", "--steps", "3",
                                                             "train.py"], ["-o", "y"]),
        (["--out=x", "train.py", "--", "a"], ["--out=x", "train.py"], ["--", "a"]),
        (["-q", "--", "train.py", "--"], ["-q", "train.py"], ["--"]),
        (["-m", "pkg.train", "--lr", "1"], ["-m", "pkg.train"], ["--lr", "1"]),
        (["-mpkg.train", "a"], ["-m", "pkg.train"], ["a"]),
    ],
)
def test_run_arguments_after_the_target_belong_to_the_script(
    argv: list[str], own: list[str], script: list[str]
) -> None:
    parser = build_parser()
    assert parser.run_parser is not None
    assert split_run_argv(argv, parser.run_parser) == (own, script)
