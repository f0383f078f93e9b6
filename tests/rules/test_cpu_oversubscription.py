"""`cpu-oversubscription`: intra-op threads plus loader workers that want more cores than the
process has, on CPU samples recorded here and on RunContexts built as `stallscope run` would
write them."""

from __future__ import annotations

from stallscope.diagnose.rules.cpu_oversubscription import cpu_oversubscription
from tests.rules.builders import context, real, sample


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
