"""`comm-bound`: collective kernels (NCCL/RCCL) that run while no compute kernel runs beside
them on the same device. That *exposed* communication lengthens the step one-for-one, whereas
collectives that overlap compute are free; exposed collectives also absorb the wait for the
slowest rank.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stallscope.capture.context import RunContext
from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.trace.intervals import Timeline
from stallscope.trace.model import TraceModel, name_matches

RULE_ID = "comm-bound"

# Share of step time a collective may run with no compute beside it before it is flagged. Even
# well-bucketed DDP leaves the last bucket's all-reduce exposed after backward (a few percent);
# 5% is where the anchors (HTA's communication/computation overlap analysis) call it material.
EXPOSED_THRESHOLD_PCT = 5.0
TOP_COLLECTIVES = 5
COMM_NAME = re.compile(r"nccl|rccl", re.IGNORECASE)
COLLECTIVE = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
COMM_DOCS = "https://pytorch.org/docs/stable/notes/ddp.html"


def comm_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed",
                          "No GPU activity in the trace: no collective kernels to measure.")
    world = model.trace.world_size
    kernels = model.gpu[model.gpu["kind"] == "kernel"]
    is_comm = name_matches(kernels["name"].astype("category"), COMM_NAME).to_numpy()
    comm_all = kernels[is_comm]
    if not model.steps or model.total_step_us <= 0:
        return Assessment(RULE_ID, "not_assessed", "No step windows to measure in.")
    if comm_all.empty:
        if world is not None and world > 1:
            return Assessment(
                RULE_ID, "clear",
                f"No collective (NCCL/RCCL) kernels in the profiled steps of this rank "
                f"(world size {world}): no GPU communication to expose.",
            )
        return Assessment(RULE_ID, "not_assessed",
                          "No collective communication in the trace (single-process GPU run).")
    total = model.total_step_us
    n = len(model.steps)
    results = {dev: _exposed_comm(model, kernels[kernels["device"] == dev],
                                  is_comm[(kernels["device"] == dev).to_numpy()])
               for dev in sorted(set(comm_all["device"]))}
    dev = max(results, key=lambda d: results[d]["exposed"])
    r = results[dev]
    comm, exposed = r["comm"], r["exposed"]
    if comm <= 0:
        return Assessment(RULE_ID, "clear",
                          "Collective kernels run only outside the profiled steps.")
    share = pct(exposed, total)
    evidence = {
        "device": dev,
        "world_size": world,
        "comm_ms_per_step": ms(comm / n),
        "comm_share_pct": pct(comm, total),
        "exposed_ms_per_step": ms(exposed / n),
        "exposed_share_pct": share,
        "overlap_pct": pct(comm - exposed, comm),
        "exposed_ms_by_step": [ms(x) for x in r["per_step"]],
        "top_collectives": r["top"],
        "steps": n,
    }
    if share < EXPOSED_THRESHOLD_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"Collectives take {evidence['comm_share_pct']:.1f}% of step time on device {dev}, "
            f"{evidence['overlap_pct']:.0f}% of it overlapped with compute; exposed "
            f"{share:.1f}% (threshold {EXPOSED_THRESHOLD_PCT:.0f}%).",
        )
    kinds = [c["collective"] for c in r["top"]]
    sharded = any(k in ("AllGather", "ReduceScatter") for k in kinds[:2])
    p2p = bool(kinds) and kinds[0] in ("SendRecv", "Send", "Recv")
    rec = (
        f"Collectives run with no compute beside them for {share:.1f}% of each step "
        f"({ms(exposed / n)} ms; largest, exposed ms summed over the {n} steps: "
        + ", ".join(f"{c['collective']} {c['exposed_ms']} ms" for c in r["top"][:3])
        + "). Overlap them with compute: for DDP let gradient buckets start all-reducing "
        "during backward (bucket_cap_mb sized so the first buckets fire early, "
        "gradient_as_bucket_view=True), and with gradient accumulation skip the all-reduce on "
        "all but the last micro-step with no_sync()."
    )
    if sharded:
        rec += (" AllGather/ReduceScatter dominate (FSDP/ZeRO): enable forward and backward "
                "prefetch so the next shard's all-gather runs under the current compute.")
    if p2p:
        rec += (" Point-to-point SendRecv dominates (pipeline parallelism or all-to-all): more "
                "micro-batches shrink the pipeline bubble the transfers sit in.")
    rec += (" An exposed collective also spins while it waits for the slowest rank: compare "
            "step and loader times across ranks (rank-imbalance) before tuning buckets.")
    snippet = (
        "model = torch.nn.parallel.DistributedDataParallel(\n"
        "    model, device_ids=[local_rank],\n"
        "    bucket_cap_mb=25,                  # try 10-50: smaller starts overlap sooner\n"
        "    gradient_as_bucket_view=True,\n"
        ")\n"
        "for i, batch in enumerate(loader):\n"
        "    sync_now = (i + 1) % accum_steps == 0\n"
        "    ctx = contextlib.nullcontext() if sync_now else model.no_sync()\n"
        "    with ctx:\n"
        "        loss = model(batch).loss / accum_steps\n"
        "        loss.backward()\n"
        "    if sync_now:\n"
        "        optimizer.step(); optimizer.zero_grad(set_to_none=True)"
    )
    if sharded:
        snippet = (
            f"{for_torch(model)}"
            + ("" if has(model, (1, 13)) else
               ": FullyShardedDataParallel with these arguments needs torch >= 1.13")
            + "\nfrom torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel\n"
            "model = FullyShardedDataParallel(\n"
            "    model,\n"
            "    forward_prefetch=True,\n"
            "    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
            "    limit_all_gathers=True,\n"
            ")"
        )
    finding = Finding(
        id=RULE_ID,
        title=f"Collective communication is exposed for {share:.1f}% of each step",
        evidence=evidence,
        recommendation=rec,
        snippet=snippet,
        precondition=(
            "Overlap helps only when there is compute left to hide the collective under (a "
            "collective at the very end of backward, or one the next op needs at once, stays "
            "exposed), and only for the transfer itself: time a collective spends waiting for a "
            "slower rank moves elsewhere unless the straggler is fixed. no_sync() applies only "
            "with gradient accumulation."
        ),
        estimated_saving_pct=share,
        saving_basis=(
            f"upper bound: the collective time on device {dev} during which no compute kernel "
            "ran, if all of it were hidden under compute; part of it may be waiting for slower "
            "ranks, which overlap does not remove"
        ),
        docs=COMM_DOCS,
    )
    return Assessment.found(finding)


def _exposed_comm(model: TraceModel, kernels: pd.DataFrame, is_comm: np.ndarray) -> dict:
    """Collective time, and the part of it with no compute kernel running, inside the steps."""
    windows = model.windows
    comm = kernels[is_comm]
    compute = kernels[~is_comm]
    c_iv = (comm["ts"].to_numpy(), comm["end"].to_numpy())
    k_iv = (compute["ts"].to_numpy(), compute["end"].to_numpy())
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), c_iv, k_iv)
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    comm_m = tl.cover(*c_iv) & (bucket >= 0)
    exposed_m = comm_m & ~tl.cover(*k_iv)
    n = len(windows)
    per_step = tl.sum_by(exposed_m, bucket, n)
    # Exposed time inside each collective kernel, by prefix sums over the segments.
    prefix = np.concatenate([[0.0], np.cumsum(np.where(exposed_m, tl.lengths, 0.0))])
    inside = np.concatenate([[0.0], np.cumsum(np.where(comm_m, tl.lengths, 0.0))])
    lo = np.searchsorted(tl.edges, c_iv[0], side="left")
    hi = np.searchsorted(tl.edges, c_iv[1], side="left")
    kind = comm["name"].str.extract(COLLECTIVE.pattern, flags=re.IGNORECASE)[0]
    table = pd.DataFrame({
        "collective": kind.fillna(comm["name"].str.slice(0, 40)).to_numpy(),
        "exposed": prefix[hi] - prefix[lo],
        "us": inside[hi] - inside[lo],
    })
    table = table[table["us"] > 0]
    top = (table.groupby("collective")
           .agg(count=("us", "size"), us=("us", "sum"), exposed=("exposed", "sum"))
           .sort_values(["exposed", "us"], ascending=False).head(TOP_COLLECTIVES))
    return {
        "comm": float(tl.sum_by(comm_m, bucket, n).sum()),
        "exposed": float(per_step.sum()),
        "per_step": per_step,
        "top": [{"collective": str(k), "count": int(row["count"]), "comm_ms": ms(row["us"]),
                 "exposed_ms": ms(row["exposed"])} for k, row in top.iterrows()],
    }
