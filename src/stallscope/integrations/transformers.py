"""`StallscopeCallback` for the Hugging Face `Trainer`: profile a few optimizer steps.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[StallscopeCallback(steps=5)])

The hooks go in at `on_train_begin`; the profiler starts at `on_step_begin` of step `skip` and
each `on_step_end` is a step boundary (integrations/window.py), so with gradient accumulation a
step is one optimizer step over all its micro-batches. After `steps` recorded steps the report
is written to `out_dir` (default `<args.output_dir>/stallscope`) and is `callback.report`;
training goes on unprofiled. Under several processes only the main process profiles. The
Trainer's DataLoader is built before `on_train_begin`, so the report has no DataLoader table
(the trace still shows the loading). Imports transformers, so import this module only where
transformers is installed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from stallscope.api.result import Report
from stallscope.integrations.window import BatchWindow


class StallscopeCallback(TrainerCallback):
    """Profile `steps` training steps after `skip`, and write the stallscope report."""

    def __init__(self, steps: int = 5, skip: int = 2,
                 out_dir: str | os.PathLike[str] | None = None, watch: bool = False) -> None:
        # watch=True: every batch timed to the end of training (`stallscope watch`).
        self._window = BatchWindow(steps, skip, out_dir, watch)

    @property
    def report(self) -> Report | None:
        """The report, once the recorded steps are analysed (None before, or if none were)."""
        return self._window.report

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._window.open(Path(args.output_dir or ".") / "stallscope")

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self._window.batch_start()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._window.batch_end()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._window.close()
