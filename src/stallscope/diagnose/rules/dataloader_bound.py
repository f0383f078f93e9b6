"""`dataloader-bound`: the training step waits for the next batch.

Three steps: `measure` reads the loader's figures from the trace and `run`'s measurements
(`LoaderEvidence`); `judge` decides from them alone what is found, why, and how many workers
(`Judgement`, `Sizing`); `advise` writes the prose and the change to paste (`Advice`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stallscope.diagnose import memory as mem
from stallscope.diagnose.common import busiest_gpu_us, judged_steps, ms, pct
from stallscope.diagnose.epochs import respawn_loader_us
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.hostload import other_load
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_key
from stallscope.replay.loader import LoaderFacts, Rounds, shm_write_us, worker_batch_us
from stallscope.replay.models.common import h2d_bytes_per_step
from stallscope.replay.threads import OneThread
from stallscope.runfacts import LoaderInfo, RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.trace.otherload import OtherLoad
from stallscope.units import millis, percent

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
# Sampled stacks (capture/sampler.py): a second line is named when it holds at least this share
# of the samples, a second category's fix given when it holds at least this share.
SECOND_LINE_SHARE = 0.1
SECOND_CATEGORY_SHARE = 0.25
# The fix for what the sampled fetches spend their time in, by category.
_GPU_SIDE = ("move augmentation to the GPU (on the batch, after .to(device)), use cheaper "
             "transforms, or cache the deterministic part of the pipeline's output")
CATEGORY_FIX = {
    "image decode (PIL)": (
        "decode at the target size: img.draft('RGB', size) right after Image.open decodes a "
        "JPEG at 1/2 to 1/8 scale, Image.reduce() or resize(..., reducing_gap=2.0) for other "
        "formats; pillow-simd decodes and resizes faster; or cache decoded samples"),
    "image decode (cv2)": (
        "decode at reduced size: cv2.imread(path, cv2.IMREAD_REDUCED_COLOR_2) (or _4, _8; "
        "the same flags for cv2.imdecode), or cache decoded samples"),
    "transforms": _GPU_SIDE,
    "numpy": _GPU_SIDE,
    "torch ops": _GPU_SIDE,
    "file reads": ("cache the samples (in memory, or on local NVMe, tmpfs or /dev/shm), or "
                   "pack small files into larger shards"),
    "sleep/wait": ("cache the samples locally (in memory, local NVMe, tmpfs or /dev/shm), or "
                   "fetch them in bulk rather than one request per sample"),
    "collate": ("make collate_fn cheaper: return ready-stacked tensors from the dataset's "
                "__getitems__, fewer and larger tensors, smaller dtypes"),
    "your code": "that time is in your own Python: make those lines cheaper or cache their output",
}
WAITING_MORE_WORKERS = "; workers that wait overlap, so more of them than cores help"
# A bursty loader (capture/transfer.py) gets a deeper queue, up to this prefetch_factor: each
# step holds prefetch_factor x num_workers batches in memory.
MAX_PREFETCH_FACTOR = 16
# A main-process-bound loader on a GPU run gets a background thread when receiving the batches
# (transfer_ms_per_batch: the batch was ready, the training process shipped it) is at least
# this share of its wait per batch: more workers cannot shorten that part.
RECEIVE_SHARE = 0.5


# Issues the step can have with its loader, each judged from the evidence alone (`judge`).
CLEAR = "clear"  # the wait is under the threshold
UNKNOWN = "unknown-workers"  # workers in use, how many not recorded: no count can be derived
BURSTY = "bursty"  # the workers keep up on average; a deeper queue hides the slow batches
RECEIVING = "receiving"  # receiving ready batches is the wait: a background thread
CORES_BUSY = "cores-busy"  # more workers would only contend for the cores
WORKERS = "workers"  # more workers, sized from load against the step's other work


@dataclass(frozen=True)
class LoaderEvidence:
    """What the trace and `run` measured about the step's wait for batches. Per step: means
    over the recorded steps, since the wait of workers that lag falls on a few of them."""

    loader_kind: str
    steps: int
    step_us: float
    loader_us: float  # inside DataLoader __next__
    wait_us: float  # of which with no GPU work running
    gpu_us: float | None  # the busiest GPU's busy time; None on a CPU run
    inference: bool
    klass: LoaderClass
    info: LoaderInfo | None = None
    cores: int | None = None  # cores this process may use
    workers_now: int | None = None  # the loader's workers; None: some, how many unknown
    threads: int | None = None  # the training process's intra-op threads
    one_thread: OneThread | None = None  # the steps `run` timed at one intra-op thread
    rounds: Rounds | None = None  # the wait falls once a round of workers that lag
    batch_bytes: float | None = None
    busy: OtherLoad | None = None  # other processes held the cores while recording
    # Of the wait, what the epochs' worker re-spawns hold: worker-startup's (persistent
    # workers, not more of them, remove it: one lost millisecond, one owner).
    respawn_us: float = 0.0
    # `run`'s memory figures (diagnose/memory.py), or why there are none: the workers that fit.
    memory: mem.MemoryFacts | str | None = None

    @property
    def memory_fit(self) -> int | None:
        return self.memory.workers_fit() if isinstance(self.memory, mem.MemoryFacts) else None

    @property
    def has_gpu(self) -> bool:
        return self.gpu_us is not None

    @property
    def wait_pct(self) -> float:
        return pct(self.wait_us, self.step_us)


@dataclass(frozen=True)
class Sizing:
    """A worker count for a loader that lags, and the step it is projected to give."""

    per_batch_us: float  # one batch's loading inside a worker
    compute_us: float  # the step's other work, at the intra-op threads it will run
    ideal: int  # load over compute, rounded up (plus a spare for new workers)
    workers: int  # the ideal within the cap
    cap: int | None  # the cores, or WAITING_WORKERS_PER_CORE per core for a waiting loader
    projected_us: float
    threads: int | None = None  # intra-op threads to set in the same change; None: keep
    # Where the step's other work at one thread sized the workers: that work at the script's
    # own threads, and the count it would have given.
    script_compute_us: float | None = None
    script_workers: int | None = None
    memory_cap: int | None = None  # the most workers memory holds, where it lowered the count


@dataclass(frozen=True)
class Judgement:
    """What is found, its cause, and the most that hiding the wait can save (per step)."""

    found: bool
    cause: str
    bound_us: float
    sizing: Sizing | None = None
    prefetch: int | None = None  # a bursty loader's prefetch_factor


def dataloader_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
    evidence = measure(model, context)
    if isinstance(evidence, Assessment):
        return evidence
    judgement = judge(evidence)
    if not judgement.found:
        return Assessment(
            RULE_ID,
            "clear",
            f"The step waits {percent(evidence.wait_pct)} of its time on the DataLoader "
            f"(threshold {percent(WAIT_THRESHOLD_PCT, 0)}).",
        )
    return Assessment.found(finding(evidence, judgement, advise(evidence, judgement)))


def measure(model: TraceModel, context: RunContext | None = None
            ) -> LoaderEvidence | Assessment:
    """The loader's figures from the trace, and from `run` (its context, or for a trace
    analysed alone the trace's own metadata, so the advice is the one `run` gave)."""
    if model.loader_kind is None:
        return Assessment(
            RULE_ID,
            "not_assessed",
            "No DataLoader __next__ events on the stepping thread (a custom input loop, or the "
            "loader ran outside the profiled steps): data-loading time could not be measured.",
        )
    n = len(model.steps)
    info = context.training_loader() if context else None
    klass = LoaderClass.of(model, info)
    facts = LoaderFacts.of(model.trace)
    one = OneThread.of(model)
    cores = context.cores_per_process if context else None
    threads = (context.environment.get("cpu", {}) or {}).get("torch_threads") if context else None
    hint = None
    if context is None and klass.bound:
        hint, cores = facts.workers, facts.cores
    elif context is None and not facts.mostly_waits:
        # The trace's metadata may say the cores (trace/cores.py); workers are capped at them
        # unless a fetch was measured to mostly wait (such workers need no core each).
        cores = facts.cores
    if context is None and one is not None:
        threads = one.threads
    single = model.loader_kind == "single-process"
    gpu = busiest_gpu_us(model) / n if model.has_gpu else None
    wait = sum(s.loader_wait_us for s in model.steps) / n
    return LoaderEvidence(
        loader_kind=model.loader_kind, steps=n, step_us=model.total_step_us / n,
        loader_us=sum(s.loader_us for s in model.steps) / n,
        wait_us=wait, gpu_us=gpu,
        inference=model.workload == "inference", klass=klass, info=info, cores=cores,
        workers_now=info.num_workers if info else (hint if hint is not None else
                                                   (0 if single else None)),
        threads=threads if isinstance(threads, int) else None, one_thread=one,
        rounds=Rounds.of(model.steps[judged_steps(n)], facts, model.loader_kind),
        batch_bytes=facts.batch_bytes if facts.batch_bytes is not None
        else h2d_bytes_per_step(model) or None,
        busy=other_load(model, context),
        respawn_us=min(respawn_loader_us(model, context) / n, wait),
        memory=mem.facts(model.trace.capture))


def judge(e: LoaderEvidence) -> Judgement:
    """Found or clear, why, and the bound: the wait less what the re-spawns hold, never below
    the busiest GPU's work."""
    own = e.wait_us - e.respawn_us
    bound = own if e.gpu_us is None else min(own, max(e.step_us - e.gpu_us, 0.0))
    if e.wait_pct < WAIT_THRESHOLD_PCT:
        return Judgement(False, CLEAR, bound)
    if e.workers_now is None:
        return Judgement(True, UNKNOWN, bound)
    if e.workers_now and e.klass.anatomy.get("bursty"):
        depth = prefetch_depth(e.info, e.klass, e.workers_now)
        if depth is not None:
            return Judgement(True, BURSTY, bound, prefetch=depth)
    if e.workers_now and e.has_gpu and _receive_bound(e.klass, e.wait_us):
        return Judgement(True, RECEIVING, bound)
    sizing = size_workers(e)
    if sizing.workers <= e.workers_now or e.step_us - sizing.projected_us < MIN_GAIN * e.step_us:
        return Judgement(True, CORES_BUSY, bound, sizing)
    return Judgement(True, WORKERS, bound, sizing)


def size_workers(e: LoaderEvidence) -> Sizing:
    """How many workers, from a batch's loading in a worker against the step's other work,
    within the cores this process has. A loader measured as waiting on storage
    (capture/anatomy.py) takes only its CPU share of a core per worker, so its workers may
    outnumber the cores (up to WAITING_WORKERS_PER_CORE per core); any other is capped at the
    cores, as the replay (replay/loader.py) models. Where the workers need the step's threads
    cut to one and `run` timed steps at one thread, the workers are sized on that step."""
    share = e.klass.cpu_share
    compute = max(e.step_us - e.wait_us, 1.0)
    first = _fit(e, _batch_us(e, e.loader_us), compute, share)
    threads = None if e.has_gpu else step_threads(first.workers, share, e.cores, e.threads)
    one = e.one_thread
    if threads != 1 or one is None or one.step_us - one.load_us <= 0:
        return replace(first, threads=threads)
    # Workers run one intra-op thread each, so in-process loading at one thread is their pace.
    per_batch = _batch_us(e, one.load_us) if e.workers_now == 0 else first.per_batch_us
    at_one = _fit(e, per_batch, one.step_us - one.load_us, share)
    return replace(at_one, threads=1, script_compute_us=compute, script_workers=first.workers)


def _batch_us(e: LoaderEvidence, in_process_us: float) -> float:
    """One batch's loading inside a worker: in-process loading per step plus writing the batch
    into shared memory (replay/loader.py); measured inside the workers where they lag already;
    else, with W workers that cannot keep up, W mean steps per batch."""
    if e.workers_now == 0:
        return float(worker_batch_us(in_process_us, e.batch_bytes))
    return e.klass.worker_load_us or (e.workers_now or 0) * e.step_us


def _fit(e: LoaderEvidence, per_batch: float, compute: float, share: float) -> Sizing:
    """Load over compute rounded up (plus one spare for new workers), within the cap; the step
    with them: the longer of the other work and the batches' arrival, and on a CPU run all CPU
    work spread over the cores."""
    waiting = e.klass.bound == "waiting"
    ideal = math.ceil(per_batch / compute) + (1 if e.workers_now == 0 else 0)
    cap = None if e.cores is None else e.cores * (WAITING_WORKERS_PER_CORE if waiting else 1)
    workers = ideal if cap is None else max(1, min(ideal, cap))
    fit = e.memory_fit  # never advise more workers than the memory holds
    memory_cap = fit if fit is not None and fit < workers else None
    if memory_cap is not None:
        workers = memory_cap
    projected = max(compute, per_batch / max(workers, 1))
    if e.cores is not None and not e.has_gpu:
        projected = max(projected, (compute + share * per_batch) / e.cores)
    return Sizing(per_batch, compute, ideal, workers, cap, projected, memory_cap=memory_cap)


def finding(e: LoaderEvidence, j: Judgement, advice: Advice) -> Finding:
    """The finding: the measured figures with the advice's, its saving within the bound."""
    evidence = {**_measured(e), **advice.evidence}
    precondition = advice.precondition
    if e.busy is not None:  # others held the cores: the sizing assumed them free
        evidence["other_cpu_share_pct"] = e.busy.share_pct
        precondition = f"{precondition} {e.busy.caveat}"
    who, unit = ("Inference", "batch") if e.inference else ("Training", "step")
    return Finding(
        id=RULE_ID,
        title=f"{who} waits on the DataLoader for {percent(e.wait_pct)} of each {unit}"
        + (f", once a round of its {e.rounds.workers} workers" if e.rounds else ""),
        evidence=evidence,
        recommendation=advice.recommendation,
        snippet=advice.snippet,
        precondition=precondition,
        estimated_saving_pct=pct(min(j.bound_us, advice.saving_us), e.step_us),
        saving_basis=advice.basis + (
            f"; less the {millis(ms(e.respawn_us), 'tenths')} ms per step of it that the "
            "epochs' worker re-spawns hold, worker-startup's to win back" if e.respawn_us > 0
            else ""),
        docs=DOCS,
    )


def _measured(e: LoaderEvidence) -> dict[str, Any]:
    out: dict[str, Any] = {
        "loader_share_pct": pct(e.loader_us, e.step_us),
        "wait_share_pct": e.wait_pct,
        "loader_ms_per_step": ms(e.loader_us),
        "wait_ms_per_step": ms(e.wait_us),
        "step_ms_mean": ms(e.step_us),
        "loader_kind": e.loader_kind,
        "steps": e.steps,
    }
    if e.respawn_us > 0:
        out["respawn_wait_ms_per_step"] = ms(e.respawn_us)
    if e.rounds is not None:
        r = e.rounds
        out.update({"round_workers": r.workers, "waited_steps": r.waited,
                    "wait_ms_max": ms(r.max_wait_us), "wait_ms_median": ms(r.median_wait_us)})
    return out


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
        listed = model.trace.capture.get("loaders")
        loaders = [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []
        busiest = max(loaders, key=lambda d: d.get("batches") or 0, default={})
        raw_anatomy = busiest.get("anatomy")
        anatomy: dict[str, Any] = raw_anatomy if isinstance(raw_anatomy, dict) else {}
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

    @property
    def transfer_ms(self) -> float | None:
        """Median time per batch the training process waited for a ready batch to be shipped
        (pickling, queue, unpickling, pinning), measured by `run` (capture/transfer.py)."""
        v = self.anatomy.get("transfer_ms_per_batch")
        return float(v) if isinstance(v, int | float) else None

    def _shipping(self) -> str:
        t = self.transfer_ms
        if t is None:
            return ""
        ready = self.anatomy.get("ready_to_received_ms")
        sat = (f" (ready in a worker a median {millis(ready['median'], 'tenths')} ms before it was "
               "received)"
               if isinstance(ready, dict) and isinstance(ready.get("median"), int | float)
               else "")
        return (" Shipping a ready batch to the training process (pickling, the queue, unpickling, "
                f"pinning) takes a median {millis(t, 'tenths')} ms of its wait{sat}.")

    def evidence(self) -> dict:
        if not self.bound:
            return {}
        a = self.anatomy
        out = {"loader_bound": self.bound}
        for key in ("fetch_ms_per_batch", "fetch_cpu_share", "blocked_share", "runq_share",
                    "collate_ms_per_batch", "cpu_busy_share", "main_cpu_ms_per_batch",
                    "transfer_ms_per_batch", "pin_ms_per_batch", "worker_starts"):
            if isinstance(a.get(key), int | float):
                out[f"loader_{key}"] = a[key]
        top = self.top_lines
        if top:
            out["loader_top_function"] = f"{top[0]['function']} ({top[0]['site']})"
            out["loader_top_category"] = self.top_categories[0]
        return out

    @property
    def top_lines(self) -> list[dict]:
        """The sampled stacks' lines, most samples first (capture/sampler.py); [] without."""
        stack = self.anatomy.get("stack")
        top = stack.get("top") if isinstance(stack, dict) else None
        if not self.top_categories:
            return []
        return [t for t in top or [] if isinstance(t, dict) and t.get("function")
                and t.get("site") and isinstance(t.get("share"), int | float)]

    @property
    def top_categories(self) -> list[str]:
        """The sampled categories worth a fix: the first, and the second when it holds at
        least SECOND_CATEGORY_SHARE of the samples."""
        stack = self.anatomy.get("stack")
        cats = stack.get("categories") if isinstance(stack, dict) else None
        if not cats or not isinstance(cats[0], dict) or not cats[0].get("category"):
            return []
        out = [cats[0]["category"]]
        if len(cats) > 1 and (cats[1].get("share") or 0) >= SECOND_CATEGORY_SHARE:
            out.append(cats[1]["category"])
        return out

    def stack_sentence(self) -> str:
        """Where the samples put the time (one or two lines, with their shares) and the fix
        for what they do; "" without stack figures: then the class's own advice stands."""
        top = self.top_lines
        if not top:
            return ""
        named = [top[0]] + [t for t in top[1:2] if t["share"] >= SECOND_LINE_SHARE]
        where = ", ".join(f"{percent(100 * t['share'], 0)} in {t['function']} ({t['site']}, "
                          f"{t.get('category')})" for t in named)
        fixes = []
        for category in self.top_categories:
            fix = CATEGORY_FIX.get(category, CATEGORY_FIX["your code"])
            if category in ("file reads", "sleep/wait") and self.bound == "waiting":
                fix += WAITING_MORE_WORKERS
            if fix not in fixes:
                fixes.append(fix)
        samples = self.anatomy["stack"].get("samples")
        return (f" Sampled stacks of the fetches ({samples} samples): {where}. "
                + " ".join(f"{f[0].upper()}{f[1:]}." for f in fixes))

    def sentence(self, cores: int | None) -> str:
        """Why the class says what it says, and its own fixes."""
        a = self.anatomy
        where = "in the workers" if a.get("where") == "workers" else "in the training process"
        share = a.get("fetch_cpu_share")
        fetch = a.get("fetch_ms_per_batch")
        sampled = self.stack_sentence()
        if self.bound == "waiting":
            return (f" Loading waits on storage or the network: measured {where}, a batch's fetch "
                    f"takes {millis(fetch, 'tenths')} ms of which {percent(100 * (share or 0), 0)} "
                    "is CPU, so workers need not have a core each."
                    + (sampled or " Also cache the samples (in memory, or on local NVMe, tmpfs "
                       "or /dev/shm) or read from faster storage."))
        if self.bound == "cpu-bound":
            cap = f"the {plural(cores, 'core')}" if cores else "the free cores"
            runq = a.get("runq_share")
            queued = (f" ({percent(100 * runq, 0)} runnable but waiting for a core: the cores are "
                      "saturated)" if isinstance(runq, int | float) and runq >= 0.1 else "")
            on = 1.0 - a["blocked_share"] if isinstance(a.get("blocked_share"), int | float) \
                else (share or 1.0)
            return (f" Loading computes: measured {where}, a batch's dataset fetch "
                    f"({millis(fetch, 'tenths')} ms, collate aside) is "
                    f"{percent(100 * on, 0)} on a core or queued for one{queued}, so "
                    f"workers beyond {cap} only contend."
                    + (sampled or " Make samples cheaper: decode at the target size "
                       "(pillow-simd for PIL decode), lighter or GPU-side augmentation, or "
                       "cache decoded samples."))
        if self.bound == "collate/transfer-bound":
            return (f" collate_fn takes {millis(a.get('collate_ms_per_batch', 0), 'tenths')} ms of "
                    "a batch's "
                    f"{millis((fetch or 0) + (a.get('collate_ms_per_batch') or 0), 'tenths')} ms "
                    f"{where}: make it cheaper (return ready-stacked tensors from the dataset's "
                    f"__getitems__, fewer and larger tensors, smaller dtypes).{self._shipping()}")
        if self.bound == "main-process-bound":
            return (" The training process itself spends "
                    f"{millis(a.get('main_cpu_ms_per_batch', 0), 'tenths')} ms of CPU per batch "
                    "receiving it (unpickling, shared-memory mapping, pinning): send fewer, larger "
                    "tensors in smaller dtypes (uint8 images, normalised on the "
                    f"GPU).{self._shipping()}")
        return ""


@dataclass
class Advice:
    recommendation: str
    snippet: str
    precondition: str
    saving_us: float  # per step
    basis: str
    evidence: dict


UPPER_BASIS = ("upper bound: the loader wait with no GPU work running, if fully overlapped; "
               "never below the busiest GPU's busy time")


def advise(e: LoaderEvidence, j: Judgement) -> Advice:
    """The prose, snippet and precondition for what `judge` found."""
    if j.cause == UNKNOWN:
        return _unknown_workers_advice(e)
    if j.cause == BURSTY and j.prefetch is not None:
        deeper = _prefetch_advice(e.info, e.klass, e.workers_now or 0, e.wait_us)
        assert deeper is not None  # judged by the same figures
        return deeper
    if j.cause == RECEIVING:
        return _background_advice(e.info, e.klass, e.wait_us)
    assert j.sizing is not None  # the other causes are sized
    if j.cause == CORES_BUSY:
        return _cores_busy_advice(e, j.sizing)
    return _workers_advice(e, j.sizing)


def _unknown_workers_advice(e: LoaderEvidence) -> Advice:
    return Advice(
        "The DataLoader already uses worker processes, yet the step still waits for batches: "
        "the workers cannot keep up. Add workers only if CPU cores are idle; otherwise make "
        "each sample cheaper (lighter or GPU-side transforms and decoding, caching decoded "
        "samples) or read from faster storage (local NVMe, /dev/shm).",
        "loader = torch.utils.data.DataLoader(\n"
        "    dataset, batch_size=...,\n"
        "    num_workers=<more, if cores are idle>,\n"
        ")",
        "More workers help only while CPU cores are free; if the cores are saturated, make "
        "loading cheaper instead.",
        e.wait_us,
        UPPER_BASIS,
        {},
    )


def _sizing_evidence(e: LoaderEvidence, s: Sizing) -> dict[str, Any]:
    out: dict[str, Any] = {"suggested_num_workers": s.workers, "ideal_num_workers": s.ideal,
                           **e.klass.evidence()}
    if e.cores is not None:
        out["cores_per_process"] = e.cores
    if e.memory_fit is not None:
        out["memory_fit_num_workers"] = e.memory_fit
    else:
        out["memory_fit"] = _memory_unassessed(e)
    return out


def _memory_unassessed(e: LoaderEvidence) -> str:
    """Why the worker count was not checked against memory."""
    if isinstance(e.memory, str):
        return f"not assessed: {e.memory}"
    return ("not assessed: no worker's memory was measured (num_workers=0, or no worker "
            "sampled), so what one more worker takes is unknown")


def _memory_sentence(e: LoaderEvidence, s: Sizing) -> str:
    """How the memory capped the count, or that it was not checked."""
    if s.memory_cap is not None and isinstance(e.memory, mem.MemoryFacts):
        asked = s.ideal if s.cap is None else max(1, min(s.ideal, s.cap))
        return (f" Capped at {plural(s.memory_cap, 'worker')} by memory (not {asked}): "
                f"{e.memory.fit_text(asked)}.")
    if e.memory_fit is not None:
        return ""
    return f" Memory for the workers: {_memory_unassessed(e)}."


def _cores_busy_advice(e: LoaderEvidence, s: Sizing) -> Advice:
    """Every core already has work: more workers would only contend for them."""
    info = e.info
    busy = (f"the DataLoader has {plural(e.workers_now, 'worker')}" if e.workers_now
            else "the step's own compute already keeps them busy")
    # unknown cores reach here only with a worker count from the trace and no core count
    held = plural(e.cores, "core") if e.cores is not None else "an unknown number of cores"
    return Advice(
        f"{_where(info)}The step waits for batches, but this process may use "
        f"{held} and {busy}: more worker processes would compete for the same cores rather "
        "than overlap. Make each sample cheaper (lighter or GPU-side transforms and "
        "decoding, caching decoded samples), read from faster storage, or give the process "
        f"more cores (fewer processes per host).{_rounds_sentence(e)}"
        f"{e.klass.sentence(e.cores)}{_memory_sentence(e, s)}",
        f"# {info.call_site if info else 'the DataLoader'}: loading competes with the step "
        f"for {held}\n"
        "# - cache decoded samples, or move augmentation to the GPU\n"
        "# - fewer processes per host, or a wider CPU affinity for this one",
        "Loading is CPU-bound on cores that are all in use.",
        e.wait_us,
        UPPER_BASIS.replace("if fully overlapped", "if loading cost nothing"),
        _sizing_evidence(e, s),
    )


def _workers_advice(e: LoaderEvidence, s: Sizing) -> Advice:
    """More workers (and, on a CPU run that needs it, one intra-op thread), as one change."""
    evidence = {**_sizing_evidence(e, s), "projected_step_ms": ms(s.projected_us)}
    change: dict = {"num_workers": s.workers}
    if e.workers_now == 0:
        # New worker processes: without it they restart each epoch. For a loader that has
        # workers already, `worker-startup` says it, with the restarts it measured.
        change["persistent_workers"] = True
    if s.threads is not None:
        evidence["suggested_torch_threads"] = s.threads
    if s.script_compute_us is not None:
        evidence.update({"other_work_ms_one_thread": ms(s.compute_us),
                         "other_work_ms_script_threads": ms(s.script_compute_us),
                         "num_workers_script_threads": s.script_workers})
    if e.has_gpu and not (e.info and e.info.pin_memory):
        change["pin_memory"] = True
    where = "Loading runs in the main process" if e.workers_now == 0 else "The workers lag"
    threads_text, threads_code = _threads_text(e, s)
    return Advice(
        f"{_where(e.info, change)}{where}: {_why(e, s)}."
        f"{_keep_alive(e) if e.workers_now == 0 else ''}"
        f"{_rounds_sentence(e)}{threads_text}{e.klass.sentence(e.cores)}"
        f"{_memory_sentence(e, s)}",
        _snippet(e.info, change) + threads_code,
        _workers_precondition(e, s, "pin_memory" in change),
        max(e.step_us - s.projected_us, 0.0),
        _workers_basis(e, s),
        evidence,
    )


def _keep_alive(e: LoaderEvidence) -> str:
    """Why persistent_workers: a trainer re-creates its loader's iterator each epoch; a
    server's loop makes one and keeps it, unless it loops over the loader again."""
    if e.inference:
        return (" Keep the workers alive between passes over the loader (each new iterator "
                "starts them again).")
    return " Keep the workers alive across epochs."


def _why(e: LoaderEvidence, s: Sizing) -> str:
    """Load against the other work, and the count it gives, with its cap."""
    waiting = e.klass.bound == "waiting"
    at = " at one intra-op thread" if s.script_compute_us is not None else ""
    shm = shm_write_us(e.batch_bytes) if e.workers_now == 0 else 0.0
    load = (f"each batch would take a worker {millis(ms(s.per_batch_us), 'tenths')} ms (its "
            f"{millis(ms(s.per_batch_us - shm), 'tenths')} ms of "
            f"{'loading at one intra-op thread' if at else 'time in the loader per step'}, plus "
            f"{millis(ms(shm), 'tenths')} ms writing it into shared memory)" if shm >= 50.0
            else f"each batch takes {millis(ms(s.per_batch_us), 'tenths')} ms of loading")
    why = (
        f"{load} against "
        f"{millis(ms(s.compute_us), 'tenths')} ms of other step work{at}, so "
        f"{plural(s.ideal, 'worker process', 'worker processes')} (load/compute rounded "
        f"up{', plus one spare' if e.workers_now == 0 else ''}) can prepare batches ahead of "
        "the step"
    )
    if waiting and e.cores is not None and s.workers > e.cores:
        why += (f"; more than the {plural(e.cores, 'core')}, as each worker mostly waits "
                f"({percent(100 * e.klass.cpu_share, 0)} of its time on CPU)")
    if s.cap is not None and e.cores is not None and s.workers < s.ideal:
        why += (f"; capped at {WAITING_WORKERS_PER_CORE} per core" if waiting
                else f"; capped at the {plural(e.cores, 'core')} this process may use")
    return why


def _rounds_sentence(e: LoaderEvidence) -> str:
    """Where the wait falls once a round of workers that lag: what a median step hides."""
    r = e.rounds
    if r is None:
        return ""
    return (f" The wait falls on {r.waited} of {r.steps} steps (up to "
            f"{millis(ms(r.max_wait_us), 'tenths')} ms), once a round of the "
            f"{plural(r.workers, 'worker')}: {millis(ms(r.mean_wait_us), 'tenths')} ms a step "
            f"on average, where the median step waits "
            f"{millis(ms(r.median_wait_us), 'tenths')} ms.")


def _threads_text(e: LoaderEvidence, s: Sizing) -> tuple[str, str]:
    """The intra-op threads set in the same change, and the step that sized the workers."""
    if s.threads is None or e.cores is None or e.threads is None:  # the fit needs both
        return "", ""
    text = (f" With {plural(s.workers, 'worker')} beside {plural(e.threads, 'intra-op thread')} "
            f"on {plural(e.cores, 'core')} they would preempt each other: set "
            f"torch.set_num_threads({s.threads}) in the same change (the two together, not "
            "either alone).")
    if s.script_compute_us is not None and s.script_workers is not None:
        text += (f" The workers are sized on the step at one intra-op thread, as run timed it "
                 f"before recording: {millis(ms(s.compute_us), 'tenths')} ms of other work, "
                 f"which gives {plural(s.workers, 'worker')}; at the script's "
                 f"{plural(e.threads, 'thread')} it took "
                 f"{millis(ms(s.script_compute_us), 'tenths')} ms, which would give "
                 f"{plural(s.script_workers, 'worker')}.")
    code = (f"\n+torch.set_num_threads({s.threads})  # {plural(e.cores, 'core')} shared with "
            f"{plural(s.workers, 'loader worker')}")
    return text, code


def _workers_precondition(e: LoaderEvidence, s: Sizing, pin: bool) -> str:
    waiting = e.klass.bound == "waiting"
    text = (f"Storage that serves {s.workers} concurrent readers as fast as one (the measured "
            "wait is per read, not a bandwidth limit); memory for the extra worker processes; "
            "a picklable dataset." if waiting and e.cores is not None and s.workers > e.cores
            else f"{plural(s.workers, 'CPU core')} free for loading in this process (cores per "
            "process, after the other ranks on the host); a picklable dataset; transforms that "
            "do not touch the GPU.")
    return text + (" pin_memory helps only with .to(device, non_blocking=True)." if pin else "")


def _workers_basis(e: LoaderEvidence, s: Sizing) -> str:
    if e.cores is None:
        return UPPER_BASIS
    cpu_work = "all CPU work spread over the cores"
    if e.klass.bound == "waiting":
        cpu_work += f", loading counted at its {percent(100 * e.klass.cpu_share, 0)} CPU share"
    return (
        f"estimate: with {plural(s.workers, 'worker')} on {plural(e.cores, 'core')} a step "
        f"takes about {millis(ms(s.projected_us), 'tenths')} ms (the largest of the other step "
        f"work, loading spread over the workers{', and ' + cpu_work if not e.has_gpu else ''}); "
        "never more than the loader wait"
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


def step_threads(workers: int, share: float, cores: int | None, threads: int | None
                 ) -> int | None:
    """The intra-op threads that fit beside `workers` loader workers (each busy `share` of its
    time) on `cores`; None when the current thread count already fits or a figure is unknown.
    torch runs one thread in each worker; cpu-oversubscription sizes its advice the same way."""
    if cores is None or threads is None:
        return None
    busy = math.ceil(workers * share - 1e-9)
    if threads + busy <= cores:
        return None
    return max(cores - busy, 1)

def prefetch_depth(info: LoaderInfo | None, klass: LoaderClass, workers: int) -> int | None:
    """A bursty loader (capture/transfer.py): its workers keep up on average, and the step
    waits on the slow batches only. A slow batch holds up its worker for `slow_fetch_ms`;
    meanwhile the step consumes one batch per `compute_ms_per_batch`, so the batches in flight
    (prefetch_factor x num_workers) must cover that: prefetch_factor >= (slow + compute) /
    (num_workers x compute). None when the current depth already covers it."""
    a = klass.anatomy
    slow, compute = a.get("slow_fetch_ms"), a.get("compute_ms_per_batch")
    if not isinstance(slow, int | float) or not isinstance(compute, int | float) or compute <= 0:
        return None
    need = math.ceil((slow + compute) / (workers * compute))
    return need if need > _prefetch_now(info) else None


def _prefetch_now(info: LoaderInfo | None) -> int:
    return info.prefetch_factor if info and info.prefetch_factor else 2  # torch's default


def _prefetch_advice(info: LoaderInfo | None, klass: LoaderClass, workers: int,
                     wait: float) -> Advice | None:
    """A deeper queue for a bursty loader (`prefetch_depth`), capped at MAX_PREFETCH_FACTOR;
    None when the current depth already covers the slow batches."""
    need = prefetch_depth(info, klass, workers)
    if need is None:
        return None
    a = klass.anatomy
    slow, compute = a["slow_fetch_ms"], a["compute_ms_per_batch"]
    now = info.prefetch_factor if info and info.prefetch_factor else None
    current = _prefetch_now(info)
    depth = min(need, MAX_PREFETCH_FACTOR)
    capped = (f" (capped at {MAX_PREFETCH_FACTOR}: {need} would cover it; the rest needs "
              "the slow samples made cheaper or cached)" if need > depth else "")
    p50, p90 = a.get("fetch_ms_p50") or 0.0, a.get("fetch_ms_p90") or 0.0
    knobs = Knobs.of(info)  # DataLoader(...) at its line, or TrainingArguments under Trainer
    now_args = {"num_workers": workers, "prefetch_factor": current}
    head = (f"{knobs.change_line(now_args, {'prefetch_factor': depth})}. The workers keep"
            if knobs is not None else
            f"DataLoader(num_workers={workers}, prefetch_factor={current}): the workers keep")
    recommendation = (
        f"{head} up on average ({workers} x {millis(compute, 'tenths')} ms of other step work per "
        f"batch >= {millis(a.get('fetch_ms_mean', 0), 'tenths')} ms mean fetch), but some batches "
        f"are slow: a batch's fetch takes {millis(p50, 'tenths')} ms at the median and "
        f"{millis(p90, 'tenths')} ms at p90 ({p90 / p50 if p50 else 0:.0f}x), the slow ones "
        f"{millis(slow, 'tenths')} ms, and the step waits on "
        f"{percent(100 * (a.get('waited_share') or 0), 0)} of the batches only. A deeper queue "
        f"hides them: prefetch_factor={depth} keeps {depth * workers} batches in flight, "
        f"{millis(depth * workers * compute, 'whole')} ms of steps against a "
        f"{millis(slow, 'whole')} ms slow batch{capped}. More workers are not needed for the mean."
    )
    before = {"num_workers": workers, "prefetch_factor": now or "default (2)"}
    after = {"num_workers": workers, "prefetch_factor": depth}
    snippet = (knobs.diff(f"{info.dataset}, batch_size={info.batch_size}", before, after)
               if info is not None and knobs is not None else
               f"-DataLoader(..., num_workers={workers}, prefetch_factor={now or 'default (2)'})"
               f"\n+DataLoader(..., num_workers={workers}, prefetch_factor={depth})")
    per_batch = info.measured["bytes"] if info and info.measured else None
    memory = (f" ({max(depth * workers * per_batch / 1e6, 0.1):.1f} MB at the measured batch "
              "size)" if per_batch else "")
    evidence = {"loader_bursty": True, "suggested_prefetch_factor": depth,
                **{f"loader_{k}": a[k] for k in ("fetch_ms_p50", "fetch_ms_p90", "fetch_ms_mean",
                                                 "slow_fetch_ms", "waited_share",
                                                 "compute_ms_per_batch", "wait_ms_p50",
                                                 "wait_ms_p90")
                   if isinstance(a.get(k), int | float)},
                **klass.evidence()}
    return Advice(
        recommendation,
        snippet,
        f"Memory for {depth * workers} batches in flight{memory}; slow batches spread over the "
        "workers (a worker's slow batch still delays that worker's next ones); the dataset's "
        "slowness is per batch, not a storage that slows down for everyone at once.",
        wait,
        "upper bound: the step's wait for the DataLoader, if the deeper queue hid every slow "
        "batch",
        evidence,
    )


def _receive_bound(klass: LoaderClass, wait_us: float) -> bool:
    """The training process's own receiving is most of its wait: batches ready in the workers,
    shipped while the step waits (capture/transfer.py). More workers cannot shorten that."""
    t = klass.transfer_ms
    per_batch = klass.anatomy.get("wait_ms_per_batch")
    return (klass.bound == "main-process-bound" and t is not None
            and isinstance(per_batch, int | float) and per_batch > 0
            and t >= RECEIVE_SHARE * per_batch and wait_us > 0)


BACKGROUND_SNIPPET = """import queue
import threading


class BackgroundLoader:
    \"\"\"Receive the next batches in a thread while the GPU runs the step.\"\"\"

    def __init__(self, loader, depth=2):
        self.loader, self.depth = loader, depth

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        batches, end = queue.Queue(self.depth), object()

        def fill():
            try:
                for batch in self.loader:
                    batches.put(batch)
            except BaseException as exc:  # raised again in the training loop
                batches.put(exc)
            batches.put(end)

        threading.Thread(target=fill, daemon=True).start()
        while (batch := batches.get()) is not end:
            if isinstance(batch, BaseException):
                raise batch
            yield batch


"""


def _background_advice(info: LoaderInfo | None, klass: LoaderClass, wait: float) -> Advice:
    """Main-process-bound on a GPU run: receiving the batches (unpickling, shared-memory
    mapping, pinning) sits between the steps on the stepping thread; a thread that iterates
    the loader overlaps it with the GPU's work (the BackgroundGenerator / DataLoaderX
    pattern)."""
    a = klass.anatomy
    t = klass.transfer_ms or 0.0
    per_batch = a.get("wait_ms_per_batch") or 0.0
    ready = a.get("ready_to_received_ms")
    sat = (f"; the batches were ready in the workers a median {millis(ready['median'], 'tenths')} "
           "ms before"
           if isinstance(ready, dict) and isinstance(ready.get("median"), int | float) else "")
    where = f"{info.call_site} " if info else ""
    recommendation = (
        f"{where}Receiving each batch costs the training process a median {millis(t, 'tenths')} ms "
        f"(unpickling, shared-memory mapping, pinning) of its {millis(per_batch, 'tenths')} ms "
        f"wait per batch{sat}: the workers keep up, and more of them would not shorten it. Receive "
        "the next batch in a background thread while the GPU runs the step (the "
        "BackgroundGenerator / DataLoaderX pattern). Fewer, larger tensors in smaller dtypes "
        "(uint8 images, normalised on the GPU) make receiving cheaper too."
    )
    call = f"  # {info.call_site}" if info else ""
    snippet = (BACKGROUND_SNIPPET + f"loader = BackgroundLoader(torch.utils.data.DataLoader(...))"
               f"{call}")
    return Advice(
        recommendation,
        snippet,
        "A GPU step long enough to hide the receiving (the stepping thread then waits on the GPU, "
        "not in Python); unpickling holds the GIL, so a step whose own Python work is the limit "
        "gains less; the wrapped loader iterated from one thread only.",
        min(t * 1000.0, wait),
        "upper bound: the receiving measured in the training process per batch, if all of it "
        "overlapped the GPU's work",
        {"background_thread": True, "loader_transfer_ms_per_batch": t,
         **({"loader_ready_to_received_ms": ready} if isinstance(ready, dict) else {}),
         **klass.evidence()},
    )


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    """The workers and the step's threads as one change, where `run` timed one-thread steps;
    else the workers alone (their prediction then keeps the step's threads)."""
    ev = finding.evidence or {}
    n = ev.get("suggested_num_workers")
    if not isinstance(n, int) or n <= 0:
        return []
    probed = OneThread.of(model) is not None  # `run` timed the steps at one thread
    one_thread = ev.get("suggested_torch_threads") == 1 and probed
    one = [Change("torch_threads", "1")] if one_thread else []
    return [*one, Change("num_workers", str(int(n)))]


def no_change(finding: Finding) -> str:
    ev = finding.evidence or {}
    if "suggested_prefetch_factor" in ev:
        return "the replay does not model prefetch_factor (how many batches are in flight)"
    if ev.get("background_thread"):
        return "the replay does not model a thread that receives batches during the step"
    return ("the rule could not size a worker count (the loader already has workers and "
            "the trace does not say how many, or the cores are already busy)")


SPEC = RuleSpec(
    id=RULE_ID,
    title="the training step waits for the next batch",
    summary="the step waits in `DataLoader.__next__` with no GPU work running",
    check=dataloader_bound,
    thresholds={"WAIT_THRESHOLD_PCT": WAIT_THRESHOLD_PCT, "MIN_GAIN": MIN_GAIN,
                "WAITING_WORKERS_PER_CORE": WAITING_WORKERS_PER_CORE,
                "MAX_PREFETCH_FACTOR": MAX_PREFETCH_FACTOR},
    what_if=("num_workers", "torch_threads"),
    changes=changes,
    no_change=no_change,
    order=10,
    metric=Metric("step waiting for the DataLoader (no GPU work)", MS,
                  evidence_key("wait_ms_per_step"), "wait_share_pct"),
    verdict_metric=("wait_share_pct", "dataloader_wait_pct"),
    loader_pace=True,
    loader_setting=True,
    loader_story=True,
)
