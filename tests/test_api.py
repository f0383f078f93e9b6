"""The Python API as a caller uses it: `stallscope.analyze`, `with stallscope.profile()`,
`stallscope.step()`, the `Report`, its errors, and the report shown inline in Jupyter."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

import stallscope
from tests.conftest import ROOT, SAMPLES, run_cli, write_trace

LOADER_BOUND = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
REPORT_FILES = {"report.json", "report.html", "report.md"}


def _train(steps: int, mark: bool = False) -> int:
    """A small CPU training loop with a DataLoader built here and torch.optim; the number of
    iterations it ran."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 1)),
                        batch_size=8)
    ran = 0
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ran += 1
        if mark:
            stallscope.step()
    return ran


def _profiled_loop(prof_steps: int):  # -> torch.profiler.profile
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    w = torch.randn(64, 64)
    x = torch.randn(32, 64)
    # With a schedule the profiler marks each step (ProfilerStep#N); one cycle, kept after it.
    plan = schedule(wait=0, warmup=1, active=prof_steps - 1, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
        for _ in range(prof_steps):
            x = torch.tanh(x @ w)
            prof.step()
    return prof


# ---------------------------------------------------------------------------- analyze


def test_analyze_a_trace_path_gives_the_report_the_cli_writes(tmp_path: Path) -> None:
    report = stallscope.analyze(str(LOADER_BOUND))
    proc = run_cli("analyze", str(LOADER_BOUND), "-q", "-o", str(tmp_path / "cli"))
    assert proc.returncode == 0, proc.stderr
    assert report.to_json() == (tmp_path / "cli" / "report.json").read_text()
    assert report.verdict.startswith("Training waits on the DataLoader")
    assert report.verdict_id == "dataloader-bound"
    top = report.findings[0]
    assert (top.id, top.severity) == ("dataloader-bound", "high")
    assert top.evidence and "worker" in top.recommendation and "num_workers" in top.snippet
    assert isinstance(report, stallscope.Report)


def test_analyze_with_out_dir_writes_the_three_files(tmp_path: Path) -> None:
    report = stallscope.analyze(LOADER_BOUND, out_dir=tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == REPORT_FILES
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"**Verdict:** {report.verdict.split(':')[0]}" in md
    # save() replaces a report already there (a notebook cell run twice)
    assert report.save(tmp_path / "out") == (tmp_path / "out").resolve()
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == report.to_dict()


def test_analyze_a_finished_profile_object(tmp_path: Path) -> None:
    prof = _profiled_loop(5)
    report = stallscope.analyze(prof)
    assert report.summary["steps"] + len(report.to_dict()["traces"][0]["set_aside_steps"]) == 4
    assert report.to_dict()["traces"][0]["steps_source"] == "ProfilerStep"
    exported = Path(report.to_dict()["source"]["files"][0])
    assert not exported.exists()  # the temporary trace is gone
    kept = stallscope.analyze(prof, out_dir=tmp_path / "out")  # the same profile again
    assert kept.to_json() == (tmp_path / "out" / "report.json").read_text()
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert files == REPORT_FILES | {"profile.pt.trace.json.gz"}


def test_a_profile_analysed_in_its_process_sizes_workers_to_its_cores(tmp_path: Path) -> None:
    """A loader that costs 30x the step, profiled by the caller's own torch.profiler: its
    advice is capped at the cores this process may use, as `run` caps it, not 30 workers."""
    import os
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> torch.Tensor:
            end = time.process_time() + 0.0015  # CPU, not waiting: capped at the cores
            while time.process_time() < end:
                pass
            return torch.ones(8)

    w = torch.randn(8, 8)
    plan = schedule(wait=0, warmup=1, active=5, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
        for i, x in enumerate(DataLoader(Slow(), batch_size=8)):
            (x @ w).sum()
            prof.step()
            if i == 5:
                break
    found = {f.id: f for f in stallscope.analyze(prof).findings}
    evidence = found["dataloader-bound"].evidence
    cores = len(os.sched_getaffinity(0))
    assert evidence["cores_per_process"] == cores
    assert evidence["ideal_num_workers"] > cores >= evidence["suggested_num_workers"]


def _frames(exc: pytest.ExceptionInfo[BaseException]) -> list[str]:
    return [f.filename for f in traceback.extract_tb(exc.tb)]


@pytest.mark.parametrize("case", ["missing", "corrupt", "not-a-trace", "never-started",
                                  "recording", "wrong-type"])
def test_user_errors_raise_one_clear_exception(tmp_path: Path, case: str) -> None:
    import torch

    bad = tmp_path / "bad.pt.trace.json"
    if case == "missing":
        arg, words = tmp_path / "nope.json", "no such file"
    elif case == "corrupt":
        bad.write_bytes(b"\x1f\x8b\x08garbage")
        arg, words = bad, "damaged or truncated gzip"
    elif case == "not-a-trace":
        bad.write_text("{ not json")
        arg, words = bad, "not valid JSON"
    elif case == "never-started":
        arg, words = torch.profiler.profile(), "never started"
    elif case == "wrong-type":
        arg, words = 42, "cannot analyse a int"
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
                pytest.raises(stallscope.StallscopeError) as exc:
            stallscope.analyze(prof)
        assert "still recording" in str(exc.value)
        return
    with pytest.raises(stallscope.StallscopeError) as exc:
        stallscope.analyze(arg)
    assert words in str(exc.value)
    # The traceback ends where the caller called, not deep in the pipeline.
    ours = [f for f in _frames(exc) if "stallscope" in f and "tests" not in f]
    assert all(f.endswith(("api/analysis.py", "api/live.py")) for f in ours), ours


# ---------------------------------------------------------------------------- profile / step


def test_profile_records_a_loop_and_lets_it_run_on(tmp_path: Path) -> None:
    with stallscope.profile(steps=3, skip=1) as session:
        ran = _train(40)
    assert ran == 40  # never stopped: the loop ran every iteration after recording
    report = session.report
    assert report is not None and report.verdict
    assert isinstance(report.findings, list)
    run = report.to_dict()["run"]
    assert (run["step_source"], run["steps_recorded"], run["partial"]) == ("optimizer", 3, False)
    # the DataLoader built inside the block is named by its line, as under `stallscope run`
    (loader,) = report.to_dict()["dataloaders"]
    assert loader["call_site"].endswith(f"test_api.py:{_loader_line()}")
    assert session.traces and all(p.exists() for p in session.traces)
    out = report.save(tmp_path / "saved")
    assert {p.name for p in out.iterdir()} == REPORT_FILES
    assert not stallscope.marker.active()  # every hook is gone after the block


def _loader_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if "loader = DataLoader(" in text)


def test_profile_with_manual_steps_and_out_dir(tmp_path: Path) -> None:
    import torch

    w = torch.randn(64, 64)
    with stallscope.profile(steps=3, skip=1, out_dir=tmp_path / "out", steady=False) as session:
        x = torch.randn(32, 64)
        for _ in range(10):  # no optimizer, no DataLoader: only the markers say where steps end
            x = torch.tanh(x @ w)
            session.step()
    run = session.report.to_dict()["run"]
    assert (run["step_source"], run["steps_recorded"]) == ("marker", 3)
    assert {p.name for p in (tmp_path / "out").iterdir()} >= REPORT_FILES
    assert session.traces[0].parent == (tmp_path / "out" / "tensorboard" / "profile").resolve()


def test_profile_that_records_nothing_says_why(tmp_path: Path) -> None:
    with pytest.raises(stallscope.StallscopeError, match="call session.step()"), \
            stallscope.profile() as idle:
        sum(range(1000))
    assert idle.trace_dir is not None and not idle.trace_dir.parent.parent.exists()  # no litter
    with pytest.raises(stallscope.StallscopeError, match="before recording began"), \
            stallscope.profile(skip=2) as session:
        for _ in range(2):
            session.step()
    assert not stallscope.marker.active()


def test_profile_keeps_the_steps_recorded_before_the_block_raised() -> None:
    with pytest.raises(RuntimeError, match="boom"), \
            stallscope.profile(steps=5, skip=1, steady=False) as session:
        for i in range(20):
            if i == 5:  # markers 0-4: 1 skipped, 1 warm-up, 2 recorded, 1 cut short
                raise RuntimeError("boom")
            stallscope.step()
    run = session.report.to_dict()["run"]
    assert run["ended"] == "exception" and run["partial"] and run["steps_recorded"] == 2


def test_step_is_a_cheap_no_op_outside_stallscope() -> None:
    code = ("import sys, stallscope; assert stallscope.step() is None; "
            "print(sorted(m for m in ('torch', 'pandas', 'stallscope.api') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"  # importing stallscope for step() loads no torch, pandas
    assert stallscope.step() is None


MARKED = textwrap.dedent(
    """
    import torch, stallscope
    w = torch.randn(64, 64)
    x = torch.randn(32, 64)
    for i in range(200):  # no torch.optim, no DataLoader
        x = torch.tanh(x @ w)
        if MARK:
            stallscope.step()
    print("LOOP DONE")
    """
)


@pytest.mark.slow
def test_step_places_the_boundaries_under_run(tmp_path: Path) -> None:
    (tmp_path / "marked.py").write_text("MARK = True\n" + MARKED)
    proc = run_cli("run", "-q", "marked.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "LOOP DONE" not in proc.stdout  # stopped once the steps were recorded, as usual
    data = json.loads((tmp_path / "stallscope-marked" / "report.json").read_text())
    assert (data["run"]["step_source"], data["run"]["steps_recorded"]) == ("marker", 5)


def test_run_without_steps_points_to_the_marker() -> None:
    from stallscope.commands.run import no_steps_reason
    from stallscope.runfacts import RunContext

    reason = no_steps_reason(RunContext(command=["stallscope", "run", "x.py"], target="x.py"))
    assert "call stallscope.step() at the end of each iteration" in reason


# ---------------------------------------------------------------------------- Jupyter


def test_repr_html_is_the_page_in_a_self_contained_frame() -> None:
    report = stallscope.analyze(LOADER_BOUND)
    fragment = report._repr_html_()
    assert html.escape(report.verdict) in fragment.split("<iframe")[0]
    srcdoc = fragment.split('srcdoc="', 1)[1].split('"', 1)[0]
    assert html.unescape(srcdoc) == report.to_html()
    assert "<iframe title=\"stallscope report\" sandbox " in fragment
    assert "<link" not in fragment and "src=\"http" not in html.unescape(srcdoc)


@pytest.mark.slow
def test_report_renders_inline_in_a_notebook(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        f"import stallscope\nreport = stallscope.analyze({str(LOADER_BOUND)!r})\nreport")]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    (output,) = [o for o in nb.cells[0].outputs if o.get("output_type") == "execute_result"]
    verdict = stallscope.analyze(LOADER_BOUND).verdict
    assert html.escape(verdict) in output["data"]["text/html"]
    assert "<iframe" in output["data"]["text/html"]
    assert verdict in output["data"]["text/plain"]


def test_a_corrupt_trace_in_the_api_is_not_an_internal_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "x.pt.trace.json", [])
    with pytest.raises(stallscope.StallscopeError, match="no steps found"):
        stallscope.analyze(path)


def test_the_first_marker_outranks_the_optimizer_and_loader_guesses() -> None:
    from stallscope.capture.steps import StepDriver

    boundaries: list[str] = []
    driver = StepDriver("auto", lambda: boundaries.append(driver.source or "?"))
    opt, loader = object(), object()
    driver.on_optimizer_step(opt)  # held until the next batch...
    driver.on_marker()  # ...but the loop's own marker is that boundary
    driver.on_batch(loader)  # type: ignore[arg-type]
    driver.on_optimizer_step(opt)
    driver.on_marker()
    assert boundaries == ["marker", "marker"]
    assert not driver.direct
    chosen = StepDriver("optimizer", lambda: boundaries.append("optimizer mode"))
    chosen.on_marker()  # `--step-on optimizer` was asked for: markers do not count
    assert boundaries == ["marker", "marker"]


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Python API", 1)[1].split("\n### ", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "sample_traces").symlink_to(SAMPLES)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("Training waits on the DataLoader for 84.7% of each step.")
    assert "dataloader-bound high" in printed and "num_workers=" in printed
    assert {p.name for p in (tmp_path / "stallscope-report").iterdir()} == REPORT_FILES


def test_watch_times_every_step_of_the_block_and_analyses_them(tmp_path: Path) -> None:
    with stallscope.watch(steps=3, skip=1, out_dir=tmp_path / "out", steady=False) as session:
        ran = _train(60)
    data = session.report.to_dict()
    watch = data["watch"]
    # Every step between the first and the last boundary is in the log and the report, the
    # three recorded under the profiler marked and set aside, and the one after them, which
    # holds the writing of their trace.
    assert watch["n_steps"] == ran - 2
    assert sum(s["profiled"] for s in watch["steps"]) == 4
    assert watch["regimes"] and watch["captures"][0]["verdict"] == data["verdict"]
    assert (tmp_path / "out" / "watch" / "steps.jsonl").is_file()
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'id="watch-chart"' in page
