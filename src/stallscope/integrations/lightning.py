"""`StallscopeCallback` for PyTorch Lightning: profile a few training batches of `fit()`.

    trainer = L.Trainer(callbacks=[StallscopeCallback(steps=5, skip=2)])

The hooks go in at `on_fit_start`, before Lightning builds the training DataLoader, so its
settings reach the report; the profiler starts at `on_train_batch_start` of batch `skip` and
each batch's end is a step boundary (integrations/window.py). After `steps` recorded batches
the report is written to `out_dir` (default `<trainer.default_root_dir>/stallscope`) and is
`callback.report`; training goes on unprofiled. Under several processes only global rank 0
profiles. Imports lightning, so import this module only where lightning is installed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from stallscope.api.result import Report
from stallscope.integrations.window import BatchWindow


class StallscopeCallback(Callback):
    """Profile `steps` training batches after `skip`, and write the stallscope report."""

    def __init__(self, steps: int = 5, skip: int = 2,
                 out_dir: str | os.PathLike[str] | None = None, watch: bool = False) -> None:
        super().__init__()
        # watch=True: every batch timed to the end of training (`stallscope watch`).
        self._window = BatchWindow(steps, skip, out_dir, watch)

    @property
    def report(self) -> Report | None:
        """The report, once the recorded batches are analysed (None before, or if none were)."""
        return self._window.report

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            self._window.open(Path(trainer.default_root_dir) / "stallscope")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._window.batch_start()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._window.batch_end()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._window.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule,
                     exception: BaseException) -> None:
        self._window.close(exception)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._window.close()  # fit() left early: never leave the profiler or the hooks on
