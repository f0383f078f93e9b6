"""Find training-step boundaries in an unmodified script.

A step ends at `optimizer.step()` (a global post hook on torch.optim), or, for loops without a
torch.optim optimizer, at each batch of a DataLoader. An optimizer hook runs inside the
optimizer's own profiler range, so a boundary placed there would cut that range in two; the
boundary is therefore held until the next batch is fetched, which is where a hand-written
`prof.step()` sits too. Loops with no DataLoader at all fall back to the hook itself.

`stallscope.step()` (marker.py) is the loop's own say: once one is seen (auto mode, or mode
"marker" for the framework callbacks, which place the markers themselves) markers alone place
the boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallscope.capture.context import LoaderInfo

MODES = ("auto", "optimizer", "dataloader", "marker")
# In auto mode, batches drawn with no optimizer.step() before batches become the steps:
# generous, so that gradient accumulation over up to this many batches is still one step.
AUTO_FALLBACK_BATCHES = 16


class StepDriver:
    """Turns optimizer steps, DataLoader batches and step markers into calls of
    `on_boundary()`."""

    def __init__(self, mode: str, on_boundary: Callable[[], None]) -> None:
        if mode not in MODES:
            raise ValueError(f"step mode must be one of {MODES}")
        self.mode = mode
        self.source: str | None = "dataloader" if mode == "dataloader" else None
        self.direct = False  # optimizer boundaries placed in the hook (no loader in the loop)
        self._on_boundary = on_boundary
        self._optimizer: int | None = None
        self._loader: LoaderInfo | None = None
        self._pending = False
        self._batches_without_step = 0

    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.source in ("dataloader", "marker") or self.mode == "marker":
            return
        if self._optimizer is None:
            # Several optimizers (GANs, per-module optimizers): the first one to step drives.
            self._optimizer = id(optimizer)
            self.source = "optimizer"
        elif id(optimizer) != self._optimizer:
            return
        if self._pending:  # two optimizer steps without a batch between: no loader in the loop
            self.direct = True
        if self.direct:
            self._pending = False
            self._on_boundary()
        else:
            self._pending = True

    def on_batch(self, loader: LoaderInfo) -> None:
        if self.source == "marker" or self.mode == "marker":
            return
        if self.source == "optimizer":
            if self._pending:
                self._pending = False
                self._on_boundary()
            return
        if self.mode == "optimizer":
            return
        if self.source is None:  # auto, undecided: wait a while for an optimizer step
            self._batches_without_step += 1
            if self._batches_without_step <= AUTO_FALLBACK_BATCHES:
                return
            self.source = "dataloader"
        if self._loader is None:
            self._loader = loader  # the first loader to yield drives the steps
        if loader is self._loader:
            self._on_boundary()

    def on_marker(self) -> None:
        """`stallscope.step()`: in auto mode the first marker outranks what was guessed so far
        (an optimizer boundary still held for the next batch is dropped: the marker is that
        boundary); `--step-on optimizer|dataloader` chose otherwise and ignores markers."""
        if self.mode not in ("auto", "marker"):
            return
        if self.source != "marker":
            self.source = "marker"
            self._pending = False
            self.direct = False
        self._on_boundary()
