"""What the recording's memory figures say: each DataLoader worker's unique memory and its growth,
the memory the job may use, and how many workers fit in it.

Read from the trace's stallscope metadata (`memory`, written by `stallscope run`:
capture/memory.py), so `analyze` of that trace says the same. One more worker adds about its
unique memory (USS: the pages only it holds); the pages it shares with the training process
are counted once in the processes' proportional sizes (PSS), whose sum is what the job holds.
A worker that grows as it reads a dataset of Python objects copies the pages those objects live
on (copy-on-write, as each access writes the object's reference count): its unique memory grows
toward its resident size, the pages it inherited, which is the bound used for such a worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Memory left free when counting the workers that fit: the allocator's slack, page cache, the
# spikes between samples.
MARGIN = 0.9
# A worker grows when its unique memory rose by at least this much (MB) and this share of
# where it started, between its first and last sample.
GROWTH_MIN_MB = 32.0
GROWTH_MIN_SHARE = 0.25
MB = 1 << 20


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's unique and resident memory at its first and last sample (bytes)."""

    pid: int
    worker_id: int | None
    loader: str | None
    first_uss: int
    last_uss: int
    last_rss: int
    last_pss: int
    seconds: float  # between the first and last sample

    @property
    def growth(self) -> int:
        return self.last_uss - self.first_uss

    @property
    def grows(self) -> bool:
        return (self.growth >= GROWTH_MIN_MB * MB
                and self.growth >= GROWTH_MIN_SHARE * max(self.first_uss, 1))

    @property
    def mb_per_s(self) -> float | None:
        return round(self.growth / MB / self.seconds, 2) if self.seconds > 0 else None


@dataclass(frozen=True)
class MemoryFacts:
    """The run's memory as sampled: the workers, the job's total, the budget."""

    workers: tuple[WorkerMemory, ...]
    main_pss: int | None
    budget_bytes: int | None  # what the job may hold: the container's limit, else held + free
    budget_source: str  # "container limit (<file>)" or "memory available on the machine"
    limit_bytes: int | None
    storage: tuple[dict[str, Any], ...]  # the recorded loaders' dataset storage
    samples: int

    @property
    def tree_bytes(self) -> int:
        """What the training process and its workers hold together (sum of PSS)."""
        return (self.main_pss or 0) + sum(w.last_pss for w in self.workers)

    @property
    def growing(self) -> tuple[WorkerMemory, ...]:
        return tuple(w for w in self.workers if w.grows)

    @property
    def per_worker_bytes(self) -> int:
        """One more worker's memory: its unique memory as measured, or, for workers that
        grow, their resident size (what copy-on-write tends to)."""
        if not self.workers:
            return 0
        if self.growing:
            return max(max(w.last_rss, w.last_uss) for w in self.growing)
        return max(w.last_uss for w in self.workers)

    @property
    def python_storage(self) -> tuple[dict[str, Any], ...]:
        return tuple(s for s in self.storage if s.get("python_objects"))

    def workers_fit(self) -> int | None:
        """The most workers the budget holds (MARGIN of it): what the job holds without its
        workers' own pages, plus that many workers at `per_worker_bytes`. None when unknown."""
        per = self.per_worker_bytes
        if self.budget_bytes is None or per <= 0 or self.main_pss is None:
            return None
        base = self.tree_bytes - sum(w.last_uss for w in self.workers)
        return max(0, math.floor((MARGIN * self.budget_bytes - base) / per))

    def fit_text(self, asked: int) -> str:
        """`asked` workers against the budget, in words."""
        per, fit = self.per_worker_bytes, self.workers_fit()
        need = self.tree_bytes - sum(w.last_uss for w in self.workers) + asked * per
        kind = ("resident size, which copy-on-write grows them toward" if self.growing
                else "unique memory, measured")
        return (f"{asked} workers would hold about {mb(need)} MB with the training process "
                f"({mb(per)} MB each, their {kind}) against {mb(self.budget_bytes or 0)} MB, the "
                f"{self.budget_source}; {fit} fit within {round(100 * MARGIN)}% of it")


def mb(value: float) -> int:
    return round(value / MB)


def facts(capture: Mapping[str, Any]) -> MemoryFacts | str:
    """The memory facts of a trace's stallscope metadata, or why there are none."""
    mem = capture.get("memory")
    if not isinstance(mem, dict):
        return ("the trace carries no memory figures (recorded without `stallscope run`, or by "
                "a version that did not sample memory)")
    if "off" in mem:
        return f"memory sampling was turned off ({mem['off']})"
    procs = [p for p in mem.get("processes") or [] if isinstance(p, dict)]
    main = next((p for p in procs if p.get("role") == "main"), None)
    workers = tuple(w for w in (_worker(p) for p in procs if p.get("role") == "worker")
                    if w is not None)
    limit = mem.get("limit") if isinstance(mem.get("limit"), dict) else None
    limit_bytes = _int((limit or {}).get("bytes"))
    machine = mem.get("machine") or {}
    avail = [a for a in machine.get("available_bytes") or [] if isinstance(a, int)]
    main_pss = _last(main, "pss_bytes") if main else None
    budget: int | None
    if limit_bytes is not None:
        budget, source = limit_bytes, f"container limit ({(limit or {}).get('source')})"
    elif avail and main_pss is not None:
        budget = avail[-1] + main_pss + sum(w.last_pss for w in workers)
        source = "memory available on the machine plus what the job holds"
    else:
        budget, source = None, "unknown"
    storage = tuple(s for lo in mem.get("loaders") or [] if isinstance(lo, dict)
                    for s in lo.get("storage") or [] if isinstance(s, dict))
    return MemoryFacts(workers, main_pss, budget, source, limit_bytes, storage,
                       int((mem.get("sampling") or {}).get("sweeps") or 0))


def _worker(p: dict[str, Any]) -> WorkerMemory | None:
    t, uss = p.get("t_s") or [], p.get("uss_bytes") or []
    if not t or len(uss) != len(t):
        return None
    return WorkerMemory(int(p.get("pid") or 0), p.get("worker_id"), p.get("loader"),
                        int(uss[0]), int(uss[-1]), _last(p, "rss_bytes") or 0,
                        _last(p, "pss_bytes") or 0, float(t[-1]) - float(t[0]))


def _last(p: dict[str, Any], key: str) -> int | None:
    values = p.get(key) or []
    return int(values[-1]) if values and isinstance(values[-1], int | float) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None
