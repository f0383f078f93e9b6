"""Watch every DataLoader the script builds: its configuration, its call site, its batches.

The trace shows that the step waits in `DataLoader.__next__` but not which loader, where it was
built, or with what settings; that is what makes a recommendation pasteable. The watcher wraps
`DataLoader.__init__`, `DataLoader.__iter__` and the iterators' `__next__` for the length of the
run and restores them after.

With `stallscope run --set KEY=VALUE`, the `__init__` wrapper also rewrites the constructor's
arguments (positional ones included) before torch sees them, so a recommended change can be
measured without editing the script. Combinations torch would reject are not passed on: the
override is dropped with a note, because crashing the user's script would measure nothing.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.utils.data
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from stallscope.capture import anatomy, frameworks, memory, sampler, transfer
from stallscope.runfacts import LoaderInfo

_ATTR = "_stallscope_loader"
_EPOCH = "_stallscope_epoch"  # on an iterator: which `__iter__` call of its loader made it


class LoaderWatcher:
    """Records loaders and calls `on_batch(loader_info, iterator)` before each batch is fetched.

    `on_batch` runs in front of the loader's own `record_function`, so a step boundary placed
    there nests cleanly in the trace.
    """

    def __init__(
        self,
        on_batch: Callable[[LoaderInfo, Any], None],
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.loaders: list[LoaderInfo] = []
        self.overrides: dict[str, Any] = dict(overrides or {})
        self.notes: list[str] = []  # overrides dropped or reset, one line each, no repeats
        self._recording = False
        self._on_batch = on_batch
        self._pid = os.getpid()
        self._saved: list[tuple[type, str, Any]] = []
        # Anatomy (capture/anatomy.py): the folder the workers write their totals into, and
        # per loader (by id of its LoaderInfo) the wrappers and the training process's figures.
        self._folder: Path | None = None
        self._taps: dict[int, _Tap] = {}
        # Batches between the workers and the step (capture/transfer.py): when recording
        # started (time.monotonic()), and the pin-memory threads' pin_memory() calls.
        self._record_start = float("inf")
        self._pins = transfer.PinLedger()
        self._arguments = frameworks.ArgumentsWatch()  # where TrainingArguments are built
        # The worker iterators the script made (weakly): see shutdown_workers.
        self._worker_iters: weakref.WeakSet[Any] = weakref.WeakSet()
        # Before recording (capture/steady.py): the iterator whose batch opened the latest
        # step, and the time spent in `__next__` since the step boundary before.
        self.current: weakref.ref[Any] | None = None
        self.unprofiled_wait_us = 0.0
        # For `watch`'s step log (capture/steplog.py), recording or not: the wait since the
        # last boundary, and each loader's `__iter__` calls so far (its epochs).
        self.step_wait_us = 0.0
        self._epochs: dict[int, int] = {}

    @property
    def recording(self) -> bool:
        return self._recording

    @recording.setter
    def recording(self, value: bool) -> None:
        """Set by the session at each step boundary; the start of recording is the baseline of
        the workers' totals, so the anatomy covers the recorded steps."""
        if value and not self._recording and self._folder is not None:
            for tap in self._taps.values():
                tap.base = anatomy.read_workers(self._folder, tap.key)
        if value and self._record_start == float("inf"):
            self._record_start = time.monotonic()
        if not value:
            for tap in self._taps.values():
                tap.transfer.stopped()
        self._pins.active = value
        self._recording = value

    def new_window(self) -> None:
        """Forget the last recorded window: `watch`'s later captures (capture/recapture.py)
        describe their own steps' loaders, not the sum since the first capture. Called while
        not recording; the workers' totals are re-based when recording starts again."""
        for info in self.loaders:
            info.batches_recorded = info.fetch_bytes = 0
            info.fetch_wall_us = info.fetch_cpu_us = info.fetch_process_cpu_us = 0.0
        for key, tap in list(self._taps.items()):
            self._taps[key] = _Tap(tap.key, tap.collate,
                                   runq_us=None if tap.runq_us is None else 0.0)
        self._record_start = float("inf")

    def anatomy_of(self, info: LoaderInfo) -> dict[str, Any]:
        """The loader's anatomy over the recording so far (also kept in `info.anatomy` and
        `info.bound`); the last one computed once the hooks are removed. Never raises.

        It reads every worker's file and summarises every batch's figures: 0.1-4 ms over tens
        to hundreds of batches, 30 ms over 1,500 (benchmarks/bench_anatomy.py), so the session
        asks for it when recording begins and when it ends, never at each step (the steps pay
        only `_poll`)."""
        tap = self._taps.get(id(info))
        if tap is None or self._folder is None:
            return info.anatomy
        try:
            if info.num_workers > 0:
                self._read(tap, self._folder)
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
        """While recording, read the workers' files at most every READ_S (~0.15 ms for two
        workers): a worker's file keeps only its last RING batches' end stamps, which must be
        matched with their receipts before they roll out (capture/transfer.py)."""
        if time.monotonic() - tap.read_at >= anatomy.READ_S:
            with contextlib.suppress(Exception):  # anatomy_of says what was lost
                self._read(tap, folder)

    def install(self) -> None:
        loader_cls = torch.utils.data.DataLoader
        watcher = self
        orig_init, orig_iter = loader_cls.__init__, loader_cls.__iter__
        orig_next = _BaseDataLoaderIter.__next__
        orig_get = _MultiProcessingDataLoaderIter._try_get_data

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            if os.getpid() != watcher._pid or _ATTR in loader.__dict__:
                orig_init(loader, *args, **kwargs)
                return
            origin = _origin(loader, sys._getframe(1))
            plan = None
            if watcher.overrides:
                plan = plan_overrides(orig_init, loader, args, kwargs, watcher.overrides)
            if plan is None:
                orig_init(loader, *args, **kwargs)
            else:
                orig_init(*plan.args, **plan.kwargs)
            if origin.parent is not None and not _same_data(origin.parent, loader):
                origin = _origin(loader, sys._getframe(1), rebuilt=False)
            if plan is not None and origin.parent is None:
                watcher._note(origin.call_site, plan.notes)  # a rebuild said them already
            watcher._register(loader, origin, plan)

        def __iter__(loader: Any) -> Any:  # noqa: N807
            it = orig_iter(loader)
            if isinstance(it, _MultiProcessingDataLoaderIter) and os.getpid() == watcher._pid:
                watcher._worker_iters.add(it)
            info = loader.__dict__.get(_ATTR)
            if info is not None:
                it.__dict__[_ATTR] = info
                if os.getpid() == watcher._pid:
                    epoch = watcher._epochs.get(id(info), 0)
                    watcher._epochs[id(info)] = epoch + 1
                    it.__dict__[_EPOCH] = epoch
                tap = watcher._taps.get(id(info))
                if tap is not None and os.getpid() == watcher._pid:
                    with contextlib.suppress(Exception):  # the figures are lost, not the loader
                        tap.transfer.iterated(it, watcher.recording, watcher._pins)
            return it

        def _try_get_data(it: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            got = orig_get(it, *args, **kwargs)
            info = it.__dict__.get(_ATTR)
            if info is not None and got[0]:
                ret = time.monotonic()
                tap = watcher._taps.get(id(info))
                if tap is not None:
                    with contextlib.suppress(Exception):
                        tap.transfer.received(it, got[1], start, ret, watcher.recording)
            return got

        def __next__(it: Any) -> Any:  # noqa: N807
            info = it.__dict__.get(_ATTR)
            if info is not None and os.getpid() == watcher._pid and not _exhausted(it):
                watcher.current = weakref.ref(it)  # weakly: the script's loop owns it
                watcher._on_batch(info, it)  # may open a new step, or stop the script
                info.batches += 1
                if not watcher.recording:  # the wait of an unprofiled step (capture/steady.py)
                    start = time.perf_counter()
                    try:
                        return orig_next(it)
                    finally:
                        waited = (time.perf_counter() - start) * 1e6
                        watcher.unprofiled_wait_us += waited
                        watcher.step_wait_us += waited
                if watcher.recording:
                    info.batches_recorded += 1
                    tap = watcher._taps.get(id(info))
                    collate = tap.collate if tap is not None else None
                    if collate is not None:
                        cw, cc = collate.main_wall_us, collate.main_cpu_us
                    runq = anatomy.runq_us() if tap is not None else None
                    wall, cpu = time.perf_counter(), time.thread_time()
                    proc = time.process_time()
                    smp = None  # num_workers=0: sample this thread's stack while it fetches
                    if (tap is not None and info.num_workers == 0
                            and sampler.start(sampler.SAMPLE_S_MAIN)):
                        smp = sampler.begin(tap.stack)
                    try:
                        batch = orig_next(it)
                    finally:
                        if smp is not None:
                            smp.end()
                    end = time.perf_counter()
                    info.fetch_wall_us += (end - wall) * 1e6
                    watcher.step_wait_us += (end - wall) * 1e6
                    info.fetch_cpu_us += (time.thread_time() - cpu) * 1e6
                    info.fetch_process_cpu_us += (time.process_time() - proc) * 1e6
                    if tap is not None:
                        tap.transfer.waited(wall, end)
                    info.fetch_bytes += tensor_bytes(batch)
                    if tap is not None and runq is not None and tap.runq_us is not None:
                        after = anatomy.runq_us()
                        tap.runq_us = None if after is None else tap.runq_us + after - runq
                    if tap is not None and collate is not None:  # collated here (num_workers=0)
                        tap.collate_wall_us += collate.main_wall_us - cw
                        tap.collate_cpu_us += collate.main_cpu_us - cc
                    if tap is not None and info.num_workers > 0 and watcher._folder:
                        watcher._poll(tap, watcher._folder)
                    return batch
            return orig_next(it)

        for cls, name, fn in (
            (loader_cls, "__init__", __init__),
            (loader_cls, "__iter__", __iter__),
            (_BaseDataLoaderIter, "__next__", __next__),
            (_MultiProcessingDataLoaderIter, "_try_get_data", _try_get_data),
        ):
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, fn)
        with contextlib.suppress(Exception):  # no pin figures, the rest as before
            self._pins.install()
        try:
            self._folder = Path(tempfile.mkdtemp(prefix="stallscope-anatomy-"))
        except OSError:  # no temporary folder: no worker anatomy, the rest as before
            self._folder = None
        self._arguments.install()

    def take_unprofiled_wait(self) -> float:
        """The time (us) the training process spent in DataLoader `__next__` since the last
        call: the loader wait of the unprofiled step that just ended."""
        wait, self.unprofiled_wait_us = self.unprofiled_wait_us, 0.0
        return wait

    def take_step_wait(self) -> float:
        """The DataLoader wait (us) since the last call, recording or not (the step log's)."""
        wait, self.step_wait_us = self.step_wait_us, 0.0
        return wait

    def current_epoch(self) -> int | None:
        """The epoch (0-based `__iter__` call) of the loader whose batch opened the latest
        step; None before any batch or without a torch DataLoader."""
        it = self.current() if self.current is not None else None
        return None if it is None else it.__dict__.get(_EPOCH)

    def prefetched_left(self) -> tuple[int, int]:
        """Of the batches the current iterator's workers prefetched when it started (an epoch's
        `num_workers * prefetch_factor`), how many are still queued; and its worker count."""
        it = self.current() if self.current is not None else None
        if not isinstance(it, _MultiProcessingDataLoaderIter):
            return 0, 0
        try:
            workers = int(it._num_workers)
            return max(0, workers * int(it._prefetch_factor) - int(it._num_yielded)), workers
        except (AttributeError, TypeError, ValueError):  # another torch: no such counters
            return 0, 0

    def batches_left(self) -> int | None:
        """Batches the driving loader's current iterator has still to yield this epoch; None
        when unknown (no loader seen, an iterable dataset without a length)."""
        it = self.current() if self.current is not None else None
        if it is None:
            return None
        try:
            return max(0, len(it) - int(it._num_yielded))
        except Exception:  # no length, or another torch's iterator
            return None

    def shutdown_workers(self) -> None:
        """Shut down the workers of every iterator the script left alive, as torch does when a
        loop's iterator is released. A script stopped mid-loop leaves its iterator in a
        reference cycle (frames, the exception); the garbage collector then closes the index
        queues' feeder threads before the iterator's `__del__` asks the workers to stop, and
        each persistent worker is joined only after a 5 s timeout (40 s for 8 workers)."""
        for it in list(self._worker_iters):
            with contextlib.suppress(Exception):  # torch kills what does not stop
                it._shutdown_workers()
        self._worker_iters = weakref.WeakSet()
        self.current = None

    def worker_processes(self) -> list[tuple[str, int, str | None, int | None]]:
        """("worker", pid, loader call site, worker id) of every worker alive now (read from
        the memory sampler's thread: a set changed meanwhile gives [] this once)."""
        out: list[tuple[str, int, str | None, int | None]] = []
        try:
            for it in list(self._worker_iters):
                info = it.__dict__.get(_ATTR)
                site = info.call_site if isinstance(info, LoaderInfo) else None
                for wid, proc in enumerate(list(getattr(it, "_workers", []))):
                    if proc.pid is not None:
                        out.append(("worker", int(proc.pid), site, wid))
        except Exception:  # the script's loop changed the set meanwhile: next sweep
            return []
        return out

    def uninstall(self) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)
        self._saved.clear()
        sampler.stop()  # the training process's sampler (num_workers=0 loaders), if started
        self._pins.uninstall()
        self._arguments.uninstall()
        if self._folder is not None:  # workers still running find it gone and stop writing
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _note(self, site: str, notes: list[str]) -> None:
        for text in notes:
            line = f"{site}: {text}"
            if line not in self.notes:  # a loader rebuilt every epoch says it once
                self.notes.append(line)

    def _register(self, loader: Any, origin: frameworks.Origin,
                  plan: OverridePlan | None) -> None:
        parent = _info(origin.parent)
        # accelerate may wrap an iterable dataset in its shard: the user's own is the one named.
        dataset = loader.dataset if parent is None else origin.parent.dataset
        try:
            length: int | None = len(dataset)
        except Exception:  # an IterableDataset, or a dataset whose length is unknown
            length = None
        name = type(dataset).__name__
        batch_size = loader.batch_size
        overrides = dict(plan.applied) if plan else {}
        built_with = dict(plan.built_with) if plan else {}
        if parent is not None:
            # A rebuild passes a batch_sampler of the original's size, and reads the original's
            # settings, already overridden: what the script asked for is the original's.
            batch_size = parent.batch_size if batch_size is None else batch_size
            overrides.update(parent.overrides)
            built_with.update(parent.built_with)
        info = LoaderInfo(
            call_site=origin.call_site,
            num_workers=int(loader.num_workers),
            pin_memory=bool(loader.pin_memory),
            batch_size=batch_size,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=bool(loader.persistent_workers),
            dataset=name if length is None else f"{name} ({length} items)",
            dataset_len=length,
            drop_last=bool(getattr(loader, "drop_last", False)),
            overrides=overrides,
            built_with=built_with,
            framework=origin.framework,
            user_site=origin.user_site,
            configured_in=origin.configured_in,
            settings_site=origin.settings_site,
            built_at=origin.built_at,
            dataset_storage=memory.describe_storage(dataset),
        )
        # DataLoader refuses a few attributes after construction, not a private one.
        object.__setattr__(loader, _ATTR, info)
        self.loaders.append(info)
        self._tap(loader, info)

    def _tap(self, loader: Any, info: LoaderInfo) -> None:
        """Wrap the loader's collate_fn and worker_init_fn (capture/anatomy.py). A loader that
        cannot be wrapped runs unwrapped: it loses its anatomy, nothing else."""
        key = f"l{len(self.loaders)}"
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
            if loader.num_workers > 0 and self._folder is not None:
                init = anatomy.WorkerInit(own_init, str(self._folder), key)
            elif own_init is not loader.worker_init_fn:
                loader.worker_init_fn = own_init
            loader.collate_fn = collate
            if init is not None:
                loader.worker_init_fn = init
        except Exception as exc:
            info.anatomy = {"lost": f"the loader could not be wrapped ({type(exc).__name__})"}
            return
        self._taps[id(info)] = _Tap(key, collate)


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


@dataclass
class OverridePlan:
    """The constructor call to make instead of the script's, and what changed in it."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    applied: dict[str, Any] = field(default_factory=dict)  # key -> value passed to torch
    built_with: dict[str, Any] = field(default_factory=dict)  # key -> the script's value
    notes: list[str] = field(default_factory=list)


# Settings that only mean something with worker processes: torch raises when they are set
# with num_workers=0, so an override to 0 workers resets the script's own values of them.
_MULTIPROCESS_ONLY = ("persistent_workers", "prefetch_factor", "multiprocessing_context")


def plan_overrides(
    orig_init: Callable[..., None],
    loader: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    requested: Mapping[str, Any],
) -> OverridePlan | None:
    """Rewrite one `DataLoader(...)` call with `requested` applied, keeping it one torch accepts.

    Binding to the signature makes `DataLoader(ds, 32)` as overridable as `batch_size=32`.
    None when the call does not bind: then torch should raise its own error, as without us.
    """
    sig = inspect.signature(orig_init)
    try:
        bound = sig.bind(loader, *args, **kwargs)
    except TypeError:
        return None
    params = sig.parameters
    defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}

    def current(name: str) -> Any:
        return bound.arguments.get(name, defaults.get(name))

    wanted = {k: v for k, v in requested.items() if k in params}
    notes = [f"--set {k} not applied: this torch's DataLoader has no such argument"
             for k in requested if k not in params]
    if current("batch_sampler") is not None:
        for key in ("batch_size", "drop_last"):
            if wanted.pop(key, None) is not None:
                notes.append(f"--set {key} not applied: the script passes a batch_sampler, "
                             "which decides the batches")
    elif current("batch_size") is None:
        for key in ("batch_size", "drop_last"):
            if wanted.pop(key, None) is not None:
                notes.append(f"--set {key} not applied: the script passes batch_size=None "
                             "(its dataset yields whole batches)")
    workers = wanted.get("num_workers", current("num_workers"))
    if workers == 0:
        if wanted.get("persistent_workers"):
            del wanted["persistent_workers"]
            notes.append("--set persistent_workers=true not applied: it needs num_workers > 0 "
                         "and this DataLoader has num_workers=0")
        if "prefetch_factor" in wanted:
            del wanted["prefetch_factor"]
            notes.append("--set prefetch_factor not applied: it needs num_workers > 0 and this "
                         "DataLoader has num_workers=0")
        if "num_workers" in wanted:
            for key in _MULTIPROCESS_ONLY:
                if key in params and key not in wanted and current(key) != defaults.get(key):
                    wanted[key] = defaults.get(key)
                    notes.append(f"the script's {key} was reset to {defaults.get(key)!r}: "
                                 "torch refuses it with --set num_workers=0")
    plan = OverridePlan((), {}, notes=notes)
    for key, value in wanted.items():
        if key != "multiprocessing_context":  # an object, not a fact for report.json
            plan.built_with[key] = current(key)
            plan.applied[key] = value
        bound.arguments[key] = value
    if wanted.get("pin_memory") and not _accelerator_available():
        notes.append("--set pin_memory=true has no effect here: torch pins memory only for "
                     "a GPU or other accelerator, and none is available")
    if wanted.get("num_workers") and _is_iterable_dataset(current("dataset")):
        notes.append("num_workers > 0 with an IterableDataset: each worker iterates the whole "
                     "dataset unless it shards itself with get_worker_info()")
    plan.args, plan.kwargs = bound.args, dict(bound.kwargs)
    return plan


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


def _is_iterable_dataset(dataset: Any) -> bool:
    return isinstance(dataset, torch.utils.data.IterableDataset)


def tensor_bytes(batch: Any, depth: int = 0) -> int:
    """Bytes of the tensors in a batch (nested tuples, lists and dicts), without copying."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if depth > 4:
        return 0
    if isinstance(batch, dict):
        return sum(tensor_bytes(v, depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(tensor_bytes(v, depth + 1) for v in batch[:1024])
    return 0


def _exhausted(it: Any) -> bool:
    """True when this call will raise StopIteration: it must not count as a batch."""
    try:
        return it._num_yielded >= len(it)
    except Exception:  # iterable datasets have no length: count every call
        return False


def _info(obj: Any) -> LoaderInfo | None:
    """The watcher's record of a DataLoader built earlier in this run; None for anything else."""
    try:
        if isinstance(obj, torch.utils.data.DataLoader):
            info = obj.__dict__.get(_ATTR)
            return info if isinstance(info, LoaderInfo) else None
    except Exception:  # an object whose class or attributes cannot be read is not ours
        pass
    return None


def _origin(loader: Any, frame: Any, rebuilt: bool = True) -> frameworks.Origin:
    """Who built `loader` (capture/frameworks.py); never raises: at worst "unknown"."""
    try:
        return frameworks.origin(loader, frame, _info if rebuilt else (lambda _: None))
    except Exception:
        return frameworks.Origin("unknown")


def _same_data(parent: Any, loader: Any) -> bool:
    """A rebuild serves the original's dataset, or accelerate's shard of it (`.dataset`)."""
    original = getattr(parent, "dataset", None)
    data = getattr(loader, "dataset", None)
    return original is not None and (data is original or getattr(data, "dataset", None)
                                     is original)
