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

from stallscope.diagnose.common import COMM_NAME, ms
from stallscope.diagnose.registry import what_if_keys
from stallscope.diagnose.rules.allocator_churn import ALLOC_CALL, FREE_CALL
from stallscope.diagnose.rules.comm_bound import COLLECTIVE, host_kinds, peer_excess
from stallscope.diagnose.rules.no_mixed_precision import (
    AMP_MEMORY,
    AMP_VALUES,
    AUTOCAST_CASTS,
    CUDNN_BATCH_NORM_AMP,
    ELEMENTWISE,
    LAYOUT,
    NORM,
    PEAK_TFLOPS,
    POOLING,
    REDUCTION,
    SIMT_ATTAINED,
    SOFTMAX,
    TF32_ATTAINED,
    amp_scale,
    device_major,
    kernel_class,
)
from stallscope.diagnose.rules.single_tensor_optimizer import STEP_NAME as OPTIMIZER_STEP
from stallscope.diagnose.rules.zero_grad_kernels import ZERO_GRAD
from stallscope.diagnose.spec import Change
from stallscope.errors import StallscopeError
from stallscope.replay import transforms as tf
from stallscope.replay.engine import replay
from stallscope.replay.graph import CALL, FILL, LOADER, Graph
from stallscope.replay.loader import LoaderFacts, NotModelled, with_workers
from stallscope.replay.threads import one_thread
from stallscope.text import plural
from stallscope.trace.model import SYNC_CALLS, TraceModel
from stallscope.trace.names import name_matches, per_name
from stallscope.units import millis

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
        keys = what_if_keys()
        spec = WHAT_IF.get(key) if key in keys else None
        if spec is None:
            raise StallscopeError(f"--what-if {item!r}: unknown change {key!r}; one of "
                                  f"{', '.join(keys)}")
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
    _block_on_own_copy(g, ops)
    notes.append("the host still waits for each copy (copy_ without non_blocking syncs its "
                 "stream): it queues the copy, then waits for the work queued before it and "
                 "the copy itself, no longer for a staging memcpy at the pageable rate")
    in_process = ctx.facts.workers_now(ctx.model.loader_kind) == 0
    loads = np.flatnonzero(g.h_kind == LOADER)
    if in_process and len(loads) and "num_workers" not in ctx.applied:
        per_batch = _h2d_bytes_per_step(ctx.model) * g.steps / len(loads)
        g.h_dur[loads] += per_batch / (PIN_GBPS * 1e3)
        notes.append(f"without workers the training process copies each batch into pinned "
                     f"memory itself, at an assumed {PIN_GBPS:.0f} GB/s")
    return g, notes


# A host thread returns this long after the GPU work it waited for ends (a stream sync's
# wake-up): the median return of the waits the graph finds was 5.9-7.5 us in the three H200
# w8-item-every-step recordings, 10.0 us in H200 r4's and 7.4 us in H100 r1's w8-pinned-blocking
# (replay/graph.py's RETURN_US bounds what counts as a wait at all).
OWN_COPY_RETURN_US = 8.0


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
    return g, [f"{plural(int(waits.sum()), 'host wait')} on the GPU (stream/device syncs, "
               "device-to-host copies) no longer block the step: the values are read every "
               "N steps instead"]


def _amp(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in AMP_VALUES:
        raise NotModelled(f"amp takes {', '.join(AMP_VALUES)}")
    if not ctx.model.has_gpu:
        raise NotModelled("the trace has no GPU work")
    major, source = ctx.once("device major", lambda: device_major(ctx.model))
    if major is None:
        raise NotModelled(
            "ROCm (AMD) trace: its matrix cores and kernel names are not modelled"
            if source == "ROCm" else
            "the GPU's generation is unknown: no deviceProperties and no architecture "
            "(sm70_/sm80_/sm90_, volta_/ampere_/hopper_) in the kernel names")
    if major < 7:
        raise NotModelled(f"compute capability {major}.x has no tensor cores: mixed precision "
                          "would not move GEMM/convolution onto them")
    if value in ("bf16", "tf32") and major < 8:
        raise NotModelled(f"{value} needs compute capability 8.0 (Ampere) or later; use fp16 "
                          "with a GradScaler")
    factor = amp_scale(g.g_names, major, value)[g.g_name]
    changed = (g.g_kind == "kernel") & (g.g_step >= 0) & (factor != 1.0)
    if not changed.any():
        raise NotModelled(f"no kernel in the steps that {value} would change (no fp32 "
                          "GEMM/convolution, no fp32 memory-bound kernel)")
    g = g.copy()
    tf.scale_gpu(g, changed, factor[changed])
    sku = {7: "V100", 8: "A100", 9: "H100 SXM"}[min(major, 9)] + (
        " (a later GPU takes its ratios)" if major > 9 else "")
    peak = PEAK_TFLOPS[min(major, 9)]
    rates = ", ".join(f"{k} {v:g}" for k, v in peak.items())
    attained = SIMT_ATTAINED["tf32" if value == "tf32" else "half"]
    notes = [f"device: compute capability {major}.x (from {source}); GEMM/convolution kernels "
             f"sped up by the {sku} peak-rate ratio ({rates} TFLOPS dense) times what such "
             f"kernels attained on measured pairs ({attained:g} of it from fp32 SIMT, "
             f"{TF32_ATTAINED:g} from TF32; docs/replay.md)"]
    if value == "tf32":
        notes.append("TF32 keeps fp32 storage: memory-bound kernels unchanged")
    else:
        notes.append(f"autocast's casts of the GEMM/convolution operands add {AUTOCAST_CASTS:.0%} "
                     "of their reduced-precision time (measured 51-70%); memory-bound kernels "
                     f"by the bytes they move: elementwise {AMP_MEMORY[ELEMENTWISE]:g} of their "
                     f"time, layout copies {AMP_MEMORY[LAYOUT]:g}, cuDNN batch norm "
                     f"{CUDNN_BATCH_NORM_AMP:g}x slower (ATen's mixed-precision kernels), other "
                     "norms, softmax, losses and the optimizer unchanged (autocast keeps them in "
                     "fp32); all measured, docs/replay.md")
        notes.append("autocast's casts on the host are not modelled (on the measured CNN 25 "
                     "more aten::to and 12 ToCopyBackward0 per step)")
    return g, notes


# torch.compile (inductor), as measured on the compile pairs (sample_traces/real-h200-r1-w8 and
# real-h100-r2-w8 -> w8-compile, a small CNN, torch 2.11): GEMM/conv kernels unchanged (1.08-1.10x
# their time: cuDNN's kernels for channels_last), the optimizer and the loss (outside the
# compiled module) unchanged, and the memory-bound kernels between the convolutions, 5.1-5.6 ms
# per step in 120 kernels (cuDNN batch norm, ReLU, NCHW<->NHWC transposes), became 1.2-1.5 ms
# in 111 Triton and cuDNN kernels: 0.23 and 0.27 of their time. The host did not gain: 165
# launches per step against 171 (inductor splits each batch norm into a statistics kernel and a
# pointwise one) and host time per step unprofiled +0.3 and +3.7 ms (its wrappers: guards,
# AOTAutograd), so the model keeps the host and the launches as recorded.
#
# The model: each chain of memory-bound kernels on a stream (tf.chains; loss kernels and the
# optimizer's left out, as both pairs kept them outside the compiled module) is fused. Bytes, in
# units of the chain's activation tensor (an assumption: every kernel of the chain reads one
# such tensor and writes one): an eager kernel reads and writes (2 units), a norm or softmax
# reads twice (statistics, then normalise) and writes (3); the fused chain reads its input once
# and writes its output once (2), plus one more read per norm/softmax/reduction; NCHW<->NHWC
# transposes vanish (inductor keeps the activations channels_last, the layout cuDNN wants). The
# chain's time scales by fused/eager bytes over COMPILE_BANDWIDTH_GAIN, what Triton's kernels
# attain over the eager ones: 1.0 (the bytes alone give 0.285 and 0.271 of the time on the two
# pairs, measured 0.229 and 0.269: no factor is needed to fit them, and none is claimed). On the
# transformer pair (real-h200-xfmr-fp32 -> compile: GELU, dropout, residual add, layer norm and
# softmax chains) the model gives 0.49 of the chained time, measured 0.61; its kernels 31.0 ->
# 29.2 ms per step predicted, 29.5 recorded.
COMPILE_UNITS = {ELEMENTWISE: 2.0, POOLING: 2.0, REDUCTION: 2.0, LAYOUT: 2.0, NORM: 3.0,
                 SOFTMAX: 3.0}
COMPILE_BANDWIDTH_GAIN = 1.0
_TRANSPOSE = re.compile(r"nchwToNhwc|nhwcToNchw", re.IGNORECASE)
# Loss kernels: the loss is usually computed outside the compiled module (both measured pairs).
_LOSS = re.compile(r"nll_loss|cross_entropy|mse_loss|mse_kernel|smooth_l1|bce|binary_cross",
                   re.IGNORECASE)


@dataclass(frozen=True)
class CompileEstimate:
    """What compile=true changes in a graph's steps: chains of memory-bound kernels fused."""

    chain: np.ndarray  # per GPU op, its chain (-1: not fused)
    factor: np.ndarray  # per chain, its time after over before
    before_us: float  # the chained kernels' time per step, eager
    after_us: float  # ...and fused
    kernels: float  # kernels per step in the chains
    chains: float  # chains per step


def compile_estimate(g: Graph, model: TraceModel) -> CompileEstimate | None:
    """The compile model on a graph (see COMPILE_UNITS); None when nothing in the steps fuses
    or they already run compiled code. Callable by rules that want to know what torch.compile
    would take off the GPU (`before_us - after_us` per step)."""
    if any(n.startswith("triton_") for n in g.g_names):
        return None  # already compiled
    cls = np.array([kernel_class(n) for n in g.g_names], dtype=object)[g.g_name]
    loss = g.gpu_named(lambda name: bool(_LOSS.search(name)))
    units = np.where(loss, 0.0, np.array([COMPILE_UNITS.get(c, 0.0) for c in cls]))
    ops = model.ops
    nodes = tf.within(g, ops[name_matches(ops["name"], OPTIMIZER_STEP)
                             | per_name(ops["name"], _is_zero_grad).to_numpy(dtype=bool)])
    outside = tf.launched_by(g, nodes)  # the optimizer's and zero_grad's kernels
    member = (g.g_kind == "kernel") & (g.g_step >= 0) & (units > 0) & ~outside
    chain = tf.chains(g, member)
    n = int(chain.max()) + 1
    if n == 0:
        return None
    rows = chain >= 0
    c = chain[rows]
    transpose = g.gpu_named(lambda name: bool(_TRANSPOSE.search(name)))[rows]
    stats = np.isin(cls[rows], [NORM, REDUCTION, SOFTMAX])
    eager = np.bincount(c, weights=units[rows], minlength=n)
    kept = np.bincount(c, weights=~transpose, minlength=n) > 0  # only transposes: all gone
    n_stats = np.bincount(c, weights=stats, minlength=n)
    fused = np.where(kept, 2.0 + n_stats, 0.0)
    factor = np.minimum(fused / eager / COMPILE_BANDWIDTH_GAIN, 1.0)
    dur = g.g_dur[rows]
    before = float(dur.sum())
    after = float((dur * factor[c]).sum())
    return CompileEstimate(chain, factor, before / g.steps, after / g.steps, len(c) / g.steps,
                           n / g.steps)


def _is_zero_grad(name: str) -> bool:
    return name.startswith(ZERO_GRAD)


def _compile(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only compile=true is replayed")
    if not ctx.model.has_gpu:
        raise NotModelled("the compile model is of GPU kernels; the trace has none")
    if any(n.startswith("triton_") for n in g.g_names):
        raise NotModelled("the steps already run torch.compile's Triton kernels")
    est = ctx.once("compile", lambda: compile_estimate(g, ctx.model))
    if est is None:
        raise NotModelled("no memory-bound kernels between the GEMM/convolution kernels to fuse")
    g = g.copy()
    rows = est.chain >= 0
    tf.scale_gpu(g, rows, est.factor[est.chain[rows]])
    return g, [
        f"torch.compile fuses each run of memory-bound kernels between GEMM/convolution "
        f"kernels ({est.chains:.0f} runs, {est.kernels:.0f} kernels per step): "
        f"{est.before_us / 1000:.2f} -> {est.after_us / 1000:.2f} ms per step, by the bytes no "
        "longer written and read back (one activation tensor in and one out per run, one more "
        "read per norm's statistics; NCHW<->NHWC transposes gone); GEMM/conv, optimizer and "
        "loss kernels unchanged",
        "the host keeps its time and launches: on the measured pairs compiled code launched as "
        "many kernels and ran as long on the host as eager ops did (needs a model dynamo "
        "traces without graph breaks; compilation is paid once, before these steps)",
    ]


def _optimizer(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in OPTIMIZER_HOST_LEFT:
        raise NotModelled(f"optimizer takes {', '.join(OPTIMIZER_HOST_LEFT)}")
    nodes = _optimizer_nodes(g, ctx)
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
    nodes = _zero_grad_nodes(g, ctx)
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
    # What torch.compile(model, mode="reduce-overhead") or make_graphed_callables(model)
    # captures is the model's forward and backward: the loader, the input copies, host waits,
    # the optimizer step and zero_grad stay as they are (the H200 r5 hostbound-graphs
    # recording kept Adam.step's 1.6 ms of host time per step).
    outside = _optimizer_nodes(g, ctx) | _zero_grad_nodes(g, ctx)
    keep = (g.h_kind == LOADER) | _h2d_calls(g) | (g.h_wait >= 0) | outside
    nodes = in_steps & ((g.h_kind == FILL) | (g.h_kind == CALL)) & ~keep
    g = g.copy()
    tf.scale_host(g, nodes, GRAPH_HOST_LEFT)
    tf.tighten_streams(g, tf.launched_by(g, nodes), GRAPH_KERNEL_GAP_US)
    return g, [f"the model's forward and backward replay as CUDA graphs: {GRAPH_HOST_LEFT:.0%} "
               f"of the host time between their launches is left and their kernels follow "
               f"each other within {GRAPH_KERNEL_GAP_US:g} us; the optimizer step, zero_grad, "
               "the loader and the input copies keep their time (needs static shapes and no "
               "host syncs inside the captured region)"]


def _optimizer_nodes(g: Graph, ctx: Context) -> np.ndarray:
    ops = ctx.model.ops
    return ctx.once("optimizer", lambda: tf.within(
        g, ops[name_matches(ops["name"], OPTIMIZER_STEP)]))


def _zero_grad_nodes(g: Graph, ctx: Context) -> np.ndarray:
    ops = ctx.model.ops
    return ctx.once("zero_grad", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: n.startswith(ZERO_GRAD)).astype(bool)]))


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
        f"{plural(moved, 'collective')} start as soon as their inputs are ready: gradient "
        "all-reduce "
        "and reduce-scatter sent in buckets (DDP's default 25 MB, taken as "
        f"{BUCKET_US / 1000:g} ms each: 25 GB/s assumed) as backward produces their gradients "
        "(in proportion to their transfer time), all-gathers one ahead (FSDP prefetch); none "
        "starts before the compute it follows, and the optimizer still waits for the last",
        "the per-collective host calls (c10d/nccl ranges) leave the step: DDP and FSDP issue "
        "one call per bucket from C++ hooks (their cost is neglected)",
    ]
    if wait.any():
        notes.append(f"{millis(ms(float(wait.sum()) / max(g.steps, 1)))} ms per step of waiting on "
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


# key -> (fix, value check, what values it takes): the replay model of each --what-if key the
# rules declare (diagnose/registry.py's what_if_keys; tests/test_registry.py keeps them equal).
WHAT_IF: dict[str, tuple[Fix, Callable[[str], bool], str]] = {
    "num_workers": (_num_workers, _is_whole, "a whole number >= 1"),
    "torch_threads": (_torch_threads, _is_whole, "a whole number >= 1"),
    "pin_memory": (_pin_memory, lambda v: v == "true", "true"),
    "non_blocking": (_non_blocking, lambda v: v == "true", "true"),
    "amp": (_amp, lambda v: v in AMP_VALUES, "bf16, fp16 or tf32"),
    "sync": (_sync_off, lambda v: v == "off", "off"),
    "optimizer": (_optimizer, lambda v: v in OPTIMIZER_HOST_LEFT, "foreach or fused"),
    "zero_grad": (_zero_grad, lambda v: v == "none", "none"),
    "cuda_graphs": (_cuda_graphs, lambda v: v == "true", "true"),
    "compile": (_compile, lambda v: v == "true", "true"),
    "allocator": (_allocator, lambda v: v == "steady", "steady"),
    "comm": (_comm, lambda v: v == "overlap", "overlap"),
}
