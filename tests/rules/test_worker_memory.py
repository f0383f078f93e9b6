"""`worker-memory`: DataLoader workers whose own memory grows (copy-on-write of a dataset of
Python objects) or that do not fit the memory, from `run`'s memory samples in the trace's
metadata; and every worker count dataloader-bound and `tune` advise fits that memory.

Unit tests on synthetic figures shaped as capture/memory.py writes them; slow tests on real
scripts under `stallscope run` (a dataset of Python strings that each worker copies as it
reads, and a container limit faked through STALLSCOPE_MEMORY_LIMIT_FILE)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stallscope.commands.tune_plan import baseline_from_report, worker_counts
from stallscope.diagnose import memory
from stallscope.diagnose.rules.dataloader_bound import dataloader_bound
from stallscope.diagnose.rules.worker_memory import worker_memory
from tests.conftest import SAMPLES
from tests.rules.builders import sample

MB = 1 << 20


def _proc(role: str, t: list[float], uss: list[int], rss: int, pss: int, wid: int | None = None
          ) -> dict[str, Any]:
    n = len(t)
    return {"role": role, "pid": 100 + (wid if wid is not None else -1), "loader": "train.py:9",
            "worker_id": wid, "t_s": t, "uss_bytes": [u * MB for u in uss],
            "rss_bytes": [rss * MB] * n, "pss_bytes": [pss * MB] * n, "swap_bytes": [0] * n}


def _memory(worker_uss: list[int], workers: int = 2, limit_mb: int | None = None,
            python_list: bool = True, available_mb: int = 16000) -> dict[str, Any]:
    t = [float(i) for i in range(len(worker_uss))]
    storage = ([{"attr": "items", "type": "list", "items": 2_000_000, "element": "str",
                 "python_objects": True}] if python_list else
               [{"attr": "items", "type": "numpy.ndarray", "bytes": 16_000_000, "dtype": "int64",
                 "python_objects": False}])
    return {
        "sampling": {"interval_s": 1.0, "sweeps": len(t), "sweep_ms_mean": 5.0, "duty": 0.01},
        "limit": None if limit_mb is None else {"bytes": limit_mb * MB, "source": "/fake"},
        "machine": {"total_bytes": 32000 * MB, "t_s": t,
                    "available_bytes": [available_mb * MB] * len(t),
                    "cgroup_usage_bytes": [None] * len(t)},
        "processes": [_proc("main", t, [300] * len(t), 600, 500)]
        + [_proc("worker", t, worker_uss, 450, 200, w) for w in range(workers)],
        "device": [], "pinned": None,
        "loaders": [{"call_site": "train.py:9", "num_workers": workers,
                     "dataset": "Strings (2000000 items)", "storage": storage}],
    }


def _with_memory(name: str, mem: dict[str, Any] | None):
    model = copy.copy(sample(name))
    model.trace.capture = {**model.trace.capture}
    if mem is not None:
        model.trace.capture["memory"] = mem
    return model


def test_copy_on_write_growth_is_named_with_the_datasets_storage():
    model = _with_memory("cpu-loader-bound.pt.trace.json.gz", _memory([40, 80, 130]))
    a = worker_memory(model)
    assert a.status == "finding"
    f = a.finding
    assert "copy-on-write" in f.title and "+90 MB per worker" in f.title
    assert f.evidence["worker_growth_mb"] == [90, 90]
    assert "`items` holds 2,000,000 Python str objects" in f.recommendation
    assert "np.asarray" in f.snippet and "13246" in f.docs
    assert f.estimated_saving_pct == 0.0  # memory, not step time


def test_growth_without_python_objects_is_not_called_copy_on_write():
    model = _with_memory("cpu-loader-bound.pt.trace.json.gz",
                         _memory([40, 80, 130], python_list=False))
    f = worker_memory(model).finding
    assert "copy-on-write" not in f.title
    assert "no dataset attribute of Python objects" in f.recommendation


def test_flat_workers_within_the_memory_are_clear_with_their_figures():
    a = worker_memory(_with_memory("cpu-loader-bound.pt.trace.json.gz", _memory([40, 41, 42])))
    assert a.status == "clear"
    assert "2 DataLoader workers hold 42 MB of their own" in a.detail


def test_workers_over_a_container_limit_are_found_with_the_count_that_fits():
    # base: 500 + 2*200 PSS - 2*42 USS = 816 MB; 90% of 1000 MB leaves 84 MB: 2 workers of 42.
    mem = _memory([42, 42, 42], workers=4, limit_mb=1000)
    facts = memory.facts({"memory": mem})
    assert isinstance(facts, memory.MemoryFacts)
    assert facts.workers_fit() == 0  # 500 + 4*200 - 4*42 = 1132 MB already over 900
    mem = _memory([42, 42, 42], workers=2, limit_mb=1100)
    facts = memory.facts({"memory": mem})
    assert isinstance(facts, memory.MemoryFacts)
    base = 500 + 2 * 200 - 2 * 42
    assert facts.workers_fit() == (int(0.9 * 1100) - base) // 42
    a = worker_memory(_with_memory("cpu-loader-bound.pt.trace.json.gz",
                                   _memory([42, 42, 42], workers=4, limit_mb=1000)))
    assert a.status == "finding" and a.finding.severity == "medium"
    assert "num_workers=0" in a.finding.snippet


def test_a_trace_without_memory_figures_is_not_assessed_and_says_why():
    a = worker_memory(sample("cpu-loader-bound.pt.trace.json.gz"))
    assert a.status == "not_assessed"
    assert "no memory figures" in a.detail


def test_dataloader_bound_caps_its_worker_count_by_the_memory_and_says_by_how_much():
    name = "cpu-loader-bound.pt.trace.json.gz"
    free = dataloader_bound(sample(name)).finding
    assert free.evidence["memory_fit"].startswith("not assessed")
    wanted = free.evidence["suggested_num_workers"]
    assert wanted >= 2
    # A container limit that holds one worker fewer than the load asks for.
    base = 500 + 2 * 200 - 2 * 42
    limit = int((base + (wanted - 1) * 42 + 20) / 0.9) + 1
    capped = dataloader_bound(_with_memory(name, _memory([42, 42, 42], limit_mb=limit))).finding
    assert capped.evidence["memory_fit_num_workers"] == wanted - 1
    assert capped.evidence["suggested_num_workers"] == wanted - 1
    assert f"by memory (not {wanted}): {wanted} workers would hold" in capped.recommendation
    assert "the container limit (/fake)" in capped.recommendation
    assert f"num_workers={wanted - 1}" in capped.snippet


def test_tune_tries_no_worker_count_over_what_memory_holds():
    report = {"dataloaders": [{"num_workers": 0, "batches_recorded": 9, "call_site": "t.py:3"}],
              "environment": {"captured": {"cpu": {"cores_per_process": 8}}},
              "findings": [{"id": "dataloader-bound",
                            "evidence": {"suggested_num_workers": 3,
                                         "memory_fit_num_workers": 3}}]}
    base = baseline_from_report(report)
    assert base.memory_fit == 3 and base.max_workers == 3
    assert max(worker_counts(base)) == 3
    assert any("memory holds at most 3" in n for n in base.notes)


# ------------------------------------------------------------------ real scripts, under `run`

COW_SCRIPT = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Strings(Dataset):
        # A dataset kept as a Python list of strings: each read writes an object's reference
        # count, which copies its page into the worker reading it (copy-on-write).
        def __init__(self, n):
            self.items = [str(i) * 4 for i in range(n)]
        def __len__(self):
            return len(self.items)
        def __getitem__(self, i):
            # Each item reads a block of its own, so the workers' pages are copied as they go
            # (over seconds, on a fast machine too), not all in their first moments: the growth
            # lies between the sampler's first reading of a worker and its last.
            time.sleep(0.002)
            s = 0
            for j in range(i * 2000, i * 2000 + 2000):
                s += len(self.items[j % len(self.items)])
            return torch.full((8,), float(s)), torch.zeros(1)

    if __name__ == "__main__":
        loader = DataLoader(Strings(2_000_000), batch_size=16, num_workers=2)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """
)


def _run(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None
         ) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "train.py"
    target.write_text(script)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), *args, str(target)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text())


def _finding(report: dict[str, Any], rule: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["id"] == rule), None)


@pytest.mark.slow
def test_workers_that_copy_a_python_list_are_named_with_their_growth(tmp_path: Path):
    report = _run(tmp_path, COW_SCRIPT, "--skip", "150", "--steps", "10")
    f = _finding(report, "worker-memory")
    assert f is not None, [a for a in report["assessments"] if a["rule"] == "worker-memory"]
    assert "copy-on-write" in f["title"]
    ev = f["evidence"]
    assert ev["workers"] == 2
    assert min(ev["worker_growth_mb"]) >= memory.GROWTH_MIN_MB
    assert "`items` holds 2,000,000 Python str objects" in f["recommendation"]


LAGGING_SCRIPT = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 4000
        def __getitem__(self, i):
            time.sleep(0.01)  # waits, as storage would: more workers would help
            return torch.randn(8), torch.randn(1)

    if __name__ == "__main__":
        loader = DataLoader(Slow(), batch_size=8, num_workers=1)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """
)


@pytest.mark.slow
def test_the_advised_worker_count_fits_a_faked_container_limit(tmp_path: Path):
    free = _run(tmp_path / "free", LAGGING_SCRIPT, "--skip", "12", "--steps", "6")
    f = _finding(free, "dataloader-bound")
    assert f is not None
    wanted = f["evidence"]["suggested_num_workers"]
    assert wanted >= 3, f["evidence"]
    # A limit that holds about two workers: what the job held, plus one more worker's worth.
    ev = free["findings"]
    limit_file = tmp_path / "memory.max"
    job = _job_bytes(tmp_path / "free")
    limit_file.write_text(str(int(job / 0.9) + 1))
    tight = _run(tmp_path / "tight", LAGGING_SCRIPT, "--skip", "12", "--steps", "6",
                 env={"STALLSCOPE_MEMORY_LIMIT_FILE": str(limit_file)})
    f = _finding(tight, "dataloader-bound")
    assert f is not None, ev
    evidence = f["evidence"]
    fit = evidence["memory_fit_num_workers"]
    assert fit < wanted
    assert evidence["suggested_num_workers"] <= fit
    assert "by memory" in f["recommendation"]
    assert "container limit" in f["recommendation"]


def _job_bytes(out_parent: Path) -> int:
    """The job's memory at the end of the run (sum of PSS) with its one worker's unique memory
    counted twice: a limit that holds about two workers."""
    import gzip

    trace = next((out_parent / "out" / "tensorboard").rglob("*.pt.trace.json.gz"))
    original = next(trace.parent.glob("*.original.json.gz"), trace)
    meta = json.loads(gzip.decompress(original.read_bytes()))["stallscope"]
    facts = memory.facts(meta)
    assert isinstance(facts, memory.MemoryFacts) and facts.workers
    return facts.tree_bytes + max(w.last_uss for w in facts.workers)


def test_no_committed_sample_carries_run_memory_figures():
    """Every committed recording predates the sampling: each says not assessed, with why."""
    for name in ("cpu-loader-bound.pt.trace.json.gz", "cpu-worker-startup.pt.trace.json.gz"):
        assert (SAMPLES / name).exists()
        assert worker_memory(sample(name)).status == "not_assessed"
