"""`worker-startup` and `cpu-oversubscription` on real recordings (CPU samples recorded here and
the real GPU corpus) and on RunContexts built as `stallscope run` would write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.capture.context import LoaderInfo, RunContext
from stallscope.diagnose.rules.cpu_oversubscription import cpu_oversubscription
from stallscope.diagnose.rules.worker_startup import worker_startup
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace


def sample(name: str):
    return build_model(load_trace(SAMPLES / name))


def real(name: str):
    return build_model(load_trace(real_trace(name)))


def context(cores: int = 2, threads: int = 1, workers: int = 2, persistent: bool = False,
            dataset_len: int = 96, batch_size: int = 16) -> RunContext:
    loader = LoaderInfo(
        call_site="train.py:42", num_workers=workers, pin_memory=False, batch_size=batch_size,
        prefetch_factor=2 if workers else None, persistent_workers=persistent,
        dataset=f"ImageDataset ({dataset_len} items)", dataset_len=dataset_len,
        batches=18, batches_recorded=14,
    )
    return RunContext(
        command=["stallscope", "run", "train.py"], target="train.py", dataloaders=[loader],
        environment={"cpu": {"cores_per_process": cores, "torch_threads": threads,
                             "local_processes": 1, "affinity": cores}},
    )


# ----------------------------------------------------------------------------- worker-startup


def test_respawn_each_epoch_is_found_from_the_trace_alone():
    a = worker_startup(sample("cpu-worker-startup.pt.trace.json.gz"))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["respawns_recorded"] == 2
    assert ev["boundary_steps"] == ["ProfilerStep#6", "ProfilerStep#12"]
    assert ev["steps_between_respawns"] == 6.0
    # Fork of 2 workers, joining the old ones, and the first batch's wait: all well above a
    # steady __next__ (~1 ms).
    assert ev["spawn_ms"] > 5 * ev["median_next_ms"]
    assert ev["shutdown_ms"] > 0
    assert ev["startup_ms_per_epoch"] > 5 * ev["steady_step_ms"]
    assert "persistent_workers=True" in a.finding.snippet
    assert "upper bound" in a.finding.saving_basis
    assert a.finding.severity == "high"


def test_respawn_is_amortised_over_the_epoch_the_context_gives():
    model = sample("cpu-worker-startup.pt.trace.json.gz")
    short = worker_startup(model, context(dataset_len=96))
    long = worker_startup(model, context(dataset_len=16 * 5000))
    assert short.finding.evidence["batches_per_epoch"] == 6
    assert "train.py:42" in short.finding.snippet
    # 5000 steps of ~4 ms per epoch: a ~55 ms re-spawn is immaterial.
    assert long.status == "clear"


def test_persistent_workers_reuse_workers_across_epochs():
    a = worker_startup(sample("cpu-persistent-workers.pt.trace.json.gz"))
    assert a.status == "clear"
    assert "2 epoch boundary" in a.detail


def test_context_with_only_single_process_loaders_is_clear():
    model = sample("cpu-worker-startup.pt.trace.json.gz")
    assert worker_startup(model, context(workers=0)).status == "clear"


def test_persistent_loader_rebuilt_each_epoch_gets_other_advice():
    model = sample("cpu-worker-startup.pt.trace.json.gz")
    a = worker_startup(model, context(persistent=True))
    assert a.status == "finding"
    assert "rebuilt" in a.finding.recommendation


def test_single_process_loader_is_clear():
    name = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
    a = worker_startup(real(name))
    assert a.status == "clear"
    assert worker_startup(sample("cpu-loader-bound.pt.trace.json.gz")).status == "clear"


@pytest.mark.parametrize("name", [
    "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz",
    "hta/cpu_only_rank0_dataloader.pt.trace.json.gz",
])
def test_multi_process_window_without_epoch_boundary_is_not_assessed(name: str):
    a = worker_startup(real(name))
    assert a.status == "not_assessed"
    assert "no epoch boundary" in a.detail


def test_no_loader_is_not_assessed():
    a = worker_startup(real("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"))
    assert a.status == "not_assessed"


# ---------------------------------------------------------------------- cpu-oversubscription


def test_gpu_training_is_not_assessed():
    model = real("kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz")
    a = cpu_oversubscription(model, context(cores=2, threads=8, workers=4))
    assert a.status == "not_assessed"
    assert "GPU" in a.detail


def test_cpu_trace_without_context_needs_stallscope_run():
    a = cpu_oversubscription(sample("cpu-loader-bound.pt.trace.json.gz"))
    assert a.status == "not_assessed"
    assert "stallscope run" in a.detail


def test_threads_and_workers_within_cores_are_clear():
    model = sample("cpu-worker-startup.pt.trace.json.gz")
    assert cpu_oversubscription(model, context(cores=4, threads=2, workers=2)).status == "clear"
    assert cpu_oversubscription(model, context(cores=2, threads=2, workers=0)).status == "clear"


def test_oversubscribed_with_loader_waits_is_estimated():
    # 2 workers that make the step wait ~40% of its time on batches (the symptom).
    model = sample("cpu-persistent-workers.pt.trace.json.gz")
    a = cpu_oversubscription(model, context(cores=2, threads=2, workers=2))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["threads_wanted"] == 4
    assert ev["loader_wait_share_pct"] >= 5
    assert a.finding.estimated_saving_pct > 0
    assert "torch.set_num_threads(1)" in a.finding.snippet


def test_oversubscribed_without_symptom_is_info_only():
    # A real CPU-only trace whose step never waits on a loader.
    model = real("hta/cpu_only_rank34of300_gloo.pt.trace.json.gz")
    a = cpu_oversubscription(model, context(cores=2, threads=2, workers=2))
    assert a.status == "finding"
    assert a.finding.evidence["loader_wait_share_pct"] < 5
    assert a.finding.severity == "info"
    assert "not estimable" in a.finding.saving_basis


def test_samples_exist():
    for name in ("cpu-worker-startup", "cpu-persistent-workers"):
        path = Path(SAMPLES / f"{name}.pt.trace.json.gz")
        assert path.stat().st_size < 300_000


def test_workers_and_threads_come_as_one_change():
    """A CPU run whose loader needs workers on cores the step's threads already use: the loader
    advice sets both (a spawn script was once told "2 workers" in one finding and
    "set_num_threads(1) instead" in another, where only both together were best)."""
    from stallscope.diagnose import diagnose
    from stallscope.diagnose.rules.dataloader_bound import dataloader_bound

    model = sample("cpu-loader-bound.pt.trace.json.gz")
    ctx = context(cores=2, threads=2, workers=0)
    f = dataloader_bound(model, ctx).finding
    assert f.evidence["suggested_num_workers"] >= 1
    assert f.evidence["suggested_torch_threads"] == 1
    assert "torch.set_num_threads(1)" in f.snippet and "num_workers=" in f.snippet
    # Nothing says "threads instead": the current 2 threads + 0 workers fit the 2 cores.
    assert cpu_oversubscription(model, ctx).status == "clear"
    # Already oversubscribed (2 threads + 1 worker on 2 cores) and told to add workers: the
    # threads are a finding of their own (issue 30: their own change and saving), with the
    # same thread count as the loader's change, and it says so: never "threads instead".
    over = context(cores=2, threads=2, workers=1)
    g = dataloader_bound(model, over).finding
    assert g.evidence["suggested_num_workers"] == 2 and g.evidence["suggested_torch_threads"] == 1
    # The diagnosis hands the loader's finding to this rule (no rule runs another).
    a = next(x for x in diagnose(model, over) if x.rule == "cpu-oversubscription")
    assert a.status == "finding" and a.finding.evidence["suggested_torch_threads"] == 1
    assert "torch.set_num_threads(1)" in a.finding.snippet
    assert "dataloader-bound's change sets the same thread count" in a.finding.saving_basis
    alone = cpu_oversubscription(model, over)  # without it, the same finding, no such note
    assert alone.finding.evidence == a.finding.evidence
    assert "dataloader-bound's change" not in alone.finding.saving_basis
    assert "--set torch_threads=1" in a.finding.recommendation
    # Enough cores for both: no thread change.
    roomy = dataloader_bound(model, context(cores=16, threads=2, workers=0)).finding
    assert "suggested_torch_threads" not in roomy.evidence
