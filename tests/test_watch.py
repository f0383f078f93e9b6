"""`stallscope watch` end to end: the script runs to its end, every step is logged (and shown in
TensorBoard as the run goes), and report.json carries the whole run beside the diagnosis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from stallscope.capture.steplog import StepLog
from stallscope.report.schema import check
from stallscope.wholerun.series import StepSeries

# Two epochs of 40 batches; prints how many optimizer steps it took, so the log can be checked
# against the script's own count.
TWO_EPOCHS = textwrap.dedent(
    """
    import sys, time, torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(320, 8), torch.randn(320, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
            time.sleep(float(sys.argv[1]))
    print(f"SCRIPT STEPS {steps}", flush=True)
    """
)


def read_steps(path: Path) -> list[dict]:
    """The step log's lines as a reader mid-run sees them (a torn last line left out)."""
    if not path.exists():
        return []
    return StepSeries.from_jsonl(path).to_records()


def start_watch(tmp_path: Path, sleep_s: str, **popen: Any) -> subprocess.Popen:
    """`stallscope watch -q` on TWO_EPOCHS (each step sleeping `sleep_s`), left running."""
    script = tmp_path / "two_epochs.py"
    script.write_text(TWO_EPOCHS)
    return subprocess.Popen(
        [sys.executable, "-m", "stallscope", "watch", "-q", "-o", str(tmp_path / "out"),
         str(script), sleep_s], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, **popen)


def watch(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    script = tmp_path / "two_epochs.py"
    script.write_text(TWO_EPOCHS)
    return subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-o", str(tmp_path / "out"), "--force",
         *args, str(script), "0.002"],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.slow
def test_watch_logs_every_step_of_the_whole_run(tmp_path: Path) -> None:
    done = watch(tmp_path, "-q")
    assert done.returncode == 0, done.stderr
    assert "SCRIPT STEPS 80" in done.stdout  # the script ran to its end, not stopped
    steps = read_steps(tmp_path / "out" / "watch" / "steps.jsonl")
    # A step ends at the batch after its optimizer.step(): of the 80, the first holds the
    # start-up (before the first boundary) and no batch closes the last; the 78 between are
    # each one line.
    assert len(steps) == 78
    assert [s["step"] for s in steps] == list(range(1, 79))
    assert {s["epoch"] for s in steps} == {0, 1}
    assert sum(s["profiled"] for s in steps) >= 5  # the recorded window is marked
    assert all(s["step_ms"] > 0 and 0 <= s["loader_wait_ms"] <= s["step_ms"] for s in steps)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    check(report)  # the shipped schema describes it
    assert report["watch"]["n_steps"] == 78
    assert len(report["watch"]["regimes"]) == 1  # a steady loop: one regime
    assert report["watch"]["captures"][0]["verdict"] == report["verdict"]
    # The job's memory over the run, from the memory sampler's sweeps (at least the first).
    lines = (tmp_path / "out" / "watch" / "steps.jsonl").read_text().splitlines()
    sampled = [m for m in (json.loads(x).get("mem_mb") for x in lines) if m is not None]
    mem = report["watch"]["memory"]
    assert sampled and mem["samples"] == len(sampled) and mem["peak_mb"] == max(sampled) > 50
    assert 'id="watch-memory"' in (tmp_path / "out" / "report.html").read_text()
    # ... and the other load, from the other-load sampler's sweeps
    probed = [p for p in (json.loads(x).get("probe_us") for x in lines) if p is not None]
    assert probed and all(p > 0 for p in probed)
    # The same figures as TensorBoard scalars, beside the trace.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = next((tmp_path / "out" / "tensorboard").iterdir())
    scalars = EventAccumulator(str(run)).Reload()
    points = scalars.Scalars("watch/step_ms")  # a point each half second, the last at the end
    assert points and points[-1].step == 78 and all(p.value > 0 for p in points)


@pytest.mark.slow
def test_a_killed_watch_keeps_the_steps_it_logged(tmp_path: Path) -> None:
    log = tmp_path / "out" / "watch" / "steps.jsonl"
    proc = start_watch(tmp_path, "0.1", start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_steps(log)) < 20:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: what a node failure leaves
    proc.wait()
    steps = read_steps(log)
    assert len(steps) >= 20  # flushed as the run went, at most a second behind
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("sig, status, ended", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, None)])
def test_an_interrupted_watch_reports_every_step_it_saw(tmp_path: Path, sig: int, status: int,
                                                        ended: str | None) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) or a kill (SIGTERM) mid-run, after the
    first capture: the report is written, covering every step logged, with the exit status the
    shell expects."""
    log = tmp_path / "out" / "watch" / "steps.jsonl"
    proc = start_watch(tmp_path, "0.1", start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_steps(log)) < 25:
        time.sleep(0.2)
    os.killpg(proc.pid, sig)
    assert proc.wait(timeout=120) == status
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    check(report)
    assert report["watch"]["n_steps"] == len(read_steps(log)) >= 25
    assert report["run"]["exit_status"] == status
    if ended:
        assert report["run"]["ended"] == ended
    assert report["watch"]["captures"][0]["first_step"] is not None


def test_the_step_log_times_each_step_and_never_writes_from_a_forked_child(
        tmp_path: Path) -> None:
    log = StepLog(tmp_path / "steps.jsonl")
    log.boundary(0.0, None, False)  # the first boundary: start-up before it is no step
    time.sleep(0.02)
    log.boundary(5000.0, 0, False)
    pid = os.fork()
    if pid == 0:  # a child the script forks inherits the log: it must not write to it
        log.boundary(1.0, 0, False)
        log.close()
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.01)
    log.boundary(0.0, 0, True)
    log.close()
    steps = read_steps(tmp_path / "steps.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["step_ms"] >= 20 and steps[0]["loader_wait_ms"] == 5.0
    assert steps[1]["profiled"] is True




def synthetic_watch(n: int, stall_every: int = 0) -> dict:
    steps = []
    for i in range(1, n + 1):
        ms = 10.0 + (500.0 if stall_every and i % stall_every == 0 else 0.0)
        steps.append({"step": i, "start_s": i * 0.01, "step_ms": ms, "loader_wait_ms": 2.0,
                      "epoch": (i - 1) * 4 // n, "profiled": 50 <= i < 55})
    return {"step_log": "steps.jsonl", "steps": steps, "n_steps": n, "wall_ms": n * 10.0,
            "median_step_ms": 10.0, "loader_wait_share": 0.2, "regimes": [], "periodic": [],
            "captures": [{"first_step": 50, "verdict": {"text": "x", "id": "no-finding"}}]}


def test_a_long_run_is_drawn_in_bounded_size_and_keeps_its_stalls() -> None:
    from stallscope.report.watch_chart import MAX_POINTS, watch_chart

    chart = watch_chart(synthetic_watch(200_000, stall_every=1000))
    assert chart is not None
    assert len(chart["line"].split()) <= MAX_POINTS
    # A stall every 1,000 steps shares its bucket with 333 plain steps: the median line hides
    # it, the slowest-step line does not.
    tops = [float(p.split(",")[1]) for p in chart["peaks"].split()]
    mids = [float(p.split(",")[1]) for p in chart["line"].split()]
    assert min(tops) < min(mids) - 50  # y grows downwards: the peaks reach far higher
    assert len(chart["epochs"]) == 3 and len(chart["captures"]) == 1


def test_report_html_leads_with_the_whole_run() -> None:
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.html import render_html

    root = Path(__file__).resolve().parents[1]
    trace = root / "sample_traces" / "cpu-loader-bound.pt.trace.json.gz"
    report = analyze_paths([trace])
    plain = render_html(report)
    assert 'id="watch-chart"' not in plain  # only watch reports have it
    report.watch = synthetic_watch(300)
    page = render_html(report)
    assert page.index('id="whole-run"') < page.index('id="findings"')
    assert 'id="watch-chart"' in page and "300 steps" in page
    # The line is printed whole: every step a point (cut at 2,000 characters, as any printed
    # string is, it drew nothing in a browser past ~100 steps).
    points = re.search(r'<polyline id="watch-line" points="([^"]*)"', page)
    assert points is not None and "\u2026" not in points.group(1)
    pairs = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert len(pairs) == 300


def watch_case(tmp_path: Path, case: str) -> dict:
    """`stallscope watch examples/watch_cases.py --case CASE`: its report.json's watch."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / case
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-q", "-o", str(out),
         str(root / "examples" / "watch_cases.py"), "--case", case],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "trained 240 steps" in done.stdout
    return json.loads((out / "report.json").read_text())["watch"]


def script_changes(watch: dict) -> list[dict]:
    """Regime changes the script made: not those its CPU time says came from outside (other
    processes taking the cores of this shared machine)."""
    return [r for r in watch["regimes"][1:] if "outside the process" not in (r["change"] or "")]


@pytest.mark.slow
def test_a_loader_that_slows_down_halfway_is_a_new_regime(tmp_path: Path) -> None:
    w = watch_case(tmp_path, "slowdown")
    changes = script_changes(w)
    assert changes, w["regimes"]
    # Steps 1-119 read at the first cost, from about step 120 on at four times it: the
    # boundary within 5% of the run's 240 steps, the step at least twice as long, in the loader.
    first = min(changes, key=lambda r: abs(r["first_step"] - 120))
    assert abs(first["first_step"] - 120) <= 12, w["regimes"]
    before = next(r for r in w["regimes"] if r["last_step"] < first["first_step"])
    assert first["median_step_ms"] > 2 * before["median_step_ms"], w["regimes"]
    assert first["loader_wait_share"] > 0.5


@pytest.mark.slow
@pytest.mark.alone
def test_a_blocking_save_every_25_steps_is_found_with_its_cost(tmp_path: Path) -> None:
    w = watch_case(tmp_path, "save")
    periodic = [p for p in w["periodic"] if p["kind"] == "periodic"]
    assert periodic, (w["periodic"], w["outliers"])
    assert periodic[0]["every_steps"] == 25
    assert periodic[0]["cost_ms"] > 0 and 0 < periodic[0]["share_of_wall"] < 1


@pytest.mark.slow
def test_workers_started_every_epoch_are_found_with_persistent_workers_as_the_fix(
        tmp_path: Path) -> None:
    w = watch_case(tmp_path, "epochs")
    starts = [p for p in w["periodic"] if p["kind"] == "epoch_start"]
    assert starts, (w["periodic"], w["outliers"])
    assert starts[0]["fix"]["change"] == "DataLoader(..., persistent_workers=True)"
    assert starts[0]["share_of_wall"] > 0.05


@pytest.mark.slow
@pytest.mark.alone
def test_a_steady_run_reports_no_change_of_its_own(tmp_path: Path) -> None:
    w = watch_case(tmp_path, "steady")
    assert script_changes(w) == [], w["regimes"]
    assert not [p for p in w["periodic"] if p["kind"] == "periodic"], w["periodic"]


@pytest.mark.slow
def test_timeout_bounds_a_watch_and_keeps_every_step_watched(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-q", "--timeout", "6", "-o",
         str(tmp_path / "out"), str(root / "examples" / "watch_cases.py"), "--case", "steady",
         "--steps", "1000000"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 124, done.stderr
    watch = json.loads((tmp_path / "out" / "report.json").read_text())["watch"]
    assert watch["n_steps"] > 50
    assert f"the {watch['n_steps']:,} step(s) watched" in done.stderr


def test_the_live_page_is_the_run_so_far(tmp_path: Path) -> None:
    from stallscope.report.watch_live import main as live_main

    log = tmp_path / "run" / "watch" / "steps.jsonl"
    log.parent.mkdir(parents=True)
    with log.open("w") as fh:
        for step in synthetic_watch(400, stall_every=50)["steps"]:
            fh.write(json.dumps(step) + "\n")
        fh.write('{"step": 401, "step_')  # the line being written when the page was made
    assert live_main([str(log), "60"]) == 0
    section = json.loads((log.parent / "live.json").read_text())
    assert section["n_steps"] == 400 and section["notes"]
    assert [p["every_steps"] for p in section["periodic"]] == [50]
    page = (log.parent / "live.html").read_text()
    assert 'id="watch-chart"' in page and "every 60 s" in page and "Every 50 steps" in page


@pytest.mark.slow
def test_the_live_page_is_written_while_the_run_goes(tmp_path: Path) -> None:
    live = tmp_path / "out" / "watch" / "live.html"
    proc = start_watch(tmp_path, "0.05", env={**os.environ, "STALLSCOPE_WATCH_LIVE_S": "1"})
    seen_running = False
    while proc.poll() is None:
        if live.exists():
            seen_running = True  # readable before the run ended
            break
        time.sleep(0.1)
    assert proc.wait(timeout=300) == 0
    assert seen_running
    assert 'id="watch-chart"' in live.read_text()


@pytest.mark.slow
def test_max_steps_stops_a_watch_with_its_report(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    script = [str(root / "examples" / "watch_cases.py"), "--case", "steady", "--steps", "100000"]
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-q", "--max-steps", "40", "-o",
         str(tmp_path / "out"), *script], capture_output=True, text=True, timeout=300,
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["watch"]["n_steps"] == 40
    assert report["run"]["ended"] == "max steps" and report["run"]["steps_recorded"] == 5
    # Stopped before recording began: one line that says what to change, no report.
    early = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-q", "--max-steps", "3", "-o",
         str(tmp_path / "early"), *script], capture_output=True, text=True, timeout=300,
        cwd=tmp_path)
    assert early.returncode == 4
    assert "--max-steps stopped the script before recording began" in early.stderr


@pytest.mark.slow
@pytest.mark.alone
def test_duration_stops_a_watch_at_a_step_boundary_with_its_report(tmp_path: Path) -> None:
    """`--duration 6`: a script of 100,000 steps is stopped once it has run 6 s, at a step
    boundary (the recording and the steps so far kept), exit 0."""
    root = Path(__file__).resolve().parents[1]
    script = [str(root / "examples" / "watch_cases.py"), "--case", "steady", "--steps", "100000"]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "stallscope", "watch", "-q", "--duration", "6", "-o",
         str(tmp_path / "out"), *script], capture_output=True, text=True, timeout=300,
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 120
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    check(report)
    assert report["run"]["ended"] == "duration" and report["run"]["steps_recorded"] == 5
    w = report["watch"]
    assert 20 <= w["n_steps"] < 100_000 and 4_000 <= w["wall_ms"] <= 7_000
