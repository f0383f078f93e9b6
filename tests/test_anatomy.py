"""Inside the DataLoader (issue 16): `stallscope run` measures fetch and collate in the training
process and in each worker (fork and spawn), classifies the loader, and sizes its advice from
the class; whatever fails in the measuring loses only the anatomy, never the run."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallscope.capture import anatomy
from stallscope.capture.anatomy import classify, summarise
from stallscope.commands.tune_plan import baseline_from_report, worker_counts
from stallscope.report.anatomy_view import loader_views, segments

from .conftest import ROOT

EXAMPLES = ROOT / "examples"

# A loader with the user's own worker_init_fn and collate_fn, which must still run: the
# dataset refuses samples in a worker whose init did not run, and the batch carries a mark
# only the user's collate puts there.
CHAINED = textwrap.dedent(
    """
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset, default_collate

    STATE = {"init": None}

    def init(worker_id):
        STATE["init"] = worker_id

    def collate(items):
        x, y = default_collate(items)
        return x, y, "mine"

    class Waits(Dataset):
        def __len__(self):
            return 640
        def __getitem__(self, i):
            if STATE["init"] is None:
                raise RuntimeError("the user's worker_init_fn did not run")
            time.sleep(0.002)
            return torch.randn(8), torch.randn(1)

    if __name__ == "__main__":
        ctx = sys.argv[1]
        loader = DataLoader(Waits(), batch_size=8, num_workers=2, multiprocessing_context=ctx,
                            worker_init_fn=init, collate_fn=collate)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y, mark in loader:
            assert mark == "mine"
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """
)


def _run(tmp_path: Path, target: Path, *args: str, env: dict[str, str] | None = None,
         steps: int = 4) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), "--steps", str(steps),
         str(target), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads((out / "report.json").read_text())


def _loader(report: dict) -> dict:
    return max(report["dataloaders"], key=lambda d: d["batches_recorded"])


def _finding(report: dict) -> dict:
    return next(f for f in report["findings"] if f["id"] == "dataloader-bound")


def _trace_loaders(out: Path) -> list[dict]:
    trace = next(out.rglob("*.pt.trace.json.gz"))
    with gzip.open(trace, "rt") as f:
        meta = json.load(f)["stallscope"]
    return json.loads(meta)["loaders"] if isinstance(meta, str) else meta["loaders"]


# ----------------------------------------------------------------------- classification


def test_waiting_needs_blocked_time_not_just_idle_cpu() -> None:
    """A fetch off the CPU because other processes hold the cores is CPU-bound; one off the
    CPU because it sleeps on storage waits."""
    main = {"batches": 4, "wall_us": 400_000.0, "cpu_us": 120_000.0, "collate_wall_us": 0.0,
            "collate_cpu_us": 0.0}
    busy = summarise(0, [], {**main, "runq_us": 270_000.0})
    idle = summarise(0, [], {**main, "runq_us": 10_000.0})
    assert busy["bound"] == "cpu-bound" and busy["runq_share"] == pytest.approx(0.675)
    assert idle["bound"] == "waiting" and idle["blocked_share"] == pytest.approx(0.675)
    # Without schedstat the CPU share alone decides.
    assert summarise(0, [], main)["bound"] == "waiting"


def test_collate_and_main_process_classes() -> None:
    worker = {"pid": 1, "worker_id": 0, "batches": 10, "wall_us": 1e6, "process_cpu_us": 9e5,
              "fetch_wall_us": 100_000.0, "fetch_cpu_us": 95_000.0,
              "collate_wall_us": 70_000.0, "collate_cpu_us": 69_000.0, "fetch_runq_us": 0.0}
    main = {"batches": 10, "wall_us": 20_000.0, "cpu_us": 2_000.0}
    assert summarise(2, [worker], main)["bound"] == "collate/transfer-bound"
    assert classify(2, {"fetch_ms_per_batch": 3.0, "wait_ms_per_batch": 4.0,
                        "main_cpu_ms_per_batch": 3.5}) == "main-process-bound"
    lost = summarise(2, [], main)
    assert "bound" not in lost and "lost" in lost


def test_worker_whose_folder_vanished_stops_writing_without_raising(tmp_path: Path) -> None:
    acct = anatomy._WorkerAccount(tmp_path / "gone" / "l1-1.json", 0)
    acct.batches = 1
    acct.after_batch()  # the folder does not exist: no exception, and no further attempts
    assert acct.broken


def _tune_report(bound: str) -> dict:
    loader = {"call_site": "train.py:9", "num_workers": 0, "batches_recorded": 5,
              "bound": bound, "anatomy": {"bound": bound, "blocked_share": 0.95}}
    finding = {"id": "dataloader-bound", "evidence": {"suggested_num_workers": 8}}
    return {"dataloaders": [loader], "findings": [finding],
            "environment": {"captured": {"cpu": {"cores_per_process": 2}}}}


def test_tune_tries_counts_beyond_the_cores_only_for_a_waiting_loader() -> None:
    waiting = baseline_from_report(_tune_report("waiting"))
    assert worker_counts(waiting)[0] == 8 and max(worker_counts(waiting)) == 8
    assert 4 in worker_counts(waiting)
    assert any("waiting on storage" in n and "beyond the 2 core(s)" in n for n in waiting.notes)
    busy = baseline_from_report(_tune_report("cpu-bound"))
    assert max(worker_counts(busy)) == 2


# ----------------------------------------------------------------------- under stallscope run


@pytest.mark.slow
def test_waiting_loader_is_told_to_use_workers_beyond_the_cores(tmp_path: Path) -> None:
    proc, report = _run(tmp_path, EXAMPLES / "loader_waiting.py", "--samples", "480")
    loader = _loader(report)
    assert loader["bound"] == "waiting", loader["anatomy"]
    assert loader["anatomy"]["where"] == "main process"
    f = _finding(report)
    cores = f["evidence"]["cores_per_process"]
    assert f["evidence"]["loader_bound"] == "waiting"
    n = f["evidence"]["suggested_num_workers"]
    assert n >= min(6, 4 * cores) and n > cores
    assert "waits on storage" in f["recommendation"]
    # The replay of that change agrees with the rule's own estimate.
    assert f["saving_kind"] == "replayed"
    assert f["predicted_step_us"] / 1000 == pytest.approx(
        f["evidence"]["projected_step_ms"], rel=0.5)
    # cpu-oversubscription does not contradict it: the waiting workers count by CPU share.
    assert not any(g["id"] == "cpu-oversubscription" for g in report["findings"])
    # The trace alone carries the class, and `analyze` of it gives the same advice.
    assert _trace_loaders(tmp_path / "out")[0]["anatomy"]["bound"] == "waiting"
    trace = next((tmp_path / "out").rglob("*.pt.trace.json.gz"))
    alone = subprocess.run([sys.executable, "-m", "stallscope", "analyze", "-q", "-o",
                            str(tmp_path / "alone"), str(trace)], capture_output=True, text=True,
                           timeout=120)
    assert alone.returncode == 0, alone.stderr[-2000:]
    g = _finding(json.loads((tmp_path / "alone" / "report.json").read_text()))
    assert g["evidence"]["loader_bound"] == "waiting"
    assert g["evidence"]["suggested_num_workers"] == n
    # The report's DataLoader section draws where a batch's time goes: mostly blocked.
    page = (tmp_path / "out" / "report.html").read_text()
    block = page[page.index('id="loader-anatomy"'):page.index("<h3>Environment")]
    assert 'data-bound="waiting"' in block and "blocked (storage, network, sleep)" in block
    widths = dict(re.findall(r'title="([^:"]+): [0-9.]+ ms \(([0-9.]+)%\)"', block))
    assert float(widths["blocked (storage, network, sleep)"]) > 50, widths
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Inside the DataLoaders" in md and "**waiting**" in md


def test_anatomy_bar_splits_a_batch_into_measured_parts() -> None:
    a = {"fetch_ms_per_batch": 10.0, "fetch_cpu_ms_per_batch": 2.0, "runq_share": 0.1,
         "collate_ms_per_batch": 2.0, "transfer_ms_per_batch": 1.0}
    parts = {p["key"]: p["ms"] for p in segments(a)}
    # 10 ms fetch = 2 on a core + 1.2 queued (10% of fetch+collate) + 6.8 blocked.
    assert parts == {"compute": 2.0, "queued": 1.2, "blocked": 6.8, "collate": 2.0,
                     "transfer": 1.0}
    assert sum(p["pct"] for p in segments(a)) == pytest.approx(100.0, abs=0.2)
    assert segments({"where": "workers", "lost": "killed"}) == []
    assert loader_views([{"call_site": "t.py:1", "anatomy": {}}]) == []


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_workers_report_their_anatomy_and_the_users_hooks_still_run(tmp_path: Path,
                                                                    ctx: str) -> None:
    script = tmp_path / "chained.py"
    script.write_text(CHAINED)
    # 24 steps of ~8 ms: a longer window than 4 steps, so the workers' writes (at their first
    # batch, then every 0.25 s) and the final read cover it.
    _, report = _run(tmp_path, script, ctx, steps=24)
    a = _loader(report)["anatomy"]
    assert a["where"] == "workers" and a["workers_reporting"] >= 1, a
    assert {w["worker_id"] for w in a["workers"]} <= {0, 1}
    assert a["fetch_ms_per_batch"] >= 8 * 2.0 * 0.9  # 8 samples of 2 ms sleep
    assert a["bound"] == "waiting"


@pytest.mark.slow
def test_cpu_bound_loader_is_never_told_to_exceed_the_cores(tmp_path: Path) -> None:
    # One intra-op thread, as a user who exported it: two OpenMP threads on a 2-core machine
    # that other work keeps busy made this model's step 240 ms instead of 10 (barrier
    # spinning), and the step then no longer waited on its loader.
    _, report = _run(tmp_path, EXAMPLES / "loader_bound.py", "--samples", "512",
                     "--batch-size", "16", "--num-workers", "1", env={"OMP_NUM_THREADS": "1"})
    loader = _loader(report)
    assert loader["bound"] == "cpu-bound", loader["anatomy"]
    assert loader["anatomy"]["where"] == "workers"
    f = _finding(report)
    assert f["evidence"]["suggested_num_workers"] <= f["evidence"]["cores_per_process"]
    assert "Loading computes" in f["recommendation"]


@pytest.mark.slow
def test_a_script_that_ends_mid_recording_keeps_its_workers_anatomy(tmp_path: Path) -> None:
    # 8 batches for 8 recorded steps: the epoch runs out while recording, and the run writes
    # the steps it has. The workers' files were once read only after their folder was gone,
    # and the loader's anatomy came back empty (a CI run on a busy machine, whose steady wait
    # took two more steps, met it on a 16-batch epoch).
    proc, report = _run(tmp_path, EXAMPLES / "loader_bound.py", "--samples", "128",
                        "--batch-size", "16", "--num-workers", "1", steps=8,
                        env={"OMP_NUM_THREADS": "1"})
    assert any("finished after" in n for n in report["notes"]), report["notes"]
    a = _loader(report)["anatomy"]
    assert a["where"] == "workers" and a["workers_reporting"] == 1, a
    assert a["bound"] == "cpu-bound"


# A DataLoader subclass whose collate_fn can be set only once (write-once attributes, as some
# libraries' loaders have): stallscope cannot put its wrappers on it.
FROZEN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Frozen(DataLoader):
        def __setattr__(self, name, value):
            if name == "collate_fn" and "collate_fn" in self.__dict__:
                raise AttributeError(f"{name} is write-once")
            super().__setattr__(name, value)

    if __name__ == "__main__":
        data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
        loader = Frozen(data, batch_size=8, num_workers=1)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """
)


@pytest.mark.slow
def test_a_loader_that_cannot_be_wrapped_loses_only_its_anatomy(tmp_path: Path) -> None:
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN)
    _, report = _run(tmp_path, script)
    loader = _loader(report)
    assert "could not be wrapped" in loader["anatomy"]["lost"]
    assert loader["bound"] is None and loader["batches_recorded"] >= 4
    assert report["run"]["steps_recorded"] == 4
