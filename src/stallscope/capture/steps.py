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

import weakref
from collections.abc import Callable
from typing import Any

from stallscope.runfacts import LoaderInfo

MODES = ("auto", "optimizer", "dataloader", "marker")
# In auto mode, batches drawn with no optimizer.step() before batches become the steps:
# generous, so that gradient accumulation over up to this many batches is still one step.
AUTO_FALLBACK_BATCHES = 16
# A new phase (tutorials train experiment A, then B with a new optimizer and loader): another
# optimizer that steps this many times in a row while the driving one does not, or another
# loader that yields this many batches in a row, takes over. Alternating optimizers (a GAN's
# D, G, D, G) never step twice in a row, so the first keeps driving.
PHASE_OPTIMIZER_STEPS = 2
PHASE_LOADER_BATCHES = AUTO_FALLBACK_BATCHES


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
        # The driving optimizer, held weakly: an id alone is reused once an optimizer is freed
        # (experiment A's SGD, then B's Adam at the same address, was no new phase).
        self._optimizer: Callable[[], Any] | None = None
        self._loader: LoaderInfo | None = None
        self._pending = False
        self._batches_without_step = 0
        self.optimizer_steps = 0  # seen in this process, any optimizer
        self.batches = 0  # drawn from any watched loader
        # Each phase's driver as a user reads it ("optimizer SGD", "DataLoader at train.py:9")
        # with the boundaries seen before it took over; one entry when the script has one phase.
        self.phases: list[tuple[str, int]] = []
        self._boundaries = 0
        self._rival: int | None = None  # another optimizer (or loader) stepping in a row
        self._rival_count = 0

    def on_optimizer_step(self, optimizer: Any) -> None:
        self.optimizer_steps += 1
        if self.source in ("dataloader", "marker") or self.mode == "marker":
            return
        if self._optimizer is None:
            # Several optimizers (GANs, per-module optimizers): the first one to step drives.
            self._optimizer = _held(optimizer)
            self.source = "optimizer"
            self._phase(f"optimizer {type(optimizer).__name__}")
        elif self._optimizer() is not optimizer:
            if not self._takes_over(id(optimizer), PHASE_OPTIMIZER_STEPS):
                return
            self._optimizer = _held(optimizer)  # a new phase: this optimizer drives from now
            self._phase(f"optimizer {type(optimizer).__name__}")
        else:
            self._rival = None
        if self._pending:  # two optimizer steps without a batch between: no loader in the loop
            self.direct = True
        if self.direct:
            self._pending = False
            self._boundary()
        else:
            self._pending = True

    def on_batch(self, loader: LoaderInfo) -> None:
        self.batches += 1
        if self.source == "marker" or self.mode == "marker":
            return
        if self.source == "optimizer":
            if self._pending:
                self._pending = False
                self._boundary()
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
            self._phase(f"DataLoader at {loader.call_site}")
        elif loader is not self._loader:
            if not self._takes_over(id(loader), PHASE_LOADER_BATCHES):
                return
            self._loader = loader  # a new phase: this loader drives from now
            self._phase(f"DataLoader at {loader.call_site}")
        else:
            self._rival = None
        self._boundary()

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
        self._boundary()

    def _boundary(self) -> None:
        self._boundaries += 1
        self._on_boundary()

    def _phase(self, driver: str) -> None:
        self.phases.append((driver, self._boundaries))
        self._rival = None

    def _takes_over(self, key: int, needed: int) -> bool:
        """Count `key` stepping while the driver does not; True once it has `needed` times in a
        row (a new phase)."""
        if self._rival != key:
            self._rival, self._rival_count = key, 0
        self._rival_count += 1
        return self._rival_count >= needed


def _held(obj: Any) -> Callable[[], Any]:
    """A weak reference to `obj` (a strong one for the rare object that refuses weak ones)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
