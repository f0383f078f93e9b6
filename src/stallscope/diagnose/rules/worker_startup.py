"""`worker-startup`: DataLoader workers shut down and re-spawned at every epoch.

A multi-process DataLoader with `persistent_workers=False` (the default) joins
its workers when an epoch ends and forks new ones when the next epoch's iterator is created.
Torch emits no event for either; what a torch 2.x trace really shows at such a boundary
(recorded in `sample_traces/cpu-worker-startup.pt.trace.json.gz`) is: the `__next__` that ends
the epoch (it runs `_shutdown_workers`), then the new iterator's seed ops from
`_BaseDataLoaderIter.__init__` (`aten::empty`, `aten::random_`, `aten::item`: a persistent
iterator's `_reset` does not draw it), a stretch with no events while the workers are forked,
and a first `__next__` that waits for the fresh workers. The rule finds those seeds on the
stepping thread (diagnose/epochs.py, which dataloader-bound reads too), prices each re-spawn
from the three parts and amortises it over the epoch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.epochs import BOUNDARY_BUSY_FRACTION, boundaries, in_loader_us
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.spec import Metric, RuleSpec, evidence_key
from stallscope.runfacts import LoaderInfo, RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.units import millis, percent

RULE_ID = "worker-startup"

# Below this share of training time the per-epoch re-spawn is within step-to-step noise: the
# rule reports clear (severity would be info anyway: 1% is the floor of "low").
STARTUP_MATERIAL_PCT = 1.0
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
    bounds = boundaries(model)
    if bounds is None or not bounds["multi"].any():
        return Assessment(
            RULE_ID, "clear",
            f"The DataLoader is {model.loader_kind}: no worker processes are started "
            + ("per pass over it." if model.workload == "inference" else "per epoch."),
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
        # The recorded steps' loader time the re-spawns hold: dataloader-bound leaves it out.
        "respawn_loader_ms": ms(in_loader_us(respawns)),
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
    saving, basis = _saving(model, respawns, step_of, info, steady_step, evidence)
    if saving < STARTUP_MATERIAL_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"Workers are re-spawned each epoch ({millis(ms(cost), 'tenths')} ms), "
            f"{percent(saving, 2)} of the run's step time (material from "
            f"{percent(STARTUP_MATERIAL_PCT, 0)}).",
        )
    return Assessment.found(advise(context, evidence, info, multi_loaders, respawn_part, saving,
                                  basis))


def _saving(model: TraceModel, respawns: pd.DataFrame, step_of: np.ndarray,
            info: LoaderInfo | None, steady_step: float,
            evidence: dict[str, Any]) -> tuple[float, str]:
    """The re-spawns' share of the run and its basis: per epoch when `run` knows the epoch's
    length, else between recorded re-spawns, else over the recorded steps. Adds the epoch's
    length to `evidence` where it is known."""
    windows = model.windows
    cost = float(respawns["cost_us"].mean())
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
    return saving, basis


def advise(context: RunContext | None, evidence: dict[str, Any], info: LoaderInfo | None,
           multi_loaders: list[LoaderInfo], respawn_part: float, saving: float,
           basis: str) -> Finding:
    """The finding: keep the workers alive across epochs (persistent_workers=True), or build
    the DataLoader once when it is rebuilt each epoch."""
    cost_ms = millis(evidence["startup_ms_per_epoch"], "tenths")
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
            f"forks new ones for the next ({cost_ms} ms per epoch, of which "
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
    return Finding(
        id=RULE_ID,
        title=f"DataLoader workers are re-spawned every epoch ({cost_ms} ms "
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
    order=130,
    metric=Metric("DataLoader worker start-up", "ms per epoch",
                  evidence_key("startup_ms_per_epoch")),
    not_capped="its saving is per epoch, in the re-spawn steps the median step leaves out",
    per_epoch=True,
    loader_pace=True,
    loader_setting=True,
)
