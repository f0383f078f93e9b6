"""Write small, deterministic, GPU-shaped Kineto traces for patterns the real corpus lacks.

No GPU is available to this project, and `sample_traces/public` holds no DataParallel run, no
allocator churn in steady-state steps and no pinned host-to-device copy that blocks the host.
This script builds such traces event by event, following the Kineto facts in
docs/architecture.md and the shapes of the real traces (`hta/a100_rank3of8_trace_diff_control`,
`hta/v100_rank1of2_trace_diff_test`, `hta/a100_alexnet_pageable_htod`): `ProfilerStep#N` user
annotations, `cpu_op` nesting,
`cuda_runtime` calls whose `args.correlation` equals that of their GPU kernel / memcpy, `ac2g`
flow pairs, GPU rows with `pid` = device and `tid` = stream, and `deviceProperties` of real parts.

Every file says `synthetic` in its name and carries a top-level `stallscope_synthetic` key; the
output is the same bytes on every run (fixed timestamps, gzip with mtime=0). Run from the
repository root:

    python sample_traces/make_synthetic.py [PATTERN ...]   # e.g. inference-serving

Sources for what torch names (read, not copied):
- `torch/nn/parallel/data_parallel.py`: `DataParallel.forward` wraps its body in
  `torch.autograd.profiler.record_function("DataParallel.forward")` (a `user_annotation`), and
  runs scatter -> replicate -> parallel_apply (one Python thread per GPU) -> gather.
- `torch/nn/parallel/_functions.py`: `Broadcast`, `ReduceAddCoalesced`, `Gather` and `Scatter`
  are `torch.autograd.Function`s; Broadcast's backward calls `ReduceAddCoalesced.apply`,
  Gather's backward `Scatter.apply`, Scatter's backward `Gather.apply`.
- `torch/csrc/autograd/python_function.cpp` (`THPFunction_apply`): a custom Function's forward is
  recorded under `((PyTypeObject*)cls)->tp_name`, i.e. the bare class name (`Broadcast`, ...);
  `torch/autograd/function.py` (`FunctionMeta`) names its backward node `<name>Backward`, so the
  engine records `autograd::engine::evaluate_function: BroadcastBackward` (no `0` suffix, unlike
  generated nodes such as DDP's `GatherBackward0` for `aten::gather`).
- `torch/cuda/comm.py` / `torch/csrc/cuda/comm.cpp`: broadcast and reduce go through NCCL when
  available (kernel names as in `hta/a100_rank0of2_nccl`:
  `ncclKernel_Broadcast_RING_LL_Sum_int8_t`);
  scatter and gather are cross-device `copy_`s, which CUPTI reports as `Memcpy PtoP`.
- CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`): `torch.cuda.empty_cache()`
  returns cached segments with `cudaFree` (which synchronises the device), so the next step's
  allocations call `cudaMalloc` again; cbid 20/22 as in `hta/a100_alexnet_pageable_htod`.
- `at::native::copy_` (`Copy.cu`): a non_blocking=False copy is `cudaMemcpyAsync` followed by
  `cudaStreamSynchronize` (as every pageable copy in `kineto/resnet50_*` shows); a
  non_blocking=True copy from pinned memory records an event instead (`cudaEventRecord`).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent
BASE_TS = 1_700_000_000_000_000  # a fixed epoch in microseconds, like a real recording
PID = 24617
CBID = {
    "cudaLaunchKernel": 211,
    "cudaMemcpyAsync": 41,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaMalloc": 20,
    "cudaFree": 22,
}
LAUNCH_LAG_US = 5  # a kernel cannot start before its launch call has run for a few us

A100 = {
    "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 42505273344, "computeMajor": 8,
    "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
    "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 167936, "numSms": 108,
    "sharedMemPerBlockOptin": 166912,
}
V100 = {
    "name": "Tesla V100-SXM2-16GB", "totalGlobalMem": 16945512448, "computeMajor": 7,
    "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
    "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 98304, "numSms": 80,
    "sharedMemPerBlockOptin": 98304,
}

GEMM = {8: "ampere_sgemm_128x64_tn", 7: "volta_sgemm_128x64_tn"}
RELU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
    "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
    "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
    "at::native::detail::Array<char*, 2>)"
)
CAT = (
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>"
    "(float*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, "
    "128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, "
    "unsigned int)"
)
LOSS = (
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, "
    "long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)"
)
FOREACH = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
    "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
    "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::"
    "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
    "BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"
)
NCCL_BCAST = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_REDUCE = "ncclKernel_Reduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class Builder:
    """Appends Kineto events; keeps per-stream GPU clocks so GPU work on a stream never overlaps."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.ext = 0
        self.corr = 0
        self.free: dict[tuple[int, int], int] = {}

    def _x(self, cat: str, name: str, pid: int, tid: int, ts: int, dur: int,
           args: dict[str, Any]) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                            "ts": BASE_TS + ts, "dur": dur, "args": args})

    def op(self, name: str, tid: int, ts: int, dur: int, cat: str = "cpu_op") -> int:
        """A CPU op (or user annotation); returns its end."""
        self.ext += 1
        self._x(cat, name, PID, tid, ts, dur,
                {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ext - 1})
        return ts + dur

    def call(self, name: str, tid: int, ts: int, dur: int) -> int:
        """A runtime call with no GPU work of its own; returns its end."""
        self.corr += 1
        self._x("cuda_runtime", name, PID, tid, ts, dur,
                {"External id": self.ext, "cbid": CBID[name], "correlation": self.corr})
        return ts + dur

    def _gpu(self, cat: str, name: str, tid: int, ts: int, call: str, call_dur: int, device: int,
             stream: int, gpu_dur: int, after: int, extra: dict[str, Any]) -> tuple[int, int]:
        self.corr += 1
        corr = self.corr
        start = max(self.free.get((device, stream), 0), ts + LAUNCH_LAG_US, after)
        self.free[(device, stream)] = start + gpu_dur
        self._x("cuda_runtime", call, PID, tid, ts, call_dur,
                {"External id": self.ext, "cbid": CBID[call], "correlation": corr})
        self._x(cat, name, device, stream, start, gpu_dur,
                {"External id": self.ext, "device": device, "context": 1, "stream": stream,
                 "correlation": corr, **extra})
        self.events.append({"ph": "s", "id": corr, "pid": PID, "tid": tid, "ts": BASE_TS + ts,
                            "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": corr, "pid": device, "tid": stream,
                            "ts": BASE_TS + start, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return start, start + gpu_dur

    def kernel(self, tid: int, ts: int, name: str, device: int, gpu_dur: int, stream: int = 7,
               call_dur: int = 6, after: int = 0) -> int:
        """cudaLaunchKernel + its kernel; returns the kernel's end."""
        extra = {"registers per thread": 64, "shared memory": 0, "blocks per SM": 2.0,
                 "warps per SM": 8.0, "grid": [216, 1, 1], "block": [128, 1, 1],
                 "est. achieved occupancy %": 12}
        return self._gpu("kernel", name, tid, ts, "cudaLaunchKernel", call_dur, device, stream,
                         gpu_dur, after, extra)[1]

    def memcpy(self, tid: int, ts: int, kind: str, device: int, nbytes: int, gbps: float,
               call_dur: int = 12, stream: int = 7, after: int = 0) -> tuple[int, int]:
        """cudaMemcpyAsync + its GPU copy; returns the copy's (start, end)."""
        gpu_dur = max(1, round(nbytes / gbps / 1e3))
        extra = {"bytes": nbytes, "memory bandwidth (GB/s)": round(nbytes / gpu_dur / 1e3, 4)}
        return self._gpu("gpu_memcpy", kind, tid, ts, "cudaMemcpyAsync", call_dur, device,
                         stream, gpu_dur, after, extra)

    def blocking_memcpy(self, tid: int, ts: int, kind: str, device: int, nbytes: int,
                        gbps: float, ret: int = 8) -> int:
        """A copy whose cudaMemcpyAsync returns `ret` us after the copy has run (pageable memory,
        or a DtoH read the host needs); returns the call's end."""
        _, end = self.memcpy(tid, ts, kind, device, nbytes, gbps, call_dur=0)
        call = next(e for e in reversed(self.events) if e.get("cat") == "cuda_runtime")
        call["dur"] = end + ret - ts
        return end + ret

    def gpu_idle_at(self, device: int, stream: int = 7) -> int:
        return self.free.get((device, stream), 0)


def document(b: Builder, pattern: str, devices: list[dict[str, Any]], tids: dict[int, str],
             span: int) -> dict[str, Any]:
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": BASE_TS, "pid": PID, "tid": 0,
         "args": {"name": "python3.10"}},
    ]
    for tid, label in tids.items():
        meta.append({"name": "thread_name", "ph": "M", "ts": BASE_TS, "pid": PID, "tid": tid,
                     "args": {"name": label}})
    for i in range(len(devices)):
        meta.append({"name": "process_name", "ph": "M", "ts": BASE_TS, "pid": i, "tid": 0,
                     "args": {"name": f"GPU {i}"}})
    meta.append({"ph": "X", "cat": "Trace", "ts": BASE_TS, "dur": span, "pid": "Spans",
                 "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
                 "args": {"Op count": 0}})
    return {
        "schemaVersion": 1,
        "stallscope_synthetic": (
            f"generated by sample_traces/make_synthetic.py: {pattern}, not a recording"
        ),
        "deviceProperties": [{"id": i, **d} for i, d in enumerate(devices)],
        "traceName": f"synthetic-{pattern}.pt.trace.json",
        "traceEvents": meta + b.events,
    }


# --- one GPU: a small MLP step, with variants ---------------------------------------------------

def single_gpu(pattern: str, *, empty_cache: bool = False, blocking_copy: bool = False,
               steps: int = 4) -> dict[str, Any]:
    """Loader -> input copy -> 3 x (linear, relu) -> loss -> backward -> SGD, on one A100.

    empty_cache: `torch.cuda.empty_cache()` at the end of every step (cudaFree of the cached
      segments, then cudaMalloc again in the next step's ops).
    blocking_copy: `x.to(device)` from a pinned batch without non_blocking (cudaMemcpyAsync then
      cudaStreamSynchronize until the copy ends) instead of non_blocking=True.
    """
    b = Builder()
    main = PID
    t = 1000
    batch_bytes = 256 * 3 * 128 * 128 * 4  # 50 MB of float32 images per batch, pinned
    for k in range(steps):
        step_start = t
        step_idx = len(b.events)
        t = b.op(LOADER, main, t, 1800, cat="user_annotation") + 20
        grow = k == 0 or empty_cache  # the caching allocator must ask the driver for memory
        # Input copy: aten::to > aten::_to_copy > aten::empty_strided (+cudaMalloc) / copy_.
        to_start = t
        t += 8
        if grow:
            b.op("aten::empty_strided", main, t, 420)
            b.call("cudaMalloc", main, t + 6, 400)
            t += 430
        copy_at = t + 10
        _, copy_end = b.memcpy(main, copy_at + 4, "Memcpy HtoD (Pinned -> Device)", 0,
                               batch_bytes, 22.0)
        t = copy_at + 4 + 12
        if blocking_copy:
            t = b.call("cudaStreamSynchronize", main, t + 1, max(copy_end - t - 1, 1) + 2)
        else:
            t = b.call("cudaEventRecord", main, t + 1, 3)
        b.op("aten::copy_", main, copy_at, t - copy_at + 2)
        t += 4
        b.op("aten::_to_copy", main, to_start + 4, t - to_start - 4)
        b.op("aten::to", main, to_start, t - to_start + 2)
        t += 30
        # Forward.
        for _layer in range(3):
            start = t
            if grow:
                b.op("aten::empty", main, t + 10, 300)
                b.call("cudaMalloc", main, t + 14, 280)
                t += 320
            b.kernel(main, t + 20, GEMM[8], 0, 1900)
            t = t + 40
            b.op("aten::addmm", main, start + 8, t - start - 8)
            b.op("aten::linear", main, start, t - start + 4)
            t += 10
            rs = t
            b.kernel(main, t + 12, RELU, 0, 160)
            t = t + 30
            b.op("aten::relu", main, rs, t - rs)
            t += 10
        ls = t
        b.kernel(main, t + 15, LOSS, 0, 40)
        t = b.op("aten::cross_entropy_loss", main, ls, 60) + 20
        # Backward on the autograd engine's device thread.
        bwd = main + 3
        bt = t + 30
        for _layer in range(3):
            s = bt
            b.kernel(bwd, bt + 10, GEMM[8], 0, 1800)
            bt = bt + 30
            b.kernel(bwd, bt + 4, GEMM[8], 0, 1700)
            bt = bt + 30
            b.op("AddmmBackward0", bwd, s + 5, bt - s - 5)
            b.op("autograd::engine::evaluate_function: AddmmBackward0", bwd, s, bt - s + 2)
            bt += 15
        b.op("aten::ones_like", main, t, 25)
        t = b.op("autograd::engine::backward", main, t + 28, bt - t - 20)  # run_backward waits
        t = max(t, bt) + 20
        os_ = t
        b.kernel(main, t + 20, FOREACH, 0, 420)
        t = b.op("Optimizer.step#SGD.step", main, os_, 90, cat="user_annotation") + 15
        if empty_cache:
            # cudaFree synchronises the device: the first call waits for the queued work.
            t = b.call("cudaFree", main, t + 5, max(b.gpu_idle_at(0) - t, 0) + 900) + 3
            for _ in range(4):
                t = b.call("cudaFree", main, t, 350) + 3
        else:
            t += 20
        end = max(t, b.gpu_idle_at(0) - 400) + 50  # the next step's loader overlaps GPU tail
        b.events.insert(step_idx, {"ph": "X", "cat": "user_annotation",
                                   "name": f"ProfilerStep#{k + 2}", "pid": PID, "tid": main,
                                   "ts": BASE_TS + step_start, "dur": end - step_start,
                                   "args": {"External id": 0, "Record function id": 0}})
        t = end
    return document(b, pattern, [A100], {main: "python main", main + 3: "autograd device 0"},
                    t + 1000)


# --- four GPUs under torch.nn.DataParallel ------------------------------------------------------

def dataparallel(pattern: str, steps: int = 3, ngpu: int = 4) -> dict[str, Any]:
    """One process drives 4 V100s: scatter, replicate (Broadcast), parallel_apply, gather, and in
    backward GatherBackward -> Scatter and BroadcastBackward -> ReduceAddCoalesced."""
    b = Builder()
    main = PID
    workers = [PID + 10 + d for d in range(ngpu)]  # parallel_apply threads
    engine = [PID + 20 + d for d in range(ngpu)]  # autograd engine device threads
    nccl_stream = 24
    t = 1000
    batch_bytes = 512 * 3 * 64 * 64 * 4
    params_bytes = 44_000_000  # ~11 M float32 parameters
    for k in range(steps):
        step_start = t
        step_idx = len(b.events)
        t = b.op(LOADER, main, t, 600, cat="user_annotation") + 20
        s = t
        b.memcpy(main, t + 20, "Memcpy HtoD (Pinned -> Device)", 0, batch_bytes, 11.5)
        b.call("cudaEventRecord", main, t + 36, 3)
        b.op("aten::copy_", main, t + 14, 30)
        t = b.op("aten::to", main, s, 50) + 20
        dp = t
        # Scatter: split the batch on dim 0, copy chunks 1..3 to their GPUs (peer copies).
        sc = t + 10
        t = sc + 20
        b.op("aten::chunk", main, t, 25)
        t += 30
        for _d in range(1, ngpu):
            cs = t
            b.memcpy(main, t + 15, "Memcpy PtoP (Device -> Device)", 0, batch_bytes // ngpu,
                     48.0, after=b.gpu_idle_at(0))
            b.call("cudaStreamWaitEvent", main, t + 30, 4)
            t = b.op("aten::copy_", main, cs + 6, 32) + 2
            b.op("aten::to", main, cs, t - cs)
            t += 8
        b.op("Scatter", main, sc, t - sc)
        t += 20
        # replicate(): Broadcast flattens the parameters and NCCL-broadcasts them to GPUs 1..3.
        bc = t
        b.kernel(main, t + 30, CAT, 0, 1100)
        t = b.op("aten::cat", main, t + 20, 40) + 10
        for d in range(ngpu):
            b.kernel(main, t, NCCL_BCAST, d, round(params_bytes / 9e3), stream=nccl_stream,
                     call_dur=9, after=b.gpu_idle_at(0, 7))
            t += 12
        for _ in range(ngpu):
            t = b.op("aten::split", main, t + 5, 60) + 5
        t = b.op("Broadcast", main, bc, t - bc + 10)
        t += 900  # Python builds the replica modules: no events
        # parallel_apply: one thread per GPU runs the replica's forward.
        joins = []
        for d, w in enumerate(workers):
            wt = t + 40 + 25 * d
            ready = b.gpu_idle_at(d, nccl_stream)
            for _layer in range(3):
                ls = wt
                b.kernel(w, wt + 12, GEMM[7], d, 1500, after=ready)
                wt = wt + 40
                b.op("aten::addmm", w, ls + 6, wt - ls - 6)
                b.op("aten::linear", w, ls, wt - ls + 3)
                wt += 8
                rs = wt
                b.kernel(w, wt + 10, RELU, d, 120)
                wt = wt + 28
                b.op("aten::relu", w, rs, wt - rs)
                wt += 8
            joins.append(wt)
        t = max(joins) + 150
        # Gather: copy each replica's output to GPU 0 (peer copies on the source device).
        ga = t
        t += 15
        for d in range(1, ngpu):
            cs = t
            b.memcpy(main, t + 10, "Memcpy PtoP (Device -> Device)", d, 512 // ngpu * 1000 * 4,
                     40.0)
            t = b.op("aten::copy_", main, cs, 28) + 4
        b.kernel(main, t + 10, CAT, 0, 30)
        t = b.op("aten::cat", main, t + 4, 30) + 6
        b.op("Gather", main, ga, t - ga)
        t = b.op("DataParallel.forward", main, dp, t - dp + 12, cat="user_annotation") + 10
        ls = t
        b.kernel(main, t + 12, LOSS, 0, 40)
        t = b.op("aten::cross_entropy_loss", main, ls, 50) + 20
        # Backward: GatherBackward (Scatter of the output grad) on GPU 0's engine thread, the
        # replicas' backward on each GPU's thread, then BroadcastBackward -> ReduceAddCoalesced.
        e0 = engine[0]
        bt = t + 40
        gb = bt
        sb = bt + 20
        for _d in range(1, ngpu):
            b.memcpy(e0, bt + 30, "Memcpy PtoP (Device -> Device)", 0, 512 // ngpu * 1000 * 4,
                     40.0)
            bt += 40
        b.op("Scatter", e0, sb, bt - sb + 10)
        b.op("GatherBackward", e0, gb + 8, bt - gb + 14)
        bt = b.op("autograd::engine::evaluate_function: GatherBackward", e0, gb, bt - gb + 24)
        ends = []
        for d, e in enumerate(engine):
            et = bt + 20 + 15 * d
            for _layer in range(3):
                s_ = et
                b.kernel(e, et + 10, GEMM[7], d, 1400)
                et = et + 30
                b.kernel(e, et + 4, GEMM[7], d, 1300)
                et = et + 30
                b.op("AddmmBackward0", e, s_ + 5, et - s_ - 5)
                b.op("autograd::engine::evaluate_function: AddmmBackward0", e, s_, et - s_ + 2)
                et += 10
            ends.append(et)
        bb = max(ends) + 30
        rt = bb + 40
        for d in range(ngpu):
            b.kernel(e0, rt, CAT, d, 1000)
            rt = b.op("aten::cat", e0, rt - 6, 30) + 8
        for d in range(ngpu):
            b.kernel(e0, rt, NCCL_REDUCE, d, round(params_bytes / 8e3), stream=nccl_stream,
                     call_dur=9, after=b.gpu_idle_at(d))
            rt += 12
        for _ in range(ngpu):
            rt = b.op("aten::split", e0, rt + 5, 50) + 5
        b.op("ReduceAddCoalesced", e0, bb + 30, rt - bb - 25)
        b.op("BroadcastBackward", e0, bb + 15, rt - bb - 5)
        bt = b.op("autograd::engine::evaluate_function: BroadcastBackward", e0, bb, rt - bb + 15)
        b.op("aten::ones_like", main, t, 25)
        t = b.op("autograd::engine::backward", main, t + 30, bt - t - 10) + 20
        os_ = t
        b.kernel(main, t + 20, FOREACH, 0, 380, after=b.gpu_idle_at(0, nccl_stream))
        t = b.op("Optimizer.step#SGD.step", main, os_, 80, cat="user_annotation") + 20
        end = max(t, b.gpu_idle_at(0) - 300) + 60
        b.events.insert(step_idx, {"ph": "X", "cat": "user_annotation",
                                   "name": f"ProfilerStep#{k + 2}", "pid": PID, "tid": main,
                                   "ts": BASE_TS + step_start, "dur": end - step_start,
                                   "args": {"External id": 0, "Record function id": 0}})
        t = end
    tids = {main: "python main"}
    tids.update({w: f"parallel_apply {d}" for d, w in enumerate(workers)})
    tids.update({e: f"autograd device {d}" for d, e in enumerate(engine)})
    return document(b, pattern, [V100] * ngpu, tids, t + 1000)

# --- one GPU, inference: one forward, no ProfilerStep -------------------------------------------

# Six layers, run once after each input's copy (each op name twice, under the three that make
# iterations), and their kernels' GPU time (us): a large fp32 model, 5-24 ms a kernel.
INFER_LAYERS = (
    ("aten::conv2d", "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc", 18_000),
    ("aten::batch_norm", "void at::native::batch_norm_transform_input_kernel<float>", 6_000),
    ("aten::linear", GEMM[8], 24_000),
    ("aten::layer_norm", "void at::native::vectorized_layer_norm_kernel<float, float>", 5_000),
    ("aten::bmm", GEMM[8], 21_000),
    ("aten::softmax", "void at::native::cunn_SoftMaxForward<4, float, float, float>", 7_000),
)


def inference(pattern: str) -> dict[str, Any]:
    """One inference call on one A100, recorded without a schedule (no ProfilerStep): the whole
    trace is one step. Two input tensors come from pageable memory with `.to(device)`: each
    `cudaMemcpyAsync` returns only once its copy has run, and the second copy queues behind the
    first half of the model on the same stream, so the host blocks for that GPU work too. The
    output is read back with `.cpu()` (a pageable DtoH copy that waits for the rest). The GPU's
    own work (kernels and copies, about 196 ms) is the floor no change to the host removes."""
    b = Builder()
    main = PID
    t = 1000
    input_bytes = 96 * 1024 * 1024  # 100 MB of float32 per input, pageable, at 6 GB/s: 17 ms
    for _part in range(2):
        cs = t
        # A pageable copy is synchronous for the host: the call returns when the copy has run.
        t = b.blocking_memcpy(main, t + 14, "Memcpy HtoD (Pageable -> Device)", 0, input_bytes,
                              6.0, ret=9)
        b.op("aten::copy_", main, cs + 6, t - cs - 4)
        t = b.op("aten::to", main, cs, t - cs + 6) + 25
        for op_name, kernel_name, gpu_us in INFER_LAYERS:
            s = t
            b.kernel(main, t + 12, kernel_name, 0, gpu_us)
            t = b.op(op_name, main, s, 40) + 15
    # .cpu() of the 4 MB output: the call waits for the queued layers, then copies.
    cs = t
    t = b.blocking_memcpy(main, t + 10, "Memcpy DtoH (Device -> Pageable)", 0, 4 * 1024 * 1024,
                          5.0)
    b.op("aten::copy_", main, cs + 4, t - cs - 2)
    t = b.op("aten::to", main, cs, t - cs + 4) + 30
    return document(b, pattern, [A100], {main: "python main"}, t + 1000)


# --- one GPU serving requests: forward only, host preprocessing, output read ------------------

BF16_GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, "
    "c10::BFloat16, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, "
    "c10::BFloat16 const*, int)"
)
ARGMAX = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4> >(at::native::ReduceOp<c10::BFloat16, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4>)"
)
# Host preprocessing of one batch of requests (CPU tensor ops that launch nothing): decode has
# happened already; resize, collate and normalise run in the serving loop itself.
PREPROCESS = (("aten::upsample_bilinear2d", 1900), ("aten::stack", 650), ("aten::sub", 380),
              ("aten::div", 370))


def inference_serving(pattern: str, batches: int = 6) -> dict[str, Any]:
    """A serving loop on one A100, one ProfilerStep per batch of requests, no backward:

        for requests in queue:
            x = preprocess(requests)                      # CPU: resize, stack, normalise
            x = x.pin_memory().to(device, non_blocking=True)
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
                preds = model(x).softmax(-1).argmax(-1)
            reply(preds.cpu())                           # the caller needs the result
            prof.step()

    The host preprocesses the next batch only after `.cpu()` returned, so the GPU idles through
    every batch's preprocessing; `.cpu()` itself waits for the forward (pageable DtoH: the
    cudaMemcpyAsync returns once the copy is done, then copy_'s cudaStreamSynchronize is short,
    as torch 2.x records it). `reply` is 0.7 ms of host work after the read (encode, send).
    """
    b = Builder()
    main = PID
    t = 1000
    batch_bytes = 32 * 3 * 224 * 224 * 2  # 32 bf16 images of 3x224x224 per batch, pinned
    out_bytes = 32 * 8  # int64 class index per request
    for k in range(batches):
        step_start = t
        step_idx = len(b.events)
        for name, dur in PREPROCESS:
            t = b.op(name, main, t, dur) + 15
        to_start = t
        _, _copy_end = b.memcpy(main, t + 20, "Memcpy HtoD (Pinned -> Device)", 0, batch_bytes,
                                22.0)
        b.call("cudaEventRecord", main, t + 36, 3)
        b.op("aten::copy_", main, t + 14, 30)
        t = b.op("aten::to", main, to_start, 50) + 20
        # Forward: 12 x (bf16 linear, relu) then softmax and argmax, launched back to back.
        for _layer in range(12):
            start = t
            b.kernel(main, t + 18, BF16_GEMM, 0, 380)
            t = b.op("aten::addmm", main, start + 6, 30) + 2
            t = b.op("aten::linear", main, start, t - start + 3) + 6
            rs = t
            b.kernel(main, t + 10, RELU, 0, 45)
            t = b.op("aten::relu", main, rs, 24) + 6
        for kname, op, gpu_dur in ((SOFTMAX, "aten::softmax", 30), (ARGMAX, "aten::argmax", 12)):
            s = t
            b.kernel(main, t + 10, kname, 0, gpu_dur)
            t = b.op(op, main, s, 24) + 6
        # preds.cpu(): aten::to > _to_copy > empty_strided, copy_ > cudaMemcpyAsync (blocks until
        # the queued forward and the copy are done) + cudaStreamSynchronize.
        rd = t
        t += 12
        b.op("aten::empty_strided", main, t, 8)
        cp = t + 12
        _, copy_end = b.memcpy(main, cp + 6, "Memcpy DtoH (Device -> Pageable)", 0, out_bytes,
                               0.05, call_dur=max(b.gpu_idle_at(0) - cp - 6, 0) + 14)
        t = b.call("cudaStreamSynchronize", main, copy_end + 16, 4)
        b.op("aten::copy_", main, cp, t - cp + 3)
        b.op("aten::_to_copy", main, rd + 6, t - rd)
        t = b.op("aten::to", main, rd, t - rd + 10) + 15
        t = b.op("reply", main, t, 700, cat="user_annotation") + 20
        b.events.insert(step_idx, {"ph": "X", "cat": "user_annotation",
                                   "name": f"ProfilerStep#{k + 2}", "pid": PID, "tid": main,
                                   "ts": BASE_TS + step_start, "dur": t - step_start,
                                   "args": {"External id": 0, "Record function id": 0}})
        t += 10
    return document(b, pattern, [A100], {main: "python main"}, t + 1000)


PATTERNS = {
    "dataparallel": lambda p: dataparallel(p),
    "allocator-churn": lambda p: single_gpu(p, empty_cache=True),
    "allocator-steady": lambda p: single_gpu(p),
    "blocking-h2d": lambda p: single_gpu(p, blocking_copy=True),
    "inference-serving": lambda p: inference_serving(p),
    "inference-pageable": inference,
}


def render(pattern: str) -> bytes:
    """The gzip bytes of one synthetic trace: identical on every call."""
    doc = PATTERNS[pattern](pattern)
    data = json.dumps(doc, separators=(",", ":")).encode()
    return gzip.compress(data, compresslevel=9, mtime=0)


def main(out: Path = OUT, patterns: list[str] | None = None) -> list[Path]:
    """Write the named patterns' traces (all of them when none is named)."""
    written = []
    for pattern in patterns or PATTERNS:
        path = out / f"synthetic-{pattern}.pt.trace.json.gz"
        path.write_bytes(render(pattern))
        written.append(path)
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    unknown = [p for p in sys.argv[1:] if p not in PATTERNS]
    if unknown:
        sys.exit(f"unknown pattern(s) {', '.join(unknown)}; known: {', '.join(PATTERNS)}")
    main(patterns=sys.argv[1:])
