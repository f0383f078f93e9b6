"""Inside the DataLoader: where a batch's time goes, in the training process and in each worker.

The profiler sees only the training process: with `num_workers > 0` it shows the step waiting
in `__next__` but not whether the workers wait on storage or burn CPU, which decides the fix
(more workers than cores for the first, cheaper samples for the second). Under `stallscope run`
the loader's `collate_fn` and `worker_init_fn` are replaced by the wrappers below (the user's
own functions are called inside them, unchanged):

- `TimedCollate` times `collate_fn` wherever it runs (a worker, or the training process);
- `WorkerInit` runs in each worker before torch builds its fetcher, and replaces the fetchers'
  `fetch` in that worker only (fork and spawn alike: the class attribute lives in the worker's
  own memory), so each batch's fetch (`__getitem__` / `__getitems__` / an iterable's
  `__next__`, then collate) is timed in wall and thread-CPU time.

A worker keeps running totals and writes them to one small JSON file of its own in a temporary
folder (at its first batch, then at most every `FLUSH_S` seconds); the training process reads
those files. Workers are killed at shutdown without running exit handlers: a kill loses at most
the last `FLUSH_S` of figures. Every failure here (a file that cannot be written, pickling, a
missing psutil) loses only the anatomy: no exception from this module reaches the user's loader.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallscope.capture import sampler, schedstat, transfer

# A worker writes its totals at most this often (seconds): a batch costs two clock reads and two
# schedstat reads; a write (psutil's I/O counters) costs far more and is amortised over every batch
# made in the interval. The training process reads the files back at most every READ_S (the
# figures for both: docs/performance.md, "Figures behind the code").
FLUSH_S = 0.25
READ_S = 0.25
# Classification thresholds: a fetch whose CPU time is under half its wall time mostly waits
# (storage, network, sleep); collate (or receiving in the training process) taking at least
# half of a batch's time is what bounds the loader.
WAITING_CPU_SHARE = 0.5
COLLATE_SHARE = 0.5
MAIN_CPU_SHARE = 0.5
MAIN_MIN_US = 1000.0  # a __next__ under 1 ms of CPU is not what bounds a loader
MAX_WORKERS_LISTED = 64

BOUNDS = ("waiting", "cpu-bound", "collate/transfer-bound", "main-process-bound")

_account: _WorkerAccount | None = None  # this worker's totals; None in the training process


def runq_us() -> float | None:
    """Time this thread has spent runnable but waiting for a core (Linux schedstat), in us.

    This is what splits "off the CPU" in two: a fetch off the CPU because it waits on storage
    is blocked; one off the CPU because other processes hold the cores is runnable. Without it a
    CPU-bound loader on a busy machine would look like it waits. None where not available."""
    got = schedstat.thread_times_ns()
    return None if got is None else got[1] / 1000.0


class TimedCollate:
    """`collate_fn` with its wall and CPU time counted: in a worker into the worker's totals, in
    the training process (num_workers=0) into `main_*`, which the watcher reads around each
    recorded fetch. Picklable whenever the wrapped function is (spawn)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.owner = os.getpid()
        self.main_wall_us = 0.0
        self.main_cpu_us = 0.0

    def __call__(self, data: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = self.fn(data)
        dw = (time.perf_counter() - wall) * 1e6
        dc = (time.thread_time() - cpu) * 1e6
        if os.getpid() == self.owner:
            self.main_wall_us += dw
            self.main_cpu_us += dc
        elif _account is not None:
            _account.collate_wall_us += dw
            _account.collate_cpu_us += dc
        return out

    def __getattr__(self, name: str) -> Any:  # a collate_fn with attributes keeps them
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)


class WorkerInit:
    """`worker_init_fn` that starts this worker's accounting, then calls the user's own.

    The user's function runs outside our `try`: its exceptions reach torch exactly as without
    stallscope; ours never do."""

    def __init__(self, fn: Callable[[int], Any] | None, folder: str, key: str) -> None:
        self.fn = fn
        self.folder = folder
        self.key = key

    def __call__(self, worker_id: int) -> None:
        # No accounting in this worker on any failure: the loader runs as without us.
        with contextlib.suppress(Exception):
            _start_worker(Path(self.folder) / f"{self.key}-{os.getpid()}.json", worker_id)
        if self.fn is not None:
            self.fn(worker_id)


class _WorkerAccount:
    """One worker's running totals, written to `path` at intervals."""

    def __init__(self, path: Path, worker_id: int) -> None:
        self.path = path
        self.worker_id = worker_id
        self.batches = 0
        self.fetch_wall_us = 0.0  # whole fetch, collate included
        self.fetch_cpu_us = 0.0
        self.collate_wall_us = 0.0
        self.collate_cpu_us = 0.0
        self.fetch_runq_us: float | None = 0.0  # None once schedstat is unavailable
        self.start_wall = time.monotonic()
        self.start_cpu = time.process_time()
        self.last_flush = 0.0
        self.broken = False
        try:
            import psutil

            self._proc: Any = psutil.Process()
            self._proc.io_counters()
        except Exception:  # no psutil, or no I/O counters on this platform
            self._proc = None

    def after_batch(self) -> None:
        now = time.monotonic()
        if self.batches == 1 or now - self.last_flush >= FLUSH_S:
            self.flush(now)

    def flush(self, now: float) -> None:
        if self.broken:
            return
        self.last_flush = now
        data: dict[str, Any] = {
            "pid": os.getpid(), "worker_id": self.worker_id, "batches": self.batches,
            "t": now, "wall_us": (now - self.start_wall) * 1e6,
            "process_cpu_us": (time.process_time() - self.start_cpu) * 1e6,
            "fetch_wall_us": self.fetch_wall_us, "fetch_cpu_us": self.fetch_cpu_us,
            "collate_wall_us": self.collate_wall_us, "collate_cpu_us": self.collate_cpu_us,
            "fetch_runq_us": self.fetch_runq_us, "stack": sampler.export(),
        }
        data["made"] = transfer.ring_of(self)  # capture/transfer.py: the last batches' ends
        if self._proc is not None:
            try:
                io = self._proc.io_counters()
                data["read_bytes"] = io.read_bytes
                data["read_chars"] = getattr(io, "read_chars", None)
            except Exception:
                self._proc = None
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except Exception:  # the folder is gone (the run ended): stop trying
            self.broken = True


def _start_worker(path: Path, worker_id: int) -> None:
    """Count this worker's fetches: wrap the fetcher classes' `fetch` in this process only."""
    global _account
    _account = _WorkerAccount(path, worker_id)
    sampler.start()  # where the fetches' time goes (capture/sampler.py); None: no figures
    from torch.utils.data._utils import fetch as fetch_mod

    for cls in (fetch_mod._MapDatasetFetcher, fetch_mod._IterableDatasetFetcher):
        orig = cls.__dict__.get("fetch")
        if orig is None or getattr(orig, "_stallscope", False):
            continue
        cls.fetch = _timed_fetch(orig)  # type: ignore[method-assign]
    _account.flush(time.monotonic())  # the file exists from the start: the worker is seen


def _timed_fetch(orig: Callable[..., Any]) -> Callable[..., Any]:
    def fetch(self: Any, index: Any) -> Any:
        acct = _account
        runq = runq_us()
        wall, cpu = time.perf_counter(), time.thread_time()
        smp = sampler.begin()  # this thread's stack is sampled while it fetches
        try:
            out = orig(self, index)  # StopIteration and the dataset's errors pass through
        finally:
            if smp is not None:
                smp.end()
        if acct is not None:
            try:
                acct.fetch_wall_us += (time.perf_counter() - wall) * 1e6
                acct.fetch_cpu_us += (time.thread_time() - cpu) * 1e6
                after = runq_us()
                if runq is None or after is None or acct.fetch_runq_us is None:
                    acct.fetch_runq_us = None
                else:
                    acct.fetch_runq_us += after - runq
                acct.batches += 1
                transfer.made(acct, time.monotonic())  # capture/transfer.py: its end time
                acct.after_batch()
            except Exception:
                pass
        return out

    fetch._stallscope = True  # type: ignore[attr-defined]
    return fetch


# ------------------------------------------------------------------- the training process side


def read_workers(folder: Path, key: str) -> dict[int, dict[str, Any]]:
    """The latest totals each worker of loader `key` wrote, by pid; unreadable files skipped."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = [p for p in folder.iterdir() if p.name.startswith(f"{key}-")
                 and p.suffix == ".json"]
    except OSError:
        return out
    for p in names:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            out[int(data["pid"])] = data
        except Exception:  # being replaced this instant, or truncated by a kill
            continue
    return out


_SUMMED = ("batches", "wall_us", "process_cpu_us", "fetch_wall_us", "fetch_cpu_us",
           "collate_wall_us", "collate_cpu_us", "read_bytes", "read_chars", "fetch_runq_us")


def window(now: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
           ) -> list[dict[str, Any]]:
    """Each worker's totals since `base` (the recording's start); a worker whose window holds
    no batch (it had prefetched everything before) keeps its totals since it started."""
    out = []
    for pid, cur in sorted(now.items()):
        before = base.get(pid)
        delta = dict(cur)
        if before is not None and (cur.get("batches") or 0) > (before.get("batches") or 0):
            for k in _SUMMED:
                a, b = cur.get(k), before.get(k)
                if isinstance(a, int | float) and isinstance(b, int | float):
                    delta[k] = a - b
            delta["stack"] = sampler.subtract(cur.get("stack"), before.get("stack"))
        out.append(delta)
    return out


def _share(num: float, den: float) -> float | None:
    return round(min(max(num / den, 0.0), 1.0), 3) if den > 0 else None


def summarise(num_workers: int, workers: list[dict[str, Any]], main: dict[str, Any]
              ) -> dict[str, Any]:
    """The anatomy of one loader over the recording, with its class (`bound`).

    `main`: the training process's recorded fetches: batches, wall_us and cpu_us of `__next__`
    (thread CPU), runq_us (runnable, waiting for a core), collate_wall_us / collate_cpu_us
    (collate run there, num_workers=0).
    """
    n_main = main.get("batches", 0) or 0
    out: dict[str, Any] = {"where": "workers" if num_workers > 0 else "main process"}
    if n_main:
        out["wait_ms_per_batch"] = round(main["wall_us"] / n_main / 1000, 3)
        out["main_cpu_ms_per_batch"] = round(main["cpu_us"] / n_main / 1000, 3)
    if num_workers == 0:
        if not n_main:
            return out
        collate_w = main.get("collate_wall_us", 0.0)
        collate_c = main.get("collate_cpu_us", 0.0)
        fetch_w = max(main["wall_us"] - collate_w, 0.0)
        fetch_c = max(main["cpu_us"] - collate_c, 0.0)
        runq, whole = main.get("runq_us"), main["wall_us"]
        n = n_main
    else:
        made = [w for w in workers if (w.get("batches") or 0) > 0]
        n = sum(w["batches"] for w in made)
        if not n:
            out["lost"] = "no worker reported a batch (killed, or could not be wrapped)"
            return out
        collate_w = sum(w.get("collate_wall_us", 0.0) for w in made)
        collate_c = sum(w.get("collate_cpu_us", 0.0) for w in made)
        fetch_w = max(sum(w["fetch_wall_us"] for w in made) - collate_w, 0.0)
        fetch_c = max(sum(w["fetch_cpu_us"] for w in made) - collate_c, 0.0)
        queued = [w.get("fetch_runq_us") for w in made]
        counted = [q for q in queued if isinstance(q, int | float)]
        runq = sum(counted) if len(counted) == len(queued) else None
        whole = sum(w["fetch_wall_us"] for w in made)
        out["workers_reporting"] = len(made)
        out["workers"] = [_worker_row(w) for w in made[:MAX_WORKERS_LISTED]]
        reads = [w.get("read_bytes") for w in made]
        counted_reads = [r for r in reads if isinstance(r, int | float)]
        if len(counted_reads) == len(reads):
            out["read_bytes"] = int(sum(counted_reads))
    out.update({
        "batches": int(n),
        "fetch_ms_per_batch": round(fetch_w / n / 1000, 3),
        "fetch_cpu_ms_per_batch": round(fetch_c / n / 1000, 3),
        "collate_ms_per_batch": round(collate_w / n / 1000, 3),
        "collate_cpu_ms_per_batch": round(collate_c / n / 1000, 3),
        "fetch_cpu_share": _share(fetch_c, fetch_w),
        "cpu_busy_share": _share(fetch_c + collate_c, fetch_w + collate_w),
    })
    if isinstance(runq, int | float):
        # Of a batch's whole loading (fetch and collate): waiting for a core, and blocked
        # (storage, network, sleep): what is neither on a core nor queued for one.
        out["runq_share"] = _share(runq, whole)
        out["blocked_share"] = _share(whole - (fetch_c + collate_c) - runq, whole)
    if (stack := sampler.summary(workers if num_workers > 0 else [main])) is not None:
        out["stack"] = stack  # shares of the fetches' sampled stacks (capture/sampler.py)
    out["bound"] = classify(num_workers, out)
    return out


def _worker_row(w: dict[str, Any]) -> dict[str, Any]:
    n = w["batches"]
    row = {
        "worker_id": w.get("worker_id"), "pid": w.get("pid"), "batches": int(n),
        "fetch_ms_per_batch": round(w["fetch_wall_us"] / n / 1000, 3),
        "collate_ms_per_batch": round(w.get("collate_wall_us", 0.0) / n / 1000, 3),
        "cpu_busy_share": _share(w.get("process_cpu_us", 0.0), w.get("wall_us", 0.0)),
    }
    if isinstance(w.get("read_bytes"), int | float):
        row["read_bytes"] = int(w["read_bytes"])
        wall_s = (w.get("wall_us") or 0.0) / 1e6
        row["read_mb_per_s"] = round(w["read_bytes"] / 1e6 / wall_s, 2) if wall_s > 0 else None
    return row


def classify(num_workers: int, a: dict[str, Any]) -> str | None:
    """waiting | cpu-bound | collate/transfer-bound | main-process-bound, from the figures.

    main-process-bound first: with workers, a `__next__` that computes (unpickling, pinning,
    collate in the training process) more than it waits is the training process's own cost.
    Then collate over half of a batch's time; then waiting (storage, network: blocked for at
    least half of the loading) from CPU-bound (decode, augmentation: on a core, or runnable and
    queued for one because the cores are busy). Without schedstat, the CPU share alone decides,
    which a busy machine can make look like waiting."""
    fetch, collate = a.get("fetch_ms_per_batch"), a.get("collate_ms_per_batch") or 0.0
    if fetch is None:
        return None
    if num_workers > 0:
        wait, main_cpu = a.get("wait_ms_per_batch"), a.get("main_cpu_ms_per_batch")
        if (wait and main_cpu is not None and main_cpu * 1000 >= MAIN_MIN_US
                and main_cpu >= MAIN_CPU_SHARE * wait):
            return "main-process-bound"
    total = fetch + collate
    if total <= 0:
        return None
    if collate >= COLLATE_SHARE * total:
        return "collate/transfer-bound"
    blocked = a.get("blocked_share")
    if blocked is not None:
        return "waiting" if blocked >= 1.0 - WAITING_CPU_SHARE else "cpu-bound"
    share = a.get("fetch_cpu_share")
    if share is not None and share < WAITING_CPU_SHARE:
        return "waiting"
    return "cpu-bound"
