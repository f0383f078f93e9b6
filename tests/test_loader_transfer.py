"""Between the workers and the step (issue 16): `stallscope run` measures how long a batch made
in a worker takes to reach the training process, the pin-memory thread's time per batch, bursts
of slow batches and worker restarts, and the DataLoader advice follows them."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import pin_memory as pin_mod
from torch.utils.data._utils.worker import _ResumeIteration

from stallscope.capture.transfer import PinLedger, TransferTap, bursts, match
from stallscope.diagnose.rules.dataloader_bound import (
    Advice,
    LoaderClass,
    LoaderEvidence,
    advise,
    judge,
)
from stallscope.runfacts import LoaderInfo


def _run(tmp_path: Path, script: str, steps: int, *args: str) -> dict:
    target = tmp_path / "train.py"
    target.write_text(script)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), "--steps", str(steps),
         *args, str(target)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text())


def _loader(report: dict) -> dict:
    return max(report["dataloaders"], key=lambda d: d["batches_recorded"])


def _finding(report: dict, rule: str) -> dict | None:
    return next((f for f in report["findings"] if f["id"] == rule), None)


# ----------------------------------------------------------------------- under stallscope run

# Two workers each returning a 20 MB tensor: shipping it (moving it to shared memory, the
# queue, mapping it in the training process) is a cost the step can wait for.
LARGE = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Large(Dataset):
        def __len__(self):
            return 4000
        def __getitem__(self, i):
            return torch.ones(5_000_000)

    if __name__ == "__main__":
        loader = DataLoader(Large(), batch_size=None, num_workers=2)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in loader:
            time.sleep(0.01)
            opt.zero_grad()
            model(x[:8]).sum().backward()
            opt.step()
    """
)


@pytest.mark.slow
def test_large_batches_get_a_transfer_time_per_batch(tmp_path: Path) -> None:
    # 60 steps (about 1 s at 17 ms a step): the workers write their figures every FLUSH_S
    # (0.25 s), so a recording much shorter than that (8 steps took 134 ms) sees none of its
    # batches' shipping times.
    report = _run(tmp_path, LARGE, 60)
    a = _loader(report)["anatomy"]
    step_ms = sorted(s["duration_us"] for s in report["steps"])[len(report["steps"]) // 2] / 1e3
    assert a["transfer_batches"] >= 4, a
    assert 0 < a["transfer_ms_per_batch"] < step_ms
    # Ready-to-received includes the time a batch sat in the queue: never below the shipping.
    assert a["ready_to_received_ms"]["median"] >= a["transfer_ms_per_batch"]
    assert a["ready_to_received_ms"]["p90"] >= a["ready_to_received_ms"]["median"]
    assert a["worker_starts"] == 0  # one iterator, started before the recording
    assert "transfer_dropped_workers" not in a


# Each worker's every 8th batch sleeps 100 ms; the others take ~1 ms, so the workers keep up
# on average and the step waits only behind the slow ones.
BURSTY = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Bursty(Dataset):
        def __init__(self):
            self.calls = 0
        def __len__(self):
            return 100_000
        def __getitems__(self, idx):
            self.calls += 1
            time.sleep(0.1 if self.calls % 8 == 0 else 0.001)
            return [(torch.zeros(8), torch.zeros(1)) for _ in idx]

    if __name__ == "__main__":
        loader = DataLoader(Bursty(), batch_size=4, num_workers=2)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            time.sleep(0.01)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """
)


@pytest.mark.slow
def test_bursty_loader_is_told_to_prefetch_deeper(tmp_path: Path) -> None:
    report = _run(tmp_path, BURSTY, 40)
    a = _loader(report)["anatomy"]
    assert a["bursty"] is True, a
    assert a["fetch_ms_p90"] >= 2 * a["fetch_ms_p50"]
    assert a["slow_fetch_ms"] >= 90  # the 100 ms batches
    assert 0 < a["waited_share"] <= 0.5
    f = _finding(report, "dataloader-bound")
    assert f is not None, report["findings"]
    pf = f["evidence"]["suggested_prefetch_factor"]
    # The batches in flight cover a slow batch: pf x 2 workers x the step's other work.
    assert pf > 2 and pf * 2 * a["compute_ms_per_batch"] >= a["slow_fetch_ms"]
    assert f"prefetch_factor={pf}" in f["snippet"]
    assert "slow" in f["recommendation"]
    assert "suggested_num_workers" not in f["evidence"]
    assert f["saving_kind"] == "upper_bound"
    assert "prefetch_factor" in report["plan"]["not_replayed"]["dataloader-bound"]


# A small dataset and persistent_workers=False: new workers each epoch, several epochs recorded.
RESTARTS = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, TensorDataset

    if __name__ == "__main__":
        data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
        loader = DataLoader(data, batch_size=8, num_workers=2)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(100):
            for x, y in loader:
                time.sleep(0.005)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    """
)


@pytest.mark.slow
def test_workers_restarted_each_epoch_are_counted_and_said_once(tmp_path: Path) -> None:
    report = _run(tmp_path, RESTARTS, 12)
    a = _loader(report)["anatomy"]
    # 12 steps of 4-batch epochs: 2 workers started at each of the epochs begun while recording.
    assert a["worker_starts"] >= 4 and a["worker_starts"] % 2 == 0, a
    startup = _finding(report, "worker-startup")
    assert startup is not None and startup["evidence"]["worker_starts_recorded"] == \
        a["worker_starts"]
    # One finding says persistent_workers=True: the worker-startup rule, which owns it.
    saying = [f["id"] for f in report["findings"] if "persistent_workers=True" in f["snippet"]]
    assert saying == ["worker-startup"]


# ----------------------------------------------------------------------- FIFO matching


def _ring(ends: list[float], last: int) -> dict:
    return {"last": last, "end_us": [round(e * 1e6) for e in ends], "wall_us": [1000] * len(ends)}


def test_nth_received_batch_is_matched_with_the_workers_nth_made() -> None:
    ring = _ring([1.0, 1.1, 1.2, 1.3, 1.4], last=5)  # batches 1..5
    pending = deque([(1, 0.9, 1.05), (2, 1.2, 1.25), (3, 1.25, 1.30), (6, 1.5, 1.52)])
    got = match(pending, ring, flushed_at=1.41, made_count=5)
    assert got is not None
    ready = [round(r) for r, _ in got]
    ship = [round(t) for _, t in got]
    assert ready == [50_000, 150_000, 100_000]  # receive - made, in us
    # receive - max(made, get start): batch 2 was ready before the get began.
    assert ship == [50_000, 50_000, 50_000]
    assert list(pending) == [(6, 1.5, 1.52)]  # not written by the worker yet: kept


def test_counts_that_disagree_give_no_figure() -> None:
    ring = _ring([1.0, 1.1], last=2)
    # A 3rd batch received at 1.2 s, yet the worker wrote at 1.3 s that it had made 2.
    assert match(deque([(3, 1.15, 1.2)]), ring, flushed_at=1.3, made_count=2) is None
    # A batch received before the worker made it: the order is off by one.
    assert match(deque([(2, 1.0, 1.05)]), ring, flushed_at=1.3, made_count=2) is None
    # Older than the ring: dropped, not mis-matched.
    old = deque([(1, 0.5, 1.05)])
    assert match(old, _ring([1.1], last=2), flushed_at=1.3, made_count=2) == [] and not old


class FakeIter:
    """What TransferTap reads of a `_MultiProcessingDataLoaderIter`."""

    def __init__(self, pids: list[int], pin: bool = False) -> None:
        self._workers = [SimpleNamespace(pid=p) for p in pids]
        self._task_info: dict = {}
        self._pin_memory = pin


def test_attribution_follows_torchs_task_info_and_its_reset() -> None:
    tap = TransferTap()
    it = FakeIter([100, 200])
    it._task_info = {0: (0,), 1: (1,), 2: (0,)}
    tap.received(it, (0, "b0"), 1.0, 1.01, True)
    tap.received(it, (1, "b1"), 1.0, 1.02, True)
    tap.received(it, (_ResumeIteration(None), None), 1.0, 1.03, True)  # not a batch
    # A persistent iterator's _reset replaces _task_info, then drains batch 2 still in flight.
    it._task_info = {}
    tap.received(it, (2, "b2"), 1.1, 1.12, True)
    assert tap.counts == {100: 2, 200: 1} and not tap.broken
    assert [s for s, _, _ in tap.pending[100]] == [1, 2]
    # An exception a worker raised is on neither side; one from the pin thread replaced a
    # batch the worker made, so that worker's order is lost.
    it._task_info = {3: (1,)}
    tap.received(it, (3, ExceptionWrapper(where="test")), 1.2, 1.21, True)
    assert not tap.broken
    pinned = FakeIter([300], pin=True)
    pinned._task_info = {0: (0,)}
    tap.received(pinned, (0, ExceptionWrapper(where="pin")), 1.2, 1.21, True)
    assert tap.broken == {300}


def test_a_batch_from_an_unknown_task_drops_the_iterators_figures() -> None:
    tap = TransferTap()
    it = FakeIter([100, 200])
    it._task_info = {0: (0,)}
    tap.iterated(it, False, None)
    tap.received(it, (0, "b0"), 1.0, 1.01, True)
    tap.update({100: {"t": 1.02, "batches": 1, "made": _ring([1.0], last=1)}}, since=0.0)
    assert tap.figures(2, {})["transfer_batches"] == 1
    tap.received(it, (7, "b7"), 1.1, 1.11, True)  # no task 7 anywhere
    fig = tap.figures(2, {})
    assert "transfer_ms_per_batch" not in fig and fig["transfer_dropped_workers"] == 2


def test_mismatched_counts_drop_that_workers_figures() -> None:
    tap = TransferTap()
    it = FakeIter([100])
    it._task_info = {i: (0,) for i in range(3)}
    tap.iterated(it, False, None)
    for i in range(3):
        tap.received(it, (i, f"b{i}"), 1.0 + i / 10, 1.01 + i / 10, True)
    # The worker wrote at 1.3 s that it had made 2 batches; 3 were received by 1.21 s.
    tap.update({100: {"t": 1.3, "batches": 2, "made": _ring([1.0, 1.1], last=2)}}, since=0.0)
    fig = tap.figures(1, {})
    assert "transfer_ms_per_batch" not in fig and fig["transfer_dropped_workers"] == 1


# ----------------------------------------------------------------------- pin-memory thread


def test_pin_thread_time_is_counted_per_batch_for_its_loader(monkeypatch) -> None:
    """This machine has no accelerator, so torch's pin_memory() cannot run here: its module
    global is replaced by a stand-in that recurses like torch's (by the global name) and takes
    2 ms of sleep and 1 ms of CPU per tensor; torch's own `_pin_memory_loop` runs it."""

    def fake_pin(data, device=None):
        if isinstance(data, list):
            return [pin_mod.pin_memory(x, device) for x in data]
        time.sleep(0.002)
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        return data

    monkeypatch.setattr(pin_mod, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda _i: None)
    ledger = PinLedger()
    ledger.install()
    try:
        assert pin_mod.pin_memory is not fake_pin
        in_q: queue.Queue = queue.Queue()
        out_q: queue.Queue = queue.Queue()
        done = threading.Event()
        thread = threading.Thread(target=pin_mod._pin_memory_loop,
                                  args=(in_q, out_q, 0, done, None), daemon=True)
        thread.start()
        tap = TransferTap()
        tap.iterated(SimpleNamespace(_workers=[], _pin_memory_thread=thread), False, ledger)
        in_q.put((0, [torch.zeros(2), torch.zeros(2)]))  # before recording: not counted
        assert out_q.get(timeout=10)[0] == 0
        ledger.active = True
        for i in range(1, 5):
            in_q.put((i, [torch.zeros(2), torch.zeros(2)]))
        assert [out_q.get(timeout=10)[0] for _ in range(4)] == [1, 2, 3, 4]
        done.set()
        in_q.put((5, None))  # wakes the loop at once, which then sees `done`
        thread.join(timeout=10)
    finally:
        ledger.uninstall()
    assert pin_mod.pin_memory is fake_pin  # restored
    fig = tap.figures(0, {})
    assert fig["pinned_batches"] == 4  # one per batch, not one per tensor
    assert fig["pin_ms_per_batch"] >= 2 * 3.0 * 0.9  # two tensors of 2 ms sleep + 1 ms CPU
    assert 2 * 1.0 * 0.8 <= fig["pin_cpu_ms_per_batch"] < fig["pin_ms_per_batch"]


# ----------------------------------------------------------------------- bursts and advice


def test_bursty_needs_the_mean_to_keep_up() -> None:
    fetch = [1000.0] * 7 + [100_000.0]
    waits = [200.0] * 7 + [60_000.0]
    b = bursts(2, fetch * 4, waits * 4, [10_000.0] * 31)
    assert b["bursty"] and b["slow_fetch_ms"] == 100.0 and b["waited_share"] == 0.125
    # One worker and 5 ms steps: 5 ms < the 13.4 ms mean fetch, the worker lags on average.
    assert not bursts(1, fetch * 4, waits * 4, [5_000.0] * 31)["bursty"]
    # Every batch waits: not bursts, a slow loader.
    assert not bursts(2, fetch * 4, [60_000.0] * 32, [10_000.0] * 31)["bursty"]


def _info() -> LoaderInfo:
    return LoaderInfo(call_site="train.py:9", num_workers=4, pin_memory=True, batch_size=64,
                      prefetch_factor=2, persistent_workers=True, dataset="Images (9 items)",
                      batches_recorded=10)


RECEIVING = {"where": "workers", "bound": "main-process-bound", "fetch_ms_per_batch": 20.0,
             "wait_ms_per_batch": 8.0, "main_cpu_ms_per_batch": 6.0,
             "transfer_ms_per_batch": 6.5, "ready_to_received_ms": {"median": 40.0, "p90": 60.0}}


def _advice(has_gpu: bool, klass: LoaderClass) -> Advice:
    """The rule's advice on a 50 ms step that waits 8 ms for a loader of `klass`, 8 cores."""
    e = LoaderEvidence(loader_kind="multi-process", steps=5, step_us=50_000.0,
                       loader_us=8_000.0, wait_us=8_000.0,
                       gpu_us=20_000.0 if has_gpu else None, inference=False, klass=klass,
                       info=_info(), cores=8, workers_now=_info().num_workers)
    return advise(e, judge(e))


def test_main_process_bound_gpu_run_gets_a_background_thread_it_can_paste() -> None:
    advice = _advice(True, LoaderClass("main-process-bound", RECEIVING))
    assert advice.evidence["background_thread"] is True
    assert "background thread" in advice.recommendation and "6.5 ms" in advice.recommendation
    compile(advice.snippet, "snippet", "exec")  # valid Python as given
    assert "class BackgroundLoader" in advice.snippet
    assert advice.saving_us == pytest.approx(6_500.0)


@pytest.mark.parametrize("has_gpu, transfer", [(False, 6.5), (True, 1.0)])
def test_no_background_thread_without_a_gpu_or_when_workers_are_what_lags(
        has_gpu: bool, transfer: float) -> None:
    klass = LoaderClass("main-process-bound", {**RECEIVING, "transfer_ms_per_batch": transfer})
    advice = _advice(has_gpu, klass)
    assert "background_thread" not in advice.evidence
    assert "BackgroundLoader" not in advice.snippet
    # The receiving figure is still in the class's sentence.
    assert f"takes a median {transfer:.1f} ms of its wait" in advice.recommendation


BURSTY_ANATOMY = {"where": "workers", "bound": "cpu-bound", "fetch_ms_per_batch": 13.4,
          "fetch_ms_p50": 1.0, "fetch_ms_p90": 100.0, "fetch_ms_mean": 13.4,
          "slow_fetch_ms": 100.0, "waited_share": 0.125, "compute_ms_per_batch": 10.0,
          "bursty": True}


def test_prefetch_advice_names_the_knob_the_user_sets() -> None:
    """A bursty loader's deeper queue, in the user's own call: `DataLoader(...)` at its line,
    and under Trainer `TrainingArguments(..., dataloader_prefetch_factor=N)` at theirs."""
    from stallscope.diagnose.rules.dataloader_bound import _prefetch_advice

    plain = _prefetch_advice(_info(), LoaderClass("cpu-bound", BURSTY_ANATOMY), 2, 5_000.0)
    assert plain is not None
    assert plain.recommendation.startswith(
        "train.py:9 DataLoader(num_workers=2, prefetch_factor=2) -> "
        "DataLoader(..., prefetch_factor=6)"), plain.recommendation
    assert "+DataLoader(..., num_workers=2, prefetch_factor=6)" in plain.snippet
    trainer = LoaderInfo(**{**_info().__dict__, "configured_in": "TrainingArguments",
                            "settings_site": "train.py:31", "framework": "transformers.Trainer"})
    t = _prefetch_advice(trainer, LoaderClass("cpu-bound", BURSTY_ANATOMY), 2, 5_000.0)
    assert t is not None
    assert t.recommendation.startswith("train.py:31 TrainingArguments(dataloader_num_workers=2, "
                                       "dataloader_prefetch_factor=2) -> TrainingArguments(..., "
                                       "dataloader_prefetch_factor=6)"), t.recommendation
    assert "+TrainingArguments(..., dataloader_num_workers=2, dataloader_prefetch_factor=6)" \
        in t.snippet and "DataLoader(" not in t.snippet
