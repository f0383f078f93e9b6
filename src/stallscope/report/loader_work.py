"""Which host ops ran inside the DataLoader's `__next__` on the training thread.

With `num_workers=0` (and in every `run` of a script whose dataset transforms in the main
process) the dataset's own work, decoding and augmentation, runs as aten ops nested inside the
`enumerate(DataLoader)#...__next__` range. The step breakdown already counts that time as time in
the loader; the top host ops and the timeline's host-compute lane must not count it again as if
it were the model's work (a `run` report showed the host-compute lane busy 100% and the dataset's
augmentation as the top host ops). Ops on other threads are never inside the loader's range.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import column_equals_text, column_isin, name_matches


def loader_spans(model: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (us) of the training thread's DataLoader `__next__` ranges, by start
    (numpy's default argsort, as sort_values orders them)."""
    ev = model.trace.events
    if model.main_tid is None or len(ev) == 0:
        return np.empty(0), np.empty(0)
    on_main = column_equals_text(ev["tid"], str(model.main_tid)) & column_isin(
        ev["cat"], ("user_annotation", "cpu_op"))
    rows = np.flatnonzero(on_main & name_matches(ev["name"], LOADER_NAME).to_numpy())
    ts = ev["ts"].to_numpy(float)[rows]
    order = np.argsort(ts, kind="stable")
    return ts[order], ev["end"].to_numpy(float)[rows][order]


def inside_loader(model: TraceModel, ops: pd.DataFrame) -> np.ndarray:
    """A mask over `ops` (columns tid, ts, end): True for ops on the training thread that lie
    within one of its DataLoader `__next__` ranges. Vectorised: each op is matched with the last
    range starting at or before it (the thread's ranges do not overlap)."""
    starts, ends = loader_spans(model)
    if len(ops) == 0 or len(starts) == 0:
        return np.zeros(len(ops), dtype=bool)
    ts = ops["ts"].to_numpy(float)
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = idx >= 0
    within = np.zeros(len(ops), dtype=bool)
    within[ok] = ops["end"].to_numpy(float)[ok] <= ends[idx[ok]]
    return within & column_equals_text(ops["tid"], str(model.main_tid))
