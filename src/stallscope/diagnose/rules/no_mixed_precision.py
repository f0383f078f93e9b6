"""`no-mixed-precision`: fp32 GEMM/convolution kernels do the work on a GPU with tensor cores.

On Volta and later NVIDIA GPUs (compute capability >= 7) matrix multiplies and convolutions
run several times faster on tensor cores, which need fp16/bf16 inputs (or TF32 on Ampere+).
A model trained in plain fp32 keeps them on the ordinary CUDA cores: cuBLAS/cuDNN then launch
SIMT kernels whose names say so (`volta_sgemm_*`, `implicit_convolve_sgemm`, `*_scudnn_*`,
`wgrad_alg0_engine<float...>`). This rule classifies kernel names into tensor-core (or
reduced-precision) GEMM/conv kernels and fp32 SIMT GEMM/conv kernels, and reports when the
latter take a large share of the GPU's compute kernel time.

Kernel names are the only precision signal in a Kineto trace, so classification is by name:
- tensor core: `tensorop`, `wmma`, `hmma`, `imma`, `xmma`, `wgmma`, the MMA shape tags
  `s884`/`h884`/`s1688`/`h1688`/`s16816`/..., `nvjet`, flash/fmha attention kernels; except
  xmma kernels tagged `ffma` or `f32f32_f32f32` (cuBLAS's fp32 SIMT kernels built with xmma);
- reduced precision: any GEMM/conv kernel whose name carries a half type (`half`, `fp16`,
  `bf16`, `f16`, `tf32`);
- fp32 SIMT: `sgemm` (cuBLAS, cuDNN `implicit_convolve_sgemm`, CUTLASS simt), `scudnn`,
  `gcgemm`/`cgemm` (FFT convolution), and any GEMM/GEMV/convolution kernel templated on
  `float` (`dgrad_engine<float`, `wgrad_alg0_engine<float`, `winograd...<float`,
  `fft2d_r2c<float`, `gemmSN_*<float`, `gemv2N_kernel<..., float`).

ROCm traces (AMD GPUs report computeMajor 9, but their matrix cores are not CUDA tensor cores
and their kernels are Tensile `Cijk_*`) and CPU-only traces are not assessed; pre-Volta GPUs
have no tensor cores and are not assessed either.

Below the rule, the kernel classes (`kernel_class`) and the mixed-precision model the replay
and the rule's saving share (`amp_factor`): per kernel, its time after a move to bf16/fp16/TF32
on a GPU of a given generation (`device_major`: deviceProperties, else kernel names), from the
vendors' peak rates and what such kernels attained on recorded pairs (docs/replay.md).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import autocast, for_torch, grad_scaler, has
from stallscope.diagnose.common import (
    FLOAT_TYPE,
    GEMM_OR_CONV,
    MIN_COMPUTE_MAJOR,
    MIN_FP32_SHARE_PCT,
    TENSOR_CORE,
    busiest_gpu_us,
    kernel_kind,
    ms,
    pct,
)
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Change, RuleSpec
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_array, name_flags, regex_hit
from stallscope.units import percent

RULE_ID = "no-mixed-precision"
MAX_TOP_KERNELS = 5
DOCS = "https://pytorch.org/docs/stable/amp.html"

_COMM = re.compile(r"^nccl|^rccl|^msccl|ncclDevKernel|ncclKernel", re.IGNORECASE)
# ROCm: the device name, or Tensile (`Cijk_`) GEMM kernels, give it away.
_AMD_DEVICE = re.compile(r"AMD|Radeon|Instinct|\bMI\d{2,3}", re.IGNORECASE)
_AMD_KERNEL = re.compile(r"^Cijk_|^Custom_Cijk")
# Architecture named in cuBLAS/cuDNN/CUTLASS kernel names, for traces without deviceProperties.
_ARCH_HINTS = (
    (re.compile(r"(?<![a-z0-9])sm_?(\d{1,2})\d(?!\d)", re.IGNORECASE), None),
    (re.compile(r"hopper", re.IGNORECASE), 9),
    (re.compile(r"ampere|cutlass_8\d_", re.IGNORECASE), 8),
    (re.compile(r"volta|turing|cutlass_7\d_", re.IGNORECASE), 7),
)


def _is_rocm(model: TraceModel, kernel_names: pd.Series, rows: np.ndarray) -> bool:
    """Whether the trace is from ROCm: an AMD device, a `hip*` runtime call, or a Tensile
    kernel among `kernel_names[rows]`."""
    if any(_AMD_DEVICE.search(str(d.get("name", ""))) for d in model.trace.devices):
        return True
    if len(model.runtime) and name_flags(model.runtime["name"], _is_hip).any():
        return True
    return bool(name_flags(kernel_names, _is_amd_kernel)[rows].any())


def _is_hip(name: str) -> bool:
    return name.startswith("hip")


def _is_amd_kernel(name: str) -> bool:
    return regex_hit(_AMD_KERNEL, name, anywhere=True)


def _is_comm(name: str) -> bool:
    return regex_hit(_COMM, name, anywhere=True)


@functools.lru_cache(maxsize=1 << 16)
def _arch_hints(name: str) -> tuple[int | None, ...]:
    """Per `_ARCH_HINTS` pattern, the compute major it reads in one kernel name (None: the
    pattern is absent). Cached: the three searches over every long name are the rule's cost."""
    found = (pattern.search(name) for pattern, _ in _ARCH_HINTS)
    return tuple(None if m is None else (major or int(m.group(1)))
                 for m, (_, major) in zip(found, _ARCH_HINTS, strict=True))


def _used_names(names: pd.Series, rows: np.ndarray) -> list[str]:
    """The distinct names of `names[rows]` (missing ones left out)."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes = np.unique(names.array.codes[rows])
        categories = names.array.categories
        return [str(categories[c]) for c in codes if c >= 0]
    return [str(n) for n in names[rows].dropna().unique()]


def _compute_major(model: TraceModel, gpu: pd.DataFrame,
                   rows: np.ndarray) -> tuple[int | None, str]:
    """Compute capability major of the GPUs that ran the kernels `gpu[rows]`, and where it
    came from."""
    majors = model.compute_major
    used = [majors[d] for d in set(gpu["device"].to_numpy()[rows]) if d in majors]
    if used:
        return min(used), "deviceProperties"
    if majors:
        return min(majors.values()), "deviceProperties"
    hints = [_arch_hints(name) for name in _used_names(gpu["name"], rows)]
    for i in range(len(_ARCH_HINTS)):  # the first pattern found decides
        found = [major for h in hints if (major := h[i]) is not None]
        if found:  # a kernel built for sm_90 runs on sm_90 and later only: the highest named
            return max(found), "kernel names"
    return None, ""


def _device_name(model: TraceModel) -> str:
    names = sorted({str(d.get("name")) for d in model.trace.devices if d.get("name")})
    return ", ".join(names) if names else "unknown (no deviceProperties)"


def no_mixed_precision(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    if not model.steps:
        return Assessment(RULE_ID, "not_assessed", "No steps in the trace.")
    gpu = model.gpu
    # Masks over the gpu rows rather than sub-frames: pandas' per-call cost would dominate.
    kernels = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
    if not kernels.any():
        return Assessment(RULE_ID, "not_assessed", "No GPU kernels inside the steps.")
    if _is_rocm(model, gpu["name"], kernels):
        return Assessment(
            RULE_ID,
            "not_assessed",
            "ROCm (AMD) trace: its matrix cores are not CUDA tensor cores and its kernel names "
            "do not follow cuBLAS/cuDNN conventions, so precision is not judged.",
        )
    major, major_source = _compute_major(model, gpu, kernels)
    if major is None:
        return Assessment(
            RULE_ID,
            "not_assessed",
            "The GPU's compute capability is unknown (no deviceProperties, no architecture in "
            "the kernel names): whether it has tensor cores cannot be told.",
        )
    kind = name_array(gpu["name"], kernel_kind)
    compute = kernels & ~name_flags(gpu["name"], _is_comm)
    dur = gpu["dur"].to_numpy()
    # np.nansum of the selected rows is what pandas' Series.sum computes (same pairwise order).
    compute_us = float(np.nansum(dur[compute]))
    fp32 = compute & (kind == "fp32")
    fp32_us = float(np.nansum(dur[fp32]))
    tc_us = float(np.nansum(dur[compute & (kind == "tensor_core")]))
    fp32_share, tc_share = pct(fp32_us, compute_us), pct(tc_us, compute_us)
    shares = (
        f"fp32 GEMM/conv kernels take {percent(fp32_share)} of compute kernel time, tensor-core "
        f"kernels {percent(tc_share)}"
    )
    if major < MIN_COMPUTE_MAJOR:
        return Assessment(
            RULE_ID,
            "not_assessed",
            f"Compute capability {major} ({_device_name(model)}) has no tensor cores: mixed "
            f"precision would not move GEMM/conv onto them ({shares}).",
        )
    if fp32_share < MIN_FP32_SHARE_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"Inside the steps, {shares} (threshold {percent(MIN_FP32_SHARE_PCT, 0)} fp32; device "
            f"{_device_name(model)}, compute capability {major}).",
        )
    n = len(model.steps)
    total = model.total_step_us
    busiest = busiest_gpu_us(model)
    target = amp_target(major) if has(model, (1, 10)) else "fp16"
    factor = name_array(gpu["name"], lambda name: amp_factor(name, major, target), compute)
    after_us = float(np.nansum(dur[compute] * factor.astype(float)))
    saved = min(max(compute_us - after_us, 0.0), busiest)
    saving = pct(saved, total)
    top = gpu[fp32].groupby("name")["dur"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    top_kernels = [
        {"name": str(name)[:120], "ms_per_step": ms(r["sum"] / n), "share_pct": pct(r["sum"],
                                                                                     compute_us)}
        for name, r in top.head(MAX_TOP_KERNELS).iterrows()
    ]
    evidence = {
        "device": _device_name(model),
        "compute_major": major,
        "compute_major_source": major_source,
        "fp32_gemm_conv_share_pct": fp32_share,
        "tensor_core_share_pct": tc_share,
        "fp32_gemm_conv_ms_per_step": ms(fp32_us / n),
        "tensor_core_ms_per_step": ms(tc_us / n),
        "compute_kernel_ms_per_step": ms(compute_us / n),
        "gpu_busy_share_pct": pct(busiest, total),
        "top_fp32_kernels": top_kernels,
        "amp_target": target,
        "compute_kernel_ms_per_step_after": ms(after_us / n),
    }
    ampere = major >= 8
    if tc_us > 0:
        title = (
            f"{percent(fp32_share, 0)} of GPU compute time is fp32 GEMM/convolution on CUDA cores "
            f"(tensor cores: {percent(tc_share, 0)})"
        )
    else:
        title = (
            f"No tensor-core kernels: fp32 GEMM/convolution takes {percent(fp32_share, 0)} of GPU "
            "compute time"
        )
    bf16 = has(model, (1, 10))  # bf16 autocast on CUDA came with torch.autocast in 1.10
    if ampere and bf16:
        rec = (
            f"This GPU (compute capability {major}) has tensor cores, but {percent(fp32_share, 0)} "
            "of the compute kernel time is matrix multiplies and convolutions in fp32 on the CUDA "
            "cores. Run the forward pass and loss under bf16 autocast (no loss scaling needed); "
            "for a one-line change that keeps fp32 storage, let cuBLAS and cuDNN use TF32 tensor "
            "cores instead."
        )
        snippet = (
            f"{for_torch(model)}\n"
            "# bf16 mixed precision (Ampere and later):\n"
            f"with {autocast(model, 'bfloat16')}:\n"
            "    loss = loss_fn(model(inputs), targets)\n"
            "loss.backward()\n"
            "optimizer.step()\n"
            "\n"
            "# or, keeping fp32 tensors, TF32 tensor cores for matmuls and convolutions:\n"
            + _tf32_line(model)
            + "torch.backends.cudnn.allow_tf32 = True"
        )
    else:
        why = ("this GPU has no bf16 or TF32 tensor cores" if not ampere
               else "bf16 autocast needs torch >= 1.10; TF32 is the other fp32-storage option")
        rec = (
            f"This GPU (compute capability {major}) has fp16 tensor cores, but "
            f"{percent(fp32_share, 0)} of the compute kernel time is matrix multiplies and "
            "convolutions in fp32 on the CUDA cores. Run the forward pass and loss under fp16 "
            f"autocast with a gradient scaler ({why})."
        )
        snippet = (
            f"{for_torch(model)}\n"
            f"scaler = {grad_scaler(model)}\n"
            "for inputs, targets in loader:\n"
            "    optimizer.zero_grad(set_to_none=True)\n"
            f"    with {autocast(model, 'float16')}:\n"
            "        loss = loss_fn(model(inputs), targets)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()"
        )
        if ampere:
            snippet += "\n\n# or, keeping fp32 tensors, TF32 tensor cores:\n" + _tf32_line(
                model).rstrip("\n")
    if model.workload == "inference":
        dtype = "bfloat16" if ampere and bf16 else "float16"
        rec = (
            f"This GPU (compute capability {major}) has tensor cores, but {percent(fp32_share, 0)} "
            "of the compute kernel time is matrix multiplies and convolutions in fp32 on the CUDA "
            f"cores. Run the model under {dtype.replace('bfloat', 'bf')} autocast (or convert its "
            "weights with model.half() / model.to(torch.bfloat16))"
            + ("; or, keeping fp32, let cuBLAS and cuDNN use TF32 tensor cores." if ampere
               else ".")
        )
        no_grad = "torch.inference_mode()" if has(model, (1, 9)) else "torch.no_grad()"
        snippet = (
            f"{for_torch(model)}\n"
            f"with {no_grad}, {autocast(model, dtype)}:\n"
            "    outputs = model(batch)"
            + ("\n\n# or, keeping fp32 tensors, TF32 tensor cores:\n"
               + _tf32_line(model).rstrip("\n") if ampere else "")
        )
    snippet += (
        "\n\n# convolutions: channels_last lets cuDNN pick tensor-core kernels without "
        "transposes\nmodel = model.to(memory_format=torch.channels_last)"
    )
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=rec,
        snippet=snippet,
        precondition=(
            "The model's numerics must tolerate reduced precision ("
            + ("compare its outputs with an fp32 run on held-out inputs"
               if model.workload == "inference"
               else "validate the loss curve and metrics against an fp32 run")
            + "); the gain is mostly on the GEMM/conv kernels (autocast adds casts, and batch "
            "norm can get slower), so it shows in step time only while the GPU is the bottleneck "
            f"(here it is busy {percent(pct(busiest, total), 0)} of the step). Tensor cores want "
            "dimensions that are multiples of 8; convolutions want channels_last."
        ),
        estimated_saving_pct=saving,
        saving_basis=(
            f"estimate: the compute kernels inside the steps under {target} autocast, by kernel "
            "class and device generation (GEMM/conv by the vendor's peak-rate ratio times what "
            "such kernels attained on measured pairs, memory-bound kernels by the bytes they "
            "move; docs/replay.md), bounded by the busiest GPU's busy time and taken as a "
            "share of step time; an upper bound on the step-time gain, which is smaller when "
            "the GPU waits for the host or the data"
        ),
        docs=DOCS,
    )
    return Assessment.found(finding)


def _tf32_line(model: TraceModel) -> str:
    """TF32 for fp32 matmuls: set_float32_matmul_precision from torch 1.12, the flag before."""
    if has(model, (1, 12)):
        return "torch.set_float32_matmul_precision(\"high\")  # cuda.matmul.allow_tf32 = True\n"
    return "torch.backends.cuda.matmul.allow_tf32 = True  # torch < 1.12\n"



# ------------------------------------------------------------------ kernel classes for the replay
# What each kernel does, for the mixed-precision and torch.compile replays (diagnose/fixes.py):
# GEMM/conv by the precision it runs in, and the memory-bound kinds whose time follows the
# bytes they move. By name only, like `kernel_kind`.
GEMM_FP32, GEMM_TF32, GEMM_HALF = "gemm_fp32", "gemm_tf32", "gemm_half"
NORM, SOFTMAX, OPTIMIZER, LAYOUT = "norm", "softmax", "optimizer", "layout"
ELEMENTWISE, REDUCTION, POOLING, COMM, OTHER = ("elementwise", "reduction", "pooling", "comm",
                                                "other")
# TF32 tensor-core GEMMs: named so, or CUTLASS's `tensorop_s1688gemm` (fp32 operands on TF32 MMA).
_TF32 = re.compile(r"tf32|tensorop_s(?:1688|16816)", re.IGNORECASE)
_REDUCED = re.compile(r"half|fp16|bf16|bfloat16|(?<![a-z0-9])f16|__nv_bfloat|int8|imma",
                      re.IGNORECASE)
_NORM = re.compile(r"batch_?norm|layer_?norm|group_?norm|instance_?norm|rms_?norm|"
                   r"(?<![a-z])bn_(?:fw|bw)|welford|_norm_", re.IGNORECASE)
_SOFTMAX = re.compile(r"softmax|nll_loss|cross_entropy|log_sigmoid", re.IGNORECASE)
_OPTIMIZER = re.compile(r"multi_tensor_apply|fused_adam|FusedOptimizer|_fused_sgd|adam_",
                        re.IGNORECASE)
_LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw|convertTensor|transpose|permute|"
                     r"(?<![a-z])copy_kernel|direct_copy|cat_?(?:array|batched)|"
                     r"scalePackedTensor", re.IGNORECASE)
_POOLING = re.compile(r"pool", re.IGNORECASE)
_REDUCTION = re.compile(r"reduce|triton_(?:red|per)_|(?<![a-z])sum_|mean_|argmax|argmin|"
                        r"splitKreduce|ReduceSplitK", re.IGNORECASE)
_ELEMENTWISE = re.compile(r"elementwise|triton_poi_|(?<![a-z])fill|(?<![a-z])threshold|"
                          r"clamp|relu|gelu|silu|sigmoid|tanh|dropout|(?<![a-z])add|mul|"
                          r"where|masked|index|scatter|gather|embedding|memset",
                          re.IGNORECASE)


def kernel_class(name: str) -> str:
    """One of the classes above for a kernel name: GEMM/conv by precision (`kernel_kind`'s
    split, with TF32 told apart from fp16/bf16), else what the memory-bound kernel does."""
    return _kernel_class(name)


@functools.lru_cache(maxsize=1 << 16)
def _kernel_class(name: str) -> str:
    if _is_comm(name):
        return COMM
    if name.startswith("triton_"):  # inductor's generated kernels: pointwise, reductions
        return _triton_class(name)
    if "init_device_workspace" in name:  # cuDNN's workspace clear before a conv: any precision
        return OTHER
    kind = kernel_kind(name)
    if kind == "fp32":
        return GEMM_FP32
    if kind == "tensor_core" and (GEMM_OR_CONV.search(name) or TENSOR_CORE.search(name)):
        if _TF32.search(name) and not _REDUCED.search(name.replace("tf32", "")):
            return GEMM_TF32
        return GEMM_HALF
    for pattern, cls in ((_NORM, NORM), (_SOFTMAX, SOFTMAX), (_OPTIMIZER, OPTIMIZER),
                         (_LAYOUT, LAYOUT), (_POOLING, POOLING), (_REDUCTION, REDUCTION),
                         (_ELEMENTWISE, ELEMENTWISE)):
        if pattern.search(name):
            return cls
    if GEMM_OR_CONV.search(name):  # a GEMM/conv in a precision the names do not say
        return GEMM_FP32 if FLOAT_TYPE.search(name) else OTHER
    return OTHER


def _triton_class(name: str) -> str:
    """Inductor names its kernels `triton_{poi,red,per,tem}_fused_<the ops fused>`: templates
    (`tem`) are GEMMs in a precision the name does not say; the rest by the ops they fuse."""
    if name.startswith("triton_tem_"):
        return OTHER
    if _NORM.search(name):
        return NORM
    if _SOFTMAX.search(name):
        return SOFTMAX
    return ELEMENTWISE if name.startswith("triton_poi_") else REDUCTION


# ---------------------------------------------------------- the mixed-precision model (replay)
# Dense peak rates (TFLOPS) from the vendors' data sheets; each compute capability major stands
# for one SKU: sm70 Tesla V100 SXM2 (fp32 15.7, fp16 tensor 125; no TF32 or bf16), sm80 A100
# SXM4 (fp32 19.5, TF32 156, bf16/fp16 312), sm90 H100 SXM5 (fp32 67, TF32 495, bf16/fp16 989).
# Other SKUs of a major (T4, A10, L4, H100 PCIe) have other rates but similar ratios; a later
# major (Blackwell) takes sm90's ratios.
PEAK_TFLOPS: dict[int, dict[str, float]] = {
    7: {"fp32": 15.7, "half": 125.0},
    8: {"fp32": 19.5, "tf32": 156.0, "half": 312.0},
    9: {"fp32": 67.0, "tf32": 495.0, "half": 989.0},
}
# The share of the peak ratio that GEMM/conv kernels attain when they move precision, measured on
# lent H200s (torch 2.11). fp32 SIMT -> tensor cores, on the transformer pair
# (sample_traces/real-h200-xfmr-*, 72 GEMMs per step, ~360 us each in fp32): 26.1 ms per step ->
# 2.04 ms in bf16 (12.8x of a 14.8x peak ratio: 0.87) and -> 4.99 ms in TF32 (5.2x of 7.4x:
# 0.71). TF32 -> bf16, on the CNN pairs (sample_traces/real-*-w8 -> w8-bf16, where cuDNN already
# runs its convolutions in TF32): 1.90-2.00 -> 0.99-1.03 ms per step, 2.0-2.1x of a 2.0x peak
# ratio: all of it (1.0).
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


def device_major(model: TraceModel) -> tuple[int | None, str]:
    """Compute capability major of the GPU that ran the steps' kernels, and where it was read:
    deviceProperties, else the architecture named in cuBLAS/cuDNN/CUTLASS kernel names
    (sm70_/sm80_/sm90_, volta_/turing_/ampere_/hopper_, cutlass_80_); (None, "") when neither
    says. ROCm devices give (None, "ROCm")."""
    gpu = model.gpu
    if gpu.empty:
        return None, ""
    kernels = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
    if not kernels.any():
        kernels = gpu["kind"].to_numpy() == "kernel"
    if not kernels.any():
        return None, ""
    if _is_rocm(model, gpu["name"], kernels):
        return None, "ROCm"
    return _compute_major(model, gpu, kernels)


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


def amp_target(major: int) -> str:
    """The reduced precision the device takes: bf16 from Ampere (sm80) on, fp16 before."""
    return "bf16" if major >= 8 else "fp16"


def changes(finding: Finding, model: TraceModel) -> list[Change]:
    """The precision the finding names, else the best one for the trace's GPU."""
    target = (finding.evidence or {}).get("amp_target")
    if target not in AMP_VALUES:
        major, _ = device_major(model)
        target = amp_target(major if major is not None else 8)
    return [Change("amp", str(target))]


SPEC = RuleSpec(
    id=RULE_ID,
    title="fp32 GEMM/convolution kernels on a GPU with tensor cores",
    summary="fp32 GEMM/conv kernels dominate on a GPU with tensor cores, none on tensor cores",
    check=no_mixed_precision,
    thresholds={"MIN_COMPUTE_MAJOR": MIN_COMPUTE_MAJOR, "MIN_FP32_SHARE_PCT": MIN_FP32_SHARE_PCT},
    what_if=("amp",),
    changes=changes,
)
