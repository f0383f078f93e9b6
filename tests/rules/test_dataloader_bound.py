"""`dataloader-bound`: the training step waits for the next batch, on real GPU and CPU traces
(sample_traces/public, committed)."""

from __future__ import annotations

import pytest

from tests.conftest import real_trace, report_of

NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
NW4 = [
    "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
    "kineto/resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz",
]


def findings(report, rule: str) -> list:
    return [f for f in report.findings if f.id == rule]


def test_resnet50_single_process_loader_is_dataloader_bound():
    report = report_of(real_trace(NW0))
    (f,) = findings(report, "dataloader-bound")
    # The TensorBoard plugin's own figure for this span: DataLoader 33.37% of the step.
    assert abs(f.evidence["wait_share_pct"] - 33.4) <= 3.0
    assert f.evidence["loader_share_pct"] >= f.evidence["wait_share_pct"]
    assert f.evidence["loader_kind"] == "single-process"
    assert "num_workers=" in f.snippet
    assert f.severity == "high"


@pytest.mark.parametrize("name", NW4)
def test_resnet50_multi_process_loader_is_not_dataloader_bound(name: str):
    report = report_of(real_trace(name))
    assert not findings(report, "dataloader-bound")
    verdict = {a["rule"]: a["status"] for a in report.assessments}
    assert verdict["dataloader-bound"] == "clear"


def test_a_torch2_cpu_trace_with_a_dominant_loader_is_dataloader_bound():
    from tests.conftest import SAMPLES

    report = report_of(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")
    (f,) = findings(report, "dataloader-bound")
    # CPU-only: no GPU to overlap with, so the wait is the whole loader share.
    assert f.evidence["wait_share_pct"] == f.evidence["loader_share_pct"]
    assert f.evidence["wait_share_pct"] > 50
    statuses = {a["rule"]: a["status"] for a in report.assessments}
    assert statuses["pageable-h2d-copy"] == "not_assessed"
    assert statuses["host-device-sync"] == "not_assessed"


# ---------------------------------------------------------------- threads and workers as one


WAITING = {"where": "main process", "bound": "waiting", "fetch_ms_per_batch": 100.0,
           "fetch_cpu_share": 0.05, "cpu_busy_share": 0.05, "blocked_share": 0.95}


def _storage_on_two_threads(one_thread_other_us: float):
    """cpu-replay-io-w0 (a storage-waiting loader in the training process, 2 cores: steps of
    about 143 ms, 104 ms of them loading) as recorded with two intra-op threads whose other
    work stalled (39 ms), and `run`'s one-thread probe: the same loading, and
    `one_thread_other_us` of other work."""
    from stallscope.runfacts import LoaderInfo
    from tests.rules.builders import context, sample

    model = sample("cpu-replay-io-w0.pt.trace.json.gz")
    load = 104_000.0
    step = load + one_thread_other_us
    model.trace.capture["thread_probe"] = {
        "threads": 2, "probe_threads": 1, "steps_us": [step] * 5, "loader_wait_us": [load] * 5}
    ctx = context(cores=2, threads=2, workers=0)
    info = ctx.dataloaders[0]
    ctx.dataloaders[0] = LoaderInfo(**{**info.__dict__, "bound": "waiting",
                                       "anatomy": dict(WAITING)})
    return model, ctx


def test_threads_set_to_one_size_their_workers_from_the_one_thread_step():
    """A live run (a loader waiting on storage, 2 cores, two intra-op threads) was told
    "torch_threads=1 + num_workers=2", sized from the two-thread step's stalled other work;
    timed plainly at one thread, 8 workers ran 4x faster than 2. The workers that come with one
    thread are sized from the step `run` timed at one thread, and the advice says both."""
    from stallscope.diagnose.rules.dataloader_bound import dataloader_bound

    model, ctx = _storage_on_two_threads(9_000.0)
    f = dataloader_bound(model, ctx).finding
    ev = f.evidence
    assert ev["suggested_torch_threads"] == 1
    # 104 ms of loading over 9 ms of other work at one thread, plus a spare: 13, capped at 4
    # workers per core for a waiting loader; at the two threads' 39 ms it would be 4.
    assert ev["suggested_num_workers"] == 8 and ev["ideal_num_workers"] == 13
    assert ev["num_workers_script_threads"] == 4
    assert ev["other_work_ms_one_thread"] == pytest.approx(9.0, abs=0.1)
    assert ev["other_work_ms_script_threads"] > 30
    assert "9.0 ms of other work, which gives 8 workers" in f.recommendation
    assert "which would give 4 workers" in f.recommendation
    assert "num_workers=8" in f.snippet and "torch.set_num_threads(1)" in f.snippet
    # The plan replays the two as one change, on the probe's one-thread step.
    from stallscope.diagnose.registry import changes_for
    from stallscope.diagnose.spec import Change

    assert changes_for(f, model) == [Change("torch_threads", "1"), Change("num_workers", "8")]


def test_without_the_probe_the_workers_keep_the_recorded_steps_sizing():
    from stallscope.diagnose.rules.dataloader_bound import dataloader_bound

    model, ctx = _storage_on_two_threads(9_000.0)
    del model.trace.capture["thread_probe"]
    ev = dataloader_bound(model, ctx).finding.evidence
    assert ev["suggested_num_workers"] == 4 and "num_workers_script_threads" not in ev
