"""`cpu-oversubscription`: CPU training whose intra-op threads plus loader workers (torch runs
one thread in each worker) want more cores than the process has. The trace holds neither the
core count nor the thread settings, so the rule needs the RunContext of `stallscope run`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stallscope import units
from stallscope.diagnose.common import host_total, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.hostload import other_load
from stallscope.diagnose.spec import Change, Metric, RuleSpec, evidence_key
from stallscope.replay.threads import OneThread
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.units import percent

RULE_ID = "cpu-oversubscription"

# Loader wait share (of step time) from which the trace shows the workers falling behind: the
# same 5% where `dataloader-bound` flags input stalls.
OVERSUB_WAIT_SYMPTOM_PCT = 5.0
OVERSUB_DOCS = "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html"


def cpu_oversubscription(model: TraceModel, context: RunContext | None = None,
                         found: Mapping[str, Finding] | None = None) -> Assessment:
    """`found`: the findings made before on this trace (diagnose() passes them), by id;
    `dataloader-bound`'s is read, never made again here."""
    if model.has_gpu:
        return Assessment(
            RULE_ID, "not_assessed",
            "A GPU run: this rule judges CPU-only runs, where the step's compute runs on "
            "the same cores as the loader workers.",
        )
    if not model.steps:
        return Assessment(RULE_ID, "not_assessed", "No steps in the trace.")
    measured = measure(model, context)
    if isinstance(measured, Assessment):
        return measured
    verdict = judge(measured)
    if verdict is not None:
        return verdict
    return Assessment.found(advise(model, measured, found))


@dataclass(frozen=True)
class Demand:
    """The threads the run wants against the cores it may use, and the step's figures."""

    threads: int
    workers: int
    cores: int
    worker_cores: float  # the cores the workers keep busy (fewer when they wait on storage)
    busy_workers: int
    demand: int
    compute_us: float  # the step's host compute, summed over the steps
    total_us: float
    n: int
    loader: Any
    busy: Any  # other load (diagnose/hostload.py), or None
    one: OneThread | None
    evidence: dict[str, Any]


def measure(model: TraceModel, context: RunContext | None) -> Demand | Assessment:
    """The run's settings and the step's figures, or why they are not known (needs `run`)."""
    cpu = (context.environment.get("cpu", {}) if context else {}) or {}
    cores = context.cores_per_process if context else None
    threads = cpu.get("torch_threads")
    if context is None or cores is None or not isinstance(threads, int):
        return Assessment(
            RULE_ID, "not_assessed",
            "The trace holds neither the cores this process may use nor its thread and worker "
            "settings: needs `stallscope run`.",
        )
    loader = context.training_loader()
    workers = loader.num_workers if loader else 0
    # torch sets one intra-op thread in each DataLoader worker process. A loader measured as
    # waiting on storage (capture/anatomy.py) keeps its workers off the cores most of the time:
    # they count by the CPU share measured inside them, as dataloader-bound sizes them.
    worker_cores = float(workers)
    share = (loader.anatomy or {}).get("cpu_busy_share") if loader else None
    if loader is not None and loader.bound == "waiting" and isinstance(share, int | float):
        worker_cores = workers * float(share)
    busy_workers = math.ceil(worker_cores - 1e-9)
    demand = threads + busy_workers
    total = model.total_step_us
    n = len(model.steps)
    wait = sum(s.loader_wait_us for s in model.steps)
    compute = host_total(model, "host_compute")
    evidence: dict[str, Any] = {
        "cores_per_process": cores,
        "torch_threads": threads,
        "num_workers": workers,
        "threads_wanted": demand,
        "local_processes": cpu.get("local_processes"),
        "loader_wait_share_pct": pct(wait, total),
        "host_compute_ms_per_step": ms(compute / n),
        "step_ms_mean": ms(total / n),
    }
    busy = other_load(model, context)
    if busy is not None:
        evidence["other_cpu_share_pct"] = busy.share_pct
    one = OneThread.of(model)
    if one is not None:  # measured by `run` just before recording (capture/threadprobe.py)
        evidence["one_thread_step_ms"] = ms(one.step_us)
        evidence["one_thread_step_measured_ms"] = ms(one.measured_us)
    return Demand(threads, workers, cores, worker_cores, busy_workers, demand, compute, total, n,
                  loader, busy, one, evidence)


def judge(d: Demand) -> Assessment | None:
    """Clear when the threads fit the cores; not assessed when they fit but other load was
    there; None: oversubscribed, a finding."""
    threads, workers, cores, busy = d.threads, d.workers, d.cores, d.busy
    if d.demand <= cores and busy is not None:
        # Not "clear": the cores were contended, only not by this run's threads.
        return Assessment(
            RULE_ID, "not_assessed",
            f"{plural(threads, 'intra-op thread')} + {plural(workers, 'loader worker')} fit the "
            f"{plural(cores, 'core')} "
            f"this process may use, but {busy.clause}: any contention came from them, not from "
            "this run's threads. Re-record on a quiet machine to judge.",
        )
    if d.demand <= cores:
        return Assessment(
            RULE_ID, "clear",
            f"{plural(threads, 'intra-op thread')} + {plural(workers, 'loader worker')} fit the "
            f"{plural(cores, 'core')} "
            "this process may use"
            + (f" (the workers wait on storage: together they keep {d.worker_cores:.1f} cores "
               "busy)." if d.busy_workers < workers else "."),
        )
    return None


def _saving(d: Demand) -> tuple[bool, float, str]:
    """Whether the step shows the symptom (it waits for batches), the saving and its basis."""
    demand, cores, evidence = d.demand, d.cores, d.evidence
    excess = (demand - cores) / demand
    symptom = evidence["loader_wait_share_pct"] >= OVERSUB_WAIT_SYMPTOM_PCT
    if symptom:
        saving = pct(excess * d.compute_us / d.n, d.total_us / d.n)
        basis = (
            f"estimate, not a bound: under fair time-sharing {demand} runnable threads on "
            f"{plural(cores, 'core')} leave the step's compute {percent(100 * excess, 0)} short of "
            "CPU while the workers run, and the trace shows them running (the step waits "
            f"{percent(evidence['loader_wait_share_pct'])} on batches); OpenMP barriers can make "
            "the real cost larger, idle workers smaller"
        )
    else:
        saving = 0.0
        basis = (
            "not estimable from this trace: the step barely waits for batches, so the workers "
            "may idle on a full prefetch queue much of the time; measure the step time with "
            "the thread count below"
        )
    return symptom, saving, basis


def advise(model: TraceModel, d: Demand, found: Mapping[str, Finding] | None) -> Finding:
    """The finding: the thread count that leaves a core per busy worker, and how to set it."""
    threads, workers, cores, busy, one = d.threads, d.workers, d.cores, d.busy, d.one
    evidence, loader, demand = d.evidence, d.loader, d.demand
    symptom, saving, basis = _saving(d)
    fit = max(cores - d.busy_workers, 1)
    plain = _median_unprofiled(model)  # the same steps at the script's threads, as timed
    evidence["suggested_torch_threads"] = fit
    joint = (found or {}).get("dataloader-bound") if symptom else None
    if joint is not None and joint.evidence.get("suggested_torch_threads") == fit:
        basis += (f"; dataloader-bound's change sets the same thread count with its "
                  f"{joint.evidence.get('suggested_num_workers')} workers")
    where = f"{loader.call_site}: " if loader else ""
    precondition = (
        "A CPU-only run whose loader workers are busy while the step computes; with fewer "
        "intra-op threads each op is less parallel, so check the step time after the change."
    )
    if busy is not None:
        # Other load is not this run's threads': say so rather than count it as theirs.
        basis += (f"; {busy.clause}, so part of the contention the step saw was theirs, which "
                  "no thread setting here removes")
        precondition += f" {busy.caveat}"
    return Finding(
        id=RULE_ID,
        title=(
            f"CPU oversubscribed: {threads} intra-op threads + {workers} loader workers on "
            f"{plural(cores, 'core')}"
        ),
        evidence=evidence,
        recommendation=(
            f"{where}The step's intra-op threads and the DataLoader workers want {demand} cores "
            f"but this process may use {cores}: they preempt each other, and a preempted "
            "OpenMP thread stalls the whole parallel region. Give the step "
            f"{plural(fit, 'thread')} "
            "and leave one core per worker, or use fewer workers."
            + (" Timed without the profiler just before recording: "
               f"{units.ms(one.measured_us, 'tenths')} ms per step at one thread, "
               f"{units.ms(plain, 'tenths')} ms at {threads}."
               if one is not None and plain else "")
            + f" Try it without editing the script: stallscope run --set torch_threads={fit}."
        ),
        snippet=(
            f"torch.set_num_threads({fit})  # cores ({cores}) - num_workers ({workers})\n"
            f"# or, before Python starts: OMP_NUM_THREADS={fit} python train.py"
        ),
        precondition=precondition,
        estimated_saving_pct=saving,
        saving_basis=basis,
        docs=OVERSUB_DOCS,
    )


def _median_unprofiled(model: TraceModel) -> float | None:
    """The median of the steps `run` timed without the profiler just before recording (at the
    script's own thread count), from the trace's metadata; None without them."""
    steps = model.trace.capture.get("unprofiled_steps_us")
    try:
        return statistics.median(float(v) for v in steps) if steps else None
    except (TypeError, ValueError):
        return None


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    n = finding.evidence.get("suggested_torch_threads")
    return [Change("torch_threads", str(int(n)))] if isinstance(n, int) and n > 0 else []


def threads_over(evidence: dict[str, Any]) -> float | None:
    """Compare's quantity: the threads wanted beyond the cores."""
    wanted = evidence_key("threads_wanted")(evidence)
    cores = evidence_key("cores_per_process")(evidence)
    return None if wanted is None or cores is None else wanted - cores


SPEC = RuleSpec(
    id=RULE_ID,
    title="intra-op threads plus loader workers want more cores than the process has",
    summary="CPU training: intra-op threads plus loader workers exceed the cores (needs `run`)",
    check=cpu_oversubscription,
    thresholds={"OVERSUB_WAIT_SYMPTOM_PCT": OVERSUB_WAIT_SYMPTOM_PCT},
    what_if=("torch_threads",),
    changes=changes,
    reads=("dataloader-bound",),
    order=150,
    metric=Metric("threads wanted beyond the cores", "threads", threads_over,
                  reads=("threads_wanted", "cores_per_process")),
)
