"""`run --set torch_threads=N`: the training process's intra-op threads, set before the script.

On a CPU run, DataLoader workers take cores from the step's intra-op threads; dataloader-bound
then advises the worker count and `torch.set_num_threads` as one change, and `tune` must measure
that change, not half of it (on an earlier version of examples/loader_bound.py, 2 workers
beside 2 threads on 2 cores measured 1.2x where 2 workers and 1 thread measured 1.7x). The
script's own `torch.set_num_threads` calls are kept from undoing the override for the run, and
said in a note; DataLoader workers still set their own single thread (torch's calls pass
through: they come from a worker process, or from torch's own code).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from stallscope.capture.frameworks import display_path


class IntraOpOverride:
    """Holds torch's intra-op thread count at `threads` while installed."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.notes: list[str] = []
        self._pid = os.getpid()
        self._orig: Any = None

    def install(self) -> None:
        self._orig = orig = torch.set_num_threads
        orig(self.threads)
        override = self

        def set_num_threads(nthreads: int) -> None:
            caller = sys._getframe(1)
            name = caller.f_globals.get("__name__", "")
            if os.getpid() != override._pid or name.split(".")[0] in ("torch", "stallscope"):
                orig(nthreads)
                return
            where = f"{display_path(caller.f_code.co_filename)}:{caller.f_lineno}"
            note = (f"--set torch_threads={override.threads}: the script's "
                    f"torch.set_num_threads({nthreads}) at {where} was not applied during the run")
            if note not in override.notes:
                override.notes.append(note)

        torch.set_num_threads = set_num_threads

    def uninstall(self) -> None:
        if self._orig is not None:
            torch.set_num_threads = self._orig
            self._orig = None
