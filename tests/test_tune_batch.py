"""`stallscope tune --batch-sizes`: the fit that predicts a batch size's peak memory, the refusal
of one that would not fit, samples per second with intervals, and (slow) a real script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stallscope.commands import tune_batch
from stallscope.commands.tune import RunResult, render_markdown, sweep
from stallscope.commands.tune_batch import Limit, Peak, fit_line, judge, parse_sizes, run_peak
from stallscope.report.tune_writers import render_terminal
from tests.test_tune import report

MB = 1 << 20


# ---------------------------------------------------------------- the fit and the refusal


def test_a_line_through_two_batch_sizes_splits_the_peak_into_held_and_per_sample():
    fit = fit_line([(16, 300 * MB + 16 * 2 * MB), (32, 300 * MB + 32 * 2 * MB)])
    assert fit is not None and not fit.proportional
    assert round(fit.held_bytes / MB) == 300 and round(fit.per_sample_bytes / MB, 3) == 2.0
    assert round(fit.at(128) / MB) == 300 + 256


def test_repeats_of_one_size_count_at_their_largest_peak():
    fit = fit_line([(16, 100 * MB), (16, 140 * MB), (32, 172 * MB)])
    assert fit is not None and round(fit.per_sample_bytes / MB, 2) == 2.0  # (172 - 140) / 16


def test_the_two_largest_sizes_set_the_line_where_a_high_water_mark_hides_small_batches():
    # The step's 1 MB per sample shows only above what start-up already peaked at (400 MB).
    fit = fit_line([(8, 400 * MB), (16, 400 * MB), (32, 416 * MB), (64, 448 * MB)])
    assert fit is not None and round(fit.per_sample_bytes / MB, 3) == 1.0
    assert round(fit.at(512) / MB) == 448 + 448


def test_one_batch_size_alone_is_taken_as_proportional_an_upper_bound():
    fit = fit_line([(32, 320 * MB)])
    assert fit is not None and fit.proportional and fit.held_bytes == 0
    assert fit.at(64) == 640 * MB
    assert fit_line([]) is None


def test_a_peak_that_falls_with_the_batch_is_noise_not_negative_memory():
    fit = fit_line([(16, 400 * MB), (32, 390 * MB)])
    assert fit is not None and fit.per_sample_bytes == 0.0 and fit.at(1024) == 400 * MB


def test_a_batch_size_whose_predicted_peak_exceeds_the_limit_is_refused_and_says_why():
    host = [(16, 300 * MB + 16 * 8 * MB), (32, 300 * MB + 32 * 8 * MB)]
    limit = Limit(1024 * MB, "the container's limit (/tmp/limit)")
    fits, refused = judge(64, host, limit, [], None)
    assert refused is None and fits[0].fits  # 812 MB <= 90% of 1024 MB
    found, refused = judge(128, host, limit, [], None)
    assert refused is not None and not found[0].fits
    assert found[0].predicted_bytes == 300 * MB + 128 * 8 * MB
    assert "would not fit: batch size 128: host memory peak predicted 1324 MB" in refused
    assert "300 MB held + 8.00 MB per sample, through the peaks at batch sizes 16 and 32" in refused
    assert "exceeds 90% of 1024 MB, the container's limit (/tmp/limit)" in refused


def test_a_batch_below_one_measured_is_bounded_by_that_sizes_peak():
    found, refused = judge(8, [(32, 400 * MB)], Limit(1024 * MB, "machine"), [], None)
    assert refused is None and found[0].predicted_bytes == 400 * MB
    assert "at most the peak measured at batch size 32" in found[0].text()


def test_the_device_is_judged_against_its_capacity_too():
    host = [(16, 100 * MB), (32, 110 * MB)]
    device = [(16, 2000 * MB), (32, 3900 * MB)]
    found, refused = judge(64, host, Limit(64 << 30, "machine"), device,
                           Limit(6000 * MB, "the device's capacity"))
    assert [p.kind for p in found] == ["host memory", "device memory"]
    assert refused is not None and refused.startswith("would not fit: batch size 64: device")


def test_nothing_to_judge_runs_the_candidate():
    assert judge(64, [], Limit(MB, "x"), [], None) == ([], None)
    assert judge(64, [(32, 100 * MB)], None, [], None) == ([], None)


def test_the_host_limit_is_the_file_worker_memory_reads(tmp_path: Path):
    (tmp_path / "limit").write_text(str(768 * MB))
    limit = tune_batch.host_limit(env={"STALLSCOPE_MEMORY_LIMIT_FILE": str(tmp_path / "limit")})
    assert limit == Limit(768 * MB, f"the container's limit ({tmp_path / 'limit'})")
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    limit = tune_batch.host_limit(env={"STALLSCOPE_MEMORY_LIMIT_FILE": str(tmp_path / "none")},
                                  meminfo_path=str(tmp_path / "meminfo"))
    assert limit == Limit(500 * 1024, "the memory available on the machine")


def test_a_runs_peak_is_the_high_water_mark_plus_the_workers_own_memory():
    mem = {"processes": [
        {"role": "main", "rss_bytes": [100 * MB, 120 * MB], "peak_rss_bytes": 180 * MB},
        {"role": "worker", "uss_bytes": [5 * MB, 9 * MB]},
        {"role": "worker", "uss_bytes": [6 * MB]}],
        "device": [{"peak_reserved_bytes": 3 << 30, "total_bytes": 16 << 30},
                   {"peak_reserved_bytes": None, "peak_allocated_bytes": 4 << 30,
                    "total_bytes": 16 << 30}]}
    assert run_peak(mem) == Peak(195 * MB, 4 << 30, 16 << 30)
    assert run_peak({"off": "STALLSCOPE_MEMORY_SAMPLING=0"}) is None and run_peak(None) is None


def test_batch_sizes_are_auto_or_whole_numbers():
    assert parse_sizes("auto").sizes is None
    assert parse_sizes("64, 16,64").sizes == (16, 64)
    with pytest.raises(ValueError, match="not a batch size"):
        parse_sizes("16,big")
    assert tune_batch.candidate_sizes(None, 32) == [16, 64, 128]
    assert tune_batch.candidate_sizes(None, 1) == [2, 4]
    assert tune_batch.candidate_sizes((8, 32), 32) == [8]


# ---------------------------------------------------------------- the sweep


class BatchMachine:
    """A script whose step takes `fixed_ms + per_sample_ms * batch` and whose peak memory is
    `held_mb + per_sample_mb * batch`, on a clock that advances 10 s per run."""

    def __init__(self, fixed_ms: float, per_sample_ms: float, held_mb: float,
                 per_sample_mb: float) -> None:
        self.fixed_ms, self.per_sample_ms = fixed_ms, per_sample_ms
        self.held_mb, self.per_sample_mb = held_mb, per_sample_mb
        self.now = 0.0
        self.launched: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.now

    def launch(self, overrides: dict[str, Any], timeout: float | None) -> RunResult:
        k = sum(1 for o in self.launched if o == overrides)
        self.launched.append(overrides)
        self.now += 10.0
        batch = overrides.get("batch_size", 32)
        us = (self.fixed_ms + self.per_sample_ms * batch) * 1000 * (1.0, 1.02)[k % 2]
        result = RunResult(0, 10.0, us, [us * f for f in (0.99, 1.0, 1.01)], None,
                           report(suggested=None, step_us=us))
        result.peak = Peak(round((self.held_mb + self.per_sample_mb * batch) * MB))
        return result


def test_batch_sizes_are_compared_in_samples_per_second_and_one_over_the_limit_is_refused():
    # 20 ms fixed + 0.5 ms per sample: a larger batch has longer steps but more samples per
    # second; 200 MB held + 4 MB per sample against 1000 MB: 128 would need 712 MB (fits 900),
    # so the limit is set to refuse it: 600 MB (540 usable).
    machine = BatchMachine(20.0, 0.5, 200.0, 4.0)
    limit = Limit(600 * MB, "the container's limit (/x)")
    result = sweep(machine.launch, repeats=2, budget_s=1000, clock=machine.clock,
                   batches=tune_batch.Asked(None), limit=limit)
    batch = [o.get("batch_size") for o in machine.launched if "batch_size" in o]
    assert batch == [16, 64, 16, 64]  # smallest first; 128 never launched
    section = result["batch_sizes"]
    rows = {r["batch_size"]: r for r in section["rows"]}
    assert sorted(rows) == [16, 32, 64, 128]
    assert rows[128]["status"] == "refused" and "would not fit" in rows[128]["refused"]
    assert "exceeds 90% of 600 MB" in rows[128]["refused"]
    # samples per second: 32 samples / 36 ms = 888.9/s at the script's batch
    assert rows[32]["samples_per_s"] == pytest.approx(32 / 0.0363, rel=0.02)
    assert rows[64]["samples_per_s"] > rows[32]["samples_per_s"] > rows[16]["samples_per_s"]
    low, high = rows[64]["samples_per_s_range"]
    assert low <= rows[64]["samples_per_s"] <= high
    assert rows[64]["verdict"] == "faster" and rows[16]["verdict"] == "slower"
    assert section["best"] == 64 and section["change"] == "DataLoader(..., batch_size=64)"
    assert section["fit"]["batch_sizes"] == [32, 64]
    assert round(section["fit"]["per_sample_bytes"] / MB, 2) == 4.0
    # The batch sizes never become the workers' winner: step time does not compare across them.
    assert all("batch_size" not in c["overrides"] for c in result["candidates"])
    doc = {**result, "script": "x.py", "command": "stallscope tune x.py"}
    text = render_markdown(doc)
    assert "## Batch sizes" in text and "learning rate follows the batch size" in text
    term = render_terminal(doc, Path("/tmp/out"))
    assert "batch_size=128" in term and "would not fit" in term and "Caveat:" in term
    # a size whose run recorded no trace: its peak says so, not an empty figure
    rows[64]["peak_memory"] = None
    line = next(ln for ln in render_terminal(doc, Path("/tmp/out")).splitlines()
                if "batch_size=64" in ln)
    assert line.endswith("peak not measured"), line


def test_without_batch_sizes_nothing_changes():
    machine = BatchMachine(20.0, 0.5, 200.0, 4.0)
    result = sweep(machine.launch, repeats=2, budget_s=1000, clock=machine.clock)
    assert "batch_sizes" not in result
    assert not any("batch_size" in o for o in machine.launched)


def test_a_loader_without_a_batch_size_says_none_was_tried():
    machine = BatchMachine(20.0, 0.5, 200.0, 4.0)
    real = machine.launch

    def launch(overrides: dict[str, Any], timeout: float | None) -> RunResult:
        r = real(overrides, timeout)
        assert r.report is not None
        r.report["dataloaders"][0]["batch_size"] = None
        return r

    result = sweep(launch, repeats=1, budget_s=1000, clock=machine.clock,
                   batches=tune_batch.Asked(None), limit=None)
    assert "takes no batch_size" in result["batch_sizes"]["why_not"]
    assert result["batch_sizes"]["rows"] == []


# ---------------------------------------------------------------- a real script

# Each step holds a workspace of 4 MB per sample (each sample's 256 features widened 4096-fold,
# as an augmentation's scratch might be) beside a small model: the training process's peak grows
# by about 4 MB per sample, far above the floor of what start-up and the profiler peak at (a
# high-water mark hides a step below it) and clear of run-to-run noise.
BATCH_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=32)
    for x, y in loader:
        work = x.unsqueeze(2).expand(-1, -1, 4096).contiguous()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y) + 0.0 * work.mean()
        loss.backward()
        opt.step()
        del work
"""


@pytest.mark.slow
def test_tune_measures_batch_sizes_in_samples_per_second_and_refuses_one_over_the_limit(
        tmp_path: Path):
    """Two or more sizes are measured (16, the script's 32 as the reference, 64), and a limit
    file set between the peaks of 64 and 512 refuses 512 before it runs; the line through the
    two largest sizes finds the step's memory per sample."""
    (tmp_path / "train.py").write_text(BATCH_SCRIPT)
    probe = tmp_path / "probe"
    first = subprocess.run([sys.executable, "-m", "stallscope", "run", "-q", "-o", str(probe),
                            "--steps", "2", "train.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr
    from stallscope.commands.tune import run_peak

    peak = run_peak(json.loads((probe / "report.json").read_text()))
    assert peak is not None and peak.host_bytes
    # About 4 MB per sample: 64 needs some 128 MB over 32's peak, 512 some 1.9 GB. A limit of
    # 32's peak plus 300 MB, over the 90% margin, holds 64 (a line from 16 and 32 cannot
    # predict it higher than the true slope allows: 16's peak is never below its own) and
    # refuses 512.
    limit_file = tmp_path / "limit"
    limit_file.write_text(str(round((peak.host_bytes + 300 * (1 << 20)) / 0.9)))
    out = tmp_path / "tune"
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "tune", "-o", str(out), "--repeats", "2",
         "--budget", "900", "--batch-sizes", "16,64,512", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False,
        env={**os.environ, "STALLSCOPE_MEMORY_LIMIT_FILE": str(limit_file)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "tune.json").read_text())
    section = result["batch_sizes"]
    rows = {r["batch_size"]: r for r in section["rows"]}
    measured = [b for b, r in rows.items() if r["status"] == "measured"]
    assert len(measured) >= 2, section
    for b in measured:
        low, high = rows[b]["samples_per_s_range"]
        assert 0 < low <= rows[b]["samples_per_s"] <= high, rows[b]
        assert rows[b]["peak_memory"]["host_bytes"] > 0
    assert rows[512]["status"] == "refused", section
    assert str(limit_file) in rows[512]["refused"]
    assert rows[16]["peak_memory"]["host_bytes"] < rows[512]["predicted_memory"][0][
        "predicted_bytes"]
    assert 3.0 < section["fit"]["per_sample_bytes"] / (1 << 20) < 6.0, section["fit"]
    assert "batch_size=512" in proc.stdout and "would not fit" in proc.stdout
    assert "learning rate follows the batch size" in proc.stdout
    html = (out / "tune.html").read_text()
    assert 'id="batch-table"' in html and "refused" in html
