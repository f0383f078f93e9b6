"""`rank-imbalance`: one rank does more work per step than the others, and all of them wait.

In synchronous data-parallel training every rank finishes a step together (the gradient
all-reduce is a barrier), so a straggler does not show as a longer step on itself: it shows as
more work per step on the straggler and more time waiting in collectives on the rest. The rule
therefore compares the work each rank does per step, not only step times: the DataLoader wait
and the GPU compute (kernels other than collectives). Host compute is shown but not compared: on
CPU (gloo) it includes the time a fast rank blocks in the all-reduce waiting for the slow one.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Metric, RuleSpec
from stallscope.trace.grouped import exact_sums
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_matches
from stallscope.units import millis, percent

RULE_ID = "rank-imbalance"
JOB_LABEL = "job"
# A rank whose per-step work exceeds the median rank's by this share of the step holds the
# others back by about that much; below it, run-to-run jitter (a few %) dominates.
SPREAD_THRESHOLD_PCT = 5.0
DOCS = "https://pytorch.org/docs/stable/notes/ddp.html"


@dataclass
class RankWork:
    """One rank's work per step, which is all this rule needs of its trace: a worker sends this
    back instead of the step model, so a job of thousands of ranks fits in memory."""

    world_size: int | None
    row: dict[str, Any]  # rank, trace, step_ms, loader_wait_ms, host_compute_ms, gpu_compute_ms


def rank_work(model: TraceModel) -> RankWork | None:
    """The trace's RankWork; None when its rank is unknown or it has no steps."""
    if model.trace.rank is None or not model.steps:
        return None
    return RankWork(model.trace.world_size, _work(model))


def rank_imbalance(works: list[RankWork | None]) -> Assessment:
    ranked = [w for w in works if w is not None]
    ranks = {w.row["rank"] for w in ranked}
    if len(ranks) < 2:
        return Assessment(RULE_ID, "not_assessed", "Needs traces of two or more ranks of one job.")
    sizes = {w.world_size for w in ranked}
    if len(sizes) > 1:
        return Assessment(
            RULE_ID,
            "not_assessed",
            f"The traces come from jobs of different world sizes ({sorted(map(str, sizes))}): "
            "ranks of different jobs cannot be compared.",
        )
    rows = [w.row for w in ranked]
    step = statistics.median(r["step_ms"] for r in rows)
    spreads = {
        key: max(_value(r, key) for r in rows) - statistics.median(_value(r, key) for r in rows)
        for key in ("loader_wait_ms", "gpu_compute_ms", "step_ms", WAITED_FOR)
    }
    worst_key = max(spreads, key=lambda k: spreads[k])
    excess = spreads[worst_key]
    excess_pct = pct(excess, step)
    evidence: dict[str, Any] = {
        "ranks": len(rows),
        "median_step_ms": round(step, 3),
        "per_rank": rows,
        "excess_ms_over_median": {k: round(v, 3) for k, v in spreads.items()},
    }
    if excess_pct < SPREAD_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"Across {len(rows)} ranks no rank's per-step work exceeds the median rank's by more "
            f"than {percent(excess_pct)} of the step (threshold "
            f"{percent(SPREAD_THRESHOLD_PCT, 0)}).",
        )
    return Assessment.found(advise(rows, evidence, worst_key, step, excess, excess_pct))


def advise(rows: list[dict[str, Any]], evidence: dict[str, Any], worst_key: str, step: float,
           excess: float, excess_pct: float) -> Finding:
    """The finding: which ranks straggle on what, and what evens the ranks out."""
    behind = _stragglers(rows, worst_key, step)
    slowest = behind[0]
    many = len(behind) > 1
    what = _what(worst_key, many)
    evidence["straggler_rank"] = slowest["rank"]
    evidence["straggler_cause"] = worst_key
    evidence["stragglers"] = behind
    who = _who(behind)
    recommendation = (
        f"{who} {what} than the median rank "
        f"({_how_far(behind)}); in synchronous training every other rank waits for "
        f"{'them' if many else 'it'} in the next collective. "
        + (
            "Give each rank an equal data shard and equal loading resources (DistributedSampler "
            "with drop_last, the same num_workers and storage per rank, no rank-0-only work such "
            "as logging or checkpointing inside the step)."
            if worst_key == "loader_wait_ms"
            else "Its DataLoader wait and GPU compute are not what differs: compare its host "
            "time per step (host_compute_ms) with the others', look for work only it does "
            "inside the step (rank-0 logging, checkpointing, evaluation), and check that its "
            "GPU is not throttled or shared."
            if worst_key == WAITED_FOR
            else "Check that every rank gets equally sized batches (variable-length samples need "
            "bucketing or padding to a common length) and that its GPU is not throttled or "
            "shared."
        )
    )
    snippet = (
        "sampler = torch.utils.data.distributed.DistributedSampler(dataset, drop_last=True)\n"
        "loader = torch.utils.data.DataLoader(dataset, sampler=sampler, num_workers=N)\n"
        "if rank == 0 and step % log_every == 0:  # rank-0-only work outside the hot path\n"
        "    log(metrics)"
    )
    return Finding(
        id=RULE_ID,
        title=(f"{who} {'are' if many else 'is'} waited for: the other ranks spend "
               f"{'up to ' if many else ''}{millis(excess, 'tenths')} ms more per step in "
               "collectives"
               if worst_key == WAITED_FOR else
               f"{who} straggle{'' if many else 's'}: "
               f"{'up to ' if many else ''}{millis(excess, 'tenths')} ms more work per step"),
        evidence=evidence,
        recommendation=recommendation,
        snippet=snippet,
        precondition="The ranks synchronise every step (DDP, FSDP or other collectives).",
        estimated_saving_pct=excess_pct,
        saving_basis=(
            "upper bound: the straggler's excess work over the median rank, which every "
            "rank waits for when the steps are synchronous"
        ),
        docs=DOCS,
        trace=JOB_LABEL,
    )


def _what(worst_key: str, many: bool) -> str:
    """What the stragglers do, by the quantity that differs most (plural for several)."""
    return {
        "loader_wait_ms": ("wait longer on their DataLoaders" if many
                           else "waits longer on its DataLoader"),
        "gpu_compute_ms": "run more GPU compute" if many else "runs more GPU compute",
        "step_ms": "take longer per step" if many else "takes longer per step",
        WAITED_FOR: ("spend less time in collectives (the others wait for them there)" if many
                     else "spends less time in collectives (the others wait for it there)"),
    }[worst_key]


# The rank that spends least time in collectives per step is the one the others wait for
# there: compared as the median rank's collective time less each rank's.
WAITED_FOR = "waited_for_ms"


def _value(row: dict, key: str) -> float:
    """A rank's per-step figure; WAITED_FOR is its collective time, negated (the median's
    excess over it is then how much less it waits than the median rank)."""
    return -float(row.get("collective_ms", 0.0)) if key == WAITED_FOR else float(row[key])


# Named in the title and recommendation; every straggler is in the evidence.
NAMED_STRAGGLERS = 8


def _stragglers(rows: list[dict], key: str, step_ms: float) -> list[dict]:
    """Every rank whose per-step `key` exceeds the median rank's by the threshold share of the
    step, furthest behind first (ties by rank): rank, trace, ms and % of the step behind."""
    values = np.array([_value(r, key) for r in rows], dtype=float)
    excess = values - float(np.median(values))
    limit = SPREAD_THRESHOLD_PCT / 100 * step_ms
    order = np.lexsort((np.array([r["rank"] for r in rows]), -excess))
    return [
        {"rank": rows[i]["rank"], "trace": rows[i]["trace"],
         "behind_ms": round(float(excess[i]), 3), "behind_pct": round(pct(excess[i], step_ms), 1)}
        for i in order
        if excess[i] >= limit or i == order[0]
    ]


def _who(behind: list[dict]) -> str:
    """'Rank 7' or 'Ranks 32, 64 and 96' (the first few, then how many more)."""
    if len(behind) == 1:
        return f"Rank {behind[0]['rank']}"
    named = [str(b["rank"]) for b in behind[:NAMED_STRAGGLERS]]
    more = len(behind) - len(named)
    if more:
        return f"Ranks {', '.join(named)} and {more} more"
    return f"Ranks {', '.join(named[:-1])} and {named[-1]}"


def _how_far(behind: list[dict]) -> str:
    """How far each named straggler is behind, per step."""
    parts = [f"rank {b['rank']} by {millis(b['behind_ms'], 'tenths')} ms "
             f"({percent(b['behind_pct'])} of the step)"
             for b in behind[:NAMED_STRAGGLERS]]
    return "; ".join(parts) + (" per step" if len(behind) == 1 else ", per step")


_COLLECTIVE = re.compile(r"(?i).*(?:nccl|rccl|msccl)")  # kernels.COMM_NAME, anywhere
HOST_COLLECTIVE = re.compile(r"(?i)(?:gloo|mpi|ucc):")  # comm.HOST_COLLECTIVE


def _busiest_device_us(devices: pd.Series, dur: np.ndarray, rows: np.ndarray) -> float | None:
    """The largest per-device sum of `dur` over `rows` (None without any): a bincount where
    its sums are exact (the same bits in any order), else pandas' groupby sum."""
    values = dur[rows]
    names = devices.to_numpy(dtype=object)[rows]
    if exact_sums(values) and all(isinstance(d, str) for d in set(names.tolist())):
        if not len(values):
            return None
        _, group = np.unique(names.astype(str), return_inverse=True)
        return float(np.bincount(group, weights=values).max())
    per_dev = pd.Series(values).groupby(names).sum()
    return float(per_dev.max()) if len(per_dev) else None


def _work(model: TraceModel) -> dict:
    n = len(model.steps)
    gpu = model.gpu
    compute_ms = collective_ms = 0.0
    if len(gpu):
        kernels = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
        if kernels.any():
            is_comm = name_matches(gpu["name"], _COLLECTIVE).to_numpy()
            busiest = _busiest_device_us(gpu["device"], gpu["dur"].to_numpy(),
                                         kernels & ~is_comm)
            compute_ms = busiest / 1000 / n if busiest is not None else 0.0
            waited = _busiest_device_us(gpu["device"], gpu["dur"].to_numpy(), kernels & is_comm)
            collective_ms = waited / 1000 / n if waited is not None else 0.0
    elif len(model.ops):
        ops = model.ops
        host = name_matches(ops["name"], HOST_COLLECTIVE).to_numpy() & (
            ops["step"].to_numpy() >= 0)
        collective_ms = float(ops["dur"].to_numpy()[host].sum()) / 1000 / n
    durations = np.array([s.duration_us for s in model.steps])
    return {
        "rank": model.trace.rank,
        "trace": model.trace.label,
        "step_ms": ms(float(np.median(durations))),
        "loader_wait_ms": ms(sum(s.loader_wait_us for s in model.steps) / n),
        "host_compute_ms": ms(sum(s.breakdown_us["host_compute"] for s in model.steps) / n),
        "gpu_compute_ms": round(compute_ms, 3),
        # time inside collectives per step (busiest device; CPU: gloo/MPI ranges), which holds
        # the wait for slower ranks: the rank that spends least there is the one waited for
        "collective_ms": round(collective_ms, 3),
    }


def excess_ms(evidence: dict[str, Any]) -> float | None:
    """Compare's quantity: the slowest rank's excess over the median rank, on the quantity that
    differs most."""
    spreads = evidence.get("excess_ms_over_median")
    if not isinstance(spreads, dict):
        return None
    values = [float(v) for v in spreads.values()
              if isinstance(v, int | float) and math.isfinite(v)]
    return max(values) if values else None


SPEC = RuleSpec(
    id=RULE_ID,
    title="one rank does more work per step and the others wait for it",
    summary="one rank does more work per step and the others wait (several ranks of one job)",
    check=rank_imbalance,
    thresholds={"SPREAD_THRESHOLD_PCT": SPREAD_THRESHOLD_PCT},
    job=True,
    order=180,
    metric=Metric("slowest rank's excess over the median rank", MS, excess_ms,
                  reads=("excess_ms_over_median",)),
    names_traces="stragglers",
)
