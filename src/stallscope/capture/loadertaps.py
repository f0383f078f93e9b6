"""Each DataLoader's anatomy over the recorded steps: the wrappers around its `collate_fn` and
`worker_init_fn` (capture/anatomy.py), the workers' files they write, the batches' way from the
workers to the step (capture/transfer.py), and what the training process measured itself.

The loader watcher (capture/loaders.py) finds the loaders and their batches; this module owns
what is measured of them, so the watcher's wrappers only hand each event on.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.capture import anatomy, sampler, transfer
from stallscope.runfacts import LoaderInfo


@dataclass
class _Tap:
    """One loader's anatomy wrappers and what the training process measured itself."""

    key: str  # the prefix of its workers' files
    collate: anatomy.TimedCollate | None
    collate_wall_us: float = 0.0  # recorded fetches only
    collate_cpu_us: float = 0.0
    runq_us: float | None = 0.0  # the fetching thread runnable but off a core; None: unknown
    base: dict[int, dict[str, Any]] = field(default_factory=dict)  # workers at recording start
    workers: list[dict[str, Any]] = field(default_factory=list)  # their window, as last read
    read_at: float = float("-inf")  # time.monotonic() of that read
    stack: dict[tuple[Any, ...], int] = field(default_factory=dict)  # num_workers=0 samples
    transfer: transfer.TransferTap = field(default_factory=transfer.TransferTap)


class LoaderTaps:
    """The folder the workers write their totals into, and per loader (by id of its
    LoaderInfo) the wrappers and the training process's figures."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.taps: dict[int, _Tap] = {}
        # When recording started (time.monotonic()), and the pin-memory threads' calls.
        self._record_start = float("inf")
        self.pins = transfer.PinLedger()

    def install(self) -> None:
        with contextlib.suppress(Exception):  # no pin figures, the rest as before
            self.pins.install()
        try:
            self.folder = Path(tempfile.mkdtemp(prefix="stallscope-anatomy-"))
        except OSError:  # no temporary folder: no worker anatomy, the rest as before
            self.folder = None

    def uninstall(self) -> None:
        self.pins.uninstall()
        if self.folder is not None:  # workers still running find it gone and stop writing
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def recording(self, value: bool, was: bool) -> None:
        """The start of recording is the baseline of the workers' totals, so the anatomy
        covers the recorded steps."""
        if value and not was and self.folder is not None:
            for tap in self.taps.values():
                tap.base = anatomy.read_workers(self.folder, tap.key)
        if value and self._record_start == float("inf"):
            self._record_start = time.monotonic()
        if not value:
            for tap in self.taps.values():
                tap.transfer.stopped()
        self.pins.active = value

    def new_window(self) -> None:
        """Forget the recorded window's figures (the workers' totals are re-based when
        recording starts again)."""
        for key, tap in list(self.taps.items()):
            self.taps[key] = _Tap(tap.key, tap.collate,
                                  runq_us=None if tap.runq_us is None else 0.0)
        self._record_start = float("inf")

    def tap(self, loader: Any, info: LoaderInfo, key: str) -> None:
        """Wrap the loader's collate_fn and worker_init_fn (capture/anatomy.py). A loader that
        cannot be wrapped runs unwrapped: it loses its anatomy, nothing else."""
        try:
            # A loader rebuilt from another (accelerate's prepare) is handed the original's
            # functions, already wrapped: wrap the user's own, or its workers would count into
            # the original's files and its collate twice.
            own_collate = loader.collate_fn
            if isinstance(own_collate, anatomy.TimedCollate):
                own_collate = own_collate.fn
            own_init = loader.worker_init_fn
            if isinstance(own_init, anatomy.WorkerInit):
                own_init = own_init.fn
            collate = anatomy.TimedCollate(own_collate)
            init = None
            if loader.num_workers > 0 and self.folder is not None:
                init = anatomy.WorkerInit(own_init, str(self.folder), key)
            elif own_init is not loader.worker_init_fn:
                loader.worker_init_fn = own_init
            loader.collate_fn = collate
            if init is not None:
                loader.worker_init_fn = init
        except Exception as exc:
            info.anatomy = {"lost": f"the loader could not be wrapped ({type(exc).__name__})"}
            return
        self.taps[id(info)] = _Tap(key, collate)

    def iterated(self, info: LoaderInfo, it: Any, recording: bool) -> None:
        tap = self.taps.get(id(info))
        if tap is not None:
            with contextlib.suppress(Exception):  # the figures are lost, not the loader
                tap.transfer.iterated(it, recording, self.pins)

    def received(self, info: LoaderInfo, it: Any, data: Any, start: float, ret: float,
                 recording: bool) -> None:
        tap = self.taps.get(id(info))
        if tap is not None:
            with contextlib.suppress(Exception):
                tap.transfer.received(it, data, start, ret, recording)

    def fetch(self, info: LoaderInfo, fetch: Callable[[], Any]) -> tuple[Any, float, float]:
        """One recorded fetch, measured: the batch, and perf_counter() before and after it
        (the wall time, the thread's and the process's CPU go into `info`)."""
        tap = self.taps.get(id(info))
        collate = tap.collate if tap is not None else None
        if collate is not None:
            cw, cc = collate.main_wall_us, collate.main_cpu_us
        runq = anatomy.runq_us() if tap is not None else None
        wall, cpu = time.perf_counter(), time.thread_time()
        proc = time.process_time()
        smp = None  # num_workers=0: sample this thread's stack while it fetches
        if tap is not None and info.num_workers == 0 and sampler.start(sampler.SAMPLE_S_MAIN):
            smp = sampler.begin(tap.stack)
        try:
            batch = fetch()
        finally:
            if smp is not None:
                smp.end()
        end = time.perf_counter()
        info.fetch_wall_us += (end - wall) * 1e6
        info.fetch_cpu_us += (time.thread_time() - cpu) * 1e6
        info.fetch_process_cpu_us += (time.process_time() - proc) * 1e6
        if tap is not None:
            tap.transfer.waited(wall, end)
        if tap is not None and runq is not None and tap.runq_us is not None:
            after = anatomy.runq_us()
            tap.runq_us = None if after is None else tap.runq_us + after - runq
        if tap is not None and collate is not None:  # collated here (num_workers=0)
            tap.collate_wall_us += collate.main_wall_us - cw
            tap.collate_cpu_us += collate.main_cpu_us - cc
        if tap is not None and info.num_workers > 0 and self.folder:
            self._poll(tap, self.folder)
        return batch, wall, end

    def anatomy_of(self, info: LoaderInfo) -> dict[str, Any]:
        """The loader's anatomy over the recording so far (also kept in `info.anatomy` and
        `info.bound`); the last one computed once the hooks are removed. Never raises.

        It reads every worker's file and summarises every batch's figures, so the session asks
        for it when recording begins and when it ends, never at each step
        (benchmarks/bench_anatomy.py; the steps pay only `_poll`)."""
        tap = self.taps.get(id(info))
        if tap is None or self.folder is None:
            return info.anatomy
        try:
            if info.num_workers > 0:
                self._read(tap, self.folder)
            main = {"batches": info.batches_recorded, "wall_us": info.fetch_wall_us,
                    "cpu_us": info.fetch_cpu_us, "collate_wall_us": tap.collate_wall_us,
                    "collate_cpu_us": tap.collate_cpu_us, "runq_us": tap.runq_us,
                    "stack": sampler.export(tap.stack)}
            info.anatomy = anatomy.summarise(info.num_workers, tap.workers, main)
            info.anatomy.update(tap.transfer.figures(info.num_workers, info.anatomy))
            info.bound = info.anatomy.get("bound")
        except Exception as exc:  # the anatomy is lost, never the run
            info.anatomy = {"lost": f"{type(exc).__name__}: {exc}"}
            info.bound = None
        return info.anatomy

    def _read(self, tap: _Tap, folder: Path) -> None:
        tap.read_at = time.monotonic()
        files = anatomy.read_workers(folder, tap.key)
        tap.workers = anatomy.window(files, tap.base)
        tap.transfer.update(files, self._record_start)

    def _poll(self, tap: _Tap, folder: Path) -> None:
        """While recording, read the workers' files at most every READ_S: a worker's file
        keeps only its last RING batches' end stamps, which must be matched with their
        receipts before they roll out (capture/transfer.py)."""
        if time.monotonic() - tap.read_at >= anatomy.READ_S:
            with contextlib.suppress(Exception):  # anatomy_of says what was lost
                self._read(tap, folder)
