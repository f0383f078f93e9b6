"""`worker-memory`: DataLoader workers whose own memory grows as they load, or that do not fit.

Each worker is a process of its own. Forked, it shares the training process's pages until it
writes to them; reading a Python object writes its reference count, so a worker that reads a
dataset held as Python objects (a list of ints, strings, dicts) copies the page under each
object it touches: its unique memory grows over the epoch toward the whole dataset, once per
worker (pytorch/pytorch#13246). The figures are `run`'s samples of each process's unique
memory (capture/memory.py, read in diagnose/memory.py); the cause is named from the dataset's
storage as `run` found it (a Python container of many objects, or arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.diagnose import memory
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel

RULE_ID = "worker-memory"
DOCS = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"
COW_ISSUE = "https://github.com/pytorch/pytorch/issues/13246"

# The thresholds diagnose/memory.py judges by, named here as the rule declares them.
GROWTH_MIN_MB = memory.GROWTH_MIN_MB
GROWTH_MIN_SHARE = memory.GROWTH_MIN_SHARE
MARGIN = memory.MARGIN

COPY_ON_WRITE = "copy-on-write"  # workers grow, the dataset holds Python objects
GROWING = "growing"  # workers grow, no Python-object storage seen
TOO_MANY = "too-many"  # the workers running now do not fit the budget


@dataclass(frozen=True)
class Judgement:
    found: bool
    cause: str
    workers: int  # the workers that ran
    fit: int | None  # the most that fit the budget


def worker_memory(model: TraceModel, context: RunContext | None = None) -> Assessment:
    evidence = measure(model, context)
    if isinstance(evidence, Assessment):
        return evidence
    j = judge(evidence)
    if not j.found:
        w = evidence.workers
        return Assessment(
            RULE_ID, "clear",
            f"{plural(len(w), 'DataLoader worker')} hold {memory.mb(max(x.last_uss for x in w))}"
            f" MB of their own at most, grown by at most "
            f"{memory.mb(max(x.growth for x in w))} MB over {_span(evidence)}"
            + (f"; {j.fit} would fit the {evidence.budget_source}" if j.fit is not None
               else "") + ".")
    return Assessment.found(finding(evidence, j))


def measure(model: TraceModel, context: RunContext | None = None
            ) -> memory.MemoryFacts | Assessment:
    """The trace's memory facts, or why the rule cannot judge."""
    got = memory.facts(model.trace.capture)
    if isinstance(got, str):
        return Assessment(RULE_ID, "not_assessed", f"{got[0].upper()}{got[1:]}.")
    if not got.workers:
        return Assessment(RULE_ID, "not_assessed",
                          "No DataLoader worker process was sampled during the run "
                          "(num_workers=0, or the workers ran between the samples).")
    return got


def judge(e: memory.MemoryFacts) -> Judgement:
    """Growth first (its cause decides the fix), then a worker count over the budget."""
    fit = e.workers_fit()
    n = len(e.workers)
    if e.growing:
        return Judgement(True, COPY_ON_WRITE if e.python_storage else GROWING, n, fit)
    if fit is not None and n > fit:
        return Judgement(True, TOO_MANY, n, fit)
    return Judgement(False, "", n, fit)


def finding(e: memory.MemoryFacts, j: Judgement) -> Finding:
    grow = e.growing
    evidence = {
        "workers": j.workers,
        "worker_unique_mb": [memory.mb(w.last_uss) for w in e.workers],
        "max_worker_unique_mb": max(memory.mb(w.last_uss) for w in e.workers),
        "worker_unique_start_mb": [memory.mb(w.first_uss) for w in e.workers],
        "worker_growth_mb": [memory.mb(w.growth) for w in e.workers],
        "worker_growth_mb_per_s": [w.mb_per_s for w in e.workers],
        "worker_resident_mb": [memory.mb(w.last_rss) for w in e.workers],
        "sampled_s": round(max(w.seconds for w in e.workers), 1),
        "job_mb": memory.mb(e.tree_bytes),
        "budget_mb": memory.mb(e.budget_bytes) if e.budget_bytes else None,
        "budget_source": e.budget_source,
        "workers_fit": j.fit,
        "dataset_storage": list(e.storage),
    }
    if grow:
        title = (f"DataLoader workers' own memory grows as they load: "
                 f"+{memory.mb(max(w.growth for w in grow))} MB per worker over "
                 f"{_span(e)}" + (" (copy-on-write of a dataset of Python objects)"
                                  if j.cause == COPY_ON_WRITE else ""))
    else:
        title = (f"{j.workers} DataLoader workers do not fit the memory: {j.fit} would, "
                 f"at {memory.mb(e.per_worker_bytes)} MB each")
    recommendation, snippet = _advice(e, j)
    over = j.fit is not None and j.workers > j.fit
    return Finding(
        id=RULE_ID, title=title, evidence=evidence, recommendation=recommendation,
        snippet=snippet,
        precondition=("Helps when the dataset's items are numbers or strings an array can "
                      "hold; the memory freed is each worker's copy, per worker."
                      if j.cause == COPY_ON_WRITE else
                      "Fewer workers load fewer batches at once: check the loader still keeps "
                      "up (dataloader-bound)."),
        estimated_saving_pct=0.0,
        saving_basis=("memory, not step time: the workers' copies of the dataset "
                      f"({memory.mb(sum(w.growth for w in grow))} MB grown in all, measured)"
                      if grow else "memory, not step time"),
        docs=COW_ISSUE if j.cause == COPY_ON_WRITE else DOCS,
        severity="medium" if over else "low",
    )


def _advice(e: memory.MemoryFacts, j: Judgement) -> tuple[str, str]:
    fit = (f" {e.fit_text(j.workers)}." if j.fit is not None else "")
    if j.cause == COPY_ON_WRITE:
        s = e.python_storage[0]
        what = (f"`{s['attr']}` holds {s.get('items', 0):,} Python {s.get('element', 'object')}"
                f" objects ({s['type']})" if "items" in s else
                f"`{s['attr']}` is an array of Python objects (dtype=object)")
        return (
            f"The dataset's {what}: each worker writes the reference count of every object it "
            "reads, which copies the page it lives on into that worker (copy-on-write), so each "
            "worker's own memory grows toward the whole dataset over an epoch. Hold the items in "
            "one buffer the workers only read: a numpy array or torch tensor for numbers, for "
            "strings one bytes array with offsets (or a pyarrow array); or use fewer workers."
            + fit,
            f"# {s['attr']}: a Python {s['type']} of {s.get('element', 'object')}: copied into "
            "every worker as it is read\n"
            f"self.{s['attr']} = np.asarray(items)            # numbers: one buffer\n"
            "# strings: one bytes buffer and the offsets into it\n"
            "enc = [x.encode() for x in items]\n"
            "self.offsets = np.cumsum([0] + [len(b) for b in enc])\n"
            "self.blob = np.frombuffer(b''.join(enc), dtype=np.uint8)",
        )
    if j.cause == GROWING:
        return (
            "Each worker's own memory grows while it loads, and no dataset attribute of Python "
            "objects was found to explain it: a cache filled in the worker, buffers kept "
            "between batches, or Python objects read through another object. Bound the cache, "
            "or keep the data in arrays; or use fewer workers." + fit,
            "# inside the Dataset: no per-worker cache that grows without bound\n"
            "# e.g. functools.lru_cache(maxsize=...) instead of a dict filled in __getitem__",
        )
    return (
        f"The workers take more memory than the job has.{fit} Use {j.fit} workers, or make "
        "each one smaller.",
        f"loader = DataLoader(dataset, ..., num_workers={j.fit})",
    )


def _span(e: memory.MemoryFacts) -> str:
    return f"{max(w.seconds for w in e.workers):.1f} s"


SPEC = RuleSpec(
    id=RULE_ID,
    title="DataLoader workers' own memory grows as they load, or they do not fit the memory",
    summary="DataLoader workers grow by copy-on-write, or more run than memory holds",
    check=worker_memory,
    thresholds={"GROWTH_MIN_MB": GROWTH_MIN_MB, "GROWTH_MIN_SHARE": GROWTH_MIN_SHARE,
                "MARGIN": MARGIN},
    order=140,
    metric=Metric("largest DataLoader worker's own memory", "MB",
                  evidence_key("max_worker_unique_mb")),
)
