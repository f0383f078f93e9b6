"""Run one function over several trace files in parallel processes, sized to the machine.

Why processes: decoding and modelling hold the GIL (msgspec builds Python objects, pandas runs
short vectorised calls), so threads would not overlap. Why sized: each worker holds one file's
columns at its peak, so the count is the smallest of the cores this process may use, the files,
and how many such peaks fit in the memory available now. Small jobs stay in-process, where a
pool's start-up would cost more than it saves.

The executor is a seam: `run_each(..., scheduler=ADDRESS)` sends the same calls to a Dask
distributed cluster instead (the optional extra `stallscope[dask]`), for jobs whose rank files
are more than one machine should read; `local:N` starts a LocalCluster of N worker processes.
The files are read by the workers, so they must see the same paths; results come back in input
order either way, so the report does not depend on the executor.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from stallscope.errors import StallscopeError

if TYPE_CHECKING:
    import multiprocessing.context

T = TypeVar("T")

# Peak resident memory of one process per byte of trace text, plus its fixed cost (interpreter,
# numpy, pandas). Measured (docs/performance.md): 130 MB for 30 MB of text, 200 MB for 302 MB,
# 1.2 GB for 3.03 GB, i.e. about 120 MB + 0.36 x text; these leave a margin over that.
PEAK_PER_TEXT_BYTE = 0.5
WORKER_BASE_BYTES = 150 << 20
# Below this much text in total, one process is faster than starting a pool.
MIN_PARALLEL_TEXT_BYTES = 24 << 20
MEMORY_HEADROOM = 0.8  # leave a fifth of the available memory to everything else


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def text_size(path: Path) -> int:
    """Bytes of JSON text in `path`: its size, or for gzip the size it records (mod 4 GiB)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            (recorded,) = struct.unpack("<I", fh.read(4))
    except OSError:
        return 0
    # ISIZE wraps at 4 GiB; a trace compresses about tenfold, so never assume less than that.
    return max(recorded, size * 10)


def worker_count(files: Sequence[Path], jobs: int | None = None) -> int:
    """How many processes to analyse `files` with (`jobs`: the user's choice, if any).

    One in a daemonic process (a `multiprocessing.Pool` worker calling the API), which may not
    start processes of its own: the fuzzer's job cases met it."""
    if _daemonic():
        return 1
    if jobs is not None:
        return max(1, min(jobs, len(files)))
    if len(files) < 2:
        return 1
    import psutil  # here: one file's analysis (the common case) does not pay for its import

    sizes = [text_size(f) for f in files]
    if sum(sizes) < MIN_PARALLEL_TEXT_BYTES:
        return 1
    per_worker = PEAK_PER_TEXT_BYTE * max(sizes) + WORKER_BASE_BYTES
    fits = int(psutil.virtual_memory().available * MEMORY_HEADROOM // per_worker)
    return max(1, min(usable_cores(), len(files), fits))


def _daemonic() -> bool:
    """Whether this is a daemonic process. A pool's worker has imported multiprocessing, so a
    process that has not is none, and need not import it to find out."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.current_process().daemon


def run_each(
    fn: Callable[..., T],
    calls: Sequence[tuple[Any, ...]],
    workers: int,
    on_done: Callable[[int], None] | None = None,
    scheduler: str | None = None,
    keep: Callable[[int, T], T] | None = None,
) -> list[T]:
    """`fn(*args)` for each args tuple, in `workers` processes; results in input order.

    `on_done(i)` runs in this process as call i finishes (for progress lines); `keep(i, r)`
    too, and what it returns is kept instead of r (to fold a large part of each result into a
    running total rather than hold thousands of them). An error in a
    worker is raised here as itself; a worker killed from outside (out of memory) becomes one
    clear error rather than a hang or a traceback. `scheduler`: a Dask scheduler address or
    `local:N`, which runs the calls on that cluster instead of a local pool.
    """
    def kept(i: int, result: T) -> T:
        out = keep(i, result) if keep else result
        if on_done:
            on_done(i)
        return out

    if scheduler:
        return _run_dask(fn, calls, scheduler, kept)
    if workers <= 1 or len(calls) <= 1:
        return [kept(i, fn(*args)) for i, args in enumerate(calls)]
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    results: dict[int, T] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context()) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        try:
            for future in as_completed(futures):
                i = futures[future]
                results[i] = kept(i, future.result())
        except BrokenProcessPool:
            raise StallscopeError(
                f"a worker process died while analysing {len(calls)} traces in {workers} "
                "processes (most likely out of memory); retry with --jobs 1"
            ) from None
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return [results[i] for i in range(len(calls))]


def _context() -> (multiprocessing.context.ForkContext | multiprocessing.context.ForkServerContext
                   | multiprocessing.context.SpawnContext):
    """fork where it is safe and cheap (Linux, torch not loaded); else a clean interpreter."""
    import multiprocessing

    if sys.platform.startswith("linux") and "torch" not in sys.modules:
        return multiprocessing.get_context("fork")
    if sys.platform != "win32":
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


LOCAL_PREFIX = "local:"
# The address schemes a Dask client connects with (distributed.comm's registry).
DASK_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss", "inproc")
_HOST_PORT = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>\d{1,5})")


def scheduler_error(address: str) -> str | None:
    """Why `address` is no Dask scheduler address (`local:N`, or [SCHEME://]HOST:PORT with a
    scheme Dask knows), or None when it is one: checked before any work, so that a typo is a
    usage error in one line rather than Dask's ValueError from deep in a connection attempt."""
    if address.startswith(LOCAL_PREFIX):
        count = address[len(LOCAL_PREFIX):]
        return None if count.isdigit() and int(count) >= 1 else "expected local:N with N >= 1"
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in DASK_SCHEMES:
        return f"unknown scheme {scheme!r} (expected one of {', '.join(DASK_SCHEMES)}, or local:N)"
    if scheme == "inproc":
        return None if rest else "expected inproc://ADDRESS"
    match = _HOST_PORT.fullmatch(rest)
    if match is None or not 0 < int(match["port"]) < 65536:
        return "expected [SCHEME://]HOST:PORT (tcp://host:8786), [IPV6]:PORT, or local:N"
    return None


def _run_dask(
    fn: Callable[..., T],
    calls: Sequence[tuple[Any, ...]],
    scheduler: str,
    kept: Callable[[int, T], T],
) -> list[T]:
    """The calls on a Dask cluster: `scheduler` is an address (tcp://host:8786) or `local:N`.
    Each result is released on the cluster once here, so workers do not hold a job's worth."""
    try:
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError:
        raise StallscopeError(
            "--scheduler needs Dask: pip install 'stallscope[dask]'"
        ) from None
    cluster = None
    if scheduler.startswith(LOCAL_PREFIX):
        count = scheduler[len(LOCAL_PREFIX):]
        if not count.isdigit() or int(count) < 1:
            raise StallscopeError(f"--scheduler {scheduler}: expected local:N with N >= 1")
        cluster = LocalCluster(n_workers=int(count), threads_per_worker=1, processes=True,
                               dashboard_address=None)
    try:
        with Client(cluster if cluster is not None else scheduler) as client:
            # pure=False: two calls with equal arguments are still two calls (no dedup).
            futures = [client.submit(fn, *args, pure=False) for args in calls]
            index = {f.key: i for i, f in enumerate(futures)}
            results: dict[int, T] = {}
            for future in dask_completed(futures):
                i = index[future.key]
                results[i] = kept(i, future.result())
                future.release()
    except OSError as e:  # no scheduler at that address
        raise StallscopeError(f"cannot reach the Dask scheduler {scheduler}: {e}") from None
    except ValueError as e:  # an address Dask refuses that scheduler_error let through
        raise StallscopeError(f"not a Dask scheduler address: {scheduler} ({e})") from None
    finally:
        if cluster is not None:
            cluster.close()
    return [results[i] for i in range(len(calls))]
