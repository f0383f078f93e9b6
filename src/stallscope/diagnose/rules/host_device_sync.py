"""`host-device-sync`: the host stops inside the step until queued GPU work finishes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import busiest_gpu_us, host_total, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.held import Held, held_waits
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.intervals import Timeline
from stallscope.trace.kernels import host_kinds
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
# Clock tolerance (us) between a host call's end and the GPU op it waited for.
CLOCK_US = 2.0
# A sync call that returns this close (us) after a GPU op ends waited for that op (the replay
# graph's RETURN_US); a sync returning later is not tied to one op.
RETURN_US = 50.0
# The waits are held (their cost is not the host's to remove) when at least this share of
# what they cost the step is time the stream they wait on sat held, with work queued on it,
# while the GPU ran nothing.
HELD_SHARE = 0.5
# Waits held for at least this share of their time say so, whatever their cause.
SAID_HELD_SHARE = 0.25
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


@dataclass(frozen=True)
class SyncEvidence:
    """What the trace says about the host's waits on the GPU inside the steps. Below the
    threshold the waits are not broken down (`cost` and `held` are None): the share alone
    clears them."""

    workload: str
    steps: int
    total_us: float  # the steps' time, summed
    blocked_us: float  # the host blocked on the GPU, summed over the steps
    busiest_us: float  # the busiest GPU's busy time, summed over the steps
    read_us: float = 0.0  # of it, an inference batch's output reads (not counted)
    has_reads: bool = False
    cost: dict[str, float] | None = None  # `_wait_cost` of the waits counted
    sources: tuple[dict, ...] = ()
    held: Held | None = None  # what the waits counted waited behind (diagnose/held.py)

    @property
    def share_pct(self) -> float:
        return pct(self.blocked_us, self.total_us)

    def per_step(self, us: float) -> float:
        return ms(us / self.steps)


@dataclass(frozen=True)
class SyncVerdict:
    """What the evidence says: `outcome` "under-threshold", "output-reads", "gpu-busy" or
    "finding"; for a finding its `cause` ("own-queue": the host drained the queue of the
    stream it waited on; "held": that stream was held behind other streams or outside work)
    and the bound on what removing it saves."""

    outcome: str
    cause: str = ""
    costly_pct: float = 0.0
    saving_pct: float = 0.0


def host_device_sync(model: TraceModel, context: RunContext | None = None) -> Assessment:
    e = measure(model, context)
    if isinstance(e, Assessment):
        return e
    return advise(e, judge(e))


def measure(model: TraceModel, _context: RunContext | None = None) -> SyncEvidence | Assessment:
    """The host's waits on the GPU in the steps: how long, what they cost the GPU, where the
    host waited, and what the GPU work it waited for waited behind."""
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity: nothing to wait on.")
    base = SyncEvidence(model.workload, len(model.steps), model.total_step_us,
                        host_total(model, "sync"), busiest_gpu_us(model))
    if base.share_pct < SYNC_THRESHOLD_PCT:
        return base
    waits = _waits(model)
    reads = _output_reads(model, waits)
    keep = ~reads
    held = held_waits(model.gpu, waits["w0"][keep], waits["w1"][keep], waits["device"][keep],
                      waits["stream"][keep], host_kinds(model))
    return replace(
        base, read_us=float((waits["w1"] - waits["w0"])[reads].sum()), has_reads=bool(reads.any()),
        cost=_wait_cost(model, waits, keep), sources=tuple(_sources(waits, keep)), held=held)


def judge(e: SyncEvidence) -> SyncVerdict:
    """Whether the waits cost step time, why, and what removing them can save at most.
    Letting the host run ahead cannot make the step shorter than the busiest GPU's work, and a
    wait costs only what the GPU idles during it or later in the step. A wait held behind other
    streams or outside work is not the host's to remove: at most the held time during which the
    GPU ran nothing is won back, and only by the held work starting sooner (collectives held
    behind are comm-bound's; other streams' work kept the GPU busy)."""
    if e.share_pct < SYNC_THRESHOLD_PCT or e.cost is None or e.held is None:
        return SyncVerdict("under-threshold")
    costly = pct(e.cost["costly"], e.total_us)
    if costly < SYNC_THRESHOLD_PCT:
        return SyncVerdict("output-reads" if e.has_reads else "gpu-busy", costly_pct=costly)
    room = max(e.total_us - e.busiest_us, 0.0)
    held_idle = min(e.held.gpu_idle_us, e.cost["costly"])
    if held_idle >= HELD_SHARE * e.cost["costly"]:
        return SyncVerdict("finding", "held", costly, pct(min(held_idle, room), e.total_us))
    return SyncVerdict("finding", "own-queue", costly, pct(min(e.cost["costly"], room),
                                                           e.total_us))


def advise(e: SyncEvidence, v: SyncVerdict) -> Assessment:
    """The assessment in words: why the waits are clear, or the finding with its advice."""
    if v.outcome == "under-threshold":
        return Assessment(
            RULE_ID, "clear",
            f"The host is blocked on the GPU {percent(e.share_pct)} of step time (threshold "
            f"{percent(SYNC_THRESHOLD_PCT, 0)}).")
    assert e.cost is not None and e.held is not None
    if v.outcome == "output-reads":
        return Assessment(RULE_ID, "clear", _output_read_detail(e, v.costly_pct))
    idle_during = pct(e.cost["idle_during"], e.cost["waits"])
    idle_after = e.per_step(e.cost["idle_after"])
    if v.outcome == "gpu-busy":
        return Assessment(
            RULE_ID, "clear",
            f"The host waits for the GPU {percent(e.share_pct)} of step time, but the GPU stays "
            f"busy through those waits ({percent(idle_during)} idle during them) and after them "
            f"({idle_after} ms idle per step later in the step): a host that did not wait would "
            "only queue work further ahead of a busy GPU. Waits that cost step time: "
            f"{percent(v.costly_pct)} (threshold {percent(SYNC_THRESHOLD_PCT, 0)}).")
    evidence: dict[str, Any] = {
        "sync_share_pct": e.share_pct,
        "blocked_ms_per_step": e.per_step(e.blocked_us),
        "gpu_idle_during_waits_pct": idle_during,
        "gpu_idle_after_waits_ms_per_step": idle_after,
        "costly_wait_share_pct": v.costly_pct,
        "sources": list(e.sources),
        **_held_evidence(e, v),
    }
    if e.has_reads:
        evidence["output_read_ms_per_step"] = e.per_step(e.read_us)
    finding = _held_finding(e, v, evidence) if v.cause == "held" else _queue_finding(e, v,
                                                                                       evidence)
    return Assessment.found(finding)


def _held_evidence(e: SyncEvidence, v: SyncVerdict) -> dict[str, Any]:
    """The evidence keys of what the waits waited behind (diagnose/held.py)."""
    h = e.held
    assert h is not None
    return {
        "wait_cause": v.cause,
        "held_ms_per_step": e.per_step(h.held_us),
        "held_share_pct": pct(h.held_us, e.total_us),
        "held_breakdown_ms_per_step": {
            "own_stream": e.per_step(h.own_us),
            "collective_on_other_stream": e.per_step(h.collective_us),
            "compute_on_other_stream": e.per_step(h.compute_us),
            "gpu_idle_work_queued": e.per_step(h.idle_queued_us),
            "gpu_idle_nothing_queued": e.per_step(h.idle_us),
        },
        "awaited_streams": list(h.streams),
        "held_behind": [{"stream": b.stream, "kind": b.kind, "op": b.op,
                         "ms_per_step": e.per_step(b.us)} for b in h.behind],
    }


def _queue_finding(e: SyncEvidence, v: SyncVerdict, evidence: dict[str, Any]) -> Finding:
    """The host drained the queue of the stream it waited on: read the value later."""
    inference = e.workload == "inference"
    return Finding(
        id=RULE_ID,
        title=f"The host waits for the GPU {percent(e.share_pct)} of each {_unit(e)}",
        evidence=evidence,
        recommendation=(
            "The host stops launching work inside the step until the GPU queue drains. Where "
            f"it waits, largest first: {_said(e)}." + _copy_why(e) + _held_aside(e) + (
                _inference_advice(e.per_step(e.read_us)) if inference
                else " Keep metrics on the GPU and read them every N steps, outside the hot "
                "loop.")
        ),
        snippet=_INFERENCE_SNIPPET if inference else _TRAINING_SNIPPET,
        precondition=(
            "Helps when the host then has work to launch (the GPU idles while the host waits "
            "and re-fills the queue); a sync the algorithm needs (data-dependent shapes, "
            "early stopping) can only be moved, not removed."
        ),
        estimated_saving_pct=v.saving_pct,
        saving_basis=(
            "upper bound: the host's blocked time during which the GPU idled, plus the rest of "
            "it up to the GPU's idle time later in the step (the lead a host that did not wait "
            "would have had), capped so the step is never shorter than the busiest GPU's busy "
            "time"
        ),
        docs=DOCS,
    )


def _held_finding(e: SyncEvidence, v: SyncVerdict, evidence: dict[str, Any]) -> Finding:
    """The stream the host waited on was held behind other streams or outside work: reading
    the value later does not shorten the step; what held the work does."""
    h = e.held
    assert h is not None
    return Finding(
        id=RULE_ID,
        title=(f"The host waits for the GPU {percent(e.share_pct)} of each {_unit(e)}, "
               f"{millis(e.per_step(h.held_us), 'tenths')} ms of it for work held behind other "
               "streams"),
        evidence=evidence,
        recommendation=(
            f"The host blocks {millis(e.per_step(e.blocked_us), 'tenths')} ms per {_unit(e)} "
            f"waiting on the GPU, largest first in: {_said(e)}." + _copy_why(e)
            + f" For {millis(e.per_step(h.held_us), 'tenths')} ms of it "
            f"({percent(pct(h.held_us, e.total_us))} of the {_unit(e)}) the stream it waits on "
            f"({_streams(h)}) had work queued that did "
            "not run: " + _held_parts(e) + " Reading the value later (sync=off) does not "
            "shorten the step: the work it waits for still runs as late. What shortens it is "
            "that work starting sooner: collective time is comm-bound's (overlap it, or find the "
            "slower rank: rank-imbalance); GPU idle with work queued waits on something this "
            "trace does not show (another rank, another device, an event recorded outside these "
            "streams), so find what the queued work waits on. Take the read itself off the other "
            "streams' path: make its stream wait on an event recorded right after the tensor it "
            "reads is produced (not wait_stream on the whole stream), copy into pinned memory "
            "with non_blocking=True, and wait for that copy's event only where the value is "
            "used."
        ),
        snippet=_HELD_SNIPPET,
        precondition=(
            "The held time shortens the step only when the work it waited for starts sooner: "
            "a collective when it overlaps compute or its slower peers catch up, work queued "
            "behind an event when that event is recorded sooner. Taking the read off the other "
            "streams' path frees the host, not the GPU; it helps only when the value does not "
            "need the held work (its stream waited for the whole stream, not for the data "
            "it reads)."
        ),
        estimated_saving_pct=v.saving_pct,
        saving_basis=(
            "upper bound: the held waits' time during which the GPU ran nothing, if the held "
            "work had run at once (time held behind a collective is comm-bound's; other streams' "
            "work kept the GPU busy), capped by the waits' cost to the step and so the step is "
            "never shorter than the busiest GPU's busy time"
        ),
        docs=DOCS,
    )


def _held_aside(e: SyncEvidence) -> str:
    """What held the waits, where that is a material part of them but not their cost."""
    h = e.held
    if h is None or h.held_us < SAID_HELD_SHARE * (h.held_us + h.own_us) or not h.streams:
        return ""
    return (f" For {millis(e.per_step(h.held_us), 'tenths')} ms per {_unit(e)} of these waits "
            f"the stream they wait on ({_streams(h)}) had work queued that waited on other "
            "streams: " + _held_parts(e))


def _streams(h: Held) -> str:
    return ("stream " if len(h.streams) == 1 else "streams ") + ", ".join(h.streams[:3])


def _held_parts(e: SyncEvidence) -> str:
    """What the held time was spent behind, in words, largest first."""
    h = e.held
    assert h is not None
    parts = []
    for b in h.behind:
        what = f"collective {b.op}" if b.kind == "collective" else f"compute, mostly {b.op}"
        parts.append((b.us, f"stream {b.stream} ({what}) ran {millis(e.per_step(b.us), 'tenths')}"
                      " ms"))
    if h.idle_queued_us > 0:
        parts.append((h.idle_queued_us,
                      f"for {millis(e.per_step(h.idle_queued_us), 'tenths')} ms the GPU ran "
                      "nothing though work was queued on other streams"))
    if h.idle_us > 0:
        parts.append((h.idle_us,
                      f"for {millis(e.per_step(h.idle_us), 'tenths')} ms the GPU ran nothing "
                      "and nothing else was queued (work not yet launched, or on another "
                      "device)"))
    named = [text for us, text in sorted(parts, key=lambda p: -p[0])
             if e.per_step(us) >= MIN_SAID_MS]
    return ("meanwhile " + "; ".join(named) + " (per step).") if named else ""


def _unit(e: SyncEvidence) -> str:
    return step_word(e.workload)


def _said(e: SyncEvidence) -> str:
    """Where the host waited, in what a user wrote."""
    causes = list(dict.fromkeys(c for c in (_cause(s) for s in _named(list(e.sources))) if c))
    return "; ".join(causes) or "explicit synchronisation calls"


def _copy_why(e: SyncEvidence) -> str:
    """A long device-to-host copy call is a synchronisation, not a slow transfer."""
    top = max(e.sources, key=lambda s: s["max_ms"], default=None)
    if (top is None or top["kind"] != "copy-wait" or top["call"].endswith("HtoD")
            or top["max_ms"] < MIN_SAID_MS):
        return ""
    return (
        f" The longest waits are {top['call']} calls: the GPU copy itself takes "
        f"{top['gpu_copy_us_max']:.0f} us for {top['bytes_max']:.0f} bytes, yet the host call "
        f"lasts up to {millis(top['max_ms'], 'tenths')} ms, because it waits for the GPU work "
        "queued before it. This is a synchronisation, not a slow transfer: pinning memory "
        "would not help."
    )


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
    op of READ_OPS around it), the device and stream of the op it waited for (a copy's own;
    NaN where unknown), and the rows `_sources` groups."""
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
    s_dev, s_stream = _awaited(model, s["ts"].to_numpy(float), s["end"].to_numpy(float))
    return {
        "device": np.concatenate([s_dev, c["device"].astype(str).to_numpy(dtype=object)]),
        "stream": np.concatenate([s_stream, c["stream_gpu"].to_numpy(dtype=float)]),
        "w0": np.concatenate([s["ts"].to_numpy(), c["ts"].to_numpy()]).astype(float),
        "w1": np.concatenate([s["end"].to_numpy(),
                              (c["ts"] + c["wait_us"]).to_numpy()]).astype(float),
        "step": np.concatenate([s["step"].to_numpy(), c["step"].to_numpy()]).astype(np.int64),
        "read": ops.to_numpy(dtype=bool) | dtoh,
        "rows": rows,
    }


def _awaited(model: TraceModel, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sync call, the device and stream of the GPU op it waited for: the op that ended last
    before the call returned, during the call and at most RETURN_US before its return (object
    array of device ids, float streams; "" and NaN where no op fits)."""
    dev = np.full(len(ts), "", dtype=object)
    stream = np.full(len(ts), np.nan)
    g = model.gpu
    if not len(ts) or not len(g):
        return dev, stream
    g_end = g["end"].to_numpy(dtype=float)
    order = np.argsort(g_end, kind="stable")
    j = np.searchsorted(g_end[order], end + CLOCK_US, side="right") - 1
    ok = j >= 0
    op = order[np.clip(j, 0, None)]
    ok &= (g_end[op] > ts) & (end - g_end[op] <= RETURN_US)
    dev[ok] = g["device"].astype(str).to_numpy(dtype=object)[op[ok]]
    stream[ok] = g["stream"].to_numpy(dtype=float)[op[ok]]
    return dev, stream


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


def _output_read_detail(e: SyncEvidence, other: float) -> str:
    """Why an inference trace's waits are not a finding, and what to do instead (`other`: the
    other waits' cost, % of the batch)."""
    return (
        f"The host waits for the GPU {percent(e.share_pct)} of each batch; "
        f"{percent(pct(e.read_us, e.total_us))} of the batch ({millis(e.per_step(e.read_us))} ms) "
        "is spent "
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
    grouped = grouped.sort_values("total", ascending=False, kind="stable").head(MAX_SOURCES)
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


_TRAINING_SNIPPET = (
    "running_loss = torch.zeros((), device=device)\n"
    "for step, (x, y) in enumerate(loader):\n"
    "    loss = criterion(model(x), y)\n"
    "    ...\n"
    "    running_loss += loss.detach()      # stays on the GPU, no sync\n"
    "    if step % 100 == 0:\n"
    "        print(running_loss.item() / 100)  # one sync per 100 steps\n"
    "        running_loss.zero_()"
)

# A small read whose stream waits only for the tensor it reads, and a host that waits only
# where it uses the value.
_HELD_SNIPPET = (
    "produced = torch.cuda.Event()\n"
    "produced.record()                    # right after the op that makes `lengths`\n"
    "with torch.cuda.stream(side):\n"
    "    side.wait_event(produced)        # not side.wait_stream(main): not its whole queue\n"
    "    host = torch.empty(lengths.shape, dtype=lengths.dtype, pin_memory=True)\n"
    "    host.copy_(lengths, non_blocking=True)\n"
    "    copied = torch.cuda.Event()\n"
    "    copied.record()\n"
    "...                                  # launch the work that does not need the value\n"
    "copied.synchronize()                 # wait here, for the copy only\n"
    "splits = host.tolist()"
)

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


def _changes(finding: Finding, _model: TraceModel) -> list[Change]:
    """sync=off, unless the waits were held: then the host not waiting changes nothing."""
    return [] if finding.evidence.get("wait_cause") == "held" else [Change("sync", "off")]


def _no_change(finding: Finding) -> str:
    held = finding.evidence.get("held_ms_per_step")
    return (
        f"its waits are held ({millis(held, 'tenths')} ms per step) behind other streams or "
        "work outside them: sync=off lets the host go on, but the work it waited for runs as "
        "late, so the step is not shorter; the held work starting sooner is what saves"
        if isinstance(held, int | float) else "its change is not one the replay can model")


SPEC = RuleSpec(
    id=RULE_ID,
    title="the host waits for the GPU inside the step",
    summary="the host blocks on the GPU inside the step (`.item()`, `.cpu()`, syncs), told "
            "apart from slow copies",
    check=host_device_sync,
    thresholds={"SYNC_THRESHOLD_PCT": SYNC_THRESHOLD_PCT,
                "NAMED_SOURCE_SHARE": NAMED_SOURCE_SHARE, "HELD_SHARE": HELD_SHARE},
    what_if=("sync",),
    changes=_changes,
    no_change=_no_change,
    order=40,
    metric=Metric("host blocked waiting for the GPU", MS, evidence_key("blocked_ms_per_step"),
                  "sync_share_pct"),
    verdict_metric=("sync_share_pct", "sync_wait_pct"),
)
