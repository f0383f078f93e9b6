"""Memory over the run: the training process's and each DataLoader worker's, the machine's, the
container's limit, and (where CUDA is used) the device's at each recorded step.

Why: more workers and bigger batches are what stallscope advises, and each costs memory. A worker
is a process of its own; a dataset kept as Python objects is copied into each worker page by page
as the worker touches the objects' reference counts (copy-on-write), so workers grow as they go.
Advice that ignores it can send a container over its limit.

Process memory is read from `/proc/<pid>/smaps_rollup` (resident, proportional and unique set
sizes: RSS counts the pages a worker still shares with the training process, USS only its own,
which is what one more worker adds). Reading it walks the process's page tables, so its cost
grows with the process's size (benchmarks/bench_memory_sampling.py measures it): a background
thread takes a sweep of every process at most every SAMPLE_S seconds, and spaces its sweeps so
that they take at most DUTY of one core. The series keeps at most MAX_POINTS points, halving its
resolution when full, so a run of days costs what a run of minutes does.

`STALLSCOPE_MEMORY_SAMPLING=0` turns the sampling off; `STALLSCOPE_MEMORY_LIMIT_FILE` names a file
that holds the container's limit in bytes instead of the cgroup's (a test fakes a limit with it).
Every failure here loses only the memory figures, never the run.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from stallscope.capture.daemon import DaemonThread

SAMPLE_S = 0.5  # at most one sweep of every process this often
DUTY = 0.01  # sweeps take at most this share of one core: the interval stretches to keep it
MAX_POINTS = 64  # points kept per series; when full, every other one is dropped
OFF_ENV = "STALLSCOPE_MEMORY_SAMPLING"
LIMIT_FILE_ENV = "STALLSCOPE_MEMORY_LIMIT_FILE"
# A cgroup v1 "no limit" is the largest page-aligned 64-bit value; anything this large is none.
NO_LIMIT_BYTES = 1 << 60
# A dataset attribute holding at least this many items is described (its storage).
STORAGE_MIN_ITEMS = 1000
KB = 1024

# (role, pid, loader call site, worker id): the processes a sweep reads.
Proc = tuple[str, int, str | None, int | None]


def sampling_on() -> bool:
    return os.environ.get(OFF_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def parse_rollup(text: str) -> dict[str, int] | None:
    """rss, pss, uss and swap (bytes) from smaps_rollup's text; None when it has no Rss line."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[name.strip()] = int(parts[0])
    if "Rss" not in kb:
        return None
    return {"rss": kb["Rss"] * KB, "pss": kb.get("Pss", 0) * KB,
            "uss": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * KB,
            "swap": kb.get("Swap", 0) * KB}


def rollup(pid: int) -> dict[str, int] | None:
    """One process's memory (parse_rollup); None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as fh:
            return parse_rollup(fh.read())
    except OSError:
        return None


def peak_rss(pid: int) -> int | None:
    """The process's resident high-water mark (bytes, `VmHWM` in /proc/<pid>/status): the peak a
    sweep every half second misses, a step's transient allocations freed before the next sweep.
    A cheap read (a counter, no page-table walk); None when gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    parts = line.split()
                    return int(parts[1]) * KB if len(parts) > 1 and parts[1].isdigit() else None
    except OSError:
        return None
    return None


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """MemTotal and MemAvailable (bytes) as `total` and `available`; {} where unreadable."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                key = {"MemTotal": "total", "MemAvailable": "available"}.get(name)
                parts = rest.split()
                if key and parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * KB
    except OSError:
        pass
    return out


def _read_bytes(path: Path) -> int | None:
    """A cgroup file's number; None for "max", a huge "no limit", or a file not there."""
    try:
        text = path.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or not text[0].isdigit():
        return None
    value = int(text[0])
    return value if 0 < value < NO_LIMIT_BYTES else None


def container_limit(cgroup_file: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup",
                    env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The memory limit this process runs under: {"bytes", "source", "usage_bytes"} or None.

    `STALLSCOPE_MEMORY_LIMIT_FILE` wins (a test's fake limit). Else cgroup v2: `memory.max` at
    this process's cgroup and each one above it (the tightest binds); else v1's
    `memory.limit_in_bytes` at the memory controller's path, or at its root inside a container
    whose cgroup namespace hides the path."""
    env = os.environ if env is None else env
    fake = env.get(LIMIT_FILE_ENV)
    if fake:
        value = _read_bytes(Path(fake))
        return None if value is None else {"bytes": value, "source": fake}
    try:
        lines = Path(cgroup_file).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    v1 = next((ln.split(":", 2)[2] for ln in lines if len(ln.split(":", 2)) == 3
               and "memory" in ln.split(":", 2)[1].split(",")), None)
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    base = Path(root)
    if v1 is not None:
        for folder in (base / "memory" / v1.lstrip("/"), base / "memory"):
            value = _read_bytes(folder / "memory.limit_in_bytes")
            if value is not None:
                return {"bytes": value, "source": str(folder / "memory.limit_in_bytes"),
                        "usage_bytes": _read_bytes(folder / "memory.usage_in_bytes")}
        return None
    if v2 is None:
        return None
    best: dict[str, Any] | None = None
    folder = base / v2.lstrip("/")
    while True:
        value = _read_bytes(folder / "memory.max")
        if value is not None and (best is None or value < best["bytes"]):
            best = {"bytes": value, "source": str(folder / "memory.max"),
                    "usage_bytes": _read_bytes(folder / "memory.current")}
        if folder == base or base not in folder.parents:
            return best
        folder = folder.parent


def describe_storage(dataset: Any) -> list[dict[str, Any]]:
    """The dataset's large attributes and what holds their items: a Python list of objects
    (each a reference count the workers write to, pytorch/pytorch#13246) or an array (one
    buffer, never written). One level into a wrapper's `.dataset` (Subset). Never raises."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(Exception):
        seen: list[tuple[str, Any]] = list(vars(dataset).items())
        inner = getattr(dataset, "dataset", None)
        if inner is not None and inner is not dataset:
            seen += [(f"dataset.{k}", v) for k, v in vars(inner).items()]
        for name, value in seen:
            row = _storage_row(name, value)
            if row is not None:
                out.append(row)
    return out[:8]


def _storage_row(name: str, value: Any) -> dict[str, Any] | None:
    kind = type(value)
    module = kind.__module__.split(".")[0]
    if isinstance(value, list | tuple | dict):
        n = len(value)
        if n < STORAGE_MIN_ITEMS:
            return None
        first = next(iter(value.values() if isinstance(value, dict) else value))
        return {"attr": name, "type": kind.__name__, "items": n,
                "element": type(first).__name__, "python_objects": True}
    if module in ("numpy", "torch", "pyarrow", "pandas"):
        nbytes = getattr(value, "nbytes", None)
        if nbytes is None and hasattr(value, "element_size"):
            nbytes = value.element_size() * value.nelement()
        if not isinstance(nbytes, int) or nbytes < STORAGE_MIN_ITEMS:
            return None
        object_dtype = str(getattr(value, "dtype", "")) == "object"
        return {"attr": name, "type": f"{module}.{kind.__name__}", "bytes": nbytes,
                "dtype": str(getattr(value, "dtype", "")) or None,
                "python_objects": object_dtype}
    return None


class _Series:
    """One process's points: seconds since the sampler started, and bytes."""

    def __init__(self, proc: Proc) -> None:
        self.role, self.pid, self.loader, self.worker_id = proc
        self.t: list[float] = []
        self.values: dict[str, list[int]] = {"rss": [], "pss": [], "uss": [], "swap": []}
        self.peak_rss: int | None = None  # the kernel's high-water mark, the last one read

    def add(self, t: float, figures: Mapping[str, int], peak: int | None = None) -> None:
        self.t.append(round(t, 3))
        for key, values in self.values.items():
            values.append(int(figures.get(key, 0)))
        if peak is not None:
            self.peak_rss = max(peak, self.peak_rss or 0)

    def halve(self) -> None:
        self.t = self.t[::2]
        for key in self.values:
            self.values[key] = self.values[key][::2]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "loader": self.loader,
                "worker_id": self.worker_id, "t_s": list(self.t),
                **{f"{k}_bytes": list(v) for k, v in self.values.items()},
                "peak_rss_bytes": self.peak_rss}


class MemorySampler(DaemonThread):
    """Sweeps `procs()` on a daemon thread (see the module's docstring); `snapshot()` is the
    trace metadata's `memory` object. Safe to call from any thread; start/stop are idempotent."""

    thread_name = "stallscope-memory"

    def __init__(self, procs: Callable[[], Iterable[Proc]],
                 limit: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._procs = procs
        self.limit = limit
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._series: dict[int, _Series] = {}
        self._machine_t: list[float] = []
        self._available: list[int] = []
        self._usage: list[int | None] = []
        self.total_bytes: int | None = None
        self.interval_s = self._floor_s = SAMPLE_S  # the floor doubles as the series is halved
        self.sweeps = 0
        self.sweep_s = 0.0  # wall time of all sweeps, summed
        # The last full sweep's job: the training process's resident memory and its workers'
        # own (unique) memory, summed (bytes; what `watch`'s step log carries, capture/steplog.py)
        # and the count of full sweeps that set it (a step logs it once per sweep).
        self.job_bytes: int | None = None
        self.job_sweeps = 0

    def start(self) -> None:
        if self._thread is None:
            self._t0 = time.monotonic()
        super().start()

    def _run(self) -> None:
        """A process seen for the first time is read at once (a worker's memory when it
        starts is the base of its growth); all of them when the interval has passed."""
        last = float("-inf")
        while not self._stop.wait(0.0 if last < 0 else SAMPLE_S):
            with contextlib.suppress(Exception):  # a failed sweep loses its point only
                procs = list(self._procs())
                if time.monotonic() - last >= self.interval_s:
                    start = time.perf_counter()
                    self.sweep(procs)
                    last = time.monotonic()
                    self.interval_s = max(self._floor_s, (time.perf_counter() - start) / DUTY)
                elif new := [p for p in procs if p[1] not in self._series]:
                    self.sweep(new, machine=False)

    def sweep(self, procs: list[Proc] | None = None, machine: bool = True) -> None:
        """One point for each process (all of them by default), and for the machine (and the
        cgroup's usage)."""
        start = time.perf_counter()
        t = time.monotonic() - self._t0
        read = [(proc, rollup(proc[1]), peak_rss(proc[1]))
                for proc in (self._procs() if procs is None else procs)]
        info = meminfo() if machine else {}
        usage = None
        if machine and self.limit is not None and self.limit.get("source", "").startswith("/sys/"):
            usage = _read_bytes(Path(self.limit["source"]).with_name(
                "memory.current" if self.limit["source"].endswith("memory.max")
                else "memory.usage_in_bytes"))
        with self._lock:
            for proc, figures, peak in read:
                if figures is None:
                    continue
                series = self._series.get(proc[1])
                if series is None:
                    series = self._series[proc[1]] = _Series(proc)
                series.add(t, figures, peak)
            if machine:
                self.job_bytes = job_bytes([(p[0], f) for p, f, _ in read if f is not None])
                self.job_sweeps += 1
            if "available" in info:
                self._machine_t.append(round(t, 3))
                self._available.append(info["available"])
                self._usage.append(usage)
            self.total_bytes = info.get("total", self.total_bytes)
            if len(self._machine_t) > MAX_POINTS:
                self._halve()
        self.sweeps += 1
        self.sweep_s += time.perf_counter() - start

    def _halve(self) -> None:
        """Drop every other point, and sweep half as often from now on."""
        self._machine_t = self._machine_t[::2]
        self._available = self._available[::2]
        self._usage = self._usage[::2]
        for series in self._series.values():
            series.halve()
        self._floor_s *= 2

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sampling": {"interval_s": round(self.interval_s, 3), "sweeps": self.sweeps,
                             "sweep_ms_mean": round(1e3 * self.sweep_s / self.sweeps, 3)
                             if self.sweeps else None, "duty": DUTY},
                "limit": self.limit,
                "machine": {"total_bytes": self.total_bytes, "t_s": list(self._machine_t),
                            "available_bytes": list(self._available),
                            "cgroup_usage_bytes": list(self._usage)},
                "processes": [s.to_dict() for s in self._series.values() if s.t],
            }


def job_bytes(figures: Iterable[tuple[str, Mapping[str, int]]]) -> int | None:
    """The job's memory at one sweep: the training process's resident size plus each worker's
    unique size (the pages a worker shares with the training process are counted once, in
    the training process's). None without the training process."""
    main = [f.get("rss", 0) for role, f in figures if role == "main"]
    if not main:
        return None
    return int(main[0] + sum(f.get("uss", 0) for role, f in figures if role == "worker"))


# ------------------------------------------------------------------------------ the device


def device_figures(stats: Mapping[str, Any], free: int | None, total: int | None
                   ) -> dict[str, Any]:
    """One step's device memory from `torch.cuda.memory_stats()` and `mem_get_info()`: the
    peaks since the last reset, what is held now, the allocator's retries and out-of-memory
    count (cumulative), and the bytes in cached blocks split by a smaller allocation
    (fragmentation that `expandable_segments` removes)."""
    def get(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if isinstance(value, int | float) else None

    return {
        "peak_allocated_bytes": get("allocated_bytes.all.peak"),
        "peak_reserved_bytes": get("reserved_bytes.all.peak"),
        "allocated_bytes": get("allocated_bytes.all.current"),
        "reserved_bytes": get("reserved_bytes.all.current"),
        "inactive_split_bytes": get("inactive_split_bytes.all.current"),
        "num_alloc_retries": get("num_alloc_retries"),
        "num_ooms": get("num_ooms"),
        "free_bytes": free,
        "total_bytes": total,
    }


class DeviceSteps:
    """The CUDA device's memory at each step boundary it is asked for (the recorded steps):
    `boundary(step)` reads the figures as the step ends; the peaks are the process's so far (or
    since the script's own `reset_peak_memory_stats`): they are never reset here, where the
    script may read them itself. Nothing where CUDA was never initialised (a CPU run)."""

    MAX_STEPS = 256

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.pinned: dict[str, Any] | None = None

    def boundary(self, step: int) -> None:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        try:
            stats = torch.cuda.memory_stats()
            free, total = torch.cuda.mem_get_info()
        except Exception:  # a device error here is the script's to meet, not ours
            return
        if len(self.steps) < self.MAX_STEPS:
            self.steps.append({"step": step, **device_figures(stats, int(free), int(total))})
        host = getattr(torch.cuda, "host_memory_stats", None)
        if host is not None:
            with contextlib.suppress(Exception):
                h = host()
                self.pinned = {"allocated_bytes": h.get("allocated_bytes.current"),
                               "active_bytes": h.get("active_bytes.current")}


class RunMemory:
    """The session's memory figures: the processes' on the sampler's thread (when sampling is
    on), the device's at each recorded boundary, and the trace's `memory` metadata from both."""

    def __init__(self, procs: Callable[[], list[Proc]]) -> None:
        self.sampler = MemorySampler(procs, container_limit()) if sampling_on() else None
        self.device = DeviceSteps()

    def start(self) -> None:
        if self.sampler is not None:
            self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def last_sweep(self) -> bool:
        """One last sweep, once no recorded step pays for it; False when sampling is off."""
        if self.sampler is None:
            return False
        with contextlib.suppress(Exception):
            self.sampler.sweep()
        return True

    def metadata(self, loaders: Iterable[Any]) -> dict[str, Any]:
        """The trace metadata's `memory`: the sampled series, the device's steps, and each
        recorded loader's dataset storage (what copy-on-write growth is judged against)."""
        out: dict[str, Any] = (self.sampler.snapshot() if self.sampler is not None
                               else {"off": f"{OFF_ENV}=0"})
        out["device"] = list(self.device.steps)
        out["pinned"] = self.device.pinned
        out["loaders"] = [{"call_site": d.call_site, "num_workers": d.num_workers,
                           "dataset": d.dataset, "storage": d.dataset_storage}
                          for d in loaders if d.batches]
        return out
