"""Epoch boundaries of a multi-process DataLoader, as the stepping thread recorded them.

A DataLoader with `persistent_workers=False` (the default) joins its workers when an epoch ends
and forks new ones when the next epoch's iterator is created. Torch emits no event for either;
what a torch 2.x trace shows at such a boundary (recorded in
`sample_traces/cpu-worker-startup.pt.trace.json.gz`) is: the `__next__` that ends the epoch
(it runs `_shutdown_workers`), then the new iterator's seed ops from
`_BaseDataLoaderIter.__init__` (`aten::empty`, `aten::random_`, `aten::item`: a persistent
iterator's `_reset` does not draw it), a stretch with no events while the workers are forked,
and a first `__next__` that waits for the fresh workers. worker-startup prices the re-spawns
from these parts; dataloader-bound leaves the loader time they hold to it.
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

from stallscope.runfacts import RunContext
from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import column_equals_text, name_matches, per_name

# Ops that may run between the `__next__` that ends an epoch and the first one of the next
# without being training work: the iterator's and RandomSampler's seeds and its permutation.
BOOKKEEPING_OPS = frozenset(
    {"aten::empty", "aten::random_", "aten::item", "aten::_local_scalar_dense",
     "aten::randperm", "aten::set_", "aten::manual_seed", "aten::resolve_conj",
     "aten::resolve_neg"}
)
# A gap between two `__next__` calls whose top-level op time is below this fraction of the
# median gap's holds no training step: an epoch boundary. A step's forward/backward/optimizer
# is orders of magnitude above the sampler's bookkeeping (0.1 ms in the samples), so 5% leaves
# room for noise on both sides.
BOUNDARY_BUSY_FRACTION = 0.05
MULTI = "_MultiProcessingDataLoaderIter"


# The last model's table: dataloader-bound and worker-startup both read it, and making it is a
# pass over every event of the trace. Its readers select rows from it and never change it.
_LAST: list[tuple[weakref.ref[TraceModel], pd.DataFrame | None]] = []


def boundaries(model: TraceModel) -> pd.DataFrame | None:
    """One row per gap between consecutive DataLoader `__next__` calls of the stepping thread
    (row g: after call g), with what happened in it. Vectorised over ops and loader calls;
    made once per model (a table that is read, not changed)."""
    if _LAST and _LAST[0][0]() is model:
        return _LAST[0][1]
    table = _boundaries(model)
    _LAST[:] = [(weakref.ref(model), table)]
    return table


def _boundaries(model: TraceModel) -> pd.DataFrame | None:
    ev = model.trace.events
    span_lo, span_hi = model.steps[0].start_us, model.steps[-1].end_us
    inside = (ev["ts"] >= span_lo) & (ev["ts"] < span_hi)
    loader = ev[inside & column_equals_text(ev["tid"], str(model.main_tid))
                & name_matches(ev["name"], LOADER_NAME)]
    loader = loader.sort_values("ts", kind="stable")
    if loader.empty:
        return None
    l_ts, l_end = loader["ts"].to_numpy(), loader["end"].to_numpy()
    l_dur = loader["dur"].to_numpy()
    multi = per_name(loader["name"], lambda n: MULTI in n).to_numpy()
    n = len(loader)

    ops = model.ops
    ops = ops[(ops["tid"].astype(str) == str(model.main_tid)) & (ops["cat"] == "cpu_op")]
    ops = ops[(ops["ts"] >= span_lo) & (ops["ts"] < span_hi)].sort_values(["ts", "end"],
                                                                          ascending=[True, False])
    o_ts, o_end = ops["ts"].to_numpy(), ops["end"].to_numpy()
    names = ops["name"].astype(str).to_numpy()
    # Top level: not nested in an earlier op of the thread.
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(o_end)[:-1]]) if len(o_ts) else o_ts
    top = o_ts >= prev_end
    # Gap index: the loader call before the op; ops inside a loader call are loading work.
    g = np.searchsorted(l_ts, o_ts, side="right") - 1
    in_loader = (g >= 0) & (o_ts < l_end[np.clip(g, 0, None)])
    keep = top & ~in_loader
    o_ts, o_end, names, g = o_ts[keep], o_end[keep], names[keep], g[keep]

    # The iterator's seed: a top-level random_ + item not followed by randperm (RandomSampler
    # draws its own seed the same way, and then permutes; a persistent `_reset` draws only that).
    nxt1 = np.append(names[1:], "")
    nxt2 = np.append(names[2:], ["", ""])[: len(names)]
    g2 = np.append(g[2:], [n, n])[: len(names)]
    seed = (names == "aten::random_") & (nxt1 == "aten::item") & (
        (nxt2 != "aten::randperm") | (g2 != g)
    )
    work = ~np.isin(names, list(BOOKKEEPING_OPS))
    gaps = np.arange(-1, n)  # gap -1: before the first loader call
    idx = g + 1
    work_n = np.bincount(idx, weights=work.astype(float), minlength=n + 1)
    seed_n = np.bincount(idx, weights=seed.astype(float), minlength=n + 1)
    busy = np.bincount(idx, weights=o_end - o_ts, minlength=n + 1)

    median_busy = float(np.median(busy[1:n])) if n > 1 else 0.0
    idle_gap = (work_n == 0) | (busy < BOUNDARY_BUSY_FRACTION * median_busy)
    after = np.append(l_ts[1:], np.nan)  # start of the call that follows each gap
    start = np.concatenate([[span_lo], l_end])
    stop = np.concatenate([[l_ts[0]], after[:-1], [np.nan]])
    nxt_multi = np.append(multi, False)
    table = pd.DataFrame({
        "gap": gaps,
        "boundary": idle_gap & (gaps >= 0) & (gaps < n - 1),
        "new_iter": (seed_n > 0) & nxt_multi & ~np.isnan(stop),
        "counted": gaps >= 0,  # an earlier loader call exists: not the run's first iterator
        "spawn_us": np.clip(stop - start - busy, 0.0, None),
        "multi": np.concatenate([[False], multi]),
    })
    # The call that ends an epoch (gap g starts right after it) and the first of the next.
    prev_dur = np.concatenate([[0.0], l_dur])
    next_dur = np.append(l_dur, 0.0)
    special = np.zeros(n, dtype=bool)
    ends_epoch = table["boundary"].to_numpy()[1:]
    special |= ends_epoch
    first = table["new_iter"].to_numpy()[1:]
    special[1:] |= first[:-1]
    special[0] |= bool(table["new_iter"].iloc[0])
    steady = l_dur[multi & ~special]
    median = float(np.median(steady)) if len(steady) else 0.0
    table["median_next_us"] = median
    exhausting = table["boundary"] & table["multi"]
    table["shutdown_us"] = np.where(exhausting, np.clip(prev_dur - median, 0.0, None), 0.0)
    table["first_excess_us"] = np.clip(next_dur - median, 0.0, None)
    table["first_ts"] = np.append(l_ts, np.nan)
    table["cost_us"] = table["shutdown_us"] + table["spawn_us"] + table["first_excess_us"]
    return table


def in_loader_us(respawns: pd.DataFrame) -> float:
    """The loader time the re-spawns (rows of `boundaries`) hold: the `__next__` that joins
    the old workers and the first one's wait for the new ones (the fork itself runs outside
    the loader's calls)."""
    return float((respawns["shutdown_us"] + respawns["first_excess_us"]).sum())


def respawn_loader_us(model: TraceModel, context: RunContext | None = None) -> float:
    """The time the recorded steps spend in the DataLoader because its workers are re-spawned
    each epoch (0 with none, or when every loader of the run loads in the main process).
    Persistent workers, not more of them, take it away: worker-startup's to claim, so
    dataloader-bound leaves it out of its bound (one lost millisecond, one owner)."""
    if model.loader_kind is None or not model.steps:
        return 0.0
    if context is not None and context.dataloaders and not any(
            d.num_workers > 0 for d in context.dataloaders):
        return 0.0
    table = boundaries(model)
    if table is None:
        return 0.0
    return in_loader_us(table[table["new_iter"] & table["counted"]])
