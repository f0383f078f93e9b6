"""pageable-h2d-copy's changes, which blocking-h2d-copy declares too: `pin_memory` (host-to-device
copies at the pinned rate, the host waiting for each on its stream) and `non_blocking` (the host
no longer waiting for them).
"""

from __future__ import annotations

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.graph import LOADER, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import (
    HTOD_PAGEABLE,
    HTOD_PINNED,
    Context,
    Model,
    followers,
    gpu_named,
    h2d_bytes_per_step,
    h2d_calls,
)
from stallscope.trace.model import SYNC_CALLS, TraceModel

# Pinned host-to-device rate when the trace has no pinned copy to measure it from, by compute
# capability: PCIe 3 (Pascal to Turing hosts), PCIe 4 (Ampere), PCIe 5 (Hopper), at what CUDA's
# bandwidthTest typically reports for pinned memory on such links. Assumed, not measured here.
PINNED_GBPS = {6: 10.0, 7: 12.0, 8: 24.0, 9: 48.0}
# Copying a batch into pinned memory on the host (the training process, without workers): a
# one-thread memcpy into warm pages (the caching host allocator reuses its blocks), as measured
# and rounded down for hosts under load (docs/performance.md, "Figures behind the code").
PIN_GBPS = 8.0
_MIN_RATE_BYTES = 256 * 1024
# A host thread returns this long after the GPU work it waited for ends (a stream sync's wake-up),
# the median return of the waits the graph finds in the committed w8-item-every-step and
# w8-pinned-blocking recordings (docs/performance.md, "Figures behind the code"; replay/graph.py's
# RETURN_US bounds what counts as a wait at all).
OWN_COPY_RETURN_US = 8.0


def pin_memory(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only pin_memory=true is replayed")
    ops = gpu_named(g, HTOD_PAGEABLE)
    if not ops.any():
        if h2d_calls(g).any():  # already pinned: nothing to change, non_blocking may follow
            return g, ["host-to-device copies already come from pinned memory"]
        raise NotModelled("no host-to-device copy in the steps")
    rate, how = _pinned_rate(g, ctx.model)
    g = g.copy("g_dur", *tf.UNBLOCKS)  # _block_on_own_copy writes what unblock does
    g.g_dur[ops] = np.nan_to_num(g.g_bytes[ops], nan=0.0) / (rate * 1e3)
    notes = [f"HtoD copies run at {rate:.1f} GB/s from pinned memory ({how})"]
    _block_on_own_copy(g, ops)
    notes.append("the host still waits for each copy (copy_ without non_blocking syncs its "
                 "stream): it queues the copy, then waits for the work queued before it and "
                 "the copy itself, no longer for a staging memcpy at the pageable rate")
    in_process = ctx.facts.workers_now(ctx.model.loader_kind) == 0
    loads = np.flatnonzero(g.h_kind == LOADER)
    if in_process and len(loads) and "num_workers" not in ctx.applied:
        per_batch = h2d_bytes_per_step(ctx.model) * g.steps / len(loads)
        g.h_dur[loads] += per_batch / (PIN_GBPS * 1e3)
        notes.append(f"without workers the training process copies each batch into pinned "
                     f"memory itself, at an assumed {PIN_GBPS:.0f} GB/s")
    return g, notes


def _block_on_own_copy(g: Graph, ops: np.ndarray) -> None:
    """A pageable copy's call lasts as long as its staging memcpy; from pinned memory the call
    only queues the copy and the host then waits for it on the stream (behind the work queued
    before it). Each call launching one of `ops` takes its typical launch time and waits for
    the last copy it launched."""
    idx = np.flatnonzero(ops & (g.g_launch >= 0))
    if not len(idx):
        return
    calls = g.g_launch[idx]
    last: dict[int, int] = {}
    for op, call in zip(idx.tolist(), calls.tolist(), strict=True):
        last[call] = op  # ops are in stream order: the call's last copy ends last
    c = np.fromiter(last.keys(), dtype=np.int64, count=len(last))
    g.h_dur[c] = np.minimum(g.h_dur[c], g.h_typical[c])
    g.h_wait[c] = np.fromiter(last.values(), dtype=np.int64, count=len(last))
    g.h_after[c] = -1
    g.h_ret[c] = OWN_COPY_RETURN_US


def non_blocking(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only non_blocking=true is replayed")
    pinned = "pin_memory" in ctx.applied or not gpu_named(g, HTOD_PAGEABLE).any()
    if not pinned:
        raise NotModelled("non_blocking=True does not overlap a copy from pageable memory: "
                          "CUDA copies it synchronously (add pin_memory=true)")
    calls = h2d_calls(g)
    if not calls.any():
        raise NotModelled("no host-to-device copy calls in the steps")
    g = g.copy(*tf.UNBLOCKS)
    follow = followers(g, calls, SYNC_CALLS)
    tf.unblock(g, calls | follow)
    return g, ["the host no longer waits for host-to-device copies (or the stream sync after "
               "them): it queues them and goes on"]


def _pinned_rate(g: Graph, model: TraceModel) -> tuple[float, str]:
    """GB/s of pinned HtoD copies measured in this trace, else the default for the GPU."""
    pinned = gpu_named(g, HTOD_PINNED) & (g.g_bytes >= _MIN_RATE_BYTES) & (g.g_dur > 0)
    if pinned.sum() >= 2:
        rate = float(np.median(g.g_bytes[pinned] / g.g_dur[pinned])) / 1e3
        return rate, f"measured on this trace's {int(pinned.sum())} pinned copies"
    major = max(model.compute_major.values(), default=7)
    rate = PINNED_GBPS.get(major, PINNED_GBPS[7])
    return rate, f"the default for compute capability {major}.x; no pinned copy to measure"


MODELS = {
    "pin_memory": Model(pin_memory, lambda v: v == "true", "true"),
    "non_blocking": Model(non_blocking, lambda v: v == "true", "true"),
}
