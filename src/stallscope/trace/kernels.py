"""What a GPU kernel is, read from its name and the trace's devices: a collective, its precision
(`kernel_kind`: tensor cores or fp32), its class for the replay's models (`kernel_class`:
GEMM/conv by precision, the memory-bound kinds), and the GPU generation that ran it
(`device_major`). Facts of the trace, below both the rules that judge by them and the replay
models that scale kernels by them.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

from stallscope.trace.intervals import enclosing
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_flags, name_mask, per_name, regex_hit

# Collective kernels: NCCL (`ncclKernel_*`, `ncclDevKernel_*`), RCCL on ROCm (the same names, or
# `rccl*`), and MSCCL, which RCCL runs for some collectives (`mscclKernel_Sum_float_LL...`).
COMM_NAME = re.compile(r"nccl|rccl|msccl", re.IGNORECASE)
# A collective kernel's name says its collective: `ncclDevKernel_AllReduce_Sum_f32_RING_LL`.
COLLECTIVE = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)


TENSOR_CORE = re.compile(
    r"tensorop|wmma|hmma|imma|xmma|wgmma|nvjet|fmha|flash_(?:fwd|bwd)"
    r"|(?<![a-z0-9])[hsi]?(?:884|1688|16816|8816|16832)(?:gemm|cudnn|fprop|dgrad|wgrad|conv|_)",
    re.IGNORECASE,
)
# cuBLAS fp32 SIMT kernels built on xmma: `sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...`.
_XMMA_FP32 = re.compile(r"ffma|_f32f32_f32f32_", re.IGNORECASE)
GEMM_OR_CONV = re.compile(
    r"(?<!fb)gemm|gemv|conv(?!ert)|dgrad|wgrad|fprop|winograd|fft2d|scudnn",
    re.IGNORECASE,
)
_HALF = re.compile(r"half|fp16|bf16|bfloat16|(?<![a-z0-9])f16|tf32|__nv_bfloat", re.IGNORECASE)
_FP32_NAMED = re.compile(r"sgemm|scudnn|gcgemm|(?<![a-z])cgemm", re.IGNORECASE)
FLOAT_TYPE = re.compile(r"\bfloat\b")


def classify_kernels(names: pd.Series) -> pd.Series:
    """'tensor_core', 'fp32' or 'other' per kernel name (evaluated once per distinct name)."""
    return per_name(names, kernel_kind)


@functools.lru_cache(maxsize=1 << 16)
def kernel_kind(name: str) -> str:
    """'tensor_core', 'fp32' or 'other' for one kernel name. Cached: the ranks of a job run the
    same kernels, so a worker analysing many of their files classifies each name once."""
    tensor_core = bool(TENSOR_CORE.search(name))
    xmma_fp32 = bool(_XMMA_FP32.search(name))
    gemm_conv = bool(GEMM_OR_CONV.search(name))
    if (tensor_core and not xmma_fp32) or (gemm_conv and _HALF.search(name)):
        return "tensor_core"
    if (_FP32_NAMED.search(name) or (tensor_core and xmma_fp32)
            or (gemm_conv and FLOAT_TYPE.search(name))):
        return "fp32"
    return "other"


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


def is_rocm(model: TraceModel, kernel_names: pd.Series, rows: np.ndarray) -> bool:
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


def is_comm_kernel(name: str) -> bool:
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


def compute_major(model: TraceModel, gpu: pd.DataFrame,
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



# What each kernel does, for the mixed-precision and torch.compile replays (replay/models/):
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
    if is_comm_kernel(name):
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
    if is_rocm(model, gpu["name"], kernels):
        return None, "ROCm"
    return compute_major(model, gpu, kernels)


# The host range each collective kernel is launched in names its collective where the kernel
# does not (NCCL runs all-to-all, and on some versions every collective, as SendRecv kernels):
# `nccl:all_reduce`, `nccl:_all_gather_base`, `rccl:...`.
HOST_RANGE = re.compile(r"^(?:nccl|rccl):(\w+)", re.IGNORECASE)
HOST_KIND = {"all_reduce": "AllReduce", "allreduce": "AllReduce",
             "all_to_all": "AllToAll", "alltoall": "AllToAll", "alltoall_base": "AllToAll",
             "all_gather": "AllGather", "_all_gather_base": "AllGather",
             "all_gather_into_tensor": "AllGather", "allgather": "AllGather",
             "reduce_scatter": "ReduceScatter", "_reduce_scatter_base": "ReduceScatter",
             "reduce_scatter_tensor": "ReduceScatter", "broadcast": "Broadcast",
             "send": "SendRecv", "recv": "SendRecv"}


def _range_kind(name: str) -> str:
    """The collective a host range's name says (`nccl:all_reduce` -> AllReduce), "" for none."""
    found = HOST_RANGE.match(name)
    return HOST_KIND.get(found.group(1).lower(), "") if found else ""


def host_kinds(model: TraceModel) -> np.ndarray:
    """Per row of `model.gpu`, the collective its launch call's enclosing `nccl:<op>` host
    range names (AllReduce, AllToAll, ...), "" where there is none."""
    gpu, rt, ops = model.gpu, model.runtime, model.ops
    out = np.full(len(gpu), "", dtype=object)
    if not len(gpu) or not len(rt) or not len(ops):
        return out
    ranged = name_mask(ops["name"], HOST_RANGE)
    if not ranged.any():
        return out
    is_comm = name_mask(gpu["name"], COMM_NAME)
    corr = gpu["correlation"].to_numpy(dtype=float)
    rt_corr = rt["correlation"].to_numpy(dtype=float)
    order = np.argsort(rt_corr, kind="stable")
    k = np.clip(np.searchsorted(rt_corr[order], corr), 0, max(len(rt) - 1, 0))
    call = np.where(is_comm & (rt_corr[order][k] == corr), order[k], -1)
    rows = np.flatnonzero(call >= 0)
    r_tid = rt["tid"].astype(str).to_numpy(dtype=object)[call[rows]]
    r_ts = rt["ts"].to_numpy(dtype=float)[call[rows]]
    r_end = rt["end"].to_numpy(dtype=float)[call[rows]]
    o_tid = ops["tid"].astype(str).to_numpy(dtype=object)[ranged]
    o_ts = ops["ts"].to_numpy(dtype=float)[ranged]
    o_end = ops["end"].to_numpy(dtype=float)[ranged]
    o_kind = np.array([_range_kind(n)
                       for n in ops["name"].astype(str).to_numpy(dtype=object)[ranged]],
                      dtype=object)
    for tid in set(r_tid.tolist()):
        mine, theirs = r_tid == tid, o_tid == tid
        if not theirs.any():
            continue
        inner, _ = enclosing(o_ts[theirs], o_end[theirs], r_ts[mine], r_end[mine])
        found = inner >= 0
        out[rows[mine][found]] = o_kind[theirs][inner[found]]
    return out
