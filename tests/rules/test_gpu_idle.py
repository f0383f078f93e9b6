"""`gpu-idle`: the GPU sits idle inside the training step, on real traces and on small
synthetic traces with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose.rules.gpu_idle import IdleEvidence, changes, gpu_idle, idle_gaps, judge
from tests.rules.builders import kernel, real, step, synthetic

NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def test_gpu_idle_num_workers_0_is_mostly_dataloader_wait():
    a = gpu_idle(real(NW0))
    assert a.status == "finding"
    ev = a.finding.evidence
    # TensorBoard plugin: GPU utilization 55.51% on this span, i.e. ~44.5% idle.
    assert 40.0 <= ev["idle_share_pct"] <= 48.0
    assert ev["idle_during_dataloader_pct"] > 50.0
    assert ev["dominant_cause"] == "dataloader"
    assert "dataloader-bound" in a.finding.recommendation
    # The DataLoader part is dataloader-bound's saving and is not counted again here.
    assert a.finding.estimated_saving_pct < ev["idle_share_pct"] - 20.0


def test_gpu_idle_gaps_sum_to_the_model_idle_time():
    model = real(NW0)
    gaps = idle_gaps(model, "0")
    assert gaps["us"].sum() == pytest.approx(sum(s.gpu_us["0"]["idle"] for s in model.steps))


def test_gpu_idle_clear_when_gpu_is_busy():
    a = gpu_idle(real("hta/v100_rank0_ns_resolution.pt.trace.json.gz"))
    assert a.status == "clear"


def test_gpu_idle_not_assessed_without_gpu():
    a = gpu_idle(real("hta/cpu_only_rank0_dataloader.pt.trace.json.gz"))
    assert a.status == "not_assessed"


def test_gpu_idle_splits_host_wait_from_queued_work(tmp_path: Path):
    events = [
        step(1, 0, 1000),
        *kernel("k1", 0, 100, 1, launch=0),
        # Gap 100..400: k2 launched at 300, after the GPU went idle: host-wait (300 us).
        *kernel("k2", 400, 100, 2, launch=300),
        # Gap 500..800: k3 launched at 200, long before: it waited on something else (300 us).
        *kernel("k3", 800, 100, 3, launch=200),
        # 900..1000: the step's tail: other (100 us).
    ]
    a = gpu_idle(synthetic(tmp_path, "idle", events))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["idle_share_pct"] == pytest.approx(70.0)
    assert ev["host_wait_share_pct"] == pytest.approx(30.0)
    assert ev["other_share_pct"] == pytest.approx(40.0)
    assert a.finding.estimated_saving_pct == pytest.approx(70.0)


def test_gpu_idle_host_wait_dominant_gets_launch_advice(tmp_path: Path):
    events = [step(1, 0, 1000)]
    for i in range(10):  # 10 us kernels, each launched 100 us after the previous one ended
        events += kernel(f"k{i}", i * 100 + 50, 10, i + 1, launch=i * 100 + 40)
    a = gpu_idle(synthetic(tmp_path, "launch-bound", events))
    assert a.status == "finding"
    assert a.finding.evidence["dominant_cause"] == "host-wait"
    assert "torch.compile" in a.finding.snippet


def test_gpu_idle_names_cpu_work_that_launches_nothing(tmp_path: Path):
    """synthetic: between kernels the stepping thread tokenises for 3 ms on the CPU (an op with
    no runtime call under it), then launches: not launch overhead, and the advice says so."""
    events = []
    for i in range(3):
        t0 = i * 5_000.0
        events += [step(i + 1, t0, 5_000),
                   *kernel("k_fwd", t0 + 20, 500, 10 * i + 1, launch=t0 + 10),
                   {"ph": "X", "cat": "cpu_op", "name": "tokenize_requests", "pid": 1, "tid": 1,
                    "ts": t0 + 600, "dur": 3_000},
                   *kernel("k_head", t0 + 3_700, 1_000, 10 * i + 2, launch=t0 + 3_650)]
    a = gpu_idle(synthetic(tmp_path, "cpu-work", events))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["dominant_cause"] == "host-cpu-work"
    assert ev["cpu_work_ops"][0]["op"] == "tokenize_requests"
    assert ev["cpu_work_ops"][0]["ms_per_step"] == pytest.approx(3.0)
    assert "tokenize_requests" in a.finding.title
    assert "DataLoader workers" in a.finding.recommendation
    assert "reduce-overhead" not in a.finding.snippet  # no CUDA graphs for CPU work


# ---------------------------------------------------------------------- every thread


def _op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _launched(name: str, ts: float, dur: float, corr: int, launch: float,
              tid: int = 1) -> list[dict]:
    """A kernel and the cudaLaunchKernel on thread `tid` that launched it."""
    return [*kernel(name, ts, dur, corr),
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
             "tid": tid, "ts": launch, "dur": 5, "args": {"correlation": corr}}]


def test_gpu_idle_counts_the_autograd_engines_launches_as_launch_work(tmp_path: Path):
    """synthetic: the stepping thread runs the forward, then sits in loss.backward() recording
    nothing while the autograd engine's thread launches each backward kernel 290 us into its
    node. Read from the stepping thread alone this was "(no recorded op)" CPU work, "not
    launch overhead"; it is the autograd engine launching, which CUDA graphs remove."""
    events: list[dict] = []
    for i in range(3):
        t0, corr = i * 5_000.0, 100 * i
        events += [step(i + 1, t0, 5_000), _op("aten::conv2d", t0 + 10, 50),
                   *_launched("k_fwd", t0 + 60, 200, corr, t0 + 50)]
        for j in range(10):
            a = t0 + 400 + 400 * j
            events += [_op("autograd::engine::evaluate_function: ConvolutionBackward0", a, 300,
                           tid=2),
                       *_launched("k_bwd", a + 300, 50, corr + j + 1, a + 290, tid=2)]
    a = gpu_idle(synthetic(tmp_path, "autograd", events))
    ev = a.finding.evidence
    assert ev["dominant_cause"] == "host-wait"
    top = ev["idle_by_thread_op"][0]
    assert (top["thread"], top["op"], top["kind"]) == (
        "autograd engine", "autograd::engine::evaluate_function: *", "launch")
    assert top["ms_per_step"] == pytest.approx(3.0, abs=0.05)  # 10 nodes, 300 us each
    # Left as host time no thread spent launching: the stepping thread after the backward,
    # before the next step's forward, and the hand-over to the engine.
    assert ev["launch_work_ms_per_step"] > 5 * ev["cpu_work_ms_per_step"]
    assert "autograd engine" in a.finding.title
    assert "reduce-overhead" in a.finding.snippet
    assert [c.text for c in changes(a.finding, synthetic(tmp_path, "autograd", events))] == [
        "cuda_graphs=true"]


def test_gpu_idle_names_python_functions_where_the_trace_has_them(tmp_path: Path):
    """synthetic, recorded with Python stacks: 3 ms of `train.py(30): tokenize` between two
    launches, with no cpu_op under it. It used to read "(no recorded op: Python code or
    untraced work)"; the python_function event names it."""
    events: list[dict] = []
    for i in range(3):
        t0 = i * 5_000.0
        events += [step(i + 1, t0, 5_000), _op("aten::add", t0 + 5, 20),
                   *_launched("k_add", t0 + 20, 500, 10 * i + 1, t0 + 10),
                   _op("train.py(30): tokenize", t0 + 600, 3_000, cat="python_function"),
                   _op("aten::mm", t0 + 3_620, 40),
                   *_launched("k_mm", t0 + 3_700, 1_000, 10 * i + 2, t0 + 3_650)]
    a = gpu_idle(synthetic(tmp_path, "python", events))
    ev = a.finding.evidence
    assert ev["dominant_cause"] == "host-cpu-work"
    assert ev["cpu_work_ops"][0]["op"] == "train.py(30): tokenize"
    assert ev["cpu_work_ops"][0]["ms_per_step"] == pytest.approx(3.0, abs=0.05)
    assert ev["host_wait_ms_per_step_by_kind"]["python"] == pytest.approx(3.0, abs=0.05)
    assert "train.py(30): tokenize" in a.finding.title


def test_gpu_idle_names_the_pin_memory_threads_hold(tmp_path: Path):
    """synthetic: right after the pin-memory thread's cudaPointerGetAttributes, no thread of
    the process records anything for 3 ms, then the stepping thread launches. It used to read
    as the stepping thread's untraced work; it is named as the pin-memory thread's."""
    events: list[dict] = []
    for i in range(3):
        t0 = i * 5_000.0
        events += [step(i + 1, t0, 5_000), _op("aten::add", t0 + 5, 20),
                   *_launched("k_add", t0 + 20, 500, 10 * i + 1, t0 + 10),
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaPointerGetAttributes",
                    "pid": 1, "tid": 3, "ts": t0 + 540, "dur": 8},
                   _op("aten::mm", t0 + 3_600, 60),
                   *_launched("k_mm", t0 + 3_700, 1_000, 10 * i + 2, t0 + 3_650)]
    a = gpu_idle(synthetic(tmp_path, "pinned", events))
    ev = a.finding.evidence
    top = ev["idle_by_thread_op"][0]
    assert (top["thread"], top["op"], top["kind"]) == (
        "pin-memory thread", "cudaPointerGetAttributes", "pin-memory")
    assert top["ms_per_step"] == pytest.approx(3.05, abs=0.05)
    assert "pin-memory thread" in a.finding.title
    assert "pin_memory" in a.finding.recommendation


# ---------------------------------------------------------------------- judge, no trace


def _evidence(**kw: object) -> IdleEvidence:
    """Ten steps of 10 ms, the GPU idle 5 ms of each, all of it host-wait gaps."""
    base: dict = {
        "device": "0", "steps": 10, "step_us": 100_000.0, "idle_us": 50_000.0,
        "by_gap_kind": (50_000.0, 0.0, 0.0), "loader_us": 0.0, "sync_us": 0.0,
        "rest": (50_000.0, 0.0, 0.0), "host_kinds": {"launch": 50_000.0}, "rows": (),
        "regions": (), "graph_launches": 0, "has_host_ops": True, "bound_pct": 50.0,
        "detail": {},
    }
    base.update(kw)
    return IdleEvidence(**base)


def test_judge_clear_below_the_threshold():
    verdict = judge(_evidence(idle_us=5_000.0))
    assert not verdict.found and not verdict.graphs


def test_judge_launch_work_is_host_wait_and_fits_cuda_graphs():
    verdict = judge(_evidence(host_kinds={"launch": 30_000.0, "untraced": 20_000.0}))
    assert (verdict.cause, verdict.graphs) == ("host-wait", True)


def test_judge_host_time_no_thread_launched_in_is_not_launch_overhead():
    """More host time without any launching than launch work: host-cpu-work, and no CUDA
    graphs (they would leave the larger part); launch work the larger part: host-wait."""
    verdict = judge(_evidence(host_kinds={"launch": 20_000.0, "pin-memory": 30_000.0}))
    assert (verdict.cause, verdict.graphs) == ("host-cpu-work", False)
    assert (verdict.launch_us, verdict.not_launch_us) == (20_000.0, 30_000.0)
    close = judge(_evidence(host_kinds={"launch": 26_000.0, "untraced": 24_000.0}))
    assert (close.cause, close.graphs) == ("host-wait", True)


def test_judge_a_step_that_already_launches_graphs_gets_no_cuda_graphs():
    verdict = judge(_evidence(graph_launches=20))
    assert verdict.cause == "host-wait" and not verdict.graphs
    graphed = judge(_evidence(graph_launches=20, host_kinds={
        "launch": 10_000.0, "graphed": 25_000.0, "cpu-work": 15_000.0}))
    assert graphed.cause == "host-wait" and not graphed.graphs


def test_judge_without_host_ops_does_not_call_the_host_time_cpu_work():
    """A legacy GPU-only export records no host ops: nothing says what the host did."""
    verdict = judge(_evidence(has_host_ops=False, host_kinds={"untraced": 50_000.0}))
    assert (verdict.cause, verdict.not_launch_us) == ("host-wait", 0.0)


def test_judge_names_the_dataloader_and_host_regions():
    loader = judge(_evidence(loader_us=30_000.0, rest=(20_000.0, 0.0, 0.0)))
    assert (loader.cause, loader.graphs) == ("dataloader", False)
    region = {"kind": "allocator", "region": "cudaMalloc/cudaFree", "ms_per_step": 2.5,
              "pct_of_host_wait": 50.0}
    assert judge(_evidence(regions=(region,))).cause == "allocator"
    assert judge(_evidence(regions=({**region, "pct_of_host_wait": 20.0},))).cause == \
        "host-wait"


def test_gpu_idle_knows_the_autograd_engine_of_an_older_torch():
    """kineto/tbtest_gpu_metrics_input (torch 1.8/1.9) records the autograd nodes without the
    evaluate_function wrapper (`MmBackward`): its thread is still the autograd engine, whose
    launches are launch work. It used to read CPU work that launches nothing."""
    ev = gpu_idle(real("kineto/tbtest_gpu_metrics_input.json")).finding.evidence
    assert ev["dominant_cause"] == "host-wait"
    assert set(ev["idle_ms_per_step_by_thread"]) == {"autograd engine", "stepping thread"}
    assert ev["idle_ms_per_step_by_thread"]["autograd engine"] > 4.0
