"""Watch every DataLoader the script builds: its configuration, its call site, its batches.

The trace shows that the step waits in `DataLoader.__next__` but not which loader, where it was
built, or with what settings; that is what makes a recommendation pasteable. The watcher wraps
`DataLoader.__init__`, `DataLoader.__iter__` and the iterators' `__next__` for the length of the
run and restores them after.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.utils.data
from torch.utils.data.dataloader import _BaseDataLoaderIter

from stallscope.context import LoaderInfo

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_STALLSCOPE_DIR = str(Path(__file__).resolve().parent.parent)
_ATTR = "_stallscope_loader"


class LoaderWatcher:
    """Records loaders and calls `on_batch(loader_info, iterator)` before each batch is fetched.

    `on_batch` runs in front of the loader's own `record_function`, so a step boundary placed
    there nests cleanly in the trace.
    """

    def __init__(self, on_batch: Callable[[LoaderInfo, Any], None]) -> None:
        self.loaders: list[LoaderInfo] = []
        self.recording = False
        self._on_batch = on_batch
        self._pid = os.getpid()
        self._saved: list[tuple[type, str, Any]] = []

    def install(self) -> None:
        loader_cls = torch.utils.data.DataLoader
        watcher = self
        orig_init, orig_iter = loader_cls.__init__, loader_cls.__iter__
        orig_next = _BaseDataLoaderIter.__next__

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            orig_init(loader, *args, **kwargs)
            if os.getpid() == watcher._pid and _ATTR not in loader.__dict__:
                watcher._register(loader)

        def __iter__(loader: Any) -> Any:  # noqa: N807
            it = orig_iter(loader)
            info = loader.__dict__.get(_ATTR)
            if info is not None:
                it.__dict__[_ATTR] = info
            return it

        def __next__(it: Any) -> Any:  # noqa: N807
            info = it.__dict__.get(_ATTR)
            if info is not None and os.getpid() == watcher._pid and not _exhausted(it):
                watcher._on_batch(info, it)  # may open a new step, or stop the script
                info.batches += 1
                if watcher.recording:
                    info.batches_recorded += 1
            return orig_next(it)

        for cls, name, fn in (
            (loader_cls, "__init__", __init__),
            (loader_cls, "__iter__", __iter__),
            (_BaseDataLoaderIter, "__next__", __next__),
        ):
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, fn)

    def uninstall(self) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)
        self._saved.clear()

    def _register(self, loader: Any) -> None:
        dataset = loader.dataset
        try:
            length: int | None = len(dataset)
        except Exception:  # an IterableDataset, or a dataset whose length is unknown
            length = None
        name = type(dataset).__name__
        info = LoaderInfo(
            call_site=_call_site(loader),
            num_workers=int(loader.num_workers),
            pin_memory=bool(loader.pin_memory),
            batch_size=loader.batch_size,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=bool(loader.persistent_workers),
            dataset=name if length is None else f"{name} ({length} items)",
            dataset_len=length,
        )
        # DataLoader refuses a few attributes after construction, not a private one.
        object.__setattr__(loader, _ATTR, info)
        self.loaders.append(info)


def _exhausted(it: Any) -> bool:
    """True when this call will raise StopIteration: it must not count as a batch."""
    try:
        return it._num_yielded >= len(it)
    except Exception:  # iterable datasets have no length: count every call
        return False


def _call_site(loader: Any) -> str:
    """The user's line that built this loader: the first frame outside torch, stallscope and
    the constructors of DataLoader subclasses."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        inside = filename.startswith((_TORCH_DIR, _STALLSCOPE_DIR)) or (
            frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is loader
        )
        if not inside and not filename.startswith("<"):
            return f"{_display_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"


def _display_path(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)
