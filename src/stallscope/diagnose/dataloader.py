"""`dataloader-bound`: the training step waits for the next batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stallscope.capture.context import LoaderInfo, RunContext
from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.hostload import other_load
from stallscope.diagnose.knobs import Knobs
from stallscope.replay.loader import LoaderFacts
from stallscope.trace.model import TraceModel

RULE_ID = "dataloader-bound"
# Share of step wall time the host waits in DataLoader.__next__ with no GPU work running.
# 5% is where the anchors (TensorBoard plugin, Nsight's rules) start flagging input stalls.
WAIT_THRESHOLD_PCT = 5.0
# Below this share of the step, a projected gain from more workers is within noise: no advice.
MIN_GAIN = 0.02
DOCS = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"
# A loader that waits on storage takes little CPU per worker: its workers may outnumber the
# cores, up to this many per core (each still holds memory and a process; beyond it the gain
# is usually the storage's own limit, which more workers do not lift).
WAITING_WORKERS_PER_CORE = 4


def dataloader_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if model.loader_kind is None:
        return Assessment(
            RULE_ID,
            "not_assessed",
            "No DataLoader __next__ events on the stepping thread (a custom input loop, or the "
            "loader ran outside the profiled steps): data-loading time could not be measured.",
        )
    total = model.total_step_us
    n = len(model.steps)
    loader = sum(s.loader_us for s in model.steps)
    wait = sum(s.loader_wait_us for s in model.steps)
    wait_pct = pct(wait, total)
    evidence = {
        "loader_share_pct": pct(loader, total),
        "wait_share_pct": wait_pct,
        "loader_ms_per_step": ms(loader / n),
        "wait_ms_per_step": ms(wait / n),
        "step_ms_mean": ms(total / n),
        "loader_kind": model.loader_kind,
        "steps": n,
    }
    if wait_pct < WAIT_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The step waits {wait_pct:.1f}% of its time on the DataLoader "
            f"(threshold {WAIT_THRESHOLD_PCT:.0f}%).",
        )
    # Hiding the wait cannot make the step shorter than the GPU's own busy time.
    bound = wait if not model.has_gpu else min(wait, max(total - busiest_gpu_us(model), 0.0))
    loader_info = context.training_loader() if context else None
    cores = context.cores_per_process if context else None
    klass = LoaderClass.of(model, loader_info)
    workers_hint = None
    if context is None and klass.bound:
        # A trace recorded by `run` with the anatomy, analysed alone: its metadata has the
        # worker count and cores too, so the advice is the one `run` gave.
        facts = LoaderFacts.from_capture(model.trace.capture)
        workers_hint, cores = facts.workers, facts.cores
    advice = _advice(model, loader_info, cores, step=total / n, wait=wait / n, load=loader / n,
                     klass=klass, workers_hint=workers_hint)
    evidence.update(advice.evidence)
    saving = pct(min(bound / n, advice.saving_us), total / n)
    who, unit = ("Inference", "batch") if model.workload == "inference" else ("Training", "step")
    title = f"{who} waits on the DataLoader for {wait_pct:.1f}% of each {unit}"
    precondition = advice.precondition
    busy = other_load(model, context)  # others held the cores: the sizing assumed them free
    if busy is not None:
        evidence["other_cpu_share_pct"] = busy.share_pct
        precondition = f"{precondition} {busy.caveat}"
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=advice.recommendation,
        snippet=advice.snippet,
        precondition=precondition,
        estimated_saving_pct=saving,
        saving_basis=advice.basis,
        docs=DOCS,
    )
    return Assessment.found(finding)


@dataclass
class LoaderClass:
    """What `stallscope run` measured inside the training loader (capture/anatomy.py): its
    class and figures, from the run context or, for a trace analysed alone, its metadata."""

    bound: str | None
    anatomy: dict

    @classmethod
    def of(cls, model: TraceModel, info: LoaderInfo | None) -> LoaderClass:
        if info is not None:
            return cls(info.bound, info.anatomy or {})
        loaders = [d for d in model.trace.capture.get("loaders") or [] if isinstance(d, dict)]
        busiest = max(loaders, key=lambda d: d.get("batches") or 0, default={})
        anatomy = busiest.get("anatomy") if isinstance(busiest.get("anatomy"), dict) else {}
        bound = anatomy.get("bound")
        return cls(bound if isinstance(bound, str) else None, anatomy)

    @property
    def cpu_share(self) -> float:
        """CPU share of a batch's loading (fetch and collate): the cores one worker takes."""
        v = self.anatomy.get("cpu_busy_share")
        return float(v) if isinstance(v, int | float) and self.bound == "waiting" else 1.0

    @property
    def worker_load_us(self) -> float | None:
        """One batch's fetch and collate wall time inside a worker, as measured."""
        a = self.anatomy
        if a.get("where") != "workers" or not isinstance(a.get("fetch_ms_per_batch"), int | float):
            return None
        return 1000.0 * (a["fetch_ms_per_batch"] + (a.get("collate_ms_per_batch") or 0.0))

    def evidence(self) -> dict:
        if not self.bound:
            return {}
        a = self.anatomy
        out = {"loader_bound": self.bound}
        for key in ("fetch_ms_per_batch", "fetch_cpu_share", "blocked_share", "runq_share",
                    "collate_ms_per_batch", "cpu_busy_share", "main_cpu_ms_per_batch"):
            if isinstance(a.get(key), int | float):
                out[f"loader_{key}"] = a[key]
        return out

    def sentence(self, cores: int | None) -> str:
        """Why the class says what it says, and its own fixes."""
        a = self.anatomy
        where = "in the workers" if a.get("where") == "workers" else "in the training process"
        share = a.get("fetch_cpu_share")
        fetch = a.get("fetch_ms_per_batch")
        if self.bound == "waiting":
            return (f" Loading waits on storage or the network: measured {where}, a batch's "
                    f"fetch takes {fetch:.1f} ms of which {100 * (share or 0):.0f}% is CPU, so "
                    "workers need not have a core each. Also cache the samples (in memory, "
                    "or on local NVMe, tmpfs or /dev/shm) or read from faster storage.")
        if self.bound == "cpu-bound":
            cap = f"the {cores} core(s)" if cores else "the free cores"
            runq = a.get("runq_share")
            queued = (f" ({100 * runq:.0f}% runnable but waiting for a core: the cores are "
                      "saturated)" if isinstance(runq, int | float) and runq >= 0.1 else "")
            on = 1.0 - a["blocked_share"] if isinstance(a.get("blocked_share"), int | float) \
                else (share or 1.0)
            return (f" Loading computes: measured {where}, a batch's {fetch:.1f} ms fetch is "
                    f"{100 * on:.0f}% on a core or queued for one{queued}, so workers beyond "
                    f"{cap} only contend. Make samples cheaper: decode at the target size "
                    "(pillow-simd for PIL decode), lighter or GPU-side augmentation, or cache "
                    "decoded samples.")
        if self.bound == "collate/transfer-bound":
            return (f" collate_fn takes {a.get('collate_ms_per_batch', 0):.1f} ms of a batch's "
                    f"{(fetch or 0) + (a.get('collate_ms_per_batch') or 0):.1f} ms {where}: "
                    "make it cheaper (return ready-stacked tensors from the dataset's "
                    "__getitems__, fewer and larger tensors, smaller dtypes).")
        if self.bound == "main-process-bound":
            return (f" The training process itself spends {a.get('main_cpu_ms_per_batch', 0):.1f}"
                    " ms of CPU per batch receiving it (unpickling, shared-memory mapping, "
                    "pinning): send fewer, larger tensors in smaller dtypes (uint8 images, "
                    "normalised on the GPU).")
        return ""


@dataclass
class _Advice:
    recommendation: str
    snippet: str
    precondition: str
    saving_us: float  # per step
    basis: str
    evidence: dict


def _advice(
    model: TraceModel, info: LoaderInfo | None, cores: int | None, step: float, wait: float,
    load: float, klass: LoaderClass | None = None, workers_hint: int | None = None,
) -> _Advice:
    """How many workers, from the measured load/compute ratio and the cores this process has.

    A loader measured as waiting on storage (capture/anatomy.py) takes only its CPU share of a
    core per worker, so its workers may outnumber the cores (up to WAITING_WORKERS_PER_CORE per
    core); any other loader is capped at the cores, as the replay (replay/loader.py) models."""
    klass = klass or LoaderClass(None, {})
    waiting = klass.bound == "waiting"
    share = klass.cpu_share
    compute = max(step - wait, 1.0)
    single = model.loader_kind == "single-process"
    workers_now = info.num_workers if info else (
        workers_hint if workers_hint is not None else (0 if single else None))
    upper_basis = (
        "upper bound: the loader wait with no GPU work running, if fully overlapped; "
        "never below the busiest GPU's busy time"
    )
    if workers_now is None:  # workers in use, count unknown: no number can be derived
        return _Advice(
            "The DataLoader already uses worker processes, yet the step still waits for batches: "
            "the workers cannot keep up. Add workers only if CPU cores are idle; otherwise make "
            "each sample cheaper (lighter or GPU-side transforms and decoding, caching decoded "
            "samples) or read from faster storage (local NVMe, /dev/shm).",
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=...,\n"
            "    num_workers=<more, if cores are idle>,\n"
            "    persistent_workers=True,\n"
            "    prefetch_factor=4,\n"
            ")",
            "More workers help only while CPU cores are free; if the cores are saturated, make "
            "loading cheaper instead.",
            wait,
            upper_basis,
            {},
        )
    # One worker's time per batch: measured in-process for a single-process loader; with W
    # workers that cannot keep up, each delivers one batch every W steps.
    per_batch = load if workers_now == 0 else (klass.worker_load_us or workers_now * step)
    ideal = math.ceil(per_batch / compute) + (1 if workers_now == 0 else 0)
    cap = None if cores is None else cores * (WAITING_WORKERS_PER_CORE if waiting else 1)
    workers = ideal if cap is None else max(1, min(ideal, cap))
    evidence: dict = {"suggested_num_workers": workers, "ideal_num_workers": ideal,
                      **klass.evidence()}
    if cores is not None:
        evidence["cores_per_process"] = cores
    projected = max(compute, per_batch / workers)
    if cores is not None and not model.has_gpu:
        # CPU training: the step's own compute and the workers' CPU share the same cores.
        projected = max(projected, (compute + share * per_batch) / cores)
    if workers <= workers_now or step - projected < MIN_GAIN * step:
        # Every core already has work: more workers would only contend for them.
        busy = (
            f"the DataLoader has {workers_now} worker(s)" if workers_now
            else "the step's own compute already keeps them busy"
        )
        return _Advice(
            f"{_where(info)}The step waits for batches, but this process may use {cores} "
            f"core(s) and {busy}: more worker processes would compete for the same cores "
            "rather than overlap. Make each sample cheaper (lighter or GPU-side transforms and "
            "decoding, caching decoded samples), read from faster storage, or give the process "
            f"more cores (fewer processes per host).{klass.sentence(cores)}",
            f"# {info.call_site if info else 'the DataLoader'}: loading competes with the step "
            f"for {cores} core(s)\n"
            "# - cache decoded samples, or move augmentation to the GPU\n"
            "# - fewer processes per host, or a wider CPU affinity for this one",
            "Loading is CPU-bound on cores that are all in use.",
            wait,
            upper_basis.replace("if fully overlapped", "if loading cost nothing"),
            evidence,
        )
    evidence["projected_step_ms"] = ms(projected)
    change = {"num_workers": workers, "persistent_workers": True}
    if model.has_gpu and not (info and info.pin_memory):
        change["pin_memory"] = True
    why = (
        f"each batch takes {ms(per_batch):.1f} ms of loading against {ms(compute):.1f} ms of "
        f"other step work, so {ideal} worker process(es) (load/compute rounded up"
        f"{', plus one spare' if workers_now == 0 else ''}) can prepare batches ahead of the step"
    )
    if waiting and cores is not None and workers > cores:
        why += (f"; more than the {cores} core(s), as each worker mostly waits "
                f"({100 * share:.0f}% of its time on CPU)")
    if cap is not None and workers < ideal:
        why += (f"; capped at {WAITING_WORKERS_PER_CORE} per core" if waiting
                else f"; capped at the {cores} core(s) this process may use")
    basis = upper_basis
    if cores is not None:
        cpu_work = "all CPU work spread over the cores"
        if waiting:
            cpu_work += f", loading counted at its {share:.0%} CPU share"
        basis = (
            f"estimate: with {workers} worker(s) on {cores} core(s) a step takes about "
            f"{ms(projected):.1f} ms (the largest of the other step work, loading spread over the "
            f"workers{', and ' + cpu_work if not model.has_gpu else ''}); "
            "never more than the loader wait"
        )
    where = "Loading runs in the main process" if workers_now == 0 else "The workers lag"
    return _Advice(
        f"{_where(info, change)}{where}: {why}. Keep the workers alive across epochs."
        f"{klass.sentence(cores)}",
        _snippet(info, change),
        (f"Storage that serves {workers} concurrent readers as fast as one (the measured wait is "
         "per read, not a bandwidth limit); memory for the extra worker processes; a picklable "
         "dataset." if waiting and cores is not None and workers > cores else
         f"{workers} CPU core(s) free for loading in this process (cores per process, after the "
         "other ranks on the host); a picklable dataset; transforms that do not touch the GPU.")
        + (" pin_memory helps only with .to(device, non_blocking=True)." if "pin_memory" in change
           else ""),
        max(step - projected, 0.0),
        basis,
        evidence,
    )


def _where(info: LoaderInfo | None, change: dict | None = None) -> str:
    """`train.py:42 DataLoader(num_workers=0, ...) -> DataLoader(..., num_workers=2)`, or the
    TrainingArguments line under transformers.Trainer (diagnose/knobs.py)."""
    knobs = Knobs.of(info)
    if info is None or knobs is None:
        return ""
    now = {"num_workers": info.num_workers, "pin_memory": info.pin_memory}
    return f"{knobs.change_line(now, change)}{': ' if change is None else '. '}"


def _snippet(info: LoaderInfo | None, change: dict) -> str:
    knobs = Knobs.of(info)
    if info is None or knobs is None:
        args = "".join(f"    {k}={v},\n" for k, v in change.items())
        return f"loader = torch.utils.data.DataLoader(\n    dataset, batch_size=...,\n{args})"
    before = {"num_workers": info.num_workers, "pin_memory": info.pin_memory,
              "persistent_workers": info.persistent_workers}
    return knobs.diff(f"{info.dataset}, batch_size={info.batch_size}", before, change)
