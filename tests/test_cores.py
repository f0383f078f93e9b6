"""Cores are read from the trace's metadata wherever it carries them (trace/cores.py): the
process's as `stallscope run` recorded them, else the recording machine's; the loader replay and
the worker advice share those cores between the step and its workers, and say which they read
or that they assumed cores of the workers' own."""

from __future__ import annotations

from pathlib import Path

from stallscope.trace.cores import Cores, cores_of
from stallscope.trace.load import load_trace
from tests.conftest import SAMPLES, real_trace, report_of, write_trace

LOADER_BOUND = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
IO_W0 = SAMPLES / "cpu-replay-io-w0.pt.trace.json.gz"


def test_cores_come_from_run_else_from_the_recording_machine(tmp_path: Path) -> None:
    assert cores_of(load_trace(IO_W0)) == Cores(2, "process")
    assert cores_of(load_trace(LOADER_BOUND)) == Cores(2, "machine")
    assert cores_of(load_trace(real_trace("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"))
                    ) is None
    # `run`'s count (the process's share of the machine) wins over the machine's.
    both = write_trace(tmp_path / "both.pt.trace.json", [],
                       stallscope={"host": {"cores_per_process": 4}},
                       stallscope_sample={"cpus": 16})
    assert cores_of(load_trace(both)) == Cores(4, "process")
    odd = write_trace(tmp_path / "odd.pt.trace.json", [], stallscope_sample={"cpus": "2"})
    assert cores_of(load_trace(odd)) is None


def test_the_loader_bound_sample_gets_no_more_workers_than_its_two_cores() -> None:
    # cpu-loader-bound: 9.5 ms of in-process CPU loading per step beside 1.7 ms of other
    # work, recorded on a machine whose metadata says `cpus: 2`. Seven workers "of their own
    # cores" were advised and replayed to 3.3 ms; on two cores the loading and the step's work
    # share them, and the replay says which cores and what it took as given.
    report = report_of(LOADER_BOUND)
    (loader,) = [f for f in report.findings if f.id == "dataloader-bound"]
    assert loader.evidence["suggested_num_workers"] == 2
    entry = report.plan_entry(loader)
    assert entry["change"] == "num_workers=2"
    said = " ".join(entry["assumptions"])
    assert "2 cores (the recording machine's, as the trace's metadata says)" in said
    assert "taken as 1.0 core busy: the trace does not say" in said
    assert "cores of their own" not in said
    # the step's CPU work (about 11 ms a step) cannot spread over more than two cores
    assert entry["predicted_step_us"] > 5_000


def test_a_loader_measured_waiting_on_storage_is_not_capped_at_the_cores() -> None:
    # cpu-replay-io-w0: run recorded 2 cores and a fetch that is 6% CPU: its workers need no
    # core each (4 workers measured 44.1 ms a step, docs/replay.md).
    report = report_of(IO_W0)
    (loader,) = [f for f in report.findings if f.id == "dataloader-bound"]
    assert loader.evidence["suggested_num_workers"] == 4
    said = " ".join(report.plan_entry(loader)["assumptions"])
    assert "2 cores shared by the step's own work (1.0 cores busy while it ran)" in said
    assert "6% of a fetch was CPU" in said
