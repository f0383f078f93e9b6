"""`host-device-sync`: the host stops inside the step until queued GPU work finishes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.diagnose.common import busiest_gpu_us, host_total, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Change, RuleSpec, fixed
from stallscope.runfacts import RunContext
from stallscope.trace.intervals import Timeline
from stallscope.trace.model import TraceModel
from stallscope.trace.workload import step_word
from stallscope.units import millis, percent

RULE_ID = "host-device-sync"
# Share of step wall time the host is blocked waiting on the GPU.
SYNC_THRESHOLD_PCT = 5.0
MAX_SOURCES = 5
# A source named in the advice holds at least this share of the listed waits: a wait of a few
# microseconds is not where the host's time went.
NAMED_SOURCE_SHARE = 0.05
# The longest single wait is quoted only from this length up: "up to 0.0 ms" is no finding.
MIN_SAID_MS = 0.1
# Ops that bring a value to the host: an inference batch's output read goes through them.
READ_OPS = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::to", "aten::_to_copy", "aten::copy_",
    "aten::tolist",
})
# A launch this close after a wait's end (us) is the wait's own copy or its sync call, not
# later work (clock skew between the host call and the GPU record).
LAUNCH_TOLERANCE_US = 1.0
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution"

# What a user wrote, given the op that synchronised.
_CAUSES = {
    "aten::item": ".item()",
    "aten::_local_scalar_dense": ".item() (or float()/int()/bool() of a GPU tensor)",
    "aten::is_nonzero": "a Python `if`/`bool()` on a GPU tensor",
    "aten::nonzero": "nonzero()/boolean-mask indexing (output size needs the device)",
    "aten::masked_select": "boolean-mask indexing",
    "aten::to": ".to('cpu') / .cpu() / .tolist() / print(tensor)",
    "aten::_to_copy": ".to('cpu') / .cpu() / .tolist() / print(tensor)",
    "aten::copy_": "a device-to-host copy (.cpu(), .numpy(), .tolist())",
}


def host_device_sync(model: TraceModel, _context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity: nothing to wait on.")
    total = model.total_step_us
    blocked = host_total(model, "sync")
    share = pct(blocked, total)
    if share < SYNC_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The host is blocked on the GPU {percent(share)} of step time (threshold "
            f"{percent(SYNC_THRESHOLD_PCT, 0)}).",
        )
    waits = _waits(model)
    reads = _output_reads(model, waits)
    cost = _wait_cost(model, waits, ~reads)
    n = len(model.steps)
    read_us = float((waits["w1"] - waits["w0"])[reads].sum())
    if reads.any() and pct(cost["costly"], total) < SYNC_THRESHOLD_PCT:
        return Assessment(RULE_ID, "clear", _output_read_detail(model, share, read_us, cost))
    gpu_evidence = {
        "gpu_idle_during_waits_pct": pct(cost["idle_during"], cost["waits"]),
        "gpu_idle_after_waits_ms_per_step": ms(cost["idle_after"] / n),
        "costly_wait_share_pct": pct(cost["costly"], total),
    }
    if gpu_evidence["costly_wait_share_pct"] < SYNC_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The host waits for the GPU {percent(share)} of step time, but the GPU stays busy "
            f"through those waits ({percent(gpu_evidence['gpu_idle_during_waits_pct'])} idle "
            f"during them) and after them ({gpu_evidence['gpu_idle_after_waits_ms_per_step']} ms "
            "idle per step later in the step): a host that did not wait would only queue work "
            "further ahead of a busy GPU. Waits that cost step time: "
            f"{percent(gpu_evidence['costly_wait_share_pct'])} (threshold "
            f"{percent(SYNC_THRESHOLD_PCT, 0)}).",
        )
    sources = _sources(waits, ~reads)
    # Letting the host run ahead cannot make the step shorter than the busiest GPU's work,
    # and a wait costs only what the GPU idles during it or later in the step.
    saving = pct(min(cost["costly"], max(total - busiest_gpu_us(model), 0.0)), total)
    evidence = {
        "sync_share_pct": share,
        "blocked_ms_per_step": ms(blocked / n),
        **gpu_evidence,
        "sources": sources,
    }
    if reads.any():
        evidence["output_read_ms_per_step"] = ms(read_us / n)
    causes = list(dict.fromkeys(c for c in (_cause(s) for s in _named(sources)) if c))
    said = "; ".join(causes) or "explicit synchronisation calls"
    title = f"The host waits for the GPU {percent(share)} of each {step_word(model.workload)}"
    top = max(sources, key=lambda s: s["max_ms"], default=None)
    why = ""
    if (top is not None and top["kind"] == "copy-wait" and not top["call"].endswith("HtoD")
            and top["max_ms"] >= MIN_SAID_MS):
        why = (
            f" The longest waits are {top['call']} calls: the GPU copy itself takes "
            f"{top['gpu_copy_us_max']:.0f} us for {top['bytes_max']:.0f} bytes, yet the host call "
            f"lasts up to {millis(top['max_ms'], 'tenths')} ms, because it waits for the GPU work "
            "queued before it. This is a synchronisation, not a slow transfer: pinning memory "
            "would not help."
        )
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=(
            "The host stops launching work inside the step until the GPU queue drains. Where "
            f"it waits, largest first: {said}." + why + (
                _inference_advice(ms(read_us / n)) if model.workload == "inference"
                else " Keep metrics on the GPU and read them every N steps, outside the hot "
                "loop.")
        ),
        snippet=_INFERENCE_SNIPPET if model.workload == "inference" else (
            "running_loss = torch.zeros((), device=device)\n"
            "for step, (x, y) in enumerate(loader):\n"
            "    loss = criterion(model(x), y)\n"
            "    ...\n"
            "    running_loss += loss.detach()      # stays on the GPU, no sync\n"
            "    if step % 100 == 0:\n"
            "        print(running_loss.item() / 100)  # one sync per 100 steps\n"
            "        running_loss.zero_()"
        ),
        precondition=(
            "Helps when the host then has work to launch (the GPU idles while the host waits "
            "and re-fills the queue); a sync the algorithm needs (data-dependent shapes, "
            "early stopping) can only be moved, not removed."
        ),
        estimated_saving_pct=saving,
        saving_basis=(
            "upper bound: the host's blocked time during which the GPU idled, plus the rest of "
            "it up to the GPU's idle time later in the step (the lead a host that did not wait "
            "would have had), capped so the step is never shorter than the busiest GPU's busy "
            "time"
        ),
        docs=DOCS,
    )
    return Assessment.found(finding)


def _wait_cost(model: TraceModel, waits: dict, keep: np.ndarray) -> dict[str, float]:
    """What the host's waits cost, summed over steps. A wait during which the GPU is idle costs
    its idle part outright. The rest of a wait (the GPU busy) costs only through the lead the
    host loses: the queue is empty when the wait ends, so the GPU idles whenever the host falls
    behind later in the step (measured on a100_rank3of8: 1% idle during the waits, 15% of the
    step idle after them, and the replay without syncs 15% shorter). Per step that part is
    capped by the GPU's idle time after the step's first wait, outside the waits. Only the
    waits in `keep` count (the caller leaves out an inference batch's output reads)."""
    w0, w1, step = waits["w0"][keep], waits["w1"][keep], waits["step"][keep]
    win = model.windows
    n = len(win)
    zero = {"waits": 0.0, "idle_during": 0.0, "idle_after": 0.0, "costly": 0.0}
    if not len(w0) or not n:
        return zero
    first = np.full(n, np.inf)
    np.minimum.at(first, step, w0)
    after = np.isfinite(first)
    a_iv = (first[after], win[after, 1])
    g = model.gpu
    g_iv = (g["ts"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float))
    tl = Timeline.from_intervals((win[:, 0], win[:, 1]), (w0, w1), a_iv, g_iv)
    bucket = tl.bucket(win[:, 0], win[:, 1])
    wait_m = tl.cover(w0, w1) & (bucket >= 0)
    idle_m = ~tl.cover(*g_iv)
    waited = tl.sum_by(wait_m, bucket, n)
    idle_during = tl.sum_by(wait_m & idle_m, bucket, n)
    idle_after = tl.sum_by(tl.cover(*a_iv) & ~wait_m & idle_m & (bucket >= 0), bucket, n)
    costly = idle_during + np.minimum(waited - idle_during, idle_after)
    return {"waits": float(waited.sum()), "idle_during": float(idle_during.sum()),
            "idle_after": float(idle_after.sum()), "costly": float(costly.sum())}


def _waits(model: TraceModel) -> dict:
    """Every host wait on the GPU inside a step, one row per sync call or blocking copy's wait:
    start w0, end w1, step, whether it reads a value to the host (a device-to-host copy, or an
    op of READ_OPS around it), and the rows `_sources` groups."""
    s = model.syncs[model.syncs["step"] >= 0]
    c = model.copies[(model.copies["step"] >= 0) & (model.copies["wait_us"] > 0)]
    rows = pd.concat([
        pd.DataFrame({"kind": "sync", "call": s["name"].astype(str), "op": s["op"],
                      "top_op": s["top_op"], "us": s["dur"], "bytes": float("nan"),
                      "gpu_us": float("nan")}),
        pd.DataFrame({"kind": "copy-wait", "call": c["name"].astype(str) + " " + c["direction"],
                      "op": c["op"], "top_op": c["top_op"], "us": c["wait_us"],
                      "bytes": c["bytes"], "gpu_us": c["dur_gpu"]}),
    ], ignore_index=True)
    ops = (rows["op"].astype(str).isin(READ_OPS) | rows["top_op"].astype(str).isin(READ_OPS))
    dtoh = np.concatenate([np.zeros(len(s), bool), (c["direction"] == "DtoH").to_numpy()])
    return {
        "w0": np.concatenate([s["ts"].to_numpy(), c["ts"].to_numpy()]).astype(float),
        "w1": np.concatenate([s["end"].to_numpy(),
                              (c["ts"] + c["wait_us"]).to_numpy()]).astype(float),
        "step": np.concatenate([s["step"].to_numpy(), c["step"].to_numpy()]).astype(np.int64),
        "read": ops.to_numpy(dtype=bool) | dtoh,
        "rows": rows,
    }


def _output_reads(model: TraceModel, waits: dict) -> np.ndarray:
    """Which waits read an inference batch's output: a read after which the GPU work its step
    launches next (device-to-host copies aside: more reads) is none, or the next batch's input
    (a host-to-device copy; a step that holds several batches). The caller needs that value;
    the wait cannot be removed, only overlapped with the next batch's preparation, and the GPU
    idle that follows it is that preparation's (gpu-idle names it). A read followed by a kernel
    is one the forward needs before it can go on: a sync inside the batch."""
    read = waits["read"]
    if model.workload != "inference" or not read.any():
        return np.zeros(len(read), bool)
    g = model.gpu
    names = g["name"].astype(str)
    copy = (g["kind"] == "memcpy").to_numpy()
    launch = g["launch_ts"].to_numpy(dtype=float)
    later = ~(copy & names.str.contains("DtoH").to_numpy()) & np.isfinite(launch)
    order = np.argsort(launch[later], kind="stable")
    at = launch[later][order]
    starts_batch = (copy & names.str.contains("HtoD").to_numpy())[later][order]
    if not len(at):
        return read.copy()
    nxt = np.searchsorted(at, waits["w1"] + LAUNCH_TOLERANCE_US, side="right")
    found = nxt < len(at)
    nxt = np.minimum(nxt, len(at) - 1)
    same_step = found & (at[nxt] < model.windows[waits["step"], 1])
    return read & (~same_step | starts_batch[nxt])


def _output_read_detail(model: TraceModel, share: float, read_us: float,
                        cost: dict[str, float]) -> str:
    """Why an inference trace's waits are not a finding, and what to do instead."""
    n, total = len(model.steps), model.total_step_us
    other = pct(cost["costly"], total)
    return (
        f"The host waits for the GPU {percent(share)} of each batch; "
        f"{percent(pct(read_us, total))} of the batch ({millis(ms(read_us / n))} ms) is spent "
        "reading its output after its last GPU work (.cpu(), .item(), .tolist()): a read the "
        f"caller needs, not a synchronisation to remove; other waits cost {percent(other)} of the "
        f"batch (threshold {percent(SYNC_THRESHOLD_PCT, 0)}). To keep the GPU busy while the host "
        "answers and prepares the next batch, batch requests together and overlap the next batch's "
        "preprocessing with this batch's forward: preprocess in DataLoader workers or a thread, "
        "copy inputs from pinned memory with non_blocking=True, and copy the output into a pinned "
        "buffer with non_blocking=True, recording an event to wait on only once the next batch is "
        "launched (see gpu-idle for the idle time)."
    )


def _inference_advice(read_ms: float) -> str:
    """The end of an inference finding's recommendation: syncs inside the forward."""
    read = (f" The output read at the end of each batch ({read_ms} ms per batch) is not "
            "counted: the caller needs it." if read_ms > 0 else "")
    return (
        " These waits sit inside the batch, before GPU work the host launches after them: "
        "keep the values on the GPU (torch.where instead of a Python `if` on a tensor, "
        "fixed-size outputs instead of boolean masks) and read the batch's results once, at "
        "its end." + read
    )


def _named(sources: list[dict]) -> list[dict]:
    """The sources worth naming: each at least NAMED_SOURCE_SHARE of the listed waits."""
    whole = sum(s["total_ms"] for s in sources)
    return [s for s in sources if s["total_ms"] >= NAMED_SOURCE_SHARE * whole]


def _cause(source: dict) -> str:
    if source["kind"] == "copy-wait" and source["call"].endswith("HtoD"):
        return (
            "input copies .to(device) from pageable memory, which wait for all queued GPU "
            "work (pin_memory=True with non_blocking=True removes the wait)"
        )
    if source["call"].endswith("DeviceSynchronize") and not source["op"]:
        return "torch.cuda.synchronize()"
    return _CAUSES.get(source["top_op"]) or _CAUSES.get(source["op"], "")


def _sources(waits: dict, keep: np.ndarray) -> list[dict]:
    """The calls the host waited in (those in `keep`), grouped by call and op, longest total
    first."""
    both = waits["rows"][keep]
    if both.empty:
        return []
    grouped = both.groupby(["kind", "call", "op", "top_op"], dropna=False).agg(
        count=("us", "size"), total=("us", "sum"), max=("us", "max"),
        bytes_max=("bytes", "max"), gpu_max=("gpu_us", "max"))
    grouped = grouped.sort_values("total", ascending=False).head(MAX_SOURCES)
    out = []
    for (kind, call, op, top_op), row in grouped.iterrows():
        item = {"kind": kind, "call": call, "op": op, "top_op": top_op,
                "count": int(row["count"]), "total_ms": ms(row["total"]),
                "max_ms": ms(row["max"])}
        if kind == "copy-wait":
            item["bytes_max"] = float(row["bytes_max"])
            item["gpu_copy_us_max"] = float(row["gpu_max"])
        out.append(item)
    return out


# Inference has no loss to accumulate: keep the batch's outputs on the GPU and bring them to
# the host once per several batches, not one `.item()`/`.cpu()` per request.
_INFERENCE_SNIPPET = (
    "pending = []\n"
    "for i, batch in enumerate(requests):\n"
    "    with torch.inference_mode():\n"
    "        pending.append(model(batch.to(device, non_blocking=True)))  # stays on the GPU\n"
    "    if len(pending) == 8:  # one sync per 8 batches, not per request\n"
    "        results = torch.cat(pending).cpu()\n"
    "        pending.clear()"
)


SPEC = RuleSpec(
    id=RULE_ID,
    title="the host waits for the GPU inside the step",
    summary="the host blocks on the GPU inside the step (`.item()`, `.cpu()`, syncs), told "
            "apart from slow copies",
    check=host_device_sync,
    thresholds={"SYNC_THRESHOLD_PCT": SYNC_THRESHOLD_PCT,
                "NAMED_SOURCE_SHARE": NAMED_SOURCE_SHARE},
    what_if=("sync",),
    changes=fixed(Change("sync", "off")),
)
