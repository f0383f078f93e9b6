"""dataloader-bound's changes: `num_workers` (the loader's fetches served by workers) and
`torch_threads` (the step at one intra-op thread, as `run` timed it), which cpu-oversubscription
declares too.
"""

from __future__ import annotations

import numpy as np

from stallscope.replay.graph import Graph
from stallscope.replay.loader import PAGE_BYTES, NotModelled, with_workers
from stallscope.replay.models.common import (
    HTOD_PAGEABLE,
    ONE_THREAD,
    ONE_THREAD_WHY,
    Context,
    Model,
    gpu_named,
    h2d_bytes_per_step,
    is_whole,
)
from stallscope.replay.threads import one_thread

# Reading a batch received from a DataLoader worker the first time costs more than the first
# read of an in-process batch, per 4 KiB page (benchmarks/bench_first_touch.py). The GPU
# recordings show pageable copies slowing more than this as loading moves to workers: busy
# hosts pay more (memory bandwidth shared with the workers), which the replay does not model
# (docs/performance.md, "Figures behind the code").
SHM_FIRST_TOUCH_US = 0.14
NO_PROBE = ("the trace has no steps timed at one intra-op thread (stallscope run times them "
            "before recording a CPU run of one process with 2+ threads)")


def num_workers(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    # Workers run one intra-op thread: each batch takes the probe's one-thread loading time.
    one = ctx.memo.get(ONE_THREAD)
    plan = with_workers(g, int(value), ctx.facts, ctx.model.loader_kind, ctx.step_us,
                        h2d_bytes_per_step(ctx.model),
                        batch_load_us=one.batch_load_us if one is not None else None,
                        one_thread="torch_threads" in ctx.applied)
    g2, notes = plan.graph, plan.assumptions
    pageable = gpu_named(g2, HTOD_PAGEABLE)
    if ctx.facts.workers_now(ctx.model.loader_kind) == 0 and pageable.any():
        # A batch from a worker arrives in shared-memory pages this process has not touched:
        # the pageable copy's staging memcpy maps each one as it reads it.
        pages = np.nan_to_num(g2.g_bytes[pageable], nan=0.0) / PAGE_BYTES
        g2.g_dur = g2.g_dur.copy()  # shared with the graph it was made from (Graph.copy)
        g2.g_dur[pageable] += pages * SHM_FIRST_TOUCH_US
        notes.append(f"a batch from a worker is copied to the GPU from shared-memory pages "
                     f"not yet mapped in the training process: +{SHM_FIRST_TOUCH_US} us per "
                     "4 KiB page of each pageable copy (measured, docs/replay.md)")
    return g2, notes


def torch_threads(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if "torch_threads" in ctx.applied:
        return g, []  # made by an earlier change of this scenario
    if value != "1":
        raise NotModelled("the replay knows the step at one intra-op thread only (the steps "
                          "stallscope run times that way before recording)")
    host = ctx.model.trace.capture.get("host")
    recorded = host.get("torch_threads") if isinstance(host, dict) else None
    if isinstance(recorded, int) and recorded <= 1:
        raise NotModelled("the training process already ran one intra-op thread")
    scales = ctx.memo.get(ONE_THREAD)
    if scales is None:
        raise NotModelled(ctx.memo.get(ONE_THREAD_WHY) or NO_PROBE)
    return one_thread(g, scales, "num_workers" not in ctx.applied), [scales.note]


MODELS = {
    "num_workers": Model(num_workers, is_whole, "a whole number >= 1"),
    "torch_threads": Model(torch_threads, is_whole, "a whole number >= 1"),
}
