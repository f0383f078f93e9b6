"""`dataloader-bound`: the training step waits for the next batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.epochs import respawn_loader_us
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.hostload import other_load
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.spec import Change, RuleSpec
from stallscope.replay.loader import LoaderFacts
from stallscope.replay.threads import OneThread
from stallscope.runfacts import LoaderInfo, RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
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
            f"The step waits {percent(wait_pct)} of its time on the DataLoader (threshold "
            f"{percent(WAIT_THRESHOLD_PCT, 0)}).",
        )
    # The wait the epochs' worker re-spawns hold is worker-startup's: persistent workers, not
    # more of them, remove it (one lost millisecond, one owner).
    respawn = min(respawn_loader_us(model, context), wait)
    # Hiding the wait cannot make the step shorter than the GPU's own busy time.
    bound = wait - respawn if not model.has_gpu else min(
        wait - respawn, max(total - busiest_gpu_us(model), 0.0))
    loader_info = context.training_loader() if context else None
    cores = context.cores_per_process if context else None
    klass = LoaderClass.of(model, loader_info)
    workers_hint = None
    if context is None:
        # A trace analysed alone: its metadata may say the cores (trace/cores.py), and one
        # recorded by `run` with the anatomy the worker count too, so the advice is the one
        # `run` gave. Without the anatomy, workers are capped at the cores unless a fetch was
        # measured to mostly wait (such workers need no core each).
        facts = LoaderFacts.of(model.trace)
        if klass.bound:
            workers_hint, cores = facts.workers, facts.cores
        elif not facts.mostly_waits:
            cores = facts.cores
    threads = (context.environment.get("cpu", {}) or {}).get("torch_threads") if context else None
    advice = _advice(model, loader_info, cores, step=total / n, wait=wait / n, load=loader / n,
                     klass=klass, workers_hint=workers_hint,
                     threads=threads if isinstance(threads, int) else None)
    evidence.update(advice.evidence)
    saving = pct(min(bound / n, advice.saving_us), total / n)
    basis = advice.basis
    if respawn > 0:
        evidence["respawn_wait_ms_per_step"] = ms(respawn / n)
        basis += (f"; less the {millis(ms(respawn / n), 'tenths')} ms per step of it that the "
                  "epochs' worker re-spawns hold, worker-startup's to win back")
    who, unit = ("Inference", "batch") if model.workload == "inference" else ("Training", "step")
    title = f"{who} waits on the DataLoader for {percent(wait_pct)} of each {unit}"
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
        saving_basis=basis,
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
            return (f" Loading computes: measured {where}, a batch's {millis(fetch, 'tenths')} ms "
                    f"fetch is {percent(100 * on, 0)} on a core or queued for one{queued}, so "
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
    threads: int | None = None,
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
            ")",
            "More workers help only while CPU cores are free; if the cores are saturated, make "
            "loading cheaper instead.",
            wait,
            upper_basis,
            {},
        )
    if workers_now and klass.anatomy.get("bursty"):
        deeper = _prefetch_advice(info, klass, workers_now, wait)
        if deeper is not None:
            return deeper
    if workers_now and model.has_gpu and _receive_bound(klass, wait):
        return _background_advice(info, klass, wait)
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
            f"the DataLoader has {plural(workers_now, 'worker')}" if workers_now
            else "the step's own compute already keeps them busy"
        )
        # unknown cores reach here only with a worker count from the trace and no core count
        held = plural(cores, "core") if cores is not None else "an unknown number of cores"
        return _Advice(
            f"{_where(info)}The step waits for batches, but this process may use "
            f"{held} and {busy}: more worker processes would compete for the "
            "same cores "
            "rather than overlap. Make each sample cheaper (lighter or GPU-side transforms and "
            "decoding, caching decoded samples), read from faster storage, or give the process "
            f"more cores (fewer processes per host).{klass.sentence(cores)}",
            f"# {info.call_site if info else 'the DataLoader'}: loading competes with the step "
            f"for {held}\n"
            "# - cache decoded samples, or move augmentation to the GPU\n"
            "# - fewer processes per host, or a wider CPU affinity for this one",
            "Loading is CPU-bound on cores that are all in use.",
            wait,
            upper_basis.replace("if fully overlapped", "if loading cost nothing"),
            evidence,
        )
    evidence["projected_step_ms"] = ms(projected)
    change: dict = {"num_workers": workers}
    if workers_now == 0:
        # New worker processes: without it they restart each epoch. For a loader that has
        # workers already, `worker-startup` says it, with the restarts it measured.
        change["persistent_workers"] = True
    # CPU training: the workers take cores from the step's intra-op threads. When the two would
    # want more cores than the process has, the thread count is part of the same change (one
    # piece of advice, not a second finding saying "fewer threads instead").
    fit = step_threads(workers, share, cores, threads) if not model.has_gpu else None
    if fit is not None:
        evidence["suggested_torch_threads"] = fit
    if model.has_gpu and not (info and info.pin_memory):
        change["pin_memory"] = True
    why = (
        f"each batch takes {millis(ms(per_batch), 'tenths')} ms of loading against "
        f"{millis(ms(compute), 'tenths')} ms of other step work, so "
        f"{plural(ideal, 'worker process', 'worker processes')} (load/compute rounded "
        f"up{', plus one spare' if workers_now == 0 else ''}) can prepare batches ahead of the step"
    )
    if waiting and cores is not None and workers > cores:
        why += (f"; more than the {plural(cores, 'core')}, as each worker mostly waits "
                f"({percent(100 * share, 0)} of its time on CPU)")
    if cap is not None and cores is not None and workers < ideal:
        why += (f"; capped at {WAITING_WORKERS_PER_CORE} per core" if waiting
                else f"; capped at the {plural(cores, 'core')} this process may use")
    basis = upper_basis
    if cores is not None:
        cpu_work = "all CPU work spread over the cores"
        if waiting:
            cpu_work += f", loading counted at its {percent(100 * share, 0)} CPU share"
        basis = (
            f"estimate: with {plural(workers, 'worker')} on {plural(cores, 'core')} a step takes "
            f"about {millis(ms(projected), 'tenths')} ms (the largest of the other step work, "
            f"loading spread over the workers{', and ' + cpu_work if not model.has_gpu else ''}); "
            "never more than the loader wait"
        )
    where = "Loading runs in the main process" if workers_now == 0 else "The workers lag"
    threads_text, threads_code = "", ""
    if fit is not None and cores is not None and threads is not None:  # fit needs both
        threads_text = (
            f" With {plural(workers, 'worker')} beside {plural(threads, 'intra-op thread')} on "
            f"{plural(cores, 'core')} "
            f"they would preempt each other: set torch.set_num_threads({fit}) in the same change "
            "(the two together, not either alone).")
        threads_code = (f"\n+torch.set_num_threads({fit})  # {plural(cores, 'core')} shared with "
                        f"{plural(workers, 'loader worker')}")
    return _Advice(
        f"{_where(info, change)}{where}: {why}."
        f"{' Keep the workers alive across epochs.' if workers_now == 0 else ''}"
        f"{threads_text}{klass.sentence(cores)}",
        _snippet(info, change) + threads_code,
        (f"Storage that serves {workers} concurrent readers as fast as one (the measured wait is "
         "per read, not a bandwidth limit); memory for the extra worker processes; a picklable "
         "dataset." if waiting and cores is not None and workers > cores else
         f"{plural(workers, 'CPU core')} free for loading in this process (cores per process, "
         "after the "
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

def _prefetch_advice(info: LoaderInfo | None, klass: LoaderClass, workers: int,
                     wait: float) -> _Advice | None:
    """A bursty loader (capture/transfer.py): its workers keep up on average, and the step
    waits on the slow batches only. A slow batch holds up its worker for `slow_fetch_ms`;
    meanwhile the step consumes one batch per `compute_ms_per_batch`, so the batches in flight
    (prefetch_factor x num_workers) must cover that: prefetch_factor >= (slow + compute) /
    (num_workers x compute). None when the current depth already covers it."""
    a = klass.anatomy
    slow, compute = a.get("slow_fetch_ms"), a.get("compute_ms_per_batch")
    if not isinstance(slow, int | float) or not isinstance(compute, int | float) or compute <= 0:
        return None
    now = info.prefetch_factor if info and info.prefetch_factor else None
    current = now or 2  # torch's default with workers
    need = math.ceil((slow + compute) / (workers * compute))
    if need <= current:
        return None
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
    return _Advice(
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


def _background_advice(info: LoaderInfo | None, klass: LoaderClass, wait: float) -> _Advice:
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
    return _Advice(
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
)
