"""`stallscope run` under the faults a training job really has (issue 36): a script that forks
children, a disk that fills while stallscope writes, SIGTERM while it analyses.

Through real subprocesses, as a user would meet them: the parent's report intact, the child
ended as under plain python with nothing of stallscope's printed or written, the script's exit
status kept, one `stallscope:` line for stallscope's own failure.
"""

from __future__ import annotations

import json
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
    import multiprocessing, os, sys
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
