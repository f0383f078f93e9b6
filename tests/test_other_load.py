"""Other load on the machine while the steps were recorded (measured by capture/hostload.py,
read back by trace/otherload.py): the report
says so in one note and in the findings that size CPU work to the cores, without changing their
numbers or calling oversubscription "clear".

The end-to-end tests run `stallscope run` on a small CPU script, once while busy-loop processes
(one per core) compete for the cores. This machine may be busy with other work too, so the
tests assert that a deliberately heavy load is seen, and, without it, only that the note
agrees with the share measured (a quiet reading cannot be promised on a shared machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.capture.hostload import CpuSample, other_load
from stallscope.diagnose.rules.cpu_oversubscription import cpu_oversubscription
from stallscope.diagnose.rules.dataloader_bound import dataloader_bound
from stallscope.replay.loader import LoaderFacts
from stallscope.trace.otherload import MIN_OTHER_CPU_US, OTHER_LOAD_PCT, load_from
from tests.conftest import ROOT
from tests.rules.builders import context, sample

# ------------------------------------------------------------------ the arithmetic, synthetic


def test_other_share_is_busy_time_not_spent_by_the_tree_over_the_capacity():
    start = CpuSample(wall=10.0, busy=100.0, total=400.0, tree=5.0, cores=2)
    # 1 s on 2 cores: 2 s capacity, 1.6 s busy, of which the tree took 0.6 s.
    end = CpuSample(wall=11.0, busy=101.6, total=402.0, tree=5.6, cores=2)
    got = other_load(start, end)
    assert got["other_cpu_share_pct"] == 50.0
    assert got["tree_cpu_us"] == pytest.approx(0.6e6)
    assert got["system_busy_us"] == pytest.approx(1.6e6)
    assert got["load_cores"] == 2
    # The tree's reads tick at 10 ms: it can exceed the cores' busy time; never negative.
    quiet = dataclasses.replace(end, busy=100.5)
    assert other_load(start, quiet)["other_cpu_share_pct"] == 0.0
    assert other_load(None, end) == {}


def test_threshold_decides_and_junk_is_ignored():
    assert load_from({"other_cpu_share_pct": OTHER_LOAD_PCT - 0.1}) is None
    got = load_from({"other_cpu_share_pct": 48.0, "load_cores": 2})
    assert got is not None and "48%" in got.note and "2 core(s)" in got.note
    assert load_from({}) is None
    assert load_from({"other_cpu_share_pct": "48"}) is None
    # 60% of a 60 ms window is a few clock ticks: too coarse to say anything.
    assert load_from({"other_cpu_share_pct": 60.0, "other_cpu_us": 36_000.0}) is None


def loaded(ctx, share: float):
    ctx.environment["host"] = {"other_cpu_share_pct": share, "load_cores": 2}
    return ctx


# ------------------------------------------------------------------- the rules it affects


def test_dataloader_bound_says_so_and_keeps_its_numbers():
    model = sample("cpu-loader-bound.pt.trace.json.gz")
    calm = dataloader_bound(model, context(cores=2, threads=1, workers=0)).finding
    busy = dataloader_bound(model, loaded(context(cores=2, threads=1, workers=0), 60.0)).finding
    assert calm is not None and busy is not None
    assert "Lower confidence" not in calm.precondition
    assert "other processes took 60%" in busy.precondition
    assert busy.evidence.pop("other_cpu_share_pct") == 60.0
    assert busy.evidence == calm.evidence
    assert (busy.estimated_saving_pct, busy.severity, busy.recommendation) == (
        calm.estimated_saving_pct, calm.severity, calm.recommendation)
    # Below the threshold: nothing said.
    low = dataloader_bound(model, loaded(context(cores=2, threads=1, workers=0), 10.0)).finding
    assert "Lower confidence" not in low.precondition


def test_oversubscription_is_not_clear_when_others_hold_the_cores():
    model = sample("cpu-worker-startup.pt.trace.json.gz")
    a = cpu_oversubscription(model, loaded(context(cores=4, threads=2, workers=2), 55.0))
    assert a.status == "not_assessed"
    assert "other processes took 55%" in a.detail and "not from this run's threads" in a.detail
    ok = cpu_oversubscription(model, loaded(context(cores=4, threads=2, workers=2), 5.0))
    assert ok.status == "clear"


def test_oversubscription_does_not_blame_our_threads_for_others_load():
    model = sample("cpu-persistent-workers.pt.trace.json.gz")
    calm = cpu_oversubscription(model, context(cores=2, threads=2, workers=2)).finding
    busy = cpu_oversubscription(model, loaded(context(cores=2, threads=2, workers=2), 40.0))
    f = busy.finding
    assert f.estimated_saving_pct == calm.estimated_saving_pct and f.severity == calm.severity
    assert "part of the contention the step saw was theirs" in f.saving_basis
    assert "other processes took 40%" in f.precondition


def test_replay_facts_carry_the_load():
    host = {"cores_per_process": 2, "other_cpu_share_pct": 70.0, "load_cores": 2}
    assert LoaderFacts.from_capture({"host": host}).other_load.share_pct == 70.0
    host["other_cpu_share_pct"] = 3.0
    assert LoaderFacts.from_capture({"host": host}).other_load is None


def _model_with(host: dict):  # -> a TraceModel whose trace carries `host` metadata
    from types import SimpleNamespace

    return SimpleNamespace(trace=SimpleNamespace(capture={"host": host}))


def test_others_wait_is_what_the_runs_own_threads_do_not_explain():
    """2 cores. Busy: the tree's threads wanted 2 cores' worth (1.0 s running + 1.0 s waiting
    over 1 s) and waited half of it; on its own it would fit, so the whole wait is others'.
    Oversubscribed by itself: 4 cores' worth on 2 cores waits half by its own doing."""
    from stallscope.replay.unload import MAX_SHARE, OtherWait

    sched = {"window_us": 1e6, "tree_run_us": 1e6, "tree_wait_us": 1e6,
             "main_run_us": 0.5e6, "main_wait_us": 0.5e6}
    busy = OtherWait.of(_model_with({"load_cores": 2, "sched": sched}))
    assert (busy.wait_share, busy.own_share, busy.others_share) == (0.5, 0.0, 0.5)
    own = {**sched, "tree_run_us": 2e6, "tree_wait_us": 2e6}
    mine = OtherWait.of(_model_with({"load_cores": 2, "sched": own}))
    assert mine.demand_cores == 4.0 and mine.own_share == 0.5 and mine.others_share == 0.0
    # The stepping thread waited more than the tree on average: its share counts.
    spun = {**sched, "main_run_us": 0.1e6, "main_wait_us": 0.9e6}
    assert OtherWait.of(_model_with({"load_cores": 2, "sched": spun})).others_share == MAX_SHARE
    # A loop sleeping on storage: runnable a tenth of the window, half of that waiting; it
    # loses 5% of the window, not half of its sleeps.
    sleepy = {**sched, "main_run_us": 0.05e6, "main_wait_us": 0.05e6}
    assert OtherWait.of(_model_with({"load_cores": 2, "sched": sleepy})).others_share == \
        pytest.approx(0.05)
    quiet = {**sched, "tree_wait_us": 0.01e6, "main_wait_us": 0.005e6}
    assert OtherWait.of(_model_with({"load_cores": 2, "sched": quiet})).others_share == 0.0
    assert OtherWait.of(_model_with({"load_cores": 2})) is None  # recorded elsewhere
    assert OtherWait.of(_model_with({"sched": sched})) is None


def test_intra_op_threads_beside_other_load_are_said_not_corrected():
    """Two intra-op threads waiting half their runnable time for others' cores: each parallel op
    waits at its barrier; the report says the figures are not the quiet run's."""
    from types import SimpleNamespace

    from stallscope.replay.unload import OtherWait, barrier_note

    sched = {"window_us": 1e6, "tree_run_us": 1e6, "tree_wait_us": 1e6,
             "main_run_us": 0.5e6, "main_wait_us": 0.5e6}

    def note(threads: int, gpu: bool = False) -> str | None:
        host = {"load_cores": 2, "sched": sched, "torch_threads": threads}
        model = SimpleNamespace(trace=SimpleNamespace(capture={"host": host}), has_gpu=gpu)
        return barrier_note(model, OtherWait.of(model))

    said = note(2)
    assert said is not None and "2 intra-op threads" in said and "50%" in said
    assert "--set torch_threads=1" in said
    assert note(1) is None and note(2, gpu=True) is None


def test_others_share_leaves_the_step_the_fixes_start_from():
    """The same CPU recording, told that its stepping thread waited half its runnable time for
    cores others held: the plan starts from about half the step, and each prediction with it;
    the step stays the recorded one, and the load is said with its figures."""
    from stallscope.diagnose import diagnose
    from stallscope.diagnose.plan import make_plan
    from stallscope.trace.load import load_trace
    from stallscope.trace.model import build_model
    from tests.conftest import SAMPLES

    def plan_with(host: dict | None):
        model = build_model(load_trace(SAMPLES / "cpu-replay-cpu-w0.pt.trace.json.gz"))
        if host is not None:
            model.trace.capture["host"] = host
        return make_plan(model, diagnose(model))

    quiet = plan_with(None)
    sched = {"window_us": 1e6, "tree_run_us": 1e6, "tree_wait_us": 1e6,
             "main_run_us": 0.5e6, "main_wait_us": 0.5e6}
    busy = plan_with({"load_cores": 2, "sched": sched})
    assert busy.measured_step_us == quiet.measured_step_us
    assert busy.load["others_share_pct"] == 50.0
    assert busy.baseline_step_us == pytest.approx(0.5 * quiet.measured_step_us
                                                  - busy.profiler["step_cost_us"], rel=0.1)
    assert busy.load["step_cost_us"] == pytest.approx(0.5 * quiet.measured_step_us, rel=0.1)
    assert busy.entries and busy.entries[0].predicted_step_us < quiet.entries[0].predicted_step_us
    assert quiet.load == {}


def test_the_kernels_run_queue_figures_are_read_for_the_tree_and_the_stepping_thread():
    import time

    from stallscope.capture.hostload import sample

    start = sample()
    end = time.thread_time() + 0.05  # this thread's own CPU time, as schedstat counts it
    while time.thread_time() < end:
        pass
    got = other_load(start, sample())
    sched = got["sched"]
    assert sched["main_run_us"] >= 40_000  # the loop above ran on this thread
    assert sched["tree_run_us"] >= sched["main_run_us"]
    assert sched["window_us"] > 0 and sched["tree_wait_us"] >= 0


# ---------------------------------------------------------------------------- end to end

# Touches $GO once torch is imported, so the busy loops below start burning only then: the
# start-up does not crawl under them, and they are at full speed when recording starts.
SCRIPT = """
import os
import torch
if os.environ.get("GO"):
    open(os.environ["GO"], "w").close()
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
# Steps of ~10-20 ms: 8 of them give a window long enough for others' CPU to pass the 100 ms
# floor (with 5 ms steps the window held 45 ms and the floor decided, not the load).
data = TensorDataset(torch.randn(16384, 64), torch.randn(16384, 1))
model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(data, batch_size=256):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

BURN = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
while True:
    pass
"""


def run(tmp: Path, *extra: str, go: Path | None = None) -> dict:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = tmp / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), *extra, str(script)],
        cwd=tmp, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "GO": str(go or "")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text())


def notes_about_load(report: dict) -> list[str]:
    return [n for n in report["notes"] if n.startswith("Other load:")]


@pytest.mark.slow
def test_run_under_heavy_other_load_says_so(tmp_path: Path):
    # One busy loop per core: others take well over a quarter of the cores.
    go = tmp_path / "go"
    burners = [subprocess.Popen([sys.executable, "-c", BURN, str(go)])
               for _ in range(os.cpu_count() or 1)]
    try:
        # 30 steps: a window of 8 once held 70 ms under the burners (140 ms of capacity), so
        # others' 80 ms stayed under the 100 ms floor and the floor decided, not the load.
        report = run(tmp_path, "--steps", "30", go=go)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    host = report["environment"]["captured"]["host"]
    share = host["other_cpu_share_pct"]
    assert share >= OTHER_LOAD_PCT and host["other_cpu_us"] >= MIN_OTHER_CPU_US, host
    assert host["tree_cpu_us"] > 0
    # The stepping thread waited for the cores the burners held: that share leaves the step
    # the fixes start from (replay/unload.py), after the profiler's own cost.
    plan = report["traces"][0]["plan"]
    load = plan["load"]
    assert load["others_share_pct"] > 0 and load["step_cost_us"] > 0, (host, load)
    assert plan["baseline_step_us"] < plan["measured_step_us"] - load["step_cost_us"] + 1
    (note,) = notes_about_load(report)
    assert f"took {share:.0f}%" in note
    # `analyze` of the trace alone knows it from the trace's metadata.
    trace = next((tmp_path / "out").rglob("*.pt.trace.json*"))
    alone = tmp_path / "alone"
    subprocess.run([sys.executable, "-m", "stallscope", "analyze", "-q", "-o", str(alone),
                    str(trace)], check=True, capture_output=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    again = json.loads((alone / "report.json").read_text())
    assert notes_about_load(again) == [note]


@pytest.mark.slow
def test_run_notes_the_load_only_when_the_measured_share_reaches_the_threshold(tmp_path: Path):
    report = run(tmp_path, "--steps", "8")
    host = report["environment"]["captured"]["host"]
    share = host["other_cpu_share_pct"]
    assert 0.0 <= share <= 100.0
    notes = notes_about_load(report)
    material = share >= OTHER_LOAD_PCT and host["other_cpu_us"] >= MIN_OTHER_CPU_US
    if material:  # the machine was busy with other work: then it must say so
        assert len(notes) == 1 and re.search(rf"took {share:.0f}%", notes[0])
    else:
        assert notes == []
