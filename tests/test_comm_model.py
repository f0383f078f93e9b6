"""The communication model: comm=overlap replayed on real traces (bucketed all-reduce through
backward compute), bounded by the compute there is to hide under, waiting on peers named as its
own quantity, and RCCL/MSCCL collective kernels recognised."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from stallscope.diagnose.rules.comm_bound import comm_bound
from stallscope.diagnose.rules.gpu_bound import COMM as GPU_BOUND_COMM
from stallscope.diagnose.rules.rank_imbalance import WAITED_FOR, RankWork, rank_imbalance
from stallscope.replay import transforms as tf
from stallscope.replay.engine import replay
from stallscope.replay.graph import CALL, MARK, Graph
from stallscope.replay.models.comm_bound import BUCKET_US, peer_excess
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import real_trace, report_of

V100_DF = "hta/v100_rank1of2_df_index_resolver.pt.trace.json.gz"
RANK0OF128 = "hta/rank0of128_sampled.pt.trace.json.gz"
QUEUE_LEN = "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"
NCCL2 = "hta/a100_rank0of2_nccl.pt.trace.json.gz"


def _model(path: Path):
    return build_model(load_trace(path))


def test_per_tensor_all_reduce_leads_the_plan_with_its_replayed_saving() -> None:
    # v100 rank 1 of 2: 404 per-tensor all-reduces per step, issued after backward, 0.32 ms of
    # host calls each; comm=overlap (buckets through backward, host calls gone) is replayed,
    # second in the plan after CUDA graphs (the host launches hold the larger share of the
    # plan's saving, and the two pay off together), before zero_grad's.
    report = report_of(real_trace(V100_DF))
    order = [e["id"] for e in report.plan["entries"]]
    assert order[:2] == ["gpu-idle", "comm-bound"]
    (comm,) = [f for f in report.findings if f.id == "comm-bound"]
    before = report.plan["baseline_step_us"]
    # Alone, comm=overlap takes a few percent off; its share of the plan is larger.
    assert report.plan["floor_us"] < comm.predicted_step_us < 0.98 * before
    assert comm.estimated_saving_pct > 100 * (before - comm.predicted_step_us) / before
    (comm,) = [f for f in report.findings if f.id == "comm-bound"]
    assert comm.saving_kind == "replayed"
    ev = comm.evidence
    assert ev["exposed_share_pct"] == pytest.approx(20.6, abs=0.2)
    assert 0 < ev["peer_wait_share_pct"] < ev["exposed_share_pct"]
    assert "waiting on peers" in comm.title
    # The cause named: per-tensor all-reduce, which DDP's buckets replace.
    assert ev["top_collective_calls_per_step"] == 404
    assert comm.recommendation.count("404 AllReduce calls per step") == 1


def test_all_to_all_bound_and_exposed_share_are_two_named_numbers() -> None:
    # rank 0 of 128 (TorchRec): 27.4% exposed all-to-all/all-reduce, but the device runs
    # compute for only 105 ms of each 615 ms step. Two steps: the same collective's instances
    # cannot be compared (step 1's first all-to-all moves 3 KB, step 2's 419 MB, by their host
    # ranges), so no waiting on peers is claimed, and the generic straggler advice stays.
    report = report_of(real_trace(RANK0OF128))
    (comm,) = [f for f in report.findings if f.id == "comm-bound"]
    ev = comm.evidence
    assert ev["peer_wait_ms_per_step"] == 0.0
    assert comm.title == ("Collective communication is exposed for 27.4% of each step (at most "
                          "17.1% hideable under compute)")
    assert ev["hideable_share_pct"] == 17.1  # of the recorded step
    # The bound on the plan's base, the step without the profiler's cost: the same ms.
    plan = report.plan
    assert comm.estimated_saving_pct == pytest.approx(
        17.1 * plan["measured_step_us"] / plan["baseline_step_us"], abs=0.05)
    assert comm.saving_kind == "upper_bound"
    assert "rank-imbalance" in comm.recommendation
    assert "all-to-all" in report.plan["not_replayed"]["comm-bound"]


def test_queue_len_all_reduce_is_labelled_by_its_host_range_and_replayed() -> None:
    # a100 rank 0 of 16: every collective runs as a SendRecv kernel; the host ranges say which
    # is which. The exposed time is mostly one all-reduce a step (24-26 ms: its host range
    # moves 447,923,396 floats, 1.79 GB, about 70 GB/s: a transfer, not a wait) issued after
    # backward in one piece: as 25 MB buckets during backward, 215.3 -> 189.7 ms (11.9%).
    report = report_of(real_trace(QUEUE_LEN))
    (comm,) = [f for f in report.findings if f.id == "comm-bound"]
    ev = comm.evidence
    assert ev["exposed_share_pct"] == pytest.approx(15.1, abs=0.2)
    assert ev["pattern"] == "all-reduce"
    assert ev["top_collectives"][0]["collective"] == "AllReduce"
    # All-to-all moves what each batch routes, so it is not compared across steps; the
    # all-reduces take the same time every step: no waiting on peers is claimed.
    assert ev["peer_wait_ms_per_step"] == 0.0
    # Replayed, and the plan's first change; the host's waits held behind other streams (an
    # upper bound the replay cannot model) lead the report.
    assert comm.saving_kind == "replayed" and report.plan["entries"][0]["id"] == "comm-bound"
    assert report.top_finding.id == "host-device-sync"
    entry = report.plan_entry(comm)
    assert report.plan["baseline_step_us"] == pytest.approx(215_300, rel=0.02)
    # 3%: as for the v100 trace above.
    assert entry["predicted_step_us"] == pytest.approx(189_700, rel=0.03)
    assert entry["predicted_step_us"] > report.plan["floor_us"]


def test_peer_excess_compares_the_same_collective_across_steps() -> None:
    # Three steps, one stream, the same two collectives each step: the third step's first
    # collective took 10 ms where it takes 1 ms: 9 ms of waiting; 1.3 vs 1.0 ms: jitter.
    stream = np.zeros(6)
    step = np.array([0, 0, 1, 1, 2, 2])
    ts = np.array([0.0, 5e3, 20e3, 35e3, 50e3, 65e3])
    dur = np.array([1e3, 1e3, 1e3, 1e3, 10e3, 1.3e3])
    kinds = np.array(["AllReduce"] * 6, dtype=object)
    assert peer_excess(stream, step, ts, dur, kinds).tolist() == [0, 0, 0, 0, 9e3, 0]
    # Steps whose collectives differ cannot be compared without their sizes; nor can two
    # steps (one may start mid-pattern): nothing claimed.
    other = kinds.copy()
    other[1] = "AllGather"
    assert not peer_excess(stream, step, ts, dur, other).any()
    two = step < 2
    assert not peer_excess(stream[two], step[two], ts[two], dur[two], kinds[two]).any()


def _one_step(end_us: float, g_stream: np.ndarray, g_ts: np.ndarray, g_dur: np.ndarray,
              cross: np.ndarray, anchor: np.ndarray, g_name: np.ndarray,
              g_names: list[str]) -> Graph:
    """A graph of one step on one host thread (a launch call at its start, its end marker at
    `end_us`) and the given GPU ops, none launched by the host: the GPU side is the test's."""
    m, n = len(g_ts), 3
    return Graph(
        h_thread=np.zeros(n, dtype=np.int64), h_kind=np.array([MARK, CALL, MARK]),
        h_ts=np.array([0.0, 1.0, end_us]), h_rec_end=np.array([0.0, 11.0, end_us]),
        h_dur=np.array([0.0, 10.0, 0.0]), h_lead=np.array([0.0, 0.0, end_us - 11.0]),
        h_release=np.full(n, -1), h_delay=np.zeros(n), h_wait=np.full(n, -1),
        h_after=np.full(n, -1), h_ret=np.zeros(n), h_name=np.zeros(n, dtype=np.int64),
        h_names=["cudaLaunchKernel"], h_typical=np.full(n, 10.0), thread_ids=["1"],
        thread_origin=np.zeros(1), markers=np.array([0, 2]), step_start=np.array([0]),
        step_end=np.array([2]),
        g_stream=g_stream, g_device=np.array(["0"] * m, dtype=object),
        g_kind=np.array(["kernel"] * m, dtype=object), g_name=g_name, g_names=g_names,
        g_ts=g_ts, g_dur=g_dur, g_bytes=np.full(m, np.nan), g_launch=np.full(m, -1),
        g_lat=np.zeros(m), g_gap=np.zeros(m), g_cross=cross, g_cgap=np.zeros(m),
        g_anchor=anchor, g_step=np.zeros(m, dtype=np.int64), launch_us=5.0,
    )


def _graph(collectives: int, comm_us: float = 12e3) -> Graph:
    """One step as recorded: backward compute on stream 0 (3 kernels of 10 ms, 0-30 ms), then
    the gradient all-reduce on stream 1 in `collectives` equal parts (`comm_us` in all, from
    30 ms), then the optimizer kernel (2 ms) that waits for the last part. No host in the way."""
    bwd = [(0.0, 10e3), (10e3, 10e3), (20e3, 10e3)]
    part = comm_us / collectives
    comm = [(30e3 + k * part, part) for k in range(collectives)]
    stream0 = [*bwd, (30e3 + comm_us, 2e3)]
    ops = [(0, ts, d, 0) for ts, d in bwd] + [(0, 30e3 + comm_us, 2e3, 1)] + [
        (1, ts, d, 2) for ts, d in comm]
    m = len(ops)
    g_stream = np.array([o[0] for o in ops])
    g_ts = np.array([o[1] for o in ops])
    g_dur = np.array([o[2] for o in ops])
    cross = np.full(m, -1)
    cross[len(stream0) - 1] = m - 1  # the optimizer waits for the last all-reduce part
    anchor = g_ts.copy()
    anchor[len(stream0) - 1] = -np.inf
    anchor[len(stream0):] = -np.inf  # the parts follow each other on their stream
    anchor[len(stream0)] = 30e3
    return _one_step(50e3, g_stream, g_ts, g_dur, cross, anchor,
                     np.array([o[3] for o in ops]),
                     ["backward_kernel", "sgd_kernel", "ncclKernel_AllReduce_RING_LL_Sum_float"])


def _gpu_done(g: Graph, overlap: bool, backward: bool = True) -> float:
    if overlap:
        comm = g.gpu_named(lambda n: n.startswith("nccl"))
        hide = g.gpu_named(lambda n: n.startswith("backward")) & backward
        g = g.copy(*tf.OVERLAPS)
        tf.overlap_collectives(g, comm, np.zeros_like(comm), hide, np.zeros(len(g.g_ts)),
                               BUCKET_US)
    return float(replay(g).gpu_end.max())


def test_overlap_saves_nothing_when_all_compute_is_before_the_collective() -> None:
    # A 0.8 ms all-reduce is one bucket: it needs the last gradient, which the last backward
    # kernel makes, so no compute is left to hide it under: the GPU ends at 32.8 ms either way.
    g = _graph(collectives=1, comm_us=800.0)
    assert _gpu_done(g, overlap=False) == pytest.approx(32.8e3)
    assert _gpu_done(g, overlap=True) == pytest.approx(32.8e3)
    # Compute that is not backward (no gradients come out of it) hides nothing either.
    g = _graph(collectives=1)
    assert _gpu_done(g, overlap=True, backward=False) == _gpu_done(g, overlap=False) == 44e3


def test_overlap_is_bounded_by_the_compute_after_the_gradients() -> None:
    # 12 ms of gradient all-reduce sent as 1 ms buckets while backward makes them: it must
    # end one bucket after the last gradient (31 ms), so it starts at the end of the backward
    # kernel by which that is possible (20 ms) and the optimizer ends at 34 ms, not 44 ms; and
    # never before backward + one bucket + optimizer (33 ms).
    g = _graph(collectives=1)
    assert _gpu_done(g, overlap=False) == pytest.approx(44e3)
    assert _gpu_done(g, overlap=True) == pytest.approx(34e3)
    # Two collectives of 6 ms: the second carries the last half of the gradients, and starts
    # at the end of backward's last kernel: 38 ms.
    assert _gpu_done(_graph(collectives=2), overlap=True) == pytest.approx(38e3)
    # More collective time than backward compute (40 ms against 30): it starts with the first
    # bucket (after the first backward kernel, 10 ms) and runs its full 40 ms: 52 ms, not 72.
    g = _graph(collectives=1, comm_us=40e3)
    assert _gpu_done(g, overlap=False) == pytest.approx(72e3)
    assert _gpu_done(g, overlap=True) == pytest.approx(52e3)


def _sharded_graph() -> Graph:
    """Two layers of a sharded step: all-gather k (stream 1, 5 ms) then layer k's compute
    (stream 0, 10 ms) that waits for it; the second all-gather was issued only when the first
    layer's compute ended (no prefetch): AG1 0-5, C1 5-15, AG2 15-20, C2 20-30 ms."""
    # sorted by (stream, start): C1, C2 on stream 0; AG1, AG2 on stream 1
    g_stream = np.array([0, 0, 1, 1])
    g_ts = np.array([5e3, 20e3, 0.0, 15e3])
    g_dur = np.array([10e3, 10e3, 5e3, 5e3])
    cross = np.array([2, 3, -1, -1])
    anchor = np.array([-np.inf, -np.inf, 0.0, 15e3])
    return _one_step(40e3, g_stream, g_ts, g_dur, cross, anchor, np.array([0, 0, 1, 1]),
                     ["layer_kernel", "ncclDevKernel_AllGather_RING_LL"])


def test_all_gather_prefetch_hides_the_next_shard_under_the_current_layer() -> None:
    # Prefetched, AG2 runs right after AG1 (5-10 ms), under C1; C2 follows C1 at 15 ms:
    # 30 -> 25 ms. The first all-gather has nothing before it to hide under and stays.
    g = _sharded_graph()
    assert float(replay(g).gpu_end.max()) == pytest.approx(30e3)
    ag = g.gpu_named(lambda n: "AllGather" in n)
    g2 = g.copy(*tf.OVERLAPS)
    moved = tf.overlap_collectives(g2, np.zeros_like(ag), ag, np.zeros_like(ag),
                                   np.zeros(len(g.g_ts)), BUCKET_US)
    assert moved == 1
    assert float(replay(g2).gpu_end.max()) == pytest.approx(25e3)


def _renamed_copy(src: Path, dst: Path, new: str) -> Path:
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    pattern = re.compile(r"^ncclKernel_[A-Za-z]+_")
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel" and pattern.match(ev.get("name", "")):
            ev["name"] = pattern.sub(new, ev["name"])
    with gzip.open(dst, "wt") as fh:
        json.dump(doc, fh)
    return dst


@pytest.mark.parametrize("new", ["mscclKernel_Sum_", "rcclKernel_AllReduce_"])
def test_rccl_and_msccl_kernels_are_collectives(tmp_path: Path, new: str) -> None:
    # a100 rank 0 of 2 with its NCCL kernels renamed as RCCL's MSCCL path names them on ROCm:
    # the same exposed communication is found, and gpu-bound counts them as communication.
    src = real_trace(NCCL2)
    renamed = _model(_renamed_copy(src, tmp_path / "renamed.pt.trace.json.gz", new))
    assert renamed.gpu["name"].astype(str).str.startswith(new[:5]).any()
    before = comm_bound(_model(src)).finding.evidence
    after = comm_bound(renamed).finding.evidence
    assert after["comm_ms_per_step"] == before["comm_ms_per_step"] > 0
    assert after["exposed_share_pct"] == before["exposed_share_pct"]
    assert GPU_BOUND_COMM.search(new)


def _rank(rank: int, collective_ms: float, host_ms: float) -> RankWork:
    return RankWork(8, {"rank": rank, "trace": f"rank {rank}", "step_ms": 100.0,
                        "loader_wait_ms": 1.0, "host_compute_ms": host_ms,
                        "gpu_compute_ms": 40.0, "collective_ms": collective_ms})


def test_the_rank_the_others_wait_for_in_collectives_is_named() -> None:
    # Equal loader waits and GPU compute; rank 3 spends 4 ms per step in collectives where the
    # others spend 16 ms: they wait 12 ms a step for it (its extra work is on its host).
    works = [_rank(r, 16.0, 50.0) for r in range(3)] + [_rank(3, 4.0, 62.0)]
    a = rank_imbalance(works)
    assert a.status == "finding"
    f = a.finding
    assert f.evidence["straggler_rank"] == 3
    assert f.evidence["straggler_cause"] == WAITED_FOR
    assert f.title == ("Rank 3 is waited for: the other ranks spend 12.0 ms more per step in "
                       "collectives")
    assert "host_compute_ms" in f.recommendation
    # Collective times within the threshold of each other: no one is named.
    assert rank_imbalance([_rank(r, 16.0 - r, 50.0) for r in range(4)]).status == "clear"
