"""Other load on the machine while the steps were recorded: the cores' busy time against this
process tree's CPU time.

The trace sees only the training process, so a loader that lags because another job holds the
cores looks exactly like a loader that is too slow. `stallscope run` reads, at the start and
at the end of the recorded window, the busy time of the cores this job may use (psutil per-CPU
times, all states but idle and iowait; steal counts as busy: a hypervisor gave the core to
someone else) and the CPU time of this process tree: the root process, its live descendants
(DataLoader workers) and the descendants already ended and reaped (the kernel adds their
times to their parent's `children_user/children_system`, which are counted too). So a worker
that ends inside the window is counted in full by the difference of the two reads. Lost: a
descendant that ended but was not yet reaped by the end read is still listed (a zombie keeps
its times); one reaped by a process outside the tree (re-parented to init) is lost, and its
CPU then reads as other load. Reads have the kernel's tick resolution (10 ms per process).

Niced work: when this process runs at normal priority (nice <= 0), the cores' `nice` time
(processes at a lower priority, which yield the cores to ours: a niced process gets about a
tenth of a contended core) is left out of the busy time; when this process is niced itself,
it competes with them as equals and their time counts.

The tree's root is this process; under torchrun (LOCAL_WORLD_SIZE > 1) it is the launcher (this
process's parent), so the other local ranks, which share the host by design, are not counted
as other load. The cores are the root's CPU affinity mask. Reading costs a scan of /proc (about
3 ms with 80 processes), done twice: just before recording starts, and at the last recorded
step boundary (inside the last recorded step).

Beside them, the kernel's schedstat of every thread of the tree (/proc/PID/task/TID/schedstat:
time on a core, time runnable but waiting in a run queue) and of the stepping thread: a
thread that waited to run lost that time to whoever held the core, this run's own threads or
other tenants' (replay/unload.py tells the two apart and takes the others' share out).

Only the measuring is here, in the training process; whether the load was material, read back
from the trace's `host` metadata by the replay and the rules, is trace/otherload.py.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from stallscope.capture import schedstat


@dataclass(frozen=True)
class CpuSample:
    """One read: wall clock, the cores' busy and total time, and the tree's CPU time (s)."""

    wall: float
    busy: float
    total: float
    tree: float
    cores: int  # CPUs added up in busy and total
    niced_excluded: bool = False  # busy leaves out the cores' `nice` time (see above)
    # Scheduler figures (schedstat, s): time on a core and time runnable but waiting for one,
    # summed over every thread of the tree, and of the thread that reads (the stepping one);
    # None where the kernel does not give them.
    tree_run: float | None = None
    tree_wait: float | None = None
    main_run: float | None = None
    main_wait: float | None = None


def _root() -> psutil.Process:
    from stallscope.capture.facts import local_processes  # torch: only when measuring

    me = psutil.Process()
    if local_processes() > 1:
        parent = me.parent()
        if parent is not None:
            return parent
    return me


def cpus_of(root: psutil.Process) -> list[int]:
    try:
        return sorted(root.cpu_affinity() or [])
    except (AttributeError, psutil.Error, OSError):
        return list(range(os.cpu_count() or 1))


def process_cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return 0.0  # ended between listing and reading: its time reaches its parent's children_*
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system",
                                                                           0.0)


def _schedstat(path: str) -> tuple[float, float] | None:
    """(on a core, runnable but waiting) in seconds for one task, from /proc/.../schedstat."""
    try:
        with open(path, encoding="ascii") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None  # ended meanwhile, or a kernel without schedstat


def _tree_schedstat(pids: list[int], main: tuple[int, int] | None = None
                    ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """Run and run-queue wait summed over every thread of `pids`, and those of the thread
    `main` ((pid, tid)) from the same read: its figures are then part of the sum read at the
    same instant, so over a window the tree's run time is never below its own (read apart, the
    thread ran between the two reads and could come out ahead)."""
    run = wait = 0.0
    seen = False
    own = None
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            got = _schedstat(f"/proc/{pid}/task/{tid}/schedstat")
            if got is not None:
                seen = True
                run, wait = run + got[0], wait + got[1]
                if main is not None and (pid, tid) == (main[0], str(main[1])):
                    own = got
    return ((run, wait) if seen else None), own


def thread_sched() -> tuple[float, float] | None:
    """(on a core, runnable but waiting) in seconds for the calling thread: a read of a
    descriptor kept open (capture/schedstat.py), cheap enough for every step boundary."""
    got = schedstat.thread_times_ns()
    return None if got is None else (got[0] / 1e9, got[1] / 1e9)


def cores_busy(per_cpu: list[Any], cpus: list[int], skip_nice: bool) -> tuple[float, float]:
    """(busy, total) seconds of the cores `cpus` from psutil's per-CPU times: every state but
    idle and iowait is busy (steal too: a hypervisor gave the core to someone else), and `nice`
    time is idle when `skip_nice` (lower-priority work yields the cores to ours)."""
    busy = total = 0.0
    for i in cpus:
        if i >= len(per_cpu):
            continue
        t = per_cpu[i]._asdict()
        # Linux counts guest time inside user already.
        all_ = sum(t.values()) - t.get("guest", 0.0) - t.get("guest_nice", 0.0)
        idle = t.get("idle", 0.0) + t.get("iowait", 0.0)
        if skip_nice:
            idle += t.get("nice", 0.0)
        total += all_
        busy += all_ - idle
    return busy, total


def sample() -> CpuSample | None:
    """Read the cores and the tree now; None where psutil cannot (no /proc)."""
    try:
        root = _root()
        cpus = cpus_of(root)
        per_cpu = psutil.cpu_times(percpu=True)
        skip_nice = psutil.Process().nice() <= 0
        children = root.children(recursive=True)
        tree = process_cpu(root) + sum(process_cpu(c) for c in children)
    except (psutil.Error, OSError):
        return None
    me = (os.getpid(), threading.get_native_id())
    sched, main = _tree_schedstat([root.pid, *(c.pid for c in children)], me)
    if main is None:  # this process is not in the tree read (its root is a parent of it)
        main = _schedstat(f"/proc/self/task/{me[1]}/schedstat")
    busy, total = cores_busy(per_cpu, cpus, skip_nice)
    return CpuSample(time.perf_counter(), busy, total, tree, len(cpus), skip_nice,
                     *(sched or (None, None)), *(main or (None, None)))


def other_load(start: CpuSample | None, end: CpuSample | None) -> dict[str, Any]:
    """The window's figures for the trace's `host` metadata; {} when either read failed.

    other_cpu_share_pct: the cores' busy time not spent by this tree, as a share of the cores'
    capacity over the window (their total time: wall x cores)."""
    if start is None or end is None or end.wall <= start.wall:
        return {}
    busy = max(end.busy - start.busy, 0.0)
    tree = max(end.tree - start.tree, 0.0)
    capacity = max(end.total - start.total, 0.0) or (end.wall - start.wall) * end.cores
    other = max(busy - tree, 0.0)
    sched: dict[str, Any] = {}
    for name in ("tree_run", "tree_wait", "main_run", "main_wait"):
        a, b = getattr(start, name), getattr(end, name)
        if a is not None and b is not None:
            sched[f"{name}_us"] = round(max(b - a, 0.0) * 1e6, 1)
    if sched:
        sched["window_us"] = round((end.wall - start.wall) * 1e6, 1)
    return {
        **({"sched": sched} if sched else {}),
        "load_cores": end.cores,
        "other_niced_excluded": end.niced_excluded,
        "system_busy_us": round(busy * 1e6, 1),
        "tree_cpu_us": round(tree * 1e6, 1),
        "other_cpu_us": round(other * 1e6, 1),
        "capacity_us": round(capacity * 1e6, 1),
        "other_cpu_share_pct": round(100.0 * other / capacity, 1) if capacity > 0 else 0.0,
    }
