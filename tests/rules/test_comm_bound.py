"""`comm-bound`: collective communication not overlapped with compute, on every backend:
gloo/CPU collectives, all-to-all advice, overlap savings capped by the compute there is to hide
under; on real traces and small synthetic ones with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose.rules.comm_bound import comm_bound
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace, report_of
from tests.rules.builders import kernel, real, step, synthetic

GLOO300 = "hta/cpu_only_rank34of300_gloo.pt.trace.json.gz"
RANK0OF128 = "hta/rank0of128_sampled.pt.trace.json.gz"


def test_gloo_all_reduce_on_cpu_is_assessed_with_gloo_advice() -> None:
    # rank 34 of 300: gloo:all_reduce ranges cover 85% of the only step; no compute beside them.
    a = comm_bound(real(GLOO300))
    assert a.status == "finding"
    f = a.finding
    assert f.evidence["backend"] == "gloo" and f.evidence["where"] == "host"
    assert f.evidence["exposed_share_pct"] > 80
    for said in ("no_sync()", "bucket_cap_mb", "fp16", "GLOO_SOCKET_IFNAME"):
        assert said in f.recommendation + f.snippet, said
    # Nothing to overlap with: the bound is what halving the bytes can give, not the overlap.
    assert f.evidence["hideable_share_pct"] == 0.0
    assert f.estimated_saving_pct == pytest.approx(f.evidence["exposed_share_pct"] / 2, abs=0.02)


@pytest.mark.parametrize("rank", [0, 1])
def test_recorded_two_process_gloo_ddp_job_is_comm_bound(rank: int) -> None:
    model = build_model(load_trace(SAMPLES / f"cpu-gloo-ddp-rank{rank}.pt.trace.json.gz"))
    assert model.trace.world_size == 2 and not model.has_gpu
    a = comm_bound(model)
    assert a.status == "finding"
    ev = a.finding.evidence
    assert (ev["backend"], ev["pattern"], ev["top_collectives"][0]["collective"]) == (
        "gloo", "all-reduce", "all_reduce")
    assert 0 < ev["overlap_pct"] < 100  # DDP starts buckets during backward: part is hidden
    assert a.finding.estimated_saving_pct <= ev["exposed_share_pct"]


def test_all_to_all_gets_its_own_advice_not_ddp_buckets() -> None:
    # rank 0 of 128 (TorchRec: nccl:all_to_all, KJTAllToAll): the exposed kernels are NCCL
    # SendRecv, which is how NCCL runs all-to-all.
    f = comm_bound(real(RANK0OF128)).finding
    assert f.evidence["pattern"] == "all-to-all"
    assert f.evidence["top_collectives"][0]["collective"] == "AllToAll"
    assert "TrainPipelineSparseDist" in f.recommendation + f.snippet
    assert "bucket_cap_mb" not in f.snippet


def test_overlap_saving_never_exceeds_the_compute_to_hide_under() -> None:
    # rank 0 of 128: 27.4% of the step is exposed all-to-all but the device runs compute
    # kernels only 17.1% of it: overlap cannot hide more than that.
    f = comm_bound(real(RANK0OF128)).finding
    ev = f.evidence
    assert ev["hideable_share_pct"] < ev["exposed_share_pct"]
    assert f.estimated_saving_pct == ev["hideable_share_pct"]
    total_ms = ev["exposed_ms_per_step"] / ev["exposed_share_pct"] * 100
    assert f.estimated_saving_pct <= 100 * ev["compute_ms_per_step"] / total_ms + 0.01
    report = report_of(real_trace(RANK0OF128))
    (comm,) = [x for x in report.findings if x.id == "comm-bound"]
    assert comm.saving_kind == "upper_bound" and comm.estimated_saving_pct <= 17.2


NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def test_comm_bound_finds_unoverlapped_allreduce():
    a = comm_bound(real("hta/v100_rank1of2_df_index_resolver.pt.trace.json.gz"))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["exposed_share_pct"] >= 5.0
    assert ev["top_collectives"][0]["collective"] == "AllReduce"
    # The bound is the exposed time less the part measured as waiting on peers (2.6%), which
    # overlap does not remove: two named quantities, not one.
    assert ev["peer_wait_share_pct"] > 0
    assert a.finding.estimated_saving_pct == pytest.approx(
        ev["exposed_share_pct"] - ev["peer_wait_share_pct"], abs=0.02)


@pytest.mark.parametrize("trace", [
    "hta/a100_rank0of2_nccl.pt.trace.json.gz",
    "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz",
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz",
    "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz",
    "hta/rank0of128_sampled.pt.trace.json.gz",
    "hta/rank1of128_sampled.pt.trace.json.gz",
])
def test_comm_bound_assesses_every_nccl_trace(trace: str):
    assert comm_bound(real(trace)).status in ("finding", "clear")


def test_comm_bound_not_assessed_on_single_gpu_and_cpu():
    assert comm_bound(real(NW0)).status == "not_assessed"
    assert comm_bound(real("hta/v100_rank0_ns_resolution.pt.trace.json.gz")).status == (
        "not_assessed")
    # A CPU trace is assessed when it has gloo collectives (the gloo tests above), not
    # when it has none.
    assert comm_bound(real("hta/cpu_only_rank0_dataloader.pt.trace.json.gz")).status == (
        "not_assessed")


def test_comm_bound_overlapped_collective_is_clear(tmp_path: Path):
    events = [
        step(1, 0, 1000),
        *kernel("sgemm", 0, 900, 1, launch=0),
        *kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 100, 500, 2, launch=0, stream=20),
    ]
    model = synthetic(tmp_path, "overlap", events, distributedInfo={"rank": 0, "world_size": 2})
    a = comm_bound(model)
    assert a.status == "clear"


def test_comm_bound_exposed_collective_is_measured(tmp_path: Path):
    events = [
        step(1, 0, 1000),
        *kernel("sgemm", 0, 400, 1, launch=0),
        # 300..700: 100 us under the GEMM, 300 us exposed.
        *kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 300, 400, 2, launch=0, stream=20),
    ]
    model = synthetic(tmp_path, "exposed", events, distributedInfo={"rank": 0, "world_size": 2})
    a = comm_bound(model)
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["exposed_share_pct"] == pytest.approx(30.0)
    assert ev["overlap_pct"] == pytest.approx(25.0)
    assert ev["top_collectives"][0] == {"collective": "AllReduce", "count": 1, "comm_ms": 0.4,
                                        "exposed_ms": 0.3}
