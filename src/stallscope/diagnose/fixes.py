"""What each fix does to the replay graph, and the `--what-if KEY=VALUE` vocabulary for them.

A change is replayed by editing a copy of the recorded graph: the loader's fetches served by
workers, HtoD copies at the pinned rate and no longer blocking, syncs that no longer wait,
fp32 GEMM/conv kernels at a tensor-core speedup, optimizer and zero_grad kernels and launches
removed, launch overhead removed (CUDA graphs), allocator calls removed, collectives no longer
holding compute back. Which events a change touches is the rules' knowledge (kernel classes,
optimizer ranges, sync sources), so it lives here, above the replay. Every prediction carries
the assumptions it rests on; a change the trace cannot support raises NotModelled with why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.allocator import ALLOC_CALL, FREE_CALL
from stallscope.diagnose.comm import COLLECTIVE, COMM_NAME, host_kinds, peer_excess
from stallscope.diagnose.common import ms
from stallscope.diagnose.optimizer import STEP_NAME as OPTIMIZER_STEP
from stallscope.diagnose.precision import classify_kernels
from stallscope.diagnose.zero_grad import ZERO_GRAD
from stallscope.errors import StallscopeError
from stallscope.replay import transforms as tf
from stallscope.replay.engine import replay
from stallscope.replay.graph import CALL, FILL, LOADER, Graph
from stallscope.replay.loader import LoaderFacts, NotModelled, with_workers
from stallscope.replay.threads import OneThread, one_thread
from stallscope.trace.model import SYNC_CALLS, TraceModel
from stallscope.trace.names import name_matches, per_name

# Tensor-core speedup assumed for fp32 GEMM/conv kernels, by target precision. Peak ratios are
# 8x (V100 fp16, A100 TF32) to 16x (A100 bf16) over fp32 SIMT; convolutions carry layout
# transforms and memory-bound epilogues, and ~2x on these kernels is what mixed precision
# commonly gives ResNet-class models end to end (the no-mixed-precision rule's assumption).
# TF32 has half the tensor-core peak of bf16: 1.5x. Not validated on a measured pair.
AMP_SPEEDUP = {"bf16": 2.0, "fp16": 2.0, "tf32": 1.5}
# Host time left of an optimizer step with multi-tensor kernels (one launch per few hundred
# tensors instead of one per tensor), and the GPU time each per-tensor kernel loses: its fixed
# cost (launch ramp, tail) when it becomes part of one multi-tensor kernel. Assumptions.
OPTIMIZER_HOST_LEFT = {"foreach": 0.2, "fused": 0.1}
# On a CPU the optimizer's arithmetic is host time too, and multi-tensor Adam loops over the
# tensors in C++ rather than in Python: measured, not assumed (examples/python_heavy.py's 97
# small parameter tensors, this project's VM; 3 rounds of the method, then 3 of
# benchmarks/bench_optimizer_cpu.py): foreach keeps 0.60-0.70 and 0.61-0.68 of the for-loop
# step's time (0.61 used), fused 0.21-0.37 and 0.15-0.24 (0.21 used).
OPTIMIZER_HOST_LEFT_CPU = {"foreach": 0.61, "fused": 0.21}
PER_KERNEL_GPU_US = 2.0
# zero_grad(set_to_none=True) only drops references: this share of its host time is left.
ZERO_GRAD_HOST_LEFT = 0.05
# CUDA graphs: one graph launch replays the captured kernels; what is left of the host time
# between a step's launches, and the gap between kernels on a stream. Assumptions.
GRAPH_HOST_LEFT = 0.02
GRAPH_KERNEL_GAP_US = 1.0
# Pinned host-to-device rate when the trace has no pinned copy to measure it from, by compute
# capability: PCIe 3 (Pascal to Turing hosts), PCIe 4 (Ampere), PCIe 5 (Hopper), at what CUDA's
# bandwidthTest typically reports for pinned memory on such links. Assumed, not measured here.
PINNED_GBPS = {6: 10.0, 7: 12.0, 8: 24.0, 9: 48.0}
# Copying a batch into pinned memory on the host (the training process, without workers): a
# one-thread memcpy into warm pages (the caching host allocator reuses its blocks), measured
# at 8.4-8.7 GB/s for 19-64 MB on this project's VM; rounded down for hosts under load.
PIN_GBPS = 8.0
_HTOD_PAGEABLE = re.compile(r"^Memcpy HtoD \(Pageable")
_HTOD_PINNED = re.compile(r"^Memcpy HtoD \(Pinned")
_DTOH = re.compile(r"^Memcpy DtoH")
_MIN_RATE_BYTES = 256 * 1024
# A sync this close (us) after an HtoD copy call is the copy's own (copy_ with non_blocking=False).
FOLLOW_US = 30.0


@dataclass(frozen=True)
class Change:
    """One change, as a user would make it: `num_workers=4`, `amp=bf16`."""

    key: str
    value: str

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}"


@dataclass
class Context:
    """What the fixes read besides the graph: the model, and what `run` measured."""

    model: TraceModel
    facts: LoaderFacts
    step_us: np.ndarray  # recorded duration of each step
    applied: list[str] = field(default_factory=list)  # keys already applied in this scenario
    # Selections that depend only on what the nodes are (names, threads, ranges), which no fix
    # changes: computed once per plan, shared by all its scenarios.
    memo: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


Fix = Callable[[Graph, Context, str], tuple[Graph, list[str]]]


def parse_what_if(items: list[str]) -> list[Change]:
    """`--what-if KEY=VALUE` options, checked before any work. Raises StallscopeError."""
    out: dict[str, Change] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip().lower()
        if not sep or not key or not value:
            raise StallscopeError(f"--what-if {item!r}: expected KEY=VALUE, e.g. "
                                  "--what-if num_workers=4")
        spec = WHAT_IF.get(key)
        if spec is None:
            raise StallscopeError(f"--what-if {item!r}: unknown change {key!r}; one of "
                                  f"{', '.join(WHAT_IF)}")
        if not spec[1](value):
            raise StallscopeError(f"--what-if {item!r}: {key} takes {spec[2]}")
        out[key] = Change(key, value)
    return list(out.values())


def apply(g: Graph, ctx: Context, changes: list[Change]) -> tuple[Graph, list[str]]:
    """`g` with every change made, in order; the assumptions they rest on. NotModelled when
    one of them cannot be replayed on this trace."""
    notes: list[str] = []
    for change in changes:
        g, said = WHAT_IF[change.key][0](g, ctx, change.value)
        ctx.applied.append(change.key)
        notes.extend(n for n in said if n not in notes)
    return g, notes


# ---------------------------------------------------------------------------- the fixes


def _num_workers(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    # Workers run one intra-op thread: each batch takes the probe's one-thread loading time.
    one = ctx.memo.get(ONE_THREAD)
    plan = with_workers(g, int(value), ctx.facts, ctx.model.loader_kind, ctx.step_us,
                        _h2d_bytes_per_step(ctx.model),
                        batch_load_us=one.batch_load_us if one is not None else None,
                        one_thread="torch_threads" in ctx.applied)
    g2, notes = plan.graph, plan.assumptions
    pageable = _gpu_named(g2, _HTOD_PAGEABLE)
    if ctx.facts.workers_now(ctx.model.loader_kind) == 0 and pageable.any():
        # A batch from a worker arrives in shared-memory pages this process has not touched:
        # the pageable copy's staging memcpy maps each one as it reads it.
        pages = np.nan_to_num(g2.g_bytes[pageable], nan=0.0) / PAGE_BYTES
        g2.g_dur[pageable] += pages * SHM_FIRST_TOUCH_US
        notes.append(f"a batch from a worker is copied to the GPU from shared-memory pages "
                     f"not yet mapped in the training process: +{SHM_FIRST_TOUCH_US} us per "
                     "4 KiB page of each pageable copy (measured, docs/replay.md)")
    return g2, notes


# Reading a batch received from a DataLoader worker the first time costs more than the first
# read of an in-process batch: 0.11-0.20 us per 4 KiB page in 6 runs (25 MB tensors, 2 workers,
# this project's 2-core VM, benchmarks/bench_first_touch.py and its first form); 0.14 is the
# median of the first 4, the 6 give 0.165. The H200
# recordings show pageable copies slowing as loading moves to workers (w0 8.2-9.7 GB/s, w8
# 3.4-5.7 GB/s: 1.3-4.8 ms per step more for 25 MB), of which this accounts for 0.9 ms: busy
# hosts pay more (memory bandwidth shared with 8 workers), which the replay does not model.
SHM_FIRST_TOUCH_US = 0.14
PAGE_BYTES = 4096.0


# Context.memo key of the plan's ThreadScales (replay/threads.py), None without a probe; and
# of why not.
ONE_THREAD = "one_thread"
ONE_THREAD_WHY = "one_thread_why"


def _torch_threads(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
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


NO_PROBE = ("the trace has no steps timed at one intra-op thread (stallscope run times them "
            "before recording a CPU run of one process with 2+ threads)")


def _pin_memory(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only pin_memory=true is replayed")
    ops = _gpu_named(g, _HTOD_PAGEABLE)
    if not ops.any():
        if _h2d_calls(g).any():  # already pinned: nothing to change, non_blocking may follow
            return g, ["host-to-device copies already come from pinned memory"]
        raise NotModelled("no host-to-device copy in the steps")
    rate, how = _pinned_rate(g, ctx.model)
    g = g.copy()
    g.g_dur[ops] = np.nan_to_num(g.g_bytes[ops], nan=0.0) / (rate * 1e3)
    notes = [f"HtoD copies run at {rate:.1f} GB/s from pinned memory ({how})"]
    in_process = ctx.facts.workers_now(ctx.model.loader_kind) == 0
    loads = np.flatnonzero(g.h_kind == LOADER)
    if in_process and len(loads) and "num_workers" not in ctx.applied:
        per_batch = _h2d_bytes_per_step(ctx.model) * g.steps / len(loads)
        g.h_dur[loads] += per_batch / (PIN_GBPS * 1e3)
        notes.append(f"without workers the training process copies each batch into pinned "
                     f"memory itself, at an assumed {PIN_GBPS:.0f} GB/s")
    return g, notes


def _non_blocking(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only non_blocking=true is replayed")
    pinned = "pin_memory" in ctx.applied or not _gpu_named(g, _HTOD_PAGEABLE).any()
    if not pinned:
        raise NotModelled("non_blocking=True does not overlap a copy from pageable memory: "
                          "CUDA copies it synchronously (add pin_memory=true)")
    calls = _h2d_calls(g)
    if not calls.any():
        raise NotModelled("no host-to-device copy calls in the steps")
    g = g.copy()
    follow = _followers(g, calls, SYNC_CALLS)
    tf.unblock(g, calls | follow)
    return g, ["the host no longer waits for host-to-device copies (or the stream sync after "
               "them): it queues them and goes on"]


def _sync_off(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in ("off", "false", "none"):
        raise NotModelled("only sync=off is replayed")
    is_sync = g.host_named(lambda n: n in SYNC_CALLS) & (g.h_kind == CALL)
    dtoh = _calls_launching(g, _gpu_named(g, _DTOH))
    waits = (is_sync | dtoh) & (g.h_wait >= 0)
    own = _followers(g, _h2d_calls(g), SYNC_CALLS) & waits  # a copy's own sync: non_blocking's
    waits &= ~own
    if not waits.any():
        if own.any():
            raise NotModelled("its waits are the stream syncs right after host-to-device "
                              "copies (copy_ with non_blocking=False): non_blocking=true with "
                              "pinned memory removes them, not moving .item() out of the loop")
        raise NotModelled("no host wait on the GPU in the steps that moving .item()/.cpu() "
                          "out of the loop would remove")
    g = g.copy()
    tf.unblock(g, waits)
    return g, [f"{int(waits.sum())} host wait(s) on the GPU (stream/device syncs, "
               "device-to-host copies) no longer block the step: the values are read every "
               "N steps instead"]


def _amp(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in AMP_SPEEDUP:
        raise NotModelled(f"amp takes {', '.join(AMP_SPEEDUP)}")
    if not ctx.model.has_gpu:
        raise NotModelled("the trace has no GPU work")
    major = max(ctx.model.compute_major.values(), default=None)
    if major is None or major < 7:
        raise NotModelled("no tensor cores on this GPU (compute capability below 7.0, or "
                          "unknown)")
    if value in ("bf16", "tf32") and major < 8:
        raise NotModelled(f"{value} needs compute capability 8.0 (Ampere) or later; use fp16 "
                          "with a GradScaler")
    fp32 = ctx.once("fp32", lambda: (classify_kernels(pd.Series(g.g_names, dtype=object))
                                     .to_numpy() == "fp32")[g.g_name] & (g.g_kind == "kernel"))
    if not fp32.any():
        raise NotModelled("no fp32 GEMM/convolution kernels in the steps")
    g = g.copy()
    speed = AMP_SPEEDUP[value]
    tf.scale_gpu(g, fp32, 1.0 / speed)
    return g, [f"fp32 GEMM/convolution kernels run {speed:g}x faster on tensor cores "
               f"({value}; an assumption from peak ratios, see docs/replay.md)"]


def _optimizer(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in OPTIMIZER_HOST_LEFT:
        raise NotModelled(f"optimizer takes {', '.join(OPTIMIZER_HOST_LEFT)}")
    ops = ctx.model.ops
    nodes = ctx.once("optimizer", lambda: tf.within(
        g, ops[name_matches(ops["name"], OPTIMIZER_STEP)]))
    if not nodes.any():
        raise NotModelled("no optimizer.step() in the steps")
    kernels = ctx.once("optimizer kernels",
                       lambda: tf.launched_by(g, nodes) & (g.g_kind == "kernel"))
    g = g.copy()
    if not ctx.model.has_gpu:
        left = OPTIMIZER_HOST_LEFT_CPU[value]
        tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), left)
        return g, [f"the optimizer step keeps {left:.0%} of its time on the CPU ({value}; "
                   "measured against a for-loop Adam on small tensors, see docs/replay.md)"]
    left = OPTIMIZER_HOST_LEFT[value]
    tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), left)
    g.g_dur[kernels] = np.maximum(g.g_dur[kernels] - PER_KERNEL_GPU_US, 0.1 * g.g_dur[kernels])
    return g, [f"the optimizer step keeps {left:.0%} of its host time and each of its kernels "
               f"loses {PER_KERNEL_GPU_US:g} us of fixed cost ({value}; an assumption, see "
               "docs/replay.md)"]


def _zero_grad(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in ("none", "set_to_none"):
        raise NotModelled("only zero_grad=none is replayed")
    ops = ctx.model.ops
    nodes = ctx.once("zero_grad", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: n.startswith(ZERO_GRAD)).astype(bool)]))
    launched = ctx.once("zero_grad kernels", lambda: tf.launched_by(g, nodes))
    if not launched.any():
        raise NotModelled("zero_grad() launches no kernels in the steps")
    g = g.copy()
    tf.remove_gpu(g, launched)
    tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), ZERO_GRAD_HOST_LEFT)
    return g, [f"zero_grad() launches nothing and keeps {ZERO_GRAD_HOST_LEFT:.0%} of its host "
               "time: gradients are set to None, not filled with zeros"]


def _cuda_graphs(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only cuda_graphs=true is replayed")
    if not len(g.g_ts):
        raise NotModelled("no GPU work to capture")
    in_steps = (g.h_ts >= g.h_ts[g.step_start[0]]) & (g.h_ts < g.h_ts[g.step_end[-1]])
    keep = (g.h_kind == LOADER) | _h2d_calls(g) | (g.h_wait >= 0)
    nodes = in_steps & ((g.h_kind == FILL) | (g.h_kind == CALL)) & ~keep
    g = g.copy()
    tf.scale_host(g, nodes, GRAPH_HOST_LEFT)
    tf.tighten_streams(g, tf.launched_by(g, nodes), GRAPH_KERNEL_GAP_US)
    return g, [f"one graph launch replaces the step's launches: {GRAPH_HOST_LEFT:.0%} of the "
               f"host time between them is left and kernels follow each other within "
               f"{GRAPH_KERNEL_GAP_US:g} us (needs static shapes and no host syncs inside "
               "the captured region)"]


def _allocator(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    calls = g.host_named(lambda n: bool(ALLOC_CALL.match(n) or FREE_CALL.match(n))) & (
        g.h_kind == CALL)
    if not calls.any():
        raise NotModelled("no cudaMalloc/cudaFree calls in the steps")
    g = g.copy()
    tf.unblock(g, calls)
    g.h_dur[calls] = 0.0
    return g, ["cudaMalloc/cudaFree (and the device syncs cudaFree implies) leave the steps: "
               "the caching allocator keeps its blocks"]


def _comm(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    comm = g.gpu_named(lambda n: bool(COMM_NAME.search(n))) & (g.g_kind == "kernel")
    if not comm.any():
        raise NotModelled("no collective (NCCL/RCCL) kernels in the steps; CPU collectives "
                          "(gloo/MPI) are not modelled")
    kinds = ctx.once("comm kinds", lambda: _graph_kinds(g, ctx.model))
    bucketed = comm & np.isin(kinds, BUCKETED)
    prefetched = comm & np.isin(kinds, PREFETCHED)
    if not (bucketed | prefetched).any():
        raise NotModelled("the step's collectives are all-to-all or send/recv, whose output the "
                          "next op needs at once: overlap within the step cannot hide them")
    ops = ctx.model.ops
    back = ctx.once("backward", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: n.startswith(BACKWARD)).astype(bool)]))
    calls = ctx.once("collective calls", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: bool(COLLECTIVE_CALL.match(n))).astype(bool)]))
    hide = tf.launched_by(g, back & ~calls) & (g.g_kind == "kernel") & ~comm
    wait = ctx.once("peer wait", lambda: _peer_wait(g, comm, kinds))
    before = replay(g)
    g = g.copy()
    # The stepping thread resumes when the thread that issued the collectives is done (a join
    # the graph's 1 ms release window misses when the hand-back took longer), with the slack
    # it had before this change: what the change takes off that thread reaches the step.
    tf.join_after(g, calls, before.host_start, before.host_end)
    moved = tf.overlap_collectives(g, bucketed, prefetched, hide, wait, BUCKET_US)
    host = calls & ((g.h_kind == FILL) | (g.h_kind == CALL)) & (g.h_wait < 0)
    tf.scale_host(g, host, 0.0)
    notes = [
        f"{moved} collective(s) start as soon as their inputs are ready: gradient all-reduce "
        "and reduce-scatter sent in buckets (DDP's default 25 MB, taken as "
        f"{BUCKET_US / 1000:g} ms each: 25 GB/s assumed) as backward produces their gradients "
        "(in proportion to their transfer time), all-gathers one ahead (FSDP prefetch); none "
        "starts before the compute it follows, and the optimizer still waits for the last",
        "the per-collective host calls (c10d/nccl ranges) leave the step: DDP and FSDP issue "
        "one call per bucket from C++ hooks (their cost is neglected)",
    ]
    if wait.any():
        notes.append(f"{ms(float(wait.sum()) / max(g.steps, 1))} ms per step of waiting on "
                     "peers (collective time beyond the same collective's median step) stays "
                     "on the step's last collective: overlap does not remove it")
    return g, notes


# Collective kernels by kind (comm.py's names): those DDP buckets during backward, those FSDP
# prefetches; the rest (send/recv, all-to-all) are not moved.
BUCKETED = ("AllReduce", "ReduceScatter")
PREFETCHED = ("AllGather",)
BACKWARD = "autograd::engine::evaluate_function"
# One DDP bucket's transfer: the default 25 MB at an assumed 25 GB/s (a 200 Gb/s InfiniBand
# link per GPU, the slower side of a multi-node all-reduce; NVLink is faster). An assumption
# from the vendors' link rates: the trace's decoded table has no message sizes to measure it.
BUCKET_US = 1000.0
# Host ranges that issue a collective (what DDP's reducer replaces with one call per bucket).
COLLECTIVE_CALL = re.compile(r"^(?:c10d::|nccl:|rccl:|record_param_comms)")


def _peer_wait(g: Graph, comm: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Per GPU op, the time a collective waited for slower ranks (comm.peer_excess)."""
    out = np.zeros(len(g.g_ts))
    out[comm] = peer_excess(g.g_stream[comm].astype(float), g.g_step[comm], g.g_ts[comm],
                            g.g_dur[comm], kinds[comm])
    return out


def _graph_kinds(g: Graph, model: TraceModel) -> np.ndarray:
    """Per GPU op, its collective: the one its launch's `nccl:<op>` host range names
    (comm.host_kinds), else the kernel name's, else ""."""
    kinds = np.array([_collective_kind(n) for n in g.g_names], dtype=object)[g.g_name]
    named = host_kinds(model)
    has = named != ""
    if has.any():
        gpu = model.gpu
        key = dict(zip(zip(gpu["device"].astype(str).to_numpy(dtype=object)[has].tolist(),
                           gpu["ts"].to_numpy(dtype=float)[has].tolist(), strict=True),
                       named[has].tolist(), strict=True))
        found = [key.get(k, "") for k in zip(g.g_device.tolist(), g.g_ts.tolist(), strict=True)]
        kinds = np.where(np.array(found, dtype=object) != "", np.array(found, dtype=object),
                         kinds)
    return kinds


def _collective_kind(name: str) -> str:
    m = COLLECTIVE.search(name)
    return m.group(1) if m else ""


def _h2d_bytes_per_step(model: TraceModel) -> float:
    c = model.copies
    h2d = c[(c["direction"] == "HtoD") & (c["step"] >= 0)]
    return float(h2d["bytes"].sum()) / max(len(model.steps), 1)


def _gpu_named(g: Graph, pattern: re.Pattern[str]) -> np.ndarray:
    return g.gpu_named(lambda n: bool(pattern.match(n))) & (g.g_step >= 0)


def _calls_launching(g: Graph, ops: np.ndarray) -> np.ndarray:
    out = np.zeros(len(g.h_ts), dtype=bool)
    launch = g.g_launch[ops & (g.g_launch >= 0)]
    out[launch] = True
    return out


def _h2d_calls(g: Graph) -> np.ndarray:
    return _calls_launching(g, g.gpu_named(lambda n: n.startswith("Memcpy HtoD")))


def _followers(g: Graph, calls: np.ndarray, names: frozenset[str]) -> np.ndarray:
    """Calls named in `names` that come next on the same thread within FOLLOW_US of a selected
    call (the stream sync `copy_` issues after a blocking copy)."""
    out = np.zeros(len(g.h_ts), dtype=bool)
    every = np.flatnonzero(g.h_kind == CALL)
    chosen = np.flatnonzero(calls & (g.h_kind == CALL))
    k = np.searchsorted(every, chosen) + 1
    ok = k < len(every)
    c, nxt = chosen[ok], every[k[ok]]
    named = g.host_named(lambda n: n in names)
    follow = ((g.h_thread[nxt] == g.h_thread[c]) & named[nxt]
              & (g.h_ts[nxt] - g.h_rec_end[c] <= FOLLOW_US))
    out[nxt[follow]] = True
    return out


def _pinned_rate(g: Graph, model: TraceModel) -> tuple[float, str]:
    """GB/s of pinned HtoD copies measured in this trace, else the default for the GPU."""
    pinned = _gpu_named(g, _HTOD_PINNED) & (g.g_bytes >= _MIN_RATE_BYTES) & (g.g_dur > 0)
    if pinned.sum() >= 2:
        rate = float(np.median(g.g_bytes[pinned] / g.g_dur[pinned])) / 1e3
        return rate, f"measured on this trace's {int(pinned.sum())} pinned copies"
    major = max(model.compute_major.values(), default=7)
    rate = PINNED_GBPS.get(major, PINNED_GBPS[7])
    return rate, f"the default for compute capability {major}.x; no pinned copy to measure"


def _is_whole(text: str, lo: int = 1) -> bool:
    return text.isdigit() and int(text) >= lo


# key -> (fix, value check, what values it takes)
WHAT_IF: dict[str, tuple[Fix, Callable[[str], bool], str]] = {
    "num_workers": (_num_workers, _is_whole, "a whole number >= 1"),
    "torch_threads": (_torch_threads, _is_whole, "a whole number >= 1"),
    "pin_memory": (_pin_memory, lambda v: v == "true", "true"),
    "non_blocking": (_non_blocking, lambda v: v == "true", "true"),
    "amp": (_amp, lambda v: v in AMP_SPEEDUP, "bf16, fp16 or tf32"),
    "sync": (_sync_off, lambda v: v == "off", "off"),
    "optimizer": (_optimizer, lambda v: v in OPTIMIZER_HOST_LEFT, "foreach or fused"),
    "zero_grad": (_zero_grad, lambda v: v == "none", "none"),
    "cuda_graphs": (_cuda_graphs, lambda v: v == "true", "true"),
    "allocator": (_allocator, lambda v: v == "steady", "steady"),
    "comm": (_comm, lambda v: v == "overlap", "overlap"),
}


def no_change_reason(finding: Any, model: TraceModel) -> str:
    """Why `changes_for` gave nothing for this finding, in the report's words."""
    if finding.id == "comm-bound":
        ev = finding.evidence or {}
        if ev.get("where") == "host":
            return "the replay models GPU collectives only, not CPU (gloo/MPI) ones"
        return (f"its advice for {ev.get('pattern')} communication (pipelining it across "
                "batches or stages) is not a change the replay models: overlap within the step "
                "cannot hide a collective whose output the next op needs")
    if finding.id == "dataloader-bound":
        ev = finding.evidence or {}
        if "suggested_prefetch_factor" in ev:
            return "the replay does not model prefetch_factor (how many batches are in flight)"
        if ev.get("background_thread"):
            return "the replay does not model a thread that receives batches during the step"
        return ("the rule could not size a worker count (the loader already has workers and "
                "the trace does not say how many, or the cores are already busy)")
    return "its change is not one the replay can model"


def has_probe(model: TraceModel) -> bool:
    """Whether `run` timed steps at one intra-op thread before recording this trace."""
    return OneThread.of(model) is not None


def changes_for(finding: Any, model: TraceModel) -> list[Change]:
    """The change a finding recommends, in what-if terms; [] when it has none to replay."""
    ev = finding.evidence or {}
    fid = finding.id
    if fid == "no-mixed-precision":
        major = max(model.compute_major.values(), default=8)
        return [Change("amp", "bf16" if major >= 8 else "fp16")]
    if fid == "dataloader-bound":
        n = ev.get("suggested_num_workers")
        if not isinstance(n, int) or n <= 0:
            return []
        # The workers and the step's threads as one change, where the one-thread steps were
        # timed; else the workers alone (their prediction then keeps the step's threads).
        threads = ev.get("suggested_torch_threads")
        one = [Change("torch_threads", "1")] if threads == 1 and has_probe(model) else []
        return [*one, Change("num_workers", str(int(n)))]
    if fid == "cpu-oversubscription":
        n = ev.get("suggested_torch_threads")
        return [Change("torch_threads", str(int(n)))] if isinstance(n, int) and n > 0 else []
    if fid == "comm-bound" and (ev.get("where") == "host"
                                or ev.get("pattern") in ("all-to-all", "send-recv")):
        return []  # see no_change_reason
    if fid in ("pageable-h2d-copy", "blocking-h2d-copy"):
        c = model.copies
        pageable = ((c["direction"] == "HtoD") & (c["src"] == "Pageable")).any()
        return ([Change("pin_memory", "true")] if pageable else []) + [
            Change("non_blocking", "true")]
    return {
        "host-device-sync": [Change("sync", "off")],
        "single-tensor-optimizer": [Change("optimizer", "foreach")],
        "zero-grad-kernels": [Change("zero_grad", "none")],
        "allocator-churn": [Change("allocator", "steady")],
        "comm-bound": [Change("comm", "overlap")],
    }.get(fid, [])
