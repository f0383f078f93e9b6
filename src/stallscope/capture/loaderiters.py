"""The iterators the script made of its DataLoaders, as the capture reads them: which epoch the
current one is, how many batches it has left and prefetched, its worker processes, and their
shutdown when the script was stopped mid-loop.

The loader watcher (capture/loaders.py) hands each iterator here as `__iter__` makes it and as
`__next__` serves from it; the session's parts only read (the steady wait, the step log, the
memory sampler). Iterators are held weakly: the script's loop owns them.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from stallscope.runfacts import LoaderInfo

LOADER_ATTR = "_stallscope_loader"  # on a loader and its iterators: its LoaderInfo
_EPOCH = "_stallscope_epoch"  # on an iterator: which `__iter__` call of its loader made it


class LoaderIterators:
    """The worker iterators alive, the iterator whose batch opened the latest step, and each
    loader's `__iter__` calls so far (its epochs)."""

    def __init__(self) -> None:
        self._workers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.current: weakref.ref[Any] | None = None
        self._epochs: dict[int, int] = {}

    def made(self, it: Any, info: LoaderInfo | None) -> None:
        """A new iterator of the training process (`info`: its loader's, when recorded)."""
        if isinstance(it, _MultiProcessingDataLoaderIter):
            self._workers.add(it)
        if info is not None:
            epoch = self._epochs.get(id(info), 0)
            self._epochs[id(info)] = epoch + 1
            it.__dict__[_EPOCH] = epoch

    def serving(self, it: Any) -> None:
        """`it` serves the batch that may open a step (weakly: the script's loop owns it)."""
        self.current = weakref.ref(it)

    def _current(self) -> Any:
        return self.current() if self.current is not None else None

    def current_epoch(self) -> int | None:
        """The epoch (0-based `__iter__` call) of the loader whose batch opened the latest
        step; None before any batch or without a torch DataLoader."""
        it = self._current()
        return None if it is None else it.__dict__.get(_EPOCH)

    def prefetched_left(self) -> tuple[int, int]:
        """Of the batches the current iterator's workers prefetched when it started (an epoch's
        `num_workers * prefetch_factor`), how many are still queued; and its worker count."""
        it = self._current()
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
        it = self._current()
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
        for it in list(self._workers):
            with contextlib.suppress(Exception):  # torch kills what does not stop
                it._shutdown_workers()
        self._workers = weakref.WeakSet()
        self.current = None

    def worker_processes(self) -> list[tuple[str, int, str | None, int | None]]:
        """("worker", pid, loader call site, worker id) of every worker alive now (read from
        the memory sampler's thread: a set changed meanwhile gives [] this once)."""
        out: list[tuple[str, int, str | None, int | None]] = []
        try:
            for it in list(self._workers):
                info = it.__dict__.get(LOADER_ATTR)
                site = info.call_site if isinstance(info, LoaderInfo) else None
                for wid, proc in enumerate(list(getattr(it, "_workers", []))):
                    if proc.pid is not None:
                        out.append(("worker", int(proc.pid), site, wid))
        except Exception:  # the script's loop changed the set meanwhile: next sweep
            return []
        return out
