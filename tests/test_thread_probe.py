"""The one-thread probe (capture/threadprobe.py) and `torch_threads=1` in the replay
(replay/threads.py): which runs are probed, what the probe leaves in the trace, and how the
plan, `--what-if` and the loader's workers use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stallscope.capture import threadprobe
from stallscope.diagnose import diagnose
from stallscope.diagnose.plan import make_plan
from stallscope.diagnose.registry import changes_for
from stallscope.diagnose.spec import Change
from stallscope.replay.loader import LoaderFacts
from stallscope.replay.threads import OneThread
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import ROOT, SAMPLES

W0 = SAMPLES / "cpu-replay-cpu-w0.pt.trace.json.gz"  # CPU, loads in the training process


def test_only_a_cpu_run_of_one_process_with_threads_and_batches_to_spare_is_probed():
    assert threadprobe.skip_reason(False, 2, 1, None, 6) == ""
    assert threadprobe.skip_reason(False, 2, 1, 100, 6) == ""
    assert "GPU" in threadprobe.skip_reason(True, 2, 1, None, 6)
    assert "one intra-op thread" in threadprobe.skip_reason(False, 1, 1, None, 6)
    assert "distributed" in threadprobe.skip_reason(False, 4, 2, None, 6)
    assert "too few" in threadprobe.skip_reason(False, 2, 1, 8, 6)


def test_the_probe_sets_one_thread_and_gives_the_scripts_count_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe = threadprobe.ThreadProbe(2)
        probe.begin()
        assert torch.get_num_threads() == 1
        for i in range(threadprobe.PROBE_STEPS):
            assert probe.result is None
            probe.boundary(1000.0 * i)
        assert torch.get_num_threads() == 2
        r = probe.result
        assert r["threads"] == 2 and r["probe_threads"] == 1
        assert len(r["steps_us"]) == len(r["loader_wait_us"]) == threadprobe.PROBE_STEPS
        assert r["loader_wait_us"][1] == 1000.0
        probe.boundary(0.0)  # after the end: nothing changes
        assert len(probe.result["steps_us"]) == threadprobe.PROBE_STEPS
    finally:
        torch.set_num_threads(before)


def probe_meta(step_us: float, wait_us: float, others_wait: float = 0.0) -> dict:
    """A probe as `run` writes it: 5 steps; the stepping thread runnable the whole window and
    waiting `others_wait` of it for cores others held (2 cores, nothing else of the run's)."""
    window = 5 * step_us
    return {"threads": 2, "probe_threads": 1, "steps_us": [step_us] * 5,
            "loader_wait_us": [wait_us] * 5, "load_cores": 2,
            "sched": {"window_us": window, "tree_run_us": window * (1 - others_wait),
                      "tree_wait_us": window * others_wait,
                      "main_run_us": window * (1 - others_wait),
                      "main_wait_us": window * others_wait}}


def model_with(probe: dict | None, threads: int = 2):
    model = build_model(load_trace(W0))
    host = dict(model.trace.capture.get("host") or {})
    host["torch_threads"] = threads
    model.trace.capture["host"] = host
    if probe is not None:
        model.trace.capture["thread_probe"] = probe
    return model


def test_the_probe_steps_lose_the_share_their_thread_waited_for_others_cores():
    one = OneThread.of(model_with(probe_meta(40_000, 30_000, others_wait=0.25)))
    assert one.measured_us == 40_000 and one.others_share == pytest.approx(0.25)
    assert one.step_us == pytest.approx(30_000) and one.load_us == pytest.approx(22_500)
    assert OneThread.of(model_with(None)) is None
    assert OneThread.of(model_with({"skipped": "a GPU run"})) is None


def what_if(model, *changes: str) -> dict:
    plan = make_plan(model, diagnose(model), [Change(*c.split("=")) for c in changes])
    return plan, plan.what_if


def test_one_thread_is_replayed_at_the_probes_pace():
    """The baseline graph replayed at one thread takes the probe's quiet step: a probe step of
    twice the baseline (threads that helped) comes out about twice as long, one of half (threads
    that stalled at barriers) about half; the assumption names the probe."""
    base = make_plan(model_with(None), diagnose(model_with(None))).baseline_step_us
    for factor in (2.0, 0.5):
        step = base * factor
        plan, w = what_if(model_with(probe_meta(step, 0.6 * step)), "torch_threads=1")
        (each,) = w["each"]
        assert each["predicted_step_us"] == pytest.approx(step, rel=0.15), (factor, each)
        assert any("one intra-op thread" in a for a in each["assumptions"])


def test_one_thread_is_not_replayed_without_the_probe_or_for_other_counts():
    _, w = what_if(model_with(None), "torch_threads=1")
    assert w["each"][0]["predicted_step_us"] is None
    assert "one intra-op thread" in w["each"][0]["not_replayed"]
    _, w = what_if(model_with(probe_meta(20_000, 10_000)), "torch_threads=2")
    assert "one intra-op thread only" in w["each"][0]["not_replayed"]
    _, w = what_if(model_with(probe_meta(20_000, 10_000), threads=1), "torch_threads=1")
    assert "already ran one" in w["each"][0]["not_replayed"]


def test_workers_load_at_the_probes_one_thread_pace():
    """A worker runs one intra-op thread: moving in-process loading to workers takes the
    probe's one-thread loading time, slow or fast, whether or not the step's threads change."""
    base = make_plan(model_with(None), diagnose(model_with(None)))
    _, plain = what_if(model_with(None), "num_workers=1")
    preds = []
    for factor in (0.3, 1.8):
        step = base.baseline_step_us * factor
        _, w = what_if(model_with(probe_meta(step, 0.9 * step)), "num_workers=1")
        assert any("one intra-op thread" in a for a in w["each"][0]["assumptions"])
        preds.append(w["each"][0]["predicted_step_us"])
    assert preds[0] < plain["each"][0]["predicted_step_us"] < preds[1]


def test_loaders_threads_and_workers_are_one_change_only_where_the_probe_measured_it():
    from types import SimpleNamespace

    finding = SimpleNamespace(id="dataloader-bound", evidence={
        "suggested_num_workers": 2, "suggested_torch_threads": 1})
    assert changes_for(finding, model_with(probe_meta(20_000, 10_000))) == [
        Change("torch_threads", "1"), Change("num_workers", "2")]
    assert changes_for(finding, model_with(None)) == [Change("num_workers", "2")]
    oversub = SimpleNamespace(id="cpu-oversubscription", evidence={"suggested_torch_threads": 1})
    assert changes_for(oversub, model_with(None)) == [Change("torch_threads", "1")]


def test_a_fetchs_cpu_need_leaves_out_its_run_queue_wait():
    """Beside two busy loops a CPU-bound fetch computed 65% of its wall time and queued 35%:
    it needs a whole core, as on a quiet machine; a fetch sleeping on storage does not."""
    def facts(cpu: float, runq: float) -> LoaderFacts:
        loader = {"num_workers": 0, "batches": 4, "fetch_wall_us": 400.0,
                  "fetch_cpu_us": 400.0 * cpu, "anatomy": {"runq_share": runq}}
        return LoaderFacts.from_capture({"loaders": [loader]})

    assert facts(0.65, 0.35).cpu_share == pytest.approx(1.0)
    assert facts(0.1, 0.0).cpu_share == pytest.approx(0.1)
    assert facts(0.1, 0.1).cpu_share == pytest.approx(0.1 / 0.9)


# ---------------------------------------------------------------------------- end to end

SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(2)
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
seen = set()
for x, y in DataLoader(data, batch_size=64):
    seen.add(torch.get_num_threads())
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("threads seen", sorted(seen), "end", torch.get_num_threads(), file=sys.stderr)
"""


def run(tmp: Path, *extra: str) -> tuple[dict, dict, str]:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = tmp / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "--run-to-end", "-o", str(out),
         *extra, str(script)],
        cwd=tmp, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    return report, report["environment"]["captured"], proc.stderr


@pytest.mark.slow
def test_run_times_one_thread_steps_before_recording_and_restores_the_scripts_threads(
        tmp_path: Path):
    report, captured, err = run(tmp_path)
    probe = captured["thread_probe"]
    assert probe["threads"] == 2 and len(probe["steps_us"]) == threadprobe.PROBE_STEPS
    assert "threads seen [1, 2] end 2" in err  # the script's count, back for the recording
    assert captured["cpu"]["torch_threads"] == 2
    window = report["run"]["window"]
    assert window["probe_steps"] == threadprobe.PROBE_STEPS
    assert any("timed with one intra-op thread" in n for n in report["notes"])
    # The steps timed for the steady judgement are the script's own, not the probe's, and the
    # scheduler's figures come one per step with them (tune takes other load out of them).
    steps = report["run"]["unprofiled_steps_us"]
    assert len(steps) == window["first_step"] - 2 - threadprobe.PROBE_STEPS - 1
    load = report["run"]["unprofiled_load"]
    assert len(load["main_run_us"]) == len(load["main_wait_us"]) == len(steps)
    assert sum(load["main_run_us"]) <= load["sched"]["window_us"] + 1
    # --what-if torch_threads=1 is then replayed on the trace alone.
    trace = next((tmp_path / "out").rglob("*.pt.trace.json*"))
    alone = tmp_path / "alone"
    subprocess.run([sys.executable, "-m", "stallscope", "analyze", "-q", "-o", str(alone),
                    "--what-if", "torch_threads=1", str(trace)], check=True,
                   capture_output=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    w = json.loads((alone / "report.json").read_text())["traces"][0]["plan"]["what_if"]
    assert w["each"][0]["predicted_step_us"] > 0


@pytest.mark.slow
def test_a_run_held_at_one_thread_is_not_probed(tmp_path: Path):
    report, captured, err = run(tmp_path, "--set", "torch_threads=1", "--no-steady-wait")
    assert "thread_probe" not in captured  # --no-steady-wait: no probe is considered
    assert "threads seen [1] end 1" in err
    # Where the profiler starts right after --skip, the figures cover every unprofiled step.
    steps = report["run"]["unprofiled_steps_us"]
    load = report["run"]["unprofiled_load"]
    assert len(steps) == 2 and len(load["main_run_us"]) == len(steps)


@pytest.mark.slow
def test_a_one_thread_run_is_not_probed(tmp_path: Path):
    _, captured, err = run(tmp_path, "--set", "torch_threads=1")
    assert "one intra-op thread" in captured["thread_probe"]["skipped"]
    assert "threads seen [1] end 1" in err


def test_a_cpu_optimizer_keeps_the_measured_share_of_its_time():
    """On a CPU the optimizer's arithmetic is host time: multi-tensor Adam keeps the measured
    61% (foreach) / 21% (fused) of a for-loop step there, not a GPU host's assumed 20% / 10%."""
    _, foreach = what_if(model_with(None), "optimizer=foreach")
    _, fused = what_if(model_with(None), "optimizer=fused")
    assert "keeps 61% of its time on the CPU" in foreach["each"][0]["assumptions"][0]
    assert "keeps 21% of its time on the CPU" in fused["each"][0]["assumptions"][0]
    base = foreach["baseline_step_us"]
    assert fused["each"][0]["predicted_step_us"] < foreach["each"][0]["predicted_step_us"] < base


def test_a_loader_too_small_to_measure_does_not_refuse_the_threads():
    """A loader that hands over ready tensors takes a few microseconds a step: its one-thread
    figure against the recorded one is noise (a probe on a busy VM read it 10x), held inside
    the bounds rather than refusing torch_threads=1 (a slow test once failed on that)."""
    from stallscope.replay.graph import LOADER, build_graph
    from stallscope.replay.threads import scales

    g = build_graph(model_with(None))
    loads = g.h_kind == LOADER
    g.h_dur[loads] = 10.0  # 10 us per fetch
    base = 50_000.0
    one = OneThread(2, 40_000.0, 40_000.0, 2_000.0, 0.0, 5)  # the probe's loading: 2 ms
    got = scales(one, g, base)
    assert got is not None and got.rest == pytest.approx(38_000.0 / (base - g.h_dur[loads].sum()
                                                                      / g.steps))
