"""`pageable-d2h-copy`: device-to-host copies into pageable memory that cost step time.

Results fetched to the host every step (`.cpu()`, `.numpy()`, `.tolist()`, `.item()`) land in
pageable memory: the host blocks for the transfer and a staging copy. Only the transfer itself
is counted here (the model's `copy_us`): host time the call spent waiting for queued GPU work
before its copy started is a synchronisation, counted by `host-device-sync` (the real
`a100_80gb_rank0of16_queue_len` trace waits 147 ms for 704-byte copies that take 2 us).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope.diagnose.common import PINNED_MEMORY_DOCS, ms, nansum, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.trace.workload import step_word
from stallscope.units import fixed_size, millis, percent

RULE_ID = "pageable-d2h-copy"
# Share of step wall time the host spends in the transfers themselves (waits excluded).
COPY_SHARE_THRESHOLD_PCT = 2.0
DOCS = PINNED_MEMORY_DOCS


def pageable_d2h_copy(model: TraceModel, _context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    # Row masks on the copies table's arrays: boolean-indexing the frame cost more than the
    # arithmetic.
    copies = model.copies
    d2h = (copies["direction"].to_numpy(dtype=object) == "DtoH") & (copies["step"].to_numpy() >= 0)
    dst = copies["dst"].to_numpy(dtype=object)[d2h]
    pageable = np.flatnonzero(d2h)[dst == "Pageable"]
    if not len(pageable):
        return Assessment(
            RULE_ID, "clear",
            "No device-to-host copies into pageable memory inside the steps."
            if not len(dst) or set(dst) <= {"Pinned", "Device"} else
            f"Device-to-host copies go to {', '.join(sorted(set(dst)))} memory, not "
            "Pageable.",
        )
    n = len(model.steps)
    total = model.total_step_us
    copy_us = nansum(copies["copy_us"].to_numpy(dtype=float)[pageable])
    waited = nansum(copies["wait_us"].to_numpy(dtype=float)[pageable])
    share = pct(copy_us, total)
    if share < COPY_SHARE_THRESHOLD_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"Device-to-host copies into pageable memory hold the host {percent(share, 2)} of step "
            f"time in the transfers themselves (threshold {percent(COPY_SHARE_THRESHOLD_PCT, 0)})"
            + (f"; the {millis(ms(waited / n), 'tenths')} ms per step their calls waited for "
               "queued GPU work "
               "is host-device-sync" if waited > copy_us else "") + ".",
        )
    nbytes = nansum(copies["bytes"].to_numpy(dtype=float)[pageable])
    gpu_us = nansum(copies["dur_gpu"].to_numpy(dtype=float)[pageable])
    gbps = round(nbytes / gpu_us / 1e3, 2) if gpu_us > 0 else 0.0
    ops = (copies["top_op"].to_numpy(dtype=object)[pageable].tolist()
           + copies["op"].to_numpy(dtype=object)[pageable].tolist())
    evidence: dict[str, Any] = {
        "copies": len(pageable),
        "copies_per_step": round(len(pageable) / n, 1),
        "bytes_per_step": int(nbytes / n),
        "achieved_gbps": gbps,
        "gpu_copy_ms_per_step": ms(gpu_us / n),
        "host_copy_ms_per_step": ms(copy_us / n),
        "host_copy_share_pct": share,
        "host_wait_for_queue_ms_per_step": ms(waited / n),
        "ops": sorted({o for o in ops if o}),
    }
    return Assessment.found(advise(model, evidence, nbytes))


def advise(model: TraceModel, evidence: dict[str, Any], nbytes: float) -> Finding:
    """The finding: keep results on the GPU and fetch every N steps, or copy into a pinned
    buffer."""
    share, gbps, n = evidence["host_copy_share_pct"], evidence["achieved_gbps"], len(model.steps)
    serving = model.workload == "inference"
    return Finding(
        id=RULE_ID,
        title=(
            f"Device-to-host copies into pageable memory take {percent(share)} of each "
            f"{step_word(model.workload)} ({fixed_size(nbytes / n, 'MB', 2)} per step at "
            f"{gbps:.1f} GB/s)"
        ),
        evidence=evidence,
        recommendation=_SERVING_ADVICE if serving else (
            "Results are copied from the GPU into pageable (ordinary) host memory every step "
            "(.cpu(), .numpy(), .tolist(), .item() on outputs or metrics): the host blocks for "
            "each transfer and the driver stages it through a bounce buffer. Keep the results "
            "on the GPU and fetch them every N steps, or copy into a pinned buffer with "
            "non_blocking=True and synchronise once where the values are read. Host time the "
            "calls spent waiting for earlier GPU work is not counted here (see "
            "host-device-sync)."
        ),
        snippet=SERVING_SNIPPET if serving else (
            "# keep per-step results on the GPU; fetch every N steps\n"
            "outputs = []\n"
            "for step, (x, y) in enumerate(loader):\n"
            "    out = model(x)\n"
            "    ...\n"
            "    outputs.append(out.detach())          # no copy, no sync\n"
            "    if step % N == 0:\n"
            "        host = torch.cat(outputs).cpu()   # one transfer per N steps\n"
            "        outputs.clear()\n"
            "\n"
            "# or, needed on the host every step: a pinned buffer, one sync\n"
            "buf = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)\n"
            "buf.copy_(out.detach(), non_blocking=True)\n"
            "...  # launch the next step's work first\n"
            "torch.cuda.current_stream().synchronize()  # then read buf"
        ),
        precondition=_SERVING_PRECONDITION if serving else (
            "Fetching every N steps helps only when the host does not need each step's values "
            "at once; when it does (e.g. every step's predictions are written out), the pinned "
            "buffer with non_blocking=True overlaps the transfer with the next step's launches "
            "but the host must still synchronise before reading it. Pinned memory is "
            "page-locked RAM: reuse one buffer rather than pinning each result."
        ),
        estimated_saving_pct=share,
        saving_basis=(
            "upper bound: the host time blocked in these transfers (not the time their calls "
            "waited for queued GPU work), if they are removed or fully overlapped"
        ),
        docs=DOCS,
    )


# Inference: the caller needs every batch's outputs, so the read stays; it can shrink and
# overlap the next batch's work instead of blocking the host in a pageable transfer.
_SERVING_ADVICE = (
    "Each batch's outputs are copied from the GPU into pageable (ordinary) host memory: the "
    "host blocks for each transfer and the driver stages it through a bounce buffer. The "
    "caller needs the outputs, so keep the read but make it smaller and overlapped: reduce "
    "them on the GPU before copying (argmax/top-k, a smaller dtype), and copy into a reused "
    "pinned buffer with non_blocking=True, waiting on its event only once the next batch is "
    "launched. Host time the calls spent waiting for the batch's GPU work is not counted here "
    "(it is the forward's own time)."
)
_SERVING_PRECONDITION = (
    "Overlapping needs the next batch to be ready when this one's output is read (requests "
    "queued, preprocessing done ahead); a fixed output shape (slice the buffer for a short "
    "last batch); two pinned buffers so a copy never overwrites a result not yet read. "
    "Pinned memory is page-locked RAM: allocate the buffers once."
)
# Double-buffered output reads: batch i's copy runs while batch i+1 is launched.
SERVING_SNIPPET = (
    "bufs = [torch.empty(max_batch, dtype=torch.long, pin_memory=True) for _ in range(2)]\n"
    "done = [torch.cuda.Event(), torch.cuda.Event()]\n"
    "prev = None\n"
    "for i, batch in enumerate(batches):\n"
    "    with torch.inference_mode():\n"
    "        preds = model(batch.to(device, non_blocking=True)).argmax(-1)  # reduce on GPU\n"
    "    buf = bufs[i % 2][: len(preds)]\n"
    "    buf.copy_(preds, non_blocking=True)\n"
    "    done[i % 2].record()\n"
    "    if prev is not None:  # the previous batch's copy ran while this one was launched\n"
    "        prev_buf, prev_done = prev\n"
    "        prev_done.synchronize()\n"
    "        reply(prev_buf.tolist())\n"
    "    prev = (buf, done[i % 2])\n"
    "if prev is not None:\n"
    "    prev[1].synchronize()\n"
    "    reply(prev[0].tolist())"
)


SPEC = RuleSpec(
    id=RULE_ID,
    title="device-to-host copies into pageable memory cost step time",
    summary="device-to-host copies into pageable memory take step time by their transfer, not "
            "by the queue they waited on (that is `host-device-sync`)",
    check=pageable_d2h_copy,
    thresholds={"COPY_SHARE_THRESHOLD_PCT": COPY_SHARE_THRESHOLD_PCT},
    order=30,
    metric=Metric("host in device-to-host copies into pageable memory", MS,
                  evidence_key("host_copy_ms_per_step"), "host_copy_share_pct"),
)
