"""gpu-bound's change, `compile=true`: torch.compile's fusion of the memory-bound kernels between
GEMM/convolution kernels (`compile_estimate`, which the rule's advice may read too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.graph import Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import Context, Model, is_zero_grad
from stallscope.trace.kernels import (
    ELEMENTWISE,
    LAYOUT,
    NORM,
    POOLING,
    REDUCTION,
    SOFTMAX,
    kernel_class,
)
from stallscope.trace.model import TraceModel
from stallscope.trace.names import OPTIMIZER_STEP, name_matches, per_name
from stallscope.units import ms

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
                             | per_name(ops["name"], is_zero_grad).to_numpy(dtype=bool)])
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


def compile_change(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only compile=true is replayed")
    if not ctx.model.has_gpu:
        raise NotModelled("the compile model is of GPU kernels; the trace has none")
    if any(n.startswith("triton_") for n in g.g_names):
        raise NotModelled("the steps already run torch.compile's Triton kernels")
    est = ctx.once("compile", lambda: compile_estimate(g, ctx.model))
    if est is None:
        raise NotModelled("no memory-bound kernels between the GEMM/convolution kernels to fuse")
    g = g.copy(*tf.SCALES_GPU)
    rows = est.chain >= 0
    tf.scale_gpu(g, rows, est.factor[est.chain[rows]])
    return g, [
        f"torch.compile fuses each run of memory-bound kernels between GEMM/convolution "
        f"kernels ({est.chains:.0f} runs, {est.kernels:.0f} kernels per step): "
        f"{ms(est.before_us, 'hundredths')} -> {ms(est.after_us, 'hundredths')} ms per step, by "
        "the bytes no "
        "longer written and read back (one activation tensor in and one out per run, one more "
        "read per norm's statistics; NCHW<->NHWC transposes gone); GEMM/conv, optimizer and "
        "loss kernels unchanged",
        "the host keeps its time and launches: on the measured pairs compiled code launched as "
        "many kernels and ran as long on the host as eager ops did (needs a model dynamo "
        "traces without graph breaks; compilation is paid once, before these steps)",
    ]


MODELS = {"compile": Model(compile_change, lambda v: v == "true", "true")}
