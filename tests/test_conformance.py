"""Conformance: what every real trace in ../shared/real_traces must and must not produce.

Each expectation carries its reason: a fact about the trace recorded in real_traces/README.md,
the TensorBoard plugin's own output on it, or what its kernels and ops show. A rule listed under
`must` has to report a finding; under `must_not` it has to report `clear` or `not_assessed`.
"""

from __future__ import annotations

import pytest

from stallscope.diagnose import RULES, diagnose
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model

from .conftest import REAL, all_real_traces, real_trace

# Rules whose signal exists only on NVIDIA CUDA (tensor-core kernel names, CUDA's memcpy source
# kinds): they must never fire on CPU-only or AMD traces.
CUDA_ONLY = {"no-mixed-precision", "pageable-h2d-copy", "blocking-h2d-copy"}
GPU_RULES = {
    "pageable-h2d-copy", "host-device-sync", "blocking-h2d-copy", "gpu-idle", "comm-bound",
    "dataparallel", "allocator-churn", "no-mixed-precision", "single-tensor-optimizer",
}

NW0 = ["kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
       "kineto/resnet50_num_workers_0__worker0.1623143566756.pt.trace.json.gz"]
NW4 = ["kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
       "kineto/resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz"]

EXPECT: dict[str, tuple[set[str], set[str]]] = {
    # ResNet50, batch 32, V100, fp32, single-process loading: the plugin measured DataLoader
    # 33.37% of the step; the old plugin found 68% of kernel time tensor-core eligible with none
    # on tensor cores; SGD from torch 1.8 launches 3 kernels per parameter (483 per step).
    # GPU idle is mostly the loader wait, so it is reported as caused by dataloader-bound.
    # zero_grad() (torch 1.8, set_to_none=False) fills all 161 gradients: 3-5% of the step.
    # A single-process loader has no workers to start; GPU training is not CPU-oversubscribed.
    **{t: ({"dataloader-bound", "no-mixed-precision", "single-tensor-optimizer", "gpu-idle",
            "zero-grad-kernels"},
           {"comm-bound", "dataparallel", "allocator-churn", "worker-startup",
            "cpu-oversubscription"}) for t in NW0},
    # The same job with 4 workers: the plugin measured DataLoader 0.84%; still fp32 on V100.
    **{t: ({"no-mixed-precision", "single-tensor-optimizer", "zero-grad-kernels"},
           {"dataloader-bound", "comm-bound", "dataparallel"}) for t in NW4},
    # 147 ms cudaMemcpyAsync calls moving 704 B DtoH whose GPU copies take ~2 us: the host
    # waited for queued work (a sync), not a slow copy; its pageable copies are 1.3 KiB/step.
    # Multi-GPU NCCL job (rank 0 of 16) on A100 already on tensor cores with FusedAdam.
    "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz": (
        {"host-device-sync", "comm-bound"},
        {"pageable-h2d-copy", "blocking-h2d-copy", "no-mixed-precision",
         "single-tensor-optimizer"},
    ),
    # 150 MB HtoD from pageable memory at ~4.3 GB/s; no ProfilerSteps and the window is mostly
    # CUDA initialisation, so the finding exists but its saving is negligible (info).
    "hta/a100_alexnet_pageable_htod.pt.trace.json.gz": (
        {"pageable-h2d-copy"}, {"host-device-sync", "comm-bound", "dataparallel"},
    ),
    # DDP on 2 A100s with NCCL all-reduce; tensor cores in use; SGD with multi_tensor_apply.
    "hta/a100_rank0of2_nccl.pt.trace.json.gz": (
        {"comm-bound"}, {"no-mixed-precision", "single-tensor-optimizer", "dataparallel"},
    ),
    # Rank 3 of 8, A100, NCCL, FusedAdam, pinned input copies issued non_blocking (no host call
    # outlasts its GPU copy). GatherBackward0 here is DDP's, not DataParallel. zero_grad()
    # launches nothing (set_to_none).
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz": (
        {"comm-bound"},
        {"blocking-h2d-copy", "dataparallel", "no-mixed-precision", "single-tensor-optimizer",
         "zero-grad-kernels"},
    ),
    # V100, world size 1, fp32 GEMMs (63% of kernel time, no tensor-core kernels), SGD foreach.
    "hta/v100_rank0_ns_resolution.pt.trace.json.gz": (
        {"no-mixed-precision"}, {"comm-bound", "single-tensor-optimizer", "dataparallel"},
    ),
    # V100 rank 1 of 2: all-reduce never overlapped with compute; fp32; per-parameter SGD
    # whose zero_grad() launches 404 fills (11.5 ms per step).
    "hta/v100_rank1of2_df_index_resolver.pt.trace.json.gz": (
        {"comm-bound", "no-mixed-precision", "single-tensor-optimizer", "zero-grad-kernels"},
        {"dataparallel"},
    ),
    # V100 rank 1 of 2 with FusedAdam and pinned non_blocking copies.
    "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz": (
        {"comm-bound", "no-mixed-precision"},
        {"single-tensor-optimizer", "blocking-h2d-copy", "dataparallel"},
    ),
    # Two ranks of a 128-rank job on tensor cores, pipeline SendRecv exposed.
    "hta/rank0of128_sampled.pt.trace.json.gz": (
        {"comm-bound"}, {"no-mixed-precision", "dataparallel", "single-tensor-optimizer"},
    ),
    "hta/rank1of128_sampled.pt.trace.json.gz": (
        {"comm-bound"}, {"no-mixed-precision", "dataparallel", "single-tensor-optimizer"},
    ),
    # GP100 (compute capability 6): no tensor cores, so mixed precision cannot be judged.
    "hta/gp100_gpu_user_annotation.pt.trace.json.gz": (set(), {"no-mixed-precision"}),
    # AMD MI250 under ROCm: no CUDA-only rule may fire (see test below), and no collectives.
    "hta/amd_mi250_rocm62_minitoy.pt.trace.json.gz": (set(), {"comm-bound"}),
    # CPU-only traces: nothing GPU-side can fire (see test below); rank 0's loader is
    # multi-process and not a bottleneck in its single step, and its one step holds no epoch
    # boundary, so no worker start-up can be seen; without `stallscope run` the thread and
    # worker counts are unknown, so oversubscription cannot be claimed.
    "hta/cpu_only_rank0_dataloader.pt.trace.json.gz": (
        set(), {"dataloader-bound", "worker-startup", "cpu-oversubscription"},
    ),
}


def _verdicts(relative: str) -> dict[str, str]:
    model = build_model(load_trace(real_trace(relative)))
    return {a.rule: a.status for a in diagnose(model)}


@pytest.mark.parametrize("relative", sorted(EXPECT))
def test_real_trace_gives_exactly_the_expected_verdicts(relative: str) -> None:
    must, must_not = EXPECT[relative]
    verdicts = _verdicts(relative)
    assert {r for r in must if verdicts[r] != "finding"} == set(), verdicts
    assert {r for r in must_not if verdicts[r] == "finding"} == set(), verdicts


def test_every_rule_is_assessed_somewhere_and_named_in_the_table() -> None:
    rules = {r.__name__.replace("_", "-") for r in RULES}
    named = set().union(*(m | n for m, n in EXPECT.values()))
    assert rules - named == set()  # each trace-level rule has a real-trace expectation


@pytest.mark.parametrize(
    "relative",
    [p.relative_to(REAL).as_posix() for p in all_real_traces()
     if "cpu_only" in p.name or "amd_" in p.name],
)
def test_cpu_only_and_amd_traces_produce_no_cuda_only_finding(relative: str) -> None:
    verdicts = _verdicts(relative)
    forbidden = GPU_RULES if "cpu_only" in relative else CUDA_ONLY
    assert {r for r in forbidden if verdicts[r] == "finding"} == set(), verdicts


def test_the_nccl_traces_are_assessed_for_comm_bound() -> None:
    nccl = [p for p in all_real_traces()
            if any(k in p.name for k in ("nccl", "of16", "of8", "of2_", "of128"))]
    if not nccl:
        pytest.skip("real traces not available")
    for path in nccl:
        verdicts = _verdicts(path.relative_to(REAL).as_posix())
        assert verdicts["comm-bound"] != "not_assessed", path.name


def test_docs_cover_every_rule_with_each_required_part() -> None:
    from stallscope.diagnose import JOB_RULES

    from .conftest import ROOT

    doc = (ROOT / "docs" / "rules.md").read_text()
    ids = {r.__name__.replace("_", "-") for r in [*RULES, *JOB_RULES]}
    for rule in ids:
        assert f'<a id="{rule}"></a>' in doc, rule
        section = doc.split(f'<a id="{rule}"></a>', 1)[1].split("<a id=", 1)[0].lower()
        for part in ("signal", "threshold", "evidence", "recommendation", "precondition",
                     "saving", "real trace"):
            assert part in section, (rule, part)
