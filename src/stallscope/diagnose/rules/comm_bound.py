"""`comm-bound`: collectives that run while no compute runs beside them. On GPUs these are
NCCL/RCCL kernels on a device with no compute kernel running; on CPU (gloo, or MPI/UCC) they are
the backend's host ranges (`gloo:all_reduce`) while the process runs no compute op. That
*exposed* communication lengthens the step one-for-one, whereas collectives that overlap compute
are free; exposed collectives also absorb the wait for the slowest rank. The advice follows the
collective: gradient all-reduce (DDP buckets, no_sync, compression), all-to-all (embedding
sharding: pipeline the next batch's all-to-all), point-to-point (pipeline stages: more
micro-batches), all-gather/reduce-scatter (FSDP prefetch).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Cause, Change, Metric, RuleSpec, evidence_key
from stallscope.replay.models.comm_bound import (
    PEER_FACTOR,
    PEER_MIN_STEPS,
    PEER_MIN_US,
    peer_excess,
)
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.grouped import group_sums
from stallscope.trace.intervals import Timeline
from stallscope.trace.kernels import COLLECTIVE, COMM_NAME, host_kinds
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_array, name_mask
from stallscope.units import millis, percent

RULE_ID = "comm-bound"

# Share of step time a collective may run with no compute beside it before it is flagged. Even
# well-bucketed DDP leaves the last bucket's all-reduce exposed after backward (a few percent);
# 5% is where the anchors (HTA's communication/computation overlap analysis) call it material.
EXPOSED_THRESHOLD_PCT = 5.0
TOP_COLLECTIVES = 5
# More all-reduces per step than this are per-tensor (or tiny buckets): DDP's default 25 MB
# buckets make 50 of them only for 1.25 GB of fp32 gradients, a model of over 300M parameters.
PER_TENSOR_CALLS = 50
COMM_DOCS = "https://pytorch.org/docs/stable/notes/ddp.html"
# CPU collectives: the backend's host range around each collective (`gloo:all_reduce`).
HOST_COLLECTIVE = re.compile(r"^(gloo|mpi|ucc):([A-Za-z_]+)", re.IGNORECASE)
# (Both matched at the start of a name, as name_matches does.)
# Host ops that are communication or waiting for it, not compute to hide a collective under.
NOT_COMPUTE = re.compile(r".*(?:c10d::|record_param_comms|ProcessGroup)|(?:.*::)?wait\b|"
                         r"(?:gloo|nccl|mpi|ucc):", re.IGNORECASE)
# Host ranges that say a job's send/recv kernels carry an all-to-all (NCCL runs all-to-all as
# grouped send/recv: `nccl:all_to_all`, `c10d::alltoall_base_`, TorchRec's KJTAllToAll).
ALL_TO_ALL_OP = re.compile(r".*all_?to_?all", re.IGNORECASE)
ALL_TO_ALL = {"AllToAll", "all_to_all", "alltoall", "all_to_all_single", "alltoall_base"}
P2P = {"SendRecv", "Send", "Recv", "send", "recv", "sendrecv"}
SHARDED = {"AllGather", "ReduceScatter", "all_gather", "reduce_scatter", "_allgather_base",
           "_reduce_scatter_base", "all_gather_into_tensor", "reduce_scatter_tensor"}


def comm_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
    world = model.trace.world_size
    if not model.steps or model.total_step_us <= 0:
        return Assessment(RULE_ID, "not_assessed", "No step windows to measure in.")
    # Row masks on the GPU table's arrays: boolean-indexing the frame per device cost more
    # than the arithmetic.
    gpu = model.gpu
    if len(gpu):
        kernel = (gpu["kind"].to_numpy() == "kernel" if model.has_gpu
                  else np.ones(len(gpu), dtype=bool))
        is_comm = kernel & name_mask(gpu["name"], COMM_NAME)
    else:
        kernel = is_comm = np.zeros(0, dtype=bool)
    if not is_comm.any():
        host = _host_comm(model)
        if host is not None:
            return _assess(model, host, where="host", backend=host["backend"])
        if not model.has_gpu:
            return Assessment(RULE_ID, "not_assessed",
                              "No GPU activity and no CPU collectives (gloo/MPI/UCC ranges) in "
                              "the trace: no communication to measure.")
        if world is not None and world > 1:
            return Assessment(
                RULE_ID, "clear",
                f"No collective (NCCL/RCCL) kernels in the profiled steps of this rank "
                f"(world size {world}): no GPU communication to expose.",
            )
        return Assessment(RULE_ID, "not_assessed",
                          "No collective communication in the trace (single-process GPU run).")
    device = gpu["device"].to_numpy()
    ts, end = gpu["ts"].to_numpy(dtype=float), gpu["end"].to_numpy(dtype=float)
    kinds = np.empty(len(gpu), dtype=object)
    kinds[is_comm] = name_array(gpu["name"], _kernel_kind, is_comm)
    named = host_kinds(model)
    kinds = np.where(is_comm & (named != ""), named, kinds)
    results = {}
    stream = gpu["stream"].to_numpy(dtype=float)
    step = gpu["step"].to_numpy()
    for dev in sorted(set(device[is_comm])):
        on = kernel & (device == dev)
        comm, compute = on & is_comm, on & ~is_comm
        results[dev] = _exposed(model, (ts[comm], end[comm]), (ts[compute], end[compute]),
                                kinds[comm])
        wait = peer_excess(np.nan_to_num(stream[comm], nan=-1.0), step[comm], ts[comm],
                           end[comm] - ts[comm], kinds[comm])
        # The wait sits inside the collective: at most its exposed part is on the step's path.
        results[dev]["peer_wait"] = float(np.minimum(wait, results[dev]["each_exposed"]).sum())
        results[dev]["peer_count"] = int((wait > 0).sum())
    dev = max(results, key=lambda d: results[d]["exposed"])
    r = results[dev]
    r["device"] = dev
    # NCCL runs all-to-all as grouped send/recv kernels (the host names are only read when a
    # send/recv is among the top collectives).
    if any(c["collective"] in P2P for c in r["top"]) and _host_names(model, ALL_TO_ALL_OP):
        for c in r["top"]:
            if c["collective"] in P2P:
                c["collective"] = "AllToAll"
        r["top"] = _merged(r["top"])
    return _assess(model, r, where="device", backend="nccl")


def _merged(top: list[dict]) -> list[dict]:
    """Entries of one collective name summed into one, ranked by exposed then collective ms."""
    out: dict[str, dict] = {}
    for c in top:
        m = out.setdefault(c["collective"], {"collective": c["collective"], "count": 0,
                                             "comm_ms": 0.0, "exposed_ms": 0.0})
        m["count"] += c["count"]
        m["comm_ms"] = round(m["comm_ms"] + c["comm_ms"], 3)
        m["exposed_ms"] = round(m["exposed_ms"] + c["exposed_ms"], 3)
    return sorted(out.values(), key=lambda c: (-c["exposed_ms"], -c["comm_ms"]))


def _assess(model: TraceModel, r: dict, where: str, backend: str) -> Assessment:
    """The verdict and advice for measured collective time `r` (from kernels or host ranges)."""
    total = model.total_step_us
    n = len(model.steps)
    world = model.trace.world_size
    comm, exposed, compute = r["comm"], r["exposed"], r["compute"]
    place = f"device {r['device']}" if where == "device" else "the host"
    if comm <= 0:
        return Assessment(RULE_ID, "clear",
                          "Collectives run only outside the profiled steps.")
    share = pct(exposed, total)
    # Overlap hides a collective only under compute that exists: never more than the step's
    # non-communication compute on the same device (or process).
    # Time spent waiting for slower ranks is not hidden by overlap: it is set apart.
    peer = min(r.get("peer_wait", 0.0), exposed)
    hideable = min(exposed - peer, compute)
    evidence: dict[str, Any] = {
        "where": where,
        "backend": backend,
        "device": r.get("device"),
        "world_size": world,
        "comm_ms_per_step": ms(comm / n),
        "comm_share_pct": pct(comm, total),
        "exposed_ms_per_step": ms(exposed / n),
        "exposed_share_pct": share,
        "overlap_pct": pct(comm - exposed, comm),
        "compute_ms_per_step": ms(compute / n),
        "hideable_share_pct": pct(hideable, total),
        "peer_wait_ms_per_step": ms(peer / n),
        "peer_wait_share_pct": pct(peer, total),
        "peer_wait_collectives": r.get("peer_count", 0),
        "exposed_ms_by_step": [ms(x) for x in r["per_step"]],
        "top_collectives": r["top"],
        "steps": n,
    }
    if share < EXPOSED_THRESHOLD_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"Collectives take {percent(evidence['comm_share_pct'])} of step time on {place}, "
            f"{percent(evidence['overlap_pct'], 0)} of it overlapped with compute; exposed "
            f"{percent(share)} (threshold {percent(EXPOSED_THRESHOLD_PCT, 0)}).",
        )
    return Assessment.found(advise(model, r, evidence, place, backend, peer, hideable))


def advise(model: TraceModel, r: dict, evidence: dict[str, Any], place: str, backend: str,
           peer: float, hideable: float) -> Finding:
    """The finding: the collectives' pattern's advice, the waiting on peers, and the bound."""
    total, n = model.total_step_us, len(model.steps)
    exposed, compute, share = r["exposed"], r["compute"], evidence["exposed_share_pct"]
    pattern = _pattern([c["collective"] for c in r["top"]])
    evidence["pattern"] = pattern
    rec, snippet = ADVICE[pattern](backend)
    snippet = _for_version(model, pattern, snippet)
    saving, basis = hideable, (
        f"upper bound: the collective time on {place} during which no compute ran, less the "
        "part measured as waiting on peers, capped by the step's other compute there (what "
        "the collective could hide under)")
    if backend == "gloo" and pattern == "all-reduce" and (exposed - peer) / 2 > hideable:
        saving, basis = (exposed - peer) / 2, (
            "upper bound: half the exposed all-reduce time less the waiting on peers, if fp16 "
            "compression halves the bytes gloo moves (more than overlap could hide under the "
            f"step's {millis(ms(compute / n))} ms of other compute)")
    peers = _peer_text(evidence, n) if peer > 0 else ""
    per_step = r["top"][0]["count"] / n if r["top"] else 0.0
    evidence["top_collective_calls_per_step"] = round(per_step, 1)
    if pattern == "all-reduce" and per_step > PER_TENSOR_CALLS:
        rec = (f"{per_step:.0f} {r['top'][0]['collective']} calls per step: gradients are "
               "all-reduced tensor by tensor, each with its own host call and launch; "
               "DistributedDataParallel buckets them (25 MB by default: a few calls per step) "
               "and starts each bucket as soon as backward has produced it. ") + rec
    rec = (
        f"{backend} collectives run with no compute beside them on {place} for {percent(share)} of "
        f"each step ({millis(ms(exposed / n))} ms; largest, exposed ms summed over the {n} steps: "
        + ", ".join(f"{c['collective']} {millis(c['exposed_ms'])} ms" for c in r["top"][:3])
        + f"). The step has {millis(ms(compute / n))} ms of other compute per step to hide "
        "them under"
        + (" (less than the exposed time: overlap alone cannot hide it all). "
           if compute < exposed - peer else ". ")
        # The larger of the two first: the waiting on peers, or what overlap can hide.
        + (peers + rec if peer >= exposed - peer else rec + (" " + peers.rstrip() if peers else ""))
        + ("" if peers else " An exposed collective also spins while it waits for the slowest "
           "rank: compare step and loader times across ranks (rank-imbalance) before tuning.")
    )
    title = _title(share, evidence["peer_wait_share_pct"], pct(saving, total),
                   halved=saving != hideable)
    return Finding(
        id=RULE_ID,
        title=title,
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
        estimated_saving_pct=pct(saving, total),
        saving_basis=basis,
        docs=COMM_DOCS,
    )


def _all_reduce_advice(backend: str) -> tuple[str, str]:
    rec = (
        "Gradient all-reduce (DDP): let buckets start all-reducing during backward "
        "(bucket_cap_mb sized so the first buckets fire early, gradient_as_bucket_view=True), "
        "and with gradient accumulation skip the all-reduce on all but the last micro-step with "
        "no_sync(): the bytes sent per optimizer step fall by the accumulation factor."
    )
    if backend == "gloo":
        rec += (
            " These are gloo all-reduces on the CPU: the gradients cross the network through "
            "the host, so bytes matter most. Compress them with DDP's fp16 communication hook "
            "(half the bytes), point gloo at the fastest interface (GLOO_SOCKET_IFNAME), and "
            "on GPU nodes use the nccl backend instead."
        )
    snippet = (
        "model = torch.nn.parallel.DistributedDataParallel(\n"
        "    model,\n"
        "    bucket_cap_mb=25,                  # try 10-50: smaller starts overlap sooner\n"
        "    gradient_as_bucket_view=True,\n"
        ")\n"
    )
    if backend == "gloo":
        snippet += (
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(None, default_hooks.fp16_compress_hook)  # half the bytes\n"
        )
    snippet += (
        "for i, batch in enumerate(loader):\n"
        "    sync_now = (i + 1) % accum_steps == 0\n"
        "    ctx = contextlib.nullcontext() if sync_now else model.no_sync()\n"
        "    with ctx:\n"
        "        loss = model(batch).loss / accum_steps\n"
        "        loss.backward()\n"
        "    if sync_now:\n"
        "        optimizer.step(); optimizer.zero_grad(set_to_none=True)"
    )
    return rec, snippet


def _all_to_all_advice(backend: str) -> tuple[str, str]:
    rec = (
        "All-to-all dominates (sharded embeddings exchanging lookups: NCCL runs it as send/recv "
        "kernels). Its output is needed by the very next op, so overlap within the step cannot "
        "hide it and DDP bucket settings do not touch it. Overlap it across batches instead: "
        "pipeline the next batch's input all-to-all under this batch's dense compute "
        "(TorchRec TrainPipelineSparseDist); send fewer bytes (quantized communication: fp16 "
        "or bf16 forward/backward all-to-all); and rebalance the sharding plan (table-wise vs "
        "row/column-wise) so no rank receives far more rows than the others."
    )
    snippet = (
        "from torchrec.distributed.train_pipeline import TrainPipelineSparseDist\n"
        "pipeline = TrainPipelineSparseDist(model, optimizer, device)  # batch i+1's all-to-all\n"
        "it = iter(loader)                                            # under batch i's compute\n"
        "while True:\n"
        "    try:\n"
        "        pipeline.progress(it)\n"
        "    except StopIteration:\n"
        "        break"
    )
    return rec, snippet


def _send_recv_advice(backend: str) -> tuple[str, str]:
    rec = (
        "Point-to-point send/recv dominates (pipeline parallelism: activations and gradients "
        "between stages). Each exposed transfer is a stage waiting for its neighbour: split the "
        "batch into more micro-batches (the pipeline bubble is (stages - 1) / (micro-batches + "
        "stages - 1) of the step), use an interleaved 1F1B schedule, and balance the stages' "
        "compute so no stage waits on a slower one. DDP bucket settings do not touch these."
    )
    snippet = (
        "from torch.distributed.pipelining import ScheduleInterleaved1F1B\n"
        "schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4 * num_stages,\n"
        "                                   loss_fn=loss_fn)\n"
        "schedule.step(x, target=y)"
    )
    return rec, snippet


def _sharded_advice(backend: str) -> tuple[str, str]:
    rec = (
        "AllGather/ReduceScatter dominate (FSDP/ZeRO): enable forward and backward prefetch so "
        "the next shard's all-gather runs under the current compute."
    )
    snippet = (
        "from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel\n"
        "model = FullyShardedDataParallel(\n"
        "    model,\n"
        "    forward_prefetch=True,\n"
        "    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
        "    limit_all_gathers=True,\n"
        ")"
    )
    return rec, snippet


def _title(share: float, peer_pct: float, saving_pct: float, halved: bool) -> str:
    """One number per quantity: the exposed share, the part of it waiting on peers, and the
    saving bound when it is smaller than what is left (each named)."""
    parts = [f"{percent(peer_pct)} of the step waiting on peers"] if peer_pct > 0 else []
    if saving_pct < share - peer_pct - 0.05:
        parts.append(f"at most {percent(saving_pct)} "
                     + ("saved by halving the bytes" if halved else "hideable under compute"))
    head = f"Collective communication is exposed for {percent(share)} of each step"
    return head + (f" ({'; '.join(parts)})" if parts else "")


def _peer_text(evidence: dict, n: int) -> str:
    """What the measured waiting on peers is, and what helps it (not overlap)."""
    return (
        f"Waiting on peers: {evidence['peer_wait_ms_per_step']} ms per step "
        f"({percent(evidence['peer_wait_share_pct'])} of the step, "
        f"{plural(evidence['peer_wait_collectives'], 'collective')} over the {n} steps) is "
        "collective time beyond what the same collective takes in a typical step (2x or more): "
        "this rank waited for slower ranks. Overlap does not remove it; look at the other ranks' "
        "traces (analyze them together: rank-imbalance compares their work per step) and balance "
        "the work and data across ranks (equal shard sizes, sequence lengths bucketed or padded "
        "alike, no rank-0-only work such as logging or checkpointing inside the step). "
    )


# The torch release each pattern's snippet needs (FSDP's prefetch arguments 1.13,
# torch.distributed.pipelining 2.4); the all-reduce and all-to-all snippets run on any torch
# that has DDP's no_sync() / TorchRec.
SNIPPET_NEEDS = {"sharded": ((1, 13), "FullyShardedDataParallel with these arguments"),
                 "send-recv": ((2, 4), "torch.distributed.pipelining")}


def _for_version(model: TraceModel, pattern: str, snippet: str) -> str:
    """The snippet headed by the torch it is written for, and what it needs when that is newer
    than the trace's torch."""
    head = for_torch(model)
    need = SNIPPET_NEEDS.get(pattern)
    if need is not None and not has(model, need[0]):
        head += f": {need[1]} needs torch >= {need[0][0]}.{need[0][1]}"
    return f"{head}\n{snippet}"


# pattern -> advice (recommendation, snippet) for a backend
ADVICE = {"all-reduce": _all_reduce_advice, "all-to-all": _all_to_all_advice,
          "send-recv": _send_recv_advice, "sharded": _sharded_advice}


def _pattern(kinds: list[str]) -> str:
    """Which communication pattern dominates, from the collectives ranked by exposed time."""
    top = kinds[0] if kinds else ""
    if top in ALL_TO_ALL:
        return "all-to-all"
    if top in P2P:
        return "send-recv"
    if any(k in SHARDED for k in kinds[:2]):
        return "sharded"
    return "all-reduce"


def _kernel_kind(name: str) -> str:
    """The collective a kernel name carries (`ncclDevKernel_AllReduce_...` -> AllReduce), else
    the name's first 40 characters (as str.extract's search, then fillna(str.slice(0, 40)))."""
    m = COLLECTIVE.search(name)
    return m.group(1) if m else name[:40]


def _host_names(model: TraceModel, pattern: re.Pattern[str]) -> bool:
    ops = model.ops
    return bool(len(ops)) and bool(name_mask(ops["name"], pattern).any())


def host_collectives(model: TraceModel) -> dict | None:
    """`_host_comm`'s measurement for the report's per-rank figures (report/kernel_mix.py):
    collective, exposed and compute time (us, summed over the steps); None without any."""
    return _host_comm(model)


def _host_comm(model: TraceModel) -> dict | None:
    """CPU collectives (gloo/MPI/UCC host ranges) in the steps, and the part of them during
    which the process ran no compute op; None when there are none."""
    ops = model.ops
    if not len(ops):
        return None
    is_coll = name_mask(ops["name"], HOST_COLLECTIVE)
    coll = is_coll & (ops["step"].to_numpy() >= 0)
    if not coll.any():
        return None
    is_compute = (name_array(ops["cat"], lambda c: c == "cpu_op").astype(bool)
                  & ~name_mask(ops["name"], NOT_COMPUTE) & ~is_coll)
    # (backend, collective) of each collective range: its name matched HOST_COLLECTIVE.
    found = name_array(ops["name"], _host_kind, coll)
    ts, end = ops["ts"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
    kinds = np.array([k for _, k in found], dtype=object)
    r = _exposed(model, (ts[coll], end[coll]), (ts[is_compute], end[is_compute]), kinds)
    tid = pd.factorize(ops["tid"].astype(str))[0][coll].astype(float)
    wait = peer_excess(tid, ops["step"].to_numpy()[coll], ts[coll], end[coll] - ts[coll], kinds)
    r["peer_wait"] = float(np.minimum(wait, r["each_exposed"]).sum())
    r["peer_count"] = int((wait > 0).sum())
    # The most common backend, the first in sorted order on a tie (Series.mode().iloc[0]).
    counts = Counter(b.lower() for b, _ in found)
    top = max(counts.values())
    r["backend"] = min(b for b, c in counts.items() if c == top)
    return r


def _host_kind(name: str) -> tuple[str, str] | None:
    """(backend, collective) of a `gloo:all_reduce` host range; None for other names."""
    m = HOST_COLLECTIVE.match(name)
    return (m.group(1), m.group(2)) if m else None


def _exposed(model: TraceModel, c_iv: tuple[np.ndarray, np.ndarray],
             k_iv: tuple[np.ndarray, np.ndarray], kinds: np.ndarray) -> dict:
    """Collective time (intervals `c_iv`, one kind each), the part of it with no compute
    (`k_iv`) running, and the compute time, inside the steps; the collectives ranked by
    exposed time."""
    windows = model.windows
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), c_iv, k_iv)
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    comm_m = tl.cover(*c_iv) & (bucket >= 0)
    compute_m = tl.cover(*k_iv) & (bucket >= 0)
    exposed_m = comm_m & ~compute_m
    n = len(windows)
    per_step = tl.sum_by(exposed_m, bucket, n)
    # Exposed time inside each collective, by prefix sums over the segments.
    prefix = np.concatenate([[0.0], np.cumsum(np.where(exposed_m, tl.lengths, 0.0))])
    inside = np.concatenate([[0.0], np.cumsum(np.where(comm_m, tl.lengths, 0.0))])
    lo = np.searchsorted(tl.edges, c_iv[0], side="left")
    hi = np.searchsorted(tl.edges, c_iv[1], side="left")
    exposed, us = prefix[hi] - prefix[lo], inside[hi] - inside[lo]
    keep = us > 0
    # Grouped by collective (sorted names), ranked by exposed then collective time, ties in
    # name order: what groupby().agg().sort_values(..., ascending=False) gave.
    names, codes = np.unique(kinds[keep], return_inverse=True)
    g_us = group_sums(us[keep], codes, len(names))
    g_exposed = group_sums(exposed[keep], codes, len(names))
    count = np.bincount(codes, minlength=len(names))
    order = np.lexsort((-g_us, -g_exposed))[:TOP_COLLECTIVES]
    return {
        "comm": float(tl.sum_by(comm_m, bucket, n).sum()),
        "exposed": float(per_step.sum()),
        "compute": float(tl.sum_by(compute_m, bucket, n).sum()),
        "per_step": per_step,
        "each_exposed": exposed,  # per collective interval, in the order given
        "top": [{"collective": str(names[i]), "count": int(count[i]), "comm_ms": ms(g_us[i]),
                 "exposed_ms": ms(g_exposed[i])} for i in order.tolist()],
    }


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    """Overlapped collectives, unless they are CPU ones or their output is needed at once."""
    ev = finding.evidence or {}
    if ev.get("where") == "host" or ev.get("pattern") in ("all-to-all", "send-recv"):
        return []  # see no_change
    return [Change("comm", "overlap")]


def no_change(finding: Finding) -> str:
    ev = finding.evidence or {}
    if ev.get("where") == "host":
        return "the replay models GPU collectives only, not CPU (gloo/MPI) ones"
    return (f"its advice for {ev.get('pattern')} communication (pipelining it across "
            "batches or stages) is not a change the replay models: overlap within the step "
            "cannot hide a collective whose output the next op needs")


SPEC = RuleSpec(
    id=RULE_ID,
    title="collective communication is not overlapped with compute",
    summary="collective kernels run exposed, not overlapped with compute",
    check=comm_bound,
    thresholds={"EXPOSED_THRESHOLD_PCT": EXPOSED_THRESHOLD_PCT, "PEER_FACTOR": PEER_FACTOR,
                "PEER_MIN_STEPS": PEER_MIN_STEPS, "PEER_MIN_US": PEER_MIN_US},
    what_if=("comm",),
    changes=changes,
    no_change=no_change,
    order=70,
    metric=Metric("communication not hidden under compute", MS,
                  evidence_key("exposed_ms_per_step"), "exposed_share_pct"),
    causes=(Cause("dataparallel"),),
    not_capped="it overlaps or removes collective kernels, GPU work the floor counts",
    per_device=True,
)
