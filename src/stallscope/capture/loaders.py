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

import inspect
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.utils.data
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from stallscope.capture import frameworks, memory, sampler
from stallscope.capture.loaderiters import LOADER_ATTR, LoaderIterators
from stallscope.capture.loadertaps import LoaderTaps
from stallscope.runfacts import LoaderInfo

_ATTR = LOADER_ATTR


class LoaderWatcher:
    """Records loaders and calls `on_batch(loader_info, iterator)` before each batch is fetched.

    `on_batch` runs in front of the loader's own `record_function`, so a step boundary placed
    there nests cleanly in the trace. What is measured of the loaders lives in `taps`
    (capture/loadertaps.py), what is read of their iterators in `iters`
    (capture/loaderiters.py); the wrappers here only find the events and hand them on.
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
        self.taps = LoaderTaps()
        self.iters = LoaderIterators()
        self._arguments = frameworks.ArgumentsWatch()  # where TrainingArguments are built
        # Before recording (capture/steady.py): the time spent in `__next__` since the step
        # boundary before; for `watch`'s step log (capture/steplog.py), recording or not, the
        # wait since the last boundary.
        self.unprofiled_wait_us = 0.0
        self.step_wait_us = 0.0

    @property
    def recording(self) -> bool:
        return self._recording

    @recording.setter
    def recording(self, value: bool) -> None:
        """Set by the session at each step boundary; the start of recording is the baseline of
        the workers' totals, so the anatomy covers the recorded steps."""
        self.taps.recording(value, self._recording)
        self._recording = value

    def new_window(self) -> None:
        """Forget the last recorded window: `watch`'s later captures (capture/recapture.py)
        describe their own steps' loaders, not the sum since the first capture. Called while
        not recording; the workers' totals are re-based when recording starts again."""
        for info in self.loaders:
            info.batches_recorded = info.fetch_bytes = 0
            info.fetch_wall_us = info.fetch_cpu_us = info.fetch_process_cpu_us = 0.0
        self.taps.new_window()

    def anatomy_of(self, info: LoaderInfo) -> dict[str, Any]:
        """The loader's anatomy over the recording so far (capture/loadertaps.py)."""
        return self.taps.anatomy_of(info)

    def read_recorded(self) -> None:
        """Every recorded loader's anatomy, read now (before the hooks and the workers' folder
        go, when the script ended mid-recording)."""
        for d in self.loaders:
            if d.batches_recorded:
                self.taps.anatomy_of(d)

    def recorded_metadata(self) -> list[dict[str, Any]]:
        """The trace metadata's `loaders`: each recorded loader's settings, what its fetches
        cost the training process, and its anatomy."""
        return [
            {"call_site": d.call_site, "num_workers": d.num_workers,
             "pin_memory": d.pin_memory, "batches": d.batches_recorded,
             "fetch_wall_us": round(d.fetch_wall_us, 1),
             "fetch_cpu_us": round(d.fetch_cpu_us, 1),
             "fetch_process_cpu_us": round(d.fetch_process_cpu_us, 1),
             "fetch_bytes": d.fetch_bytes, "anatomy": self.taps.anatomy_of(d)}
            for d in self.loaders if d.batches_recorded
        ]

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
            info = loader.__dict__.get(_ATTR)
            if info is not None:
                it.__dict__[_ATTR] = info
            if os.getpid() == watcher._pid:
                watcher.iters.made(it, info)
                if info is not None:
                    watcher.taps.iterated(info, it, watcher.recording)
            return it

        def _try_get_data(it: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            got = orig_get(it, *args, **kwargs)
            info = it.__dict__.get(_ATTR)
            if info is not None and got[0]:
                watcher.taps.received(info, it, got[1], start, time.monotonic(),
                                      watcher.recording)
            return got

        def __next__(it: Any) -> Any:  # noqa: N807
            info = it.__dict__.get(_ATTR)
            if info is not None and os.getpid() == watcher._pid and not _exhausted(it):
                return watcher._next(info, it, orig_next)
            return orig_next(it)

        for cls, name, fn in (
            (loader_cls, "__init__", __init__),
            (loader_cls, "__iter__", __iter__),
            (_BaseDataLoaderIter, "__next__", __next__),
            (_MultiProcessingDataLoaderIter, "_try_get_data", _try_get_data),
        ):
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, fn)
        self.taps.install()
        self._arguments.install()

    def _next(self, info: LoaderInfo, it: Any, orig_next: Callable[[Any], Any]) -> Any:
        """One batch of a recorded loader in the training process: the step hook first, then
        the fetch, timed as the step's wait (measured whole while recording)."""
        self.iters.serving(it)
        self._on_batch(info, it)  # may open a new step, or stop the script
        info.batches += 1
        if not self.recording:  # the wait of an unprofiled step (capture/steady.py)
            start = time.perf_counter()
            try:
                return orig_next(it)
            finally:
                waited = (time.perf_counter() - start) * 1e6
                self.unprofiled_wait_us += waited
                self.step_wait_us += waited
        info.batches_recorded += 1
        batch, wall, end = self.taps.fetch(info, lambda: orig_next(it))
        self.step_wait_us += (end - wall) * 1e6
        info.fetch_bytes += tensor_bytes(batch)
        return batch

    def take_unprofiled_wait(self) -> float:
        """The time (us) the training process spent in DataLoader `__next__` since the last
        call: the loader wait of the unprofiled step that just ended."""
        wait, self.unprofiled_wait_us = self.unprofiled_wait_us, 0.0
        return wait

    def take_step_wait(self) -> float:
        """The DataLoader wait (us) since the last call, recording or not (the step log's)."""
        wait, self.step_wait_us = self.step_wait_us, 0.0
        return wait

    def uninstall(self) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)
        self._saved.clear()
        sampler.stop()  # the training process's sampler (num_workers=0 loaders), if started
        self.taps.uninstall()
        self._arguments.uninstall()

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
        """Wrap the loader for its anatomy (capture/loadertaps.py)."""
        self.taps.tap(loader, info, f"l{len(self.loaders)}")

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
