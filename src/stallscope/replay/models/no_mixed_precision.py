"""no-mixed-precision's change, `amp=bf16|fp16|tf32`: each kernel's time after a move to that
precision on the trace's GPU generation (`amp_factor`, which the rule's saving share reads too),
from the vendors' peak rates and what such kernels attained on recorded pairs (docs/replay.md).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.graph import Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import Context, Model
from stallscope.trace.kernels import (
    ELEMENTWISE,
    GEMM_FP32,
    GEMM_TF32,
    LAYOUT,
    NORM,
    OPTIMIZER,
    POOLING,
    REDUCTION,
    SOFTMAX,
    device_major,
    kernel_class,
)
from stallscope.units import percent

# Dense peak rates (TFLOPS) from the vendors' data sheets; each compute capability major stands for
# the one SKU the model names in its assumptions (docs/replay.md, "Mixed precision and TF32"). Other
# SKUs of a major have other rates but similar ratios; a later major takes sm90's ratios.
PEAK_TFLOPS: dict[int, dict[str, float]] = {
    7: {"fp32": 15.7, "half": 125.0},
    8: {"fp32": 19.5, "tf32": 156.0, "half": 312.0},
    9: {"fp32": 67.0, "tf32": 495.0, "half": 989.0},
}
# The share of the peak ratio that GEMM/conv kernels attain when they move precision, measured
# on the committed GPU pairs: fp32 SIMT -> tensor cores on the transformer pair
# (sample_traces/real-h200-xfmr-*), TF32 -> bf16 on the CNN pairs (real-*-w8 -> w8-bf16, where
# cuDNN already runs its convolutions in TF32) (docs/performance.md, "Figures behind the code").
SIMT_ATTAINED = {"half": 0.87, "tf32": 0.71}
TF32_ATTAINED = 1.0
# Autocast casts each GEMM/conv operand that is not yet bf16/fp16 (weights every forward, fp32
# activations) in a kernel of its own before it: their time, measured as the layout/copy
# kernels' growth beyond the half-bytes of the ones already there, was 0.51-0.54 of the reduced-
# precision GEMM/conv time on the CNN pairs and 0.70 on the transformer; 0.6 is added to each
# GEMM/conv kernel that autocast moves (its cast runs just before it on its stream).
AUTOCAST_CASTS = 0.6
# Memory-bound kernels under bf16/fp16 autocast, time after over before. Elementwise: 0.50-0.54
# on the CNN pairs (all bf16 after the first convolution), 0.82 on the transformer (its residual
# stream stays fp32): 0.65. Layout transforms and copies move half the bytes (0.5; their growth
# beyond that is the casts above). Pooling: half the bytes (assumed, not measured). cuDNN's fp32
# batch-norm kernels give way to ATen's mixed bf16/fp32 ones, which ran 1.28-1.30x longer on all
# five CNN pairs (measured, used); other norms (layer norm 1.07 on the transformer), softmax and
# the losses stay in fp32 under autocast, and the optimizer updates fp32 weights: unchanged.
# Reductions: unchanged (CNN 1.5x on 0.02 ms, transformer 0.71 on 0.38 ms).
AMP_MEMORY: dict[str, float] = {ELEMENTWISE: 0.65, POOLING: 0.5, LAYOUT: 0.5, REDUCTION: 1.0,
                                NORM: 1.0, SOFTMAX: 1.0, OPTIMIZER: 1.0}
CUDNN_BATCH_NORM_AMP = 1.29
_CUDNN_BN = re.compile(r"cudnn::bn_(?:fw|bw)")
AMP_VALUES = ("bf16", "fp16", "tf32")


def amp_factor(name: str, major: int, value: str) -> float:
    """Time after / time before of one kernel when the step moves to `value` precision on a GPU
    of compute capability `major` (>= 7): GEMM/conv by the peak-rate ratio times what such
    kernels attain (with autocast's casts of its operands for bf16/fp16), memory-bound kernels
    by the bytes they move (AMP_MEMORY)."""
    return _amp_factor(name, min(major, max(PEAK_TFLOPS)), value)


@functools.lru_cache(maxsize=1 << 16)
def _amp_factor(name: str, major: int, value: str) -> float:
    peak = PEAK_TFLOPS[major]
    cls = kernel_class(name)
    target = "tf32" if value == "tf32" else "half"
    if target not in peak:
        return 1.0
    casts = 1.0 + AUTOCAST_CASTS if target == "half" else 1.0
    if cls == GEMM_FP32:
        return casts / max(1.0, peak[target] / peak["fp32"] * SIMT_ATTAINED[target])
    if cls == GEMM_TF32 and target == "half":
        return casts / max(1.0, peak["half"] / peak["tf32"] * TF32_ATTAINED)
    if value == "tf32" or cls not in AMP_MEMORY:
        return 1.0  # TF32 keeps fp32 storage: memory-bound kernels move the same bytes
    if cls == NORM and _CUDNN_BN.search(name):
        return CUDNN_BATCH_NORM_AMP
    return AMP_MEMORY[cls]


def amp_scale(names: list[str], major: int, value: str) -> np.ndarray:
    """`amp_factor` of each distinct kernel name (index with a graph's g_name)."""
    return np.array([amp_factor(n, major, value) for n in names], dtype=float)


def amp(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
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
    g = g.copy(*tf.SCALES_GPU)
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
        notes.append("autocast's casts of the GEMM/convolution operands add "
                     f"{percent(100 * AUTOCAST_CASTS, 0)} "
                     "of their reduced-precision time (measured 51-70%); memory-bound kernels "
                     f"by the bytes they move: elementwise {AMP_MEMORY[ELEMENTWISE]:g} of their "
                     f"time, layout copies {AMP_MEMORY[LAYOUT]:g}, cuDNN batch norm "
                     f"{CUDNN_BATCH_NORM_AMP:g}x slower (ATen's mixed-precision kernels), other "
                     "norms, softmax, losses and the optimizer unchanged (autocast keeps them in "
                     "fp32); all measured, docs/replay.md")
        notes.append("autocast's casts on the host are not modelled (on the measured CNN 25 "
                     "more aten::to and 12 ToCopyBackward0 per step)")
    return g, notes


MODELS = {"amp": Model(amp, lambda v: v in AMP_VALUES, "bf16, fp16 or tf32")}
