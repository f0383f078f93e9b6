"""Per rank, the GPU's kernels by type and the communication hidden under compute, and the GPU
summary (issue 32): figures on the shared real traces, checked against HolisticTraceAnalysis'
and the TensorBoard plugin's own numbers on the same traces, and shown on the page."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.kernel_mix import gpu_summary, kernel_mix
from tests.conftest import ROOT, SAMPLES, real_trace, report_of

PAIR = ("hta/rank0of128_sampled.pt.trace.json.gz", "hta/rank1of128_sampled.pt.trace.json.gz")
A100_16 = "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"


def _data(*relative: str) -> dict:
    return json.loads(render_json(report_of(*(real_trace(r) for r in relative))))


def _mix(relative: str) -> dict:
    (mix,) = _data(relative)["traces"][0]["kernel_mix"]
    return mix


def test_two_ranks_of_a_128_rank_job_say_so() -> None:
    data = _data(*PAIR)
    assert data["notes"][0].startswith("2 of 128 ranks given")
    grouped = [f for f in data["findings"] if "seen_on" in f["evidence"]]
    assert grouped, [f["title"] for f in data["findings"]]
    for f in grouped:
        assert f["title"].endswith("on ranks 0-1 (2 of 128 ranks given)"), f["title"]
        assert f["evidence"]["seen_on"]["world"] == 128
    page = render_html(report_of(*(real_trace(r) for r in PAIR)))
    assert "2 of 128 ranks given" in page
    assert "(2 of 2)" not in page


def test_communication_is_a_large_part_of_the_a100_ranks_step() -> None:
    """a100_80gb_rank0of16 (a 16-rank recommender job): its GPU spends about as long in NCCL
    kernels as in compute, and almost none of it under compute."""
    mix = _mix(A100_16)
    us = mix["per_step_us"]
    assert us["communication"] > 0.4 * (us["compute"] + us["communication"])
    assert 0 <= mix["comm_hidden_pct"] < 5
    split = mix["split_pct"]
    assert sum(split.values()) == pytest.approx(100, abs=0.05)
    assert split["comm_exposed"] > 10


def test_every_rank_row_has_its_split_and_the_overlap_is_a_share() -> None:
    data = _data(*PAIR)
    for row in data["ranks"]:
        mix = row["kernel_mix"]
        assert 0 <= mix["comm_hidden_pct"] <= 100
        assert mix["per_step_us"]["comm_hidden"] <= mix["per_step_us"]["communication"]
        assert sum(mix["split_pct"].values()) == pytest.approx(100, abs=0.05)
    assert [r["kernel_mix"]["device"] for r in data["ranks"]] == ["0", "1"]


# HolisticTraceAnalysis (github.com/facebookresearch/HolisticTraceAnalysis at f4d0062c, run by
# hand on these files): get_comm_comp_overlap's comp_comm_overlap_pctg and
# get_temporal_breakdown's compute_time(us), per rank.
HTA_FIGURES = {
    A100_16: (1.37, 143836.0),
    PAIR[0]: (11.81, 106252.0),
    PAIR[1]: (20.05, 135548.0),
    "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz": (68.8, 429216.0),
}


@pytest.mark.parametrize("relative", sorted(HTA_FIGURES))
def test_the_split_matches_hta_on_its_own_kernel_selection(relative: str) -> None:
    """HTA keeps the GPU work launched before the last ProfilerStep and measures over its whole
    span; the report measures over the judged steps. On HTA's selection the same definitions
    give HTA's numbers (benchmarks/hta_kernel_mix.py prints them)."""
    spec = importlib.util.spec_from_file_location("hta_kernel_mix", ROOT / "benchmarks" /
                                                  "hta_kernel_mix.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    mix = bench.hta_selection_mix(real_trace(relative))
    overlap, compute_us = HTA_FIGURES[relative]
    assert mix["comm_hidden_pct"] == pytest.approx(overlap, abs=0.01)
    assert mix["per_step_us"]["compute"] == pytest.approx(compute_us, abs=1.0)


# The TensorBoard profiler plugin (torch-tb-profiler 0.4.3, GPUMetricsParser, run by hand on
# this file): Est. SM Efficiency 54.68%, Est. Achieved Occupancy 49.13%. It ends each step
# where the GPU work the step launched ends; the report's windows are the host steps'.
KINETO = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def test_sm_efficiency_and_occupancy_are_the_tensorboard_plugins() -> None:
    (summary,) = _data(KINETO)["traces"][0]["gpu_summary"]
    assert summary["sm_efficiency_pct"] == pytest.approx(54.68, abs=1.0)
    assert summary["occupancy_pct"] == pytest.approx(49.13, abs=1.0)
    assert summary["tensor_core_pct"] == 0.0  # fp32 ResNet-50 on a V100: cuDNN fp32 kernels
    assert summary["missing"] is None


def _tensor_cores(name: str) -> float:
    path = SAMPLES / f"real-h200-xfmr-{name}.pt.trace.json.gz"
    (summary,) = json.loads(render_json(report_of(path)))["traces"][0]["gpu_summary"]
    return summary["tensor_core_pct"]


def test_the_tensor_core_share_follows_the_precision() -> None:
    """The same transformer block on an H200: fp32 GEMMs run on the SIMT units (0%); TF32 and
    bf16 move them onto tensor cores."""
    assert _tensor_cores("fp32") == 0.0
    assert _tensor_cores("tf32") > 40
    assert _tensor_cores("bf16") > 20


def test_what_a_trace_does_not_hold_is_not_given_as_zero() -> None:
    (gp100,) = _data("hta/gp100_gpu_user_annotation.pt.trace.json.gz")["traces"][0]["gpu_summary"]
    assert gp100["tensor_core_pct"] is None and "no tensor cores" in gp100["missing"]
    (amd,) = _data("hta/amd_mi250_rocm62_minitoy.pt.trace.json.gz")["traces"][0]["gpu_summary"]
    assert amd["sm_efficiency_pct"] is None and amd["occupancy_pct"] is None
    assert "blocks per SM" in amd["missing"]
    page = render_html(report_of(real_trace("hta/amd_mi250_rocm62_minitoy.pt.trace.json.gz")))
    assert "not in the trace" in page and 'id="gpu-summary"' in page
    cpu = _data("hta/cpu_only_rank34of300_gloo.pt.trace.json.gz")
    assert cpu["traces"][0]["kernel_mix"] is None and cpu["traces"][0]["gpu_summary"] is None
    assert cpu["ranks"][0]["kernel_mix"] is None
    cpu_page = render_html(report_of(real_trace("hta/cpu_only_rank34of300_gloo.pt.trace.json.gz")))
    assert 'id="kernels-chart"' not in cpu_page and 'id="gpu-summary"' not in cpu_page


def test_the_page_draws_one_bar_per_rank() -> None:
    page = render_html(report_of(*(real_trace(r) for r in PAIR)))
    chart = page.split('id="kernels-chart"', 1)[1].split("</svg>", 1)[0]
    assert chart.count("<title>rank ") == 2
    assert "% hidden" in chart
    table = page.split('id="kernels"', 1)[1].split("</table>", 1)[0]
    assert "198.1" in table  # rank 0's communication, ms per step


def test_report_md_states_the_same_per_rank_figures() -> None:
    from stallscope.report.markdown import render_markdown

    text = render_markdown(report_of(*(real_trace(r) for r in PAIR)))
    section = text[text.index("## Per rank"):].split("\n\n- rank 1", 1)[0]
    row = " ".join(section.split())  # the list item, unwrapped
    # as report.json and the page say
    assert "GPU compute 105.2 ms, communication 198.1 ms (14.9% hidden under compute)" in row


def test_one_gpu_without_communication_gets_no_kernel_chart_but_its_summary() -> None:
    """The split of one GPU that never communicates is the GPU breakdown already shown; a GPU
    without tensor cores says so rather than 'not in the trace'."""
    page = render_html(report_of(real_trace("hta/gp100_gpu_user_annotation.pt.trace.json.gz")))
    assert 'id="kernels-chart"' not in page
    summary = page.split('id="gpu-summary"', 1)[1].split("</table>", 1)[0]
    assert "no tensor cores" in summary and "0.1%" in summary


@pytest.mark.parametrize("relative", [A100_16, "hta/a100_rank0of2_nccl.pt.trace.json.gz",
                                      "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz"])
def test_the_comm_bound_evidence_states_the_same_figures(relative: str) -> None:
    """One definition: the comm-bound finding's overlap, exposed share and communication time
    are the kernel split's, on the same GPU."""
    data = _data(relative)
    evidence = next(f["evidence"] for f in data["findings"] if f["id"] == "comm-bound")
    mix = next(m for m in data["traces"][0]["kernel_mix"] if m["device"] == evidence["device"])
    assert evidence["overlap_pct"] == pytest.approx(mix["comm_hidden_pct"], abs=0.01)
    assert evidence["exposed_share_pct"] == pytest.approx(mix["split_pct"]["comm_exposed"],
                                                          abs=0.01)
    assert evidence["comm_ms_per_step"] == pytest.approx(
        mix["per_step_us"]["communication"] / 1000, abs=0.001)


def test_the_split_on_a_planted_step(tmp_path: Path) -> None:
    """One 100 us step: compute 10-50 (two streams, 10-30 and 20-50: counted once), an
    all-reduce 40-70 (10 us under compute, 20 exposed), a copy 80-90, idle the rest. Kineto's
    estimates: one kernel says 2 blocks per SM (SM efficiency capped at 1 while it runs), one
    writes text and one an occupancy of 900%: not percents, left out."""
    from tests.rules.builders import kernel, step, synthetic

    events = [step(1, 0, 100)]
    events += kernel("volta_sgemm_128x64_nn", 10, 20, 1, launch=1)
    events += kernel("elementwise_kernel", 20, 30, 2, launch=2, stream=8)
    events += kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 40, 30, 3, launch=3, stream=9)
    events[1]["args"].update({"blocks per SM": 2.0, "est. achieved occupancy %": 50})
    events[3]["args"].update({"blocks per SM": "many", "est. achieved occupancy %": 900})
    events += [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)",
                "pid": 0, "tid": 7, "ts": 80, "dur": 10,
                "args": {"correlation": 4, "device": 0, "stream": 7, "bytes": 1024}}]
    model = synthetic(tmp_path, "kernel-mix", events)
    (mix,) = kernel_mix(model)
    assert mix["per_step_us"] == {"compute": 40.0, "communication": 30.0, "memory": 10.0,
                                  "comm_hidden": 10.0}
    assert mix["split_pct"] == {"compute": 30.0, "comm_hidden": 10.0, "comm_exposed": 20.0,
                                "memory": 10.0, "idle": 30.0}
    assert mix["comm_hidden_pct"] == pytest.approx(33.33, abs=0.01)
    (summary,) = gpu_summary(model)
    assert summary["sm_efficiency_pct"] == 20.0  # 10-30 at min(1, 2 blocks per SM)
    assert summary["occupancy_pct"] == 50.0  # the 900% is not a percent


def test_cpu_ranks_say_their_host_collectives() -> None:
    """The gloo DDP pair (CPU only): each rank's time in gloo collectives per step, its share
    of the step and the part hidden under compute, as comm-bound measures them, in every view."""
    from stallscope.report.markdown import render_markdown

    paths = (SAMPLES / "cpu-gloo-ddp-rank0.pt.trace.json.gz",
             SAMPLES / "cpu-gloo-ddp-rank1.pt.trace.json.gz")
    report = report_of(*paths)
    data = json.loads(render_json(report))
    rows = {r["rank"]: r for r in data["ranks"]}
    assert all(r["kernel_mix"] is None for r in rows.values())
    evidence = next(f["evidence"] for f in data["findings"] if f["id"] == "comm-bound")
    comm = {r: rows[r]["host_comm"] for r in rows}
    assert all(0 < c["comm_hidden_pct"] < 100 and 20 < c["share_pct"] < 90
               for c in comm.values())
    assert any(c["share_pct"] == pytest.approx(evidence["comm_share_pct"], abs=0.01)
               and c["comm_hidden_pct"] == pytest.approx(evidence["overlap_pct"], abs=0.01)
               for c in comm.values())
    page = render_html(report)
    table = page.split('id="host-comm"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 3
    text = render_markdown(report)
    ms0 = comm[0]["per_step_us"]["communication"] / 1000
    flat = " ".join(text.split())
    assert (f"communication {ms0:.1f} ms ({comm[0]['comm_hidden_pct']:.1f}% hidden under "
            "compute)") in flat
