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

The kernel classes and the GPU generation (`kernel_class`, `device_major`) are read in
trace/kernels.py; the mixed-precision model the replay and the rule's saving share
(`amp_factor`: per kernel, its time after a move to bf16/fp16/TF32) is the rule's replay model,
replay/models/no_mixed_precision.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stallscope.diagnose.advice import autocast, for_torch, grad_scaler, has
from stallscope.diagnose.common import (
    MIN_COMPUTE_MAJOR,
    MIN_FP32_SHARE_PCT,
    busiest_gpu_us,
    ms,
    pct,
)
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_key
from stallscope.replay.models.no_mixed_precision import AMP_VALUES, amp_factor
from stallscope.runfacts import RunContext
from stallscope.trace.kernels import (
    compute_major,
    device_major,
    is_comm_kernel,
    is_rocm,
    kernel_kind,
)
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_array, name_flags
from stallscope.units import percent

RULE_ID = "no-mixed-precision"
MAX_TOP_KERNELS = 5
DOCS = "https://pytorch.org/docs/stable/amp.html"


def _device_name(model: TraceModel) -> str:
    names = sorted({str(d.get("name")) for d in model.trace.devices if d.get("name")})
    return ", ".join(names) if names else "unknown (no deviceProperties)"


@dataclass(frozen=True)
class Precision:
    """What the rule measures inside the steps: the device's generation and its compute kernels'
    time by precision class (us, summed over the steps), before and after a move to `target`."""

    major: int
    major_source: str
    steps: int
    total_us: float  # the steps' wall time
    busiest_us: float  # the busiest GPU's busy time
    compute_us: float
    fp32_us: float
    tc_us: float
    device: str
    # Masks over the trace's GPU rows: the compute kernels in the steps and their fp32 ones.
    compute: Any = field(repr=False, compare=False, default=None)
    fp32: Any = field(repr=False, compare=False, default=None)
    # Once judged a finding (`priced`): the compute kernels under `target` autocast
    # (amp_factor), and the largest fp32 kernels.
    target: str = ""
    after_us: float = 0.0
    top_kernels: tuple[dict[str, Any], ...] = ()

    @property
    def fp32_share(self) -> float:
        return pct(self.fp32_us, self.compute_us)

    @property
    def tc_share(self) -> float:
        return pct(self.tc_us, self.compute_us)

    @property
    def shares(self) -> str:
        return (f"fp32 GEMM/conv kernels take {percent(self.fp32_share)} of compute kernel time, "
                f"tensor-core kernels {percent(self.tc_share)}")


def no_mixed_precision(model: TraceModel, context: RunContext | None = None) -> Assessment:
    measured = measure(model)
    if isinstance(measured, Assessment):
        return measured
    verdict = judge(measured)
    if verdict is not None:
        return verdict
    measured = priced(model, measured)
    rec, snippet = advise(model, measured)
    return Assessment.found(Finding(
        id=RULE_ID,
        title=_title(measured),
        evidence=_evidence(measured),
        recommendation=rec,
        snippet=snippet,
        precondition=_precondition(model, measured),
        estimated_saving_pct=saving_pct(measured),
        saving_basis=_saving_basis(measured.target),
        docs=DOCS,
    ))


def _kernels(model: TraceModel) -> Any:
    """The mask of GPU kernels inside the steps, or why the rule cannot look."""
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    if not model.steps:
        return Assessment(RULE_ID, "not_assessed", "No steps in the trace.")
    gpu = model.gpu
    # Masks over the gpu rows rather than sub-frames: pandas' per-call cost would dominate.
    kernels = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
    if not kernels.any():
        return Assessment(RULE_ID, "not_assessed", "No GPU kernels inside the steps.")
    if is_rocm(model, gpu["name"], kernels):
        return Assessment(
            RULE_ID,
            "not_assessed",
            "ROCm (AMD) trace: its matrix cores are not CUDA tensor cores and its kernel names "
            "do not follow cuBLAS/cuDNN conventions, so precision is not judged.",
        )
    return kernels


def measure(model: TraceModel) -> Precision | Assessment:
    """The compute kernels' time by precision class, or why it cannot be told."""
    kernels = _kernels(model)
    if isinstance(kernels, Assessment):
        return kernels
    gpu = model.gpu
    major, major_source = compute_major(model, gpu, kernels)
    if major is None:
        return Assessment(
            RULE_ID,
            "not_assessed",
            "The GPU's compute capability is unknown (no deviceProperties, no architecture in "
            "the kernel names): whether it has tensor cores cannot be told.",
        )
    kind = name_array(gpu["name"], kernel_kind)
    compute = kernels & ~name_flags(gpu["name"], is_comm_kernel)
    dur = gpu["dur"].to_numpy()
    # np.nansum of the selected rows is what pandas' Series.sum computes (same pairwise order).
    compute_us = float(np.nansum(dur[compute]))
    fp32 = compute & (kind == "fp32")
    return Precision(
        major=major, major_source=major_source, steps=len(model.steps),
        total_us=model.total_step_us, busiest_us=busiest_gpu_us(model), compute_us=compute_us,
        fp32_us=float(np.nansum(dur[fp32])),
        tc_us=float(np.nansum(dur[compute & (kind == "tensor_core")])),
        device=_device_name(model), compute=compute, fp32=fp32,
    )


def priced(model: TraceModel, m: Precision) -> Precision:
    """A finding's measure with its autocast target, the compute kernels' time under it, and
    the largest fp32 kernels."""
    gpu, major = model.gpu, m.major
    target = amp_target(major) if has(model, (1, 10)) else "fp16"
    factor = name_array(gpu["name"], lambda name: amp_factor(name, major, target), m.compute)
    after_us = float(np.nansum(gpu["dur"].to_numpy()[m.compute] * factor.astype(float)))
    return replace(m, target=target, after_us=after_us,
                   top_kernels=_top_kernels(gpu[m.fp32], m.steps, m.compute_us))


def _top_kernels(fp32: Any, n: int, compute_us: float) -> tuple[dict[str, Any], ...]:
    top = fp32.groupby("name")["dur"].agg(["sum", "count"]).sort_values("sum", ascending=False,
                                                                       kind="stable")
    return tuple(
        {"name": str(name)[:120], "ms_per_step": ms(r["sum"] / n), "share_pct": pct(r["sum"],
                                                                                     compute_us)}
        for name, r in top.head(MAX_TOP_KERNELS).iterrows()
    )


def judge(m: Precision) -> Assessment | None:
    """Not assessed without tensor cores, clear below the threshold; None: a finding."""
    if m.major < MIN_COMPUTE_MAJOR:
        return Assessment(
            RULE_ID,
            "not_assessed",
            f"Compute capability {m.major} ({m.device}) has no tensor cores: mixed "
            f"precision would not move GEMM/conv onto them ({m.shares}).",
        )
    if m.fp32_share < MIN_FP32_SHARE_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"Inside the steps, {m.shares} (threshold {percent(MIN_FP32_SHARE_PCT, 0)} fp32; "
            f"device {m.device}, compute capability {m.major}).",
        )
    return None


def saving_pct(m: Precision) -> float:
    """The compute kernels' time saved under autocast, bounded by the busiest GPU's busy time,
    as a share of the steps."""
    return pct(min(max(m.compute_us - m.after_us, 0.0), m.busiest_us), m.total_us)


def _evidence(m: Precision) -> dict[str, Any]:
    n = m.steps
    return {
        "device": m.device,
        "compute_major": m.major,
        "compute_major_source": m.major_source,
        "fp32_gemm_conv_share_pct": m.fp32_share,
        "tensor_core_share_pct": m.tc_share,
        "fp32_gemm_conv_ms_per_step": ms(m.fp32_us / n),
        "tensor_core_ms_per_step": ms(m.tc_us / n),
        "compute_kernel_ms_per_step": ms(m.compute_us / n),
        "gpu_busy_share_pct": pct(m.busiest_us, m.total_us),
        "top_fp32_kernels": list(m.top_kernels),
        "amp_target": m.target,
        "compute_kernel_ms_per_step_after": ms(m.after_us / n),
    }


def _title(m: Precision) -> str:
    if m.tc_us > 0:
        return (
            f"{percent(m.fp32_share, 0)} of GPU compute time is fp32 GEMM/convolution on CUDA "
            f"cores (tensor cores: {percent(m.tc_share, 0)})"
        )
    return (
        f"No tensor-core kernels: fp32 GEMM/convolution takes {percent(m.fp32_share, 0)} of GPU "
        "compute time"
    )


def advise(model: TraceModel, m: Precision) -> tuple[str, str]:
    """The recommendation and the snippet: bf16 autocast (or TF32) from Ampere with torch 1.10+,
    fp16 autocast with a scaler before; autocast under no_grad for inference."""
    if model.workload == "inference":
        rec, snippet = _inference_advice(model, m)
    elif m.major >= 8 and has(model, (1, 10)):
        rec, snippet = _bf16_advice(model, m)
    else:
        rec, snippet = _fp16_advice(model, m)
    return rec, snippet + (
        "\n\n# convolutions: channels_last lets cuDNN pick tensor-core kernels without "
        "transposes\nmodel = model.to(memory_format=torch.channels_last)"
    )


def _bf16_advice(model: TraceModel, m: Precision) -> tuple[str, str]:
    rec = (
        f"This GPU (compute capability {m.major}) has tensor cores, but "
        f"{percent(m.fp32_share, 0)} of the compute kernel time is matrix multiplies and "
        "convolutions in fp32 on the CUDA cores. Run the forward pass and loss under bf16 "
        "autocast (no loss scaling needed); for a one-line change that keeps fp32 storage, let "
        "cuBLAS and cuDNN use TF32 tensor cores instead."
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
    return rec, snippet


def _fp16_advice(model: TraceModel, m: Precision) -> tuple[str, str]:
    ampere = m.major >= 8
    why = ("this GPU has no bf16 or TF32 tensor cores" if not ampere
           else "bf16 autocast needs torch >= 1.10; TF32 is the other fp32-storage option")
    rec = (
        f"This GPU (compute capability {m.major}) has fp16 tensor cores, but "
        f"{percent(m.fp32_share, 0)} of the compute kernel time is matrix multiplies and "
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
    return rec, snippet


def _inference_advice(model: TraceModel, m: Precision) -> tuple[str, str]:
    ampere = m.major >= 8
    dtype = "bfloat16" if ampere and has(model, (1, 10)) else "float16"
    rec = (
        f"This GPU (compute capability {m.major}) has tensor cores, but "
        f"{percent(m.fp32_share, 0)} of the compute kernel time is matrix multiplies and "
        "convolutions in fp32 on the CUDA "
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
    return rec, snippet


def _precondition(model: TraceModel, m: Precision) -> str:
    return (
        "The model's numerics must tolerate reduced precision ("
        + ("compare its outputs with an fp32 run on held-out inputs"
           if model.workload == "inference"
           else "validate the loss curve and metrics against an fp32 run")
        + "); the gain is mostly on the GEMM/conv kernels (autocast adds casts, and batch "
        "norm can get slower), so it shows in step time only while the GPU is the bottleneck "
        f"(here it is busy {percent(pct(m.busiest_us, m.total_us), 0)} of the step). Tensor "
        "cores want dimensions that are multiples of 8; convolutions want channels_last."
    )


def _saving_basis(target: str) -> str:
    return (
        f"estimate: the compute kernels inside the steps under {target} autocast, by kernel "
        "class and device generation (GEMM/conv by the vendor's peak-rate ratio times what "
        "such kernels attained on measured pairs, memory-bound kernels by the bytes they "
        "move; docs/replay.md), bounded by the busiest GPU's busy time and taken as a "
        "share of step time; an upper bound on the step-time gain, which is smaller when "
        "the GPU waits for the host or the data"
    )


def _tf32_line(model: TraceModel) -> str:
    """TF32 for fp32 matmuls: set_float32_matmul_precision from torch 1.12, the flag before."""
    if has(model, (1, 12)):
        return "torch.set_float32_matmul_precision(\"high\")  # cuda.matmul.allow_tf32 = True\n"
    return "torch.backends.cuda.matmul.allow_tf32 = True  # torch < 1.12\n"



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
    order=100,
    metric=Metric("fp32 GEMM/convolution kernels", MS, evidence_key("fp32_gemm_conv_ms_per_step"),
                  "fp32_gemm_conv_share_pct"),
)
