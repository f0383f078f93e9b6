"""What `stallscope tune` tries: DataLoader settings derived from the baseline run's report.

The sweep is driven by what the baseline measured, not by a fixed grid: worker counts up to the
cores this process may use (more workers than cores only adds contention on a CPU-bound loader),
and beyond them, up to WAITING_WORKERS_PER_CORE per core, when `run` measured the loader as
waiting on storage (its workers mostly blocked, off the cores: capture/anatomy.py),
the `dataloader-bound` finding's own suggestion, `persistent_workers` whenever there are workers
(re-spawning them every epoch is pure cost), `pin_memory` only when a GPU was used (pinned
memory only speeds host-to-device copies), then `prefetch_factor` 2 vs 4 on the best worker
count. On a CPU run whose loader computes (not waiting), a worker count that would not fit the
cores beside the step's intra-op threads comes with the threads it leaves the step
(`torch_threads`, as dataloader-bound advises them: one change); for a waiting loader, every
count comes with the threads the finding sets, where it sets them. The candidate the finding
suggests runs first, so a tight budget still measures it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallscope.capture.overrides import PROCESS_KEYS, Overrides, key_rank
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.rules.dataloader_bound import WAITING_WORKERS_PER_CORE
from stallscope.units import percent

# Beyond a handful of cores, every count would cost a run each; powers of two cover the curve.
DENSE_UP_TO = 4
DEFAULT_PREFETCH = 2  # torch's default when num_workers > 0
PREFETCH_CHOICES = (2, 4)


@dataclass(frozen=True)
class Baseline:
    """What the sweep needs from the baseline's report.json."""

    cores: int
    gpu_used: bool
    suggested_num_workers: int | None
    loader: dict[str, Any]  # the DataLoader that drew the most batches: the training loader
    loader_bound: bool
    notes: list[str] = field(default_factory=list)
    bound: str | None = None  # the loader's class measured by `run` (capture/anatomy.py)
    torch_threads: int | None = None  # the training process's intra-op threads, as run saw
    suggested_torch_threads: int | None = None  # dataloader-bound's, with its worker count
    # The most workers the memory holds (diagnose/memory.py, from run's samples); None: unknown.
    memory_fit: int | None = None

    @property
    def max_workers(self) -> int:
        """The most workers worth trying: the cores, or beyond them for a waiting loader; never
        more than the memory holds."""
        most = self.cores * (WAITING_WORKERS_PER_CORE if self.bound == "waiting" else 1)
        return most if self.memory_fit is None else max(1, min(most, self.memory_fit))

    @property
    def call_site(self) -> str:
        """The line to change: the DataLoader call, or the TrainingArguments under Trainer."""
        knobs = Knobs.of(self.loader)
        return knobs.where if knobs is not None else ""


def training_loader(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's DataLoader that drew the most batches while recording (then overall): the
    training loader; None when the script built none."""
    loaders = [d for d in report.get("dataloaders") or [] if isinstance(d, dict)]
    if not loaders:
        return None
    return max(loaders, key=lambda d: (d.get("batches_recorded") or 0, d.get("batches") or 0))


def baseline_from_report(report: dict[str, Any]) -> Baseline:
    """Read cores, GPUs, the finding's suggestion and the training DataLoader from a report.

    Raises ValueError when the script built no DataLoader: there is nothing to tune then.
    """
    loader = training_loader(report)
    if loader is None:
        raise ValueError("the script built no DataLoader, so there is nothing to tune")
    captured = (report.get("environment") or {}).get("captured") or {}
    cpu = captured.get("cpu") or {}
    cores = int(cpu.get("cores_per_process") or cpu.get("affinity") or cpu.get("count") or 1)
    finding = next(
        (f for f in report.get("findings") or [] if f.get("id") == "dataloader-bound"), None
    )
    suggested = suggested_threads = None
    notes = []
    if finding is not None:
        evidence = finding.get("evidence") or {}
        value = evidence.get("suggested_num_workers")
        suggested = int(value) if isinstance(value, int | float) else None
        value = evidence.get("suggested_torch_threads")
        suggested_threads = int(value) if isinstance(value, int | float) else None
    else:
        notes.append(
            "the baseline shows no dataloader-bound finding: loading is not what the step waits "
            "on, so the sweep is unlikely to find a large speedup"
        )
    bound = loader.get("bound") if isinstance(loader.get("bound"), str) else None
    threads = cpu.get("torch_threads")
    fit = memory_fit(report)
    if fit is not None:
        notes.append(f"the baseline's memory holds at most {fit} worker(s) (run's samples of "
                     "each worker's memory against the memory the job may use): no candidate "
                     "has more")
    if bound == "waiting":
        a = loader.get("anatomy") or {}
        blocked = a.get("blocked_share")
        how = (f"{percent(100 * blocked, 0)} of its loading blocked, off the CPU"
               if isinstance(blocked, int | float) else "its loading mostly off the CPU")
        notes.append(
            f"the baseline measured the loader waiting on storage ({how}): worker counts beyond "
            f"the {max(cores, 1)} core(s) are tried, up to {WAITING_WORKERS_PER_CORE} per core, "
            "since a waiting worker takes little CPU"
        )
    return Baseline(
        cores=max(cores, 1),
        gpu_used=bool(captured.get("gpus")),
        suggested_num_workers=suggested,
        loader=loader,
        loader_bound=finding is not None,
        notes=notes,
        bound=bound,
        torch_threads=threads if isinstance(threads, int) and threads > 0 else None,
        suggested_torch_threads=suggested_threads,
        memory_fit=fit,
    )


def memory_fit(report: dict[str, Any]) -> int | None:
    """The most workers memory holds, as the baseline's findings measured it (dataloader-bound's
    or worker-memory's evidence); None where memory was not assessed."""
    for f in report.get("findings") or []:
        evidence = f.get("evidence") or {}
        for key in ("memory_fit_num_workers", "workers_fit"):
            value = evidence.get(key)
            if f.get("id") in ("dataloader-bound", "worker-memory") and isinstance(value, int):
                return value
    return None


def worker_counts(base: Baseline) -> list[int]:
    """Worker counts to measure, the finding's suggestion first, then from most to fewest.

    Up to `DENSE_UP_TO` cores every count is tried; above it, powers of two and the core count.
    A waiting loader also gets twice and `WAITING_WORKERS_PER_CORE` times the cores.
    """
    cores = base.cores
    if cores <= DENSE_UP_TO:
        counts = set(range(1, cores + 1))
    else:
        counts = {2**k for k in range(cores.bit_length()) if 2**k <= cores} | {cores}
    if base.max_workers > cores:
        counts |= {2 * cores, base.max_workers}
    counts = {n for n in counts if n <= base.max_workers}
    first = []
    if base.suggested_num_workers and base.suggested_num_workers > 0:
        first = [min(base.suggested_num_workers, base.max_workers)]
    rest = sorted(counts - set(first), reverse=True)
    return first + rest


def worker_candidates(base: Baseline) -> list[Overrides]:
    """One override set per worker count; the baseline's own configuration is left out."""
    out = []
    for n in worker_counts(base):
        cand: Overrides = {"num_workers": n, "persistent_workers": True}
        if base.gpu_used:
            cand["pin_memory"] = True
        if (threads := threads_for(base, n)) is not None:
            cand["torch_threads"] = threads
        if not is_baseline_config(base.loader, cand):
            out.append(cand)
    return out


def threads_for(base: Baseline, workers: int) -> int | None:
    """The intra-op threads to run `workers` computing workers with on a CPU run, when the two
    would not fit the cores: the finding's own figure for its worker count, else the cores the
    workers leave (at least one). A waiting loader's workers take little CPU, but where the
    finding sets the threads with them (their wake-ups preempt the step's threads), every count
    is measured at those threads, so the counts compare under the change as advised. None: keep
    the script's threads (a GPU run, a waiting loader the finding leaves them for, or room
    enough)."""
    if base.gpu_used or base.torch_threads is None:
        return None
    if base.bound == "waiting":
        return base.suggested_torch_threads
    if workers + base.torch_threads <= base.cores:
        return None
    if workers == base.suggested_num_workers and base.suggested_torch_threads:
        return base.suggested_torch_threads
    return max(1, base.cores - workers)


def prefetch_candidates(base: Baseline, best: Overrides) -> list[Overrides]:
    """`prefetch_factor` values not yet measured on the best worker configuration."""
    if not best or int(best.get("num_workers", base.loader.get("num_workers") or 0)) <= 0:
        return []
    current = best.get("prefetch_factor", base.loader.get("prefetch_factor") or DEFAULT_PREFETCH)
    return [{**best, "prefetch_factor": p} for p in PREFETCH_CHOICES if p != current]


def is_baseline_config(loader: dict[str, Any], overrides: Overrides) -> bool:
    """True when applying `overrides` would not change the captured DataLoader."""
    return all(_effective(loader, k) == v for k, v in overrides.items())


def _effective(loader: dict[str, Any], key: str) -> Any:
    if key in PROCESS_KEYS:
        return None  # the process's setting, not the loader's: an override always changes it
    value = loader.get(key)
    if key == "prefetch_factor" and value is None and (loader.get("num_workers") or 0) > 0:
        return DEFAULT_PREFETCH
    return value


def change_text(loader: dict[str, Any], overrides: Overrides) -> str | None:
    """The constructor change to paste at the call site, only the arguments that differ:
    `DataLoader(..., num_workers=2, persistent_workers=True)`, spelled as the script sets them
    (`TrainingArguments(..., dataloader_num_workers=2)` under Trainer: diagnose/knobs.py);
    None when nothing differs."""
    keys = [k for k in sorted(overrides, key=key_rank) if _effective(loader, k) != overrides[k]]
    if not keys:
        return None
    return _with_threads(loader, overrides, keys, lambda k: overrides[k])


def before_text(loader: dict[str, Any], overrides: Overrides, threads: int | None = None) -> str:
    """The same arguments as `change_text`, with the values the script passed (or defaulted)."""
    keys = [k for k in sorted(overrides, key=key_rank) if _effective(loader, k) != overrides[k]]
    return _with_threads(loader, overrides, keys, lambda k: _effective(loader, k),
                         threads=threads)


def _with_threads(loader: dict[str, Any], overrides: Overrides, keys: list[str],
                  value: Any, threads: int | None = None) -> str:
    """The constructor call, then `torch.set_num_threads(N)` when the change sets threads."""
    text = _knobs(loader).call_text({k: value(k) for k in keys if k not in PROCESS_KEYS},
                                    spell=repr)
    if "torch_threads" in keys:
        n = value("torch_threads") if threads is None else threads
        if n is not None:  # a before text without the script's thread count leaves it out
            text += f"; torch.set_num_threads({n})"
    return text


def _knobs(loader: dict[str, Any]) -> Knobs:
    return Knobs.of(loader) or Knobs("DataLoader", None, None, "unknown", None)
