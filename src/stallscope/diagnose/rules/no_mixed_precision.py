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
    if is_rocm(model, gpu["name"], kernels):
        return Assessment(
            RULE_ID,
            "not_assessed",
            "ROCm (AMD) trace: its matrix cores are not CUDA tensor cores and its kernel names "
            "do not follow cuBLAS/cuDNN conventions, so precision is not judged.",
        )
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
    top = gpu[fp32].groupby("name")["dur"].agg(["sum", "count"]).sort_values("sum", ascending=False,
                                                                          kind="stable")
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
