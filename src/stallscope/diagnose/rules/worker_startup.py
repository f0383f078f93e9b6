"""`worker-startup`: DataLoader workers shut down and re-spawned at every epoch.

A multi-process DataLoader with `persistent_workers=False` (the default) joins
its workers when an epoch ends and forks new ones when the next epoch's iterator is created.
Torch emits no event for either; what a torch 2.x trace really shows at such a boundary
(recorded in `sample_traces/cpu-worker-startup.pt.trace.json.gz`) is: the `__next__` that ends
the epoch (it runs `_shutdown_workers`), then the new iterator's seed ops from
`_BaseDataLoaderIter.__init__` (`aten::empty`, `aten::random_`, `aten::item`: a persistent
iterator's `_reset` does not draw it), a stretch with no events while the workers are forked,
and a first `__next__` that waits for the fresh workers. The rule finds those seeds on the
stepping thread, prices each re-spawn from the three parts and amortises it over the epoch.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.spec import RuleSpec
from stallscope.runfacts import LoaderInfo, RunContext
from stallscope.text import plural
from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import name_matches, per_name
from stallscope.units import millis, percent

RULE_ID = "worker-startup"

# Below this share of training time the per-epoch re-spawn is within step-to-step noise: the
# rule reports clear (severity would be info anyway: 1% is the floor of "low").
STARTUP_MATERIAL_PCT = 1.0
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
STARTUP_DOCS = "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"


def worker_startup(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.steps:
        return Assessment(RULE_ID, "not_assessed", "No steps in the trace.")
    if model.loader_kind is None:
        return Assessment(
            RULE_ID, "not_assessed",
            "No DataLoader __next__ events on the stepping thread: iterator creation cannot be "
            "seen.",
        )
    multi_loaders = [d for d in context.dataloaders if d.num_workers > 0] if context else []
    if context is not None and context.dataloaders and not multi_loaders:
        return Assessment(
            RULE_ID, "clear",
            "Every DataLoader of the run loads in the main process (num_workers=0): no "
            "worker processes to start.",
        )
    bounds = _boundaries(model)
    if bounds is None or not bounds["multi"].any():
        return Assessment(
            RULE_ID, "clear",
            f"The DataLoader is {model.loader_kind}: no worker processes are started per epoch.",
        )
    respawns = bounds[bounds["new_iter"] & bounds["counted"]]
    n_boundaries = int(bounds["boundary"].sum())
    if respawns.empty:
        if n_boundaries:
            return Assessment(
                RULE_ID, "clear",
                f"{n_boundaries} epoch boundary(ies) in the recorded steps reuse the loader's "
                "worker processes (no new iterator was created: persistent workers).",
            )
        initial = bool(bounds["new_iter"].any())
        started = _measured_starts(context)
        return Assessment(
            RULE_ID, "not_assessed",
            "The recorded steps hold no epoch boundary"
            + (" (only the run's first iterator, which persistent workers start too)"
               if initial else "")
            + ": the cost of re-spawning workers each epoch was not observed. Record a window "
            "spanning an epoch boundary to measure it."
            + (f" (`run` saw {plural(started, 'worker process', 'worker processes')} start "
               "while the steps were recorded, "
               "but the trace does not show where.)" if started else ""),
        )
    return _startup_finding(model, context, bounds, respawns, multi_loaders)


def _boundaries(model: TraceModel) -> pd.DataFrame | None:
    """One row per gap between consecutive DataLoader `__next__` calls of the stepping thread
    (row g: after call g), with what happened in it. Vectorised over ops and loader calls."""
    ev = model.trace.events
    span_lo, span_hi = model.steps[0].start_us, model.steps[-1].end_us
    tid = ev["tid"].astype(str) == str(model.main_tid)
    inside = (ev["ts"] >= span_lo) & (ev["ts"] < span_hi)
    loader = ev[tid & inside & name_matches(ev["name"], LOADER_NAME)].sort_values("ts")
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


def _startup_finding(
    model: TraceModel, context: RunContext | None, bounds: pd.DataFrame,
    respawns: pd.DataFrame, multi_loaders: list[LoaderInfo],
) -> Assessment:
    windows = model.windows
    durations = windows[:, 1] - windows[:, 0]
    step_of = np.searchsorted(windows[:, 0], respawns["first_ts"].to_numpy(), side="right") - 1
    boundary_steps = set(step_of.tolist())
    steady = np.array([d for i, d in enumerate(durations) if i not in boundary_steps])
    steady_step = float(np.median(steady)) if len(steady) else float(np.median(durations))
    cost = float(respawns["cost_us"].mean())
    respawn_part = float((respawns["shutdown_us"] + respawns["spawn_us"]).mean())
    evidence: dict = {
        "respawns_recorded": len(respawns),
        "startup_ms_per_epoch": ms(cost),
        "shutdown_ms": ms(float(respawns["shutdown_us"].mean())),
        "spawn_ms": ms(float(respawns["spawn_us"].mean())),
        "first_batch_excess_ms": ms(float(respawns["first_excess_us"].mean())),
        "median_next_ms": ms(float(bounds["median_next_us"].iloc[0])),
        "steady_step_ms": ms(steady_step),
        "boundary_steps": [model.steps[i].name for i in sorted(boundary_steps) if i >= 0],
    }
    info = _non_persistent(context, multi_loaders)
    started = _measured_starts(context)
    if started is not None:
        # Counted by `run` itself (capture/transfer.py): new worker pids while recording.
        evidence["worker_starts_recorded"] = started
    bpe = None
    if info is not None and info.dataset_len and info.batch_size:
        bpe = math.ceil(info.dataset_len / info.batch_size)
    if bpe is not None:
        saving = pct(cost, bpe * steady_step + cost)
        evidence["batches_per_epoch"] = bpe
        basis = (
            f"upper bound: the re-spawn cost per epoch ({millis(ms(cost), 'tenths')} ms: worker "
            f"shutdown, fork and the first batch's excess wait) over an epoch of {bpe} steps of "
            f"{millis(ms(steady_step), 'tenths')} ms (from the RunContext); persistent workers "
            "still wait for the first batch of each epoch, so part of the excess stays"
        )
    elif len(respawns) >= 2:
        first_step, last_step = int(step_of[0]), int(step_of[-1])
        period = float(windows[last_step, 0] - windows[first_step, 0])
        saving = pct(float(respawns["cost_us"].iloc[:-1].sum()), period)
        evidence["steps_between_respawns"] = round((last_step - first_step) / (len(respawns) - 1),
                                                   1)
        basis = (
            "upper bound: re-spawn cost over the recorded time between consecutive re-spawns "
            f"({millis(ms(period), 'tenths')} ms); persistent workers still wait for the first "
            "batch of each epoch, so part of the excess stays"
        )
    else:
        saving = pct(float(respawns["cost_us"].sum()), model.total_step_us)
        basis = (
            "upper bound: re-spawn cost over the recorded steps only (epoch length unknown "
            "without `stallscope run`); a window around an epoch boundary over-represents it"
        )
    if saving < STARTUP_MATERIAL_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"Workers are re-spawned each epoch ({millis(ms(cost), 'tenths')} ms), "
            f"{percent(saving, 2)} of the run's step time (material from "
            f"{percent(STARTUP_MATERIAL_PCT, 0)}).",
        )
    rebuilt = context is not None and bool(multi_loaders) and info is None
    if rebuilt:
        recommendation = (
            "The loaders are configured with persistent_workers=True, yet new worker processes "
            "start at each epoch: the DataLoader object itself is rebuilt. Build it once, "
            "outside the epoch loop."
        )
        snippet = (
            "loader = torch.utils.data.DataLoader(dataset, ..., persistent_workers=True)\n"
            "for epoch in range(epochs):\n    for batch in loader:\n        ..."
        )
    else:
        knobs = Knobs.of(info)
        where = ""
        if knobs is not None:
            where = f"{knobs.where} " + (f"({knobs.how}) " if knobs.how else "")
        recommendation = (
            f"{where}The DataLoader shuts down its worker processes at the end of every epoch and "
            f"forks new ones for the next ({millis(ms(cost), 'tenths')} ms per epoch, of which "
            f"{millis(ms(respawn_part), 'tenths')} ms is shutdown and fork). Keep the workers "
            "alive across epochs."
        )
        nw = info.num_workers if info else "N"
        before = {"num_workers": nw, "persistent_workers": False}
        after = {"num_workers": nw, "persistent_workers": True}
        if knobs is None:
            snippet = (f"-DataLoader(..., num_workers={nw}, persistent_workers=False)\n"
                       f"+DataLoader(..., num_workers={nw}, persistent_workers=True)")
        else:
            snippet = (f"# {knobs.where}" + (f"  ({knobs.how})" if knobs.how else "") + "\n"
                       f"-{knobs.call_text(before)}\n+{knobs.call_text(after)}")
    finding = Finding(
        id=RULE_ID,
        title=f"DataLoader workers are re-spawned every epoch ({millis(ms(cost), 'tenths')} ms "
              "each time)",
        evidence=evidence,
        recommendation=recommendation,
        snippet=snippet,
        precondition=(
            "The loader is iterated for more than one epoch with the same DataLoader object; "
            "the dataset does not change in the main process between epochs (persistent "
            "workers keep their own copy; samplers still run in the main process, so "
            "DistributedSampler.set_epoch works); the workers' memory may stay allocated "
            "between epochs."
        ),
        estimated_saving_pct=saving,
        saving_basis=basis,
        docs=STARTUP_DOCS,
    )
    return Assessment.found(finding)


def _measured_starts(context: RunContext | None) -> int | None:
    """Worker processes `run` saw start while the steps were recorded, over the loaders with
    persistent_workers=False (capture/transfer.py); None without such a measurement."""
    if context is None:
        return None
    starts = [d.anatomy.get("worker_starts") for d in context.dataloaders
              if d.num_workers > 0 and not d.persistent_workers and d.anatomy]
    counts = [c for c in starts if isinstance(c, int)]
    return sum(counts) if counts else None


def _non_persistent(
    context: RunContext | None, multi_loaders: list[LoaderInfo]
) -> LoaderInfo | None:
    """The multi-process, non-persistent loader the re-spawns most likely belong to."""
    if context is None:
        return None
    candidates = [d for d in multi_loaders if not d.persistent_workers]
    if not candidates:
        return None
    train = context.training_loader()
    if train in candidates:
        return train
    return max(candidates, key=lambda d: d.batches)


# --------------------------------------------------------------------- cpu-oversubscription


SPEC = RuleSpec(
    id=RULE_ID,
    title="DataLoader workers are shut down and re-spawned at every epoch",
    summary="DataLoader workers are shut down and re-spawned every epoch",
    check=worker_startup,
    thresholds={"STARTUP_MATERIAL_PCT": STARTUP_MATERIAL_PCT,
                "BOUNDARY_BUSY_FRACTION": BOUNDARY_BUSY_FRACTION},
)
