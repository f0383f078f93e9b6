"""A job of many ranks (issue 20): workers send back digests, and beyond JOB_SCALE_TRACES the
report summarises per-rank detail so it grows by kilobytes per rank. The threshold is lowered
here so a handful of small synthetic ranks stands for thousands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.report import job_scale
from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.schema import check
from tests.rules.test_rank_imbalance import rank_trace


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_scale, "JOB_SCALE_TRACES", 3)


def _job(tmp: Path, n: int, slow: int | None = None) -> list[Path]:
    """n CPU ranks; `slow` waits 4 ms on its loader per 10 ms step, the others 0.5 ms."""
    folder = tmp / f"job{n}"
    folder.mkdir()
    return [rank_trace(folder, r, 4_000.0 if r == slow else 500.0) for r in range(n)]


def test_beyond_the_threshold_each_rank_keeps_its_summary_and_the_rest_is_summarised(
    tmp_path: Path, small_threshold: None
) -> None:
    report = analyze_paths(_job(tmp_path, 6, slow=4))
    text = render_json(report)
    assert text.count("\n") == 1  # one line: indentation was a third of a large job's report
    data = json.loads(text)
    check(data)  # still report.json's schema
    # Every rank keeps its row, its summary and its findings ...
    assert [r["rank"] for r in data["ranks"]] == list(range(6))
    assert all(t["summary"]["steps"] == 4 for t in data["traces"])
    # ... the steps are the drawn trace's (rank 0) but the summary counts every rank's.
    assert {s["trace"] for s in data["steps"]} == {"rank 0"}
    assert data["summary"]["steps"] == 24
    # One check per rule and result, naming the ranks it holds for.
    per_trace = [a for a in data["assessments"] if a["trace"] != "job"]
    assert len({(a["rule"], a["status"]) for a in per_trace}) == len(per_trace)
    assert any(a["trace"] == "6 traces (ranks 0-5)" for a in per_trace)
    # The straggler is still named by the job-level rule.
    imbalance = next(f for f in data["findings"] if f["id"] == "rank-imbalance")
    assert [s["rank"] for s in imbalance["evidence"]["stragglers"]] == [4]
    assert any("steps[] holds the steps of rank 0 only" in n for n in data["notes"])


def test_at_or_below_the_threshold_nothing_is_summarised(tmp_path: Path) -> None:
    data = json.loads(render_json(analyze_paths(_job(tmp_path, 3))))
    assert {s["trace"] for s in data["steps"]} == {"rank 0", "rank 1", "rank 2"}
    assert {a["trace"] for a in data["assessments"]} == {"rank 0", "rank 1", "rank 2", "job"}


def test_report_grows_by_kilobytes_per_rank(tmp_path: Path, small_threshold: None) -> None:
    small, large = (analyze_paths(_job(tmp_path, n)) for n in (8, 24))
    per_rank_json = (len(render_json(large)) - len(render_json(small))) / 16
    per_rank_html = (len(render_html(large)) - len(render_html(small))) / 16
    assert per_rank_json < 2500, per_rank_json
    assert per_rank_html < 5000, per_rank_html


def test_a_big_gpu_jobs_ranks_keep_their_kernel_split(
    tmp_path: Path, small_threshold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Summarised or not, every GPU rank's row keeps its kernel split, the job says how many of
    its ranks were given, and the page's kernel chart shows the ranks the rank table shows."""
    from stallscope.report import rank_table
    from stallscope.report.kernel_view import kernel_chart
    from tests.test_ranks import _job as gpu_job

    report = analyze_paths(gpu_job(tmp_path / "job", list(range(5)), {3}, world=64))
    data = json.loads(render_json(report))
    check(data)
    assert data["notes"][0].startswith("5 of 64 ranks given")
    assert all(0 <= r["kernel_mix"]["comm_hidden_pct"] <= 100 for r in data["ranks"])
    monkeypatch.setattr(rank_table, "ROWS_SHOWN", 3)
    monkeypatch.setattr(rank_table, "SLOWEST", 1)
    monkeypatch.setattr(rank_table, "FASTEST", 1)
    shown = {f"rank {r['rank']}" for r in rank_table.rank_view(report)["rows"]}
    assert 3 <= len(shown) < 5
    assert {b["label"] for b in kernel_chart(report)["bars"]} == shown
