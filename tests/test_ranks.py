"""Jobs of many ranks (issues 18 and 20): one card per finding across the ranks, stragglers
named with how far behind, files that share a rank kept apart, and a report whose size grows
with the ranks, not with their square."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stallscope.cli import main
from stallscope.report.rank_groups import rank_span, where_seen
from tests.conftest import real_trace

SOURCE = "hta/rank0of128_sampled.pt.trace.json.gz"


def _job(folder: Path, ranks: list[int], slow: set[int], world: int | None = None) -> list[Path]:
    """Synthetic rank files of one job from a real rank's trace: rank r's clock shifted by r ms,
    the `slow` ranks' GPU kernels 40% longer (planted stragglers)."""
    doc = json.loads(gzip.decompress(real_trace(SOURCE).read_bytes()))
    doc["synthetic"] = "rank files made from hta/rank0of128_sampled by tests/test_ranks.py"
    folder.mkdir(parents=True, exist_ok=True)
    events = doc["traceEvents"]
    base = [(e, e.get("ts"), e.get("dur")) for e in events]
    files = []
    for i, r in enumerate(ranks):
        for e, ts, dur in base:
            if ts is not None:
                e["ts"] = ts + r * 1000
            if e.get("cat") == "kernel" and dur is not None:
                e["dur"] = dur * (1.4 if r in slow else 1.0)
        doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": world or len(ranks)}
        path = folder / f"synthetic_job_{i}.pt.trace.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    return files


def _analyze(folder: Path, out: Path) -> dict:
    assert main(["analyze", str(folder), "-q", "-o", str(out), "--jobs", "1"]) == 0
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def six_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("six")
    _job(tmp / "job", list(range(6)), {2, 4})
    return _analyze(tmp / "job", tmp / "out"), tmp / "out"


def test_a_finding_on_every_rank_is_one_card_that_says_where(six_ranks: tuple[dict, Path]) -> None:
    report, out = six_ranks
    ids = [f["id"] for f in report["findings"]]
    assert len(ids) == len(set(ids)), ids  # one card per finding, not one per rank
    shared = [f for f in report["findings"] if f["evidence"].get("seen_on", {}).get("count") == 6]
    assert shared, [f["title"] for f in report["findings"]]
    for f in shared:
        assert f["title"].endswith("on ranks 0-5 (6 of 6)")
        spread = f["evidence"]["seen_on"]["saving_pct"]
        assert spread["min"] <= spread["median"] <= spread["max"]
    md = " ".join((out / "report.md").read_text().split())  # unwrapped
    assert "on ranks 0-5 (6 of 6)" in md


def test_planted_stragglers_are_named_with_how_far_behind(six_ranks: tuple[dict, Path]) -> None:
    report, _ = six_ranks
    imb = next(f for f in report["findings"] if f["id"] == "rank-imbalance")
    behind = imb["evidence"]["stragglers"]
    assert sorted(b["rank"] for b in behind) == [2, 4]
    assert all(b["behind_ms"] > 0 and b["behind_pct"] >= 5 for b in behind)
    assert imb["title"].startswith("Ranks ")
    assert "rank 2 by" in imb["recommendation"] and "rank 4 by" in imb["recommendation"]


def test_files_that_share_a_rank_are_kept_apart_and_named_by_file(tmp_path: Path) -> None:
    files = _job(tmp_path / "job", [0, 0, 1], set(), world=2)
    report = _analyze(tmp_path / "job", tmp_path / "out")
    labels = [t["label"] for t in report["traces"]]
    assert len(set(labels)) == 3, labels
    assert f"rank 0 ({files[0].name})" in labels and f"rank 0 ({files[1].name})" in labels
    assert "rank 1" in labels


def test_a_finding_on_one_rank_names_that_rank() -> None:
    assert where_seen([7], 16) == "on rank 7"
    assert where_seen(list(range(16)), 16) == "on ranks 0-15 (16 of 16)"
    assert rank_span([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    # Some ranks of a bigger job: the ranks not given were not looked at.
    assert where_seen([0, 1], 2, 128) == "on ranks 0-1 (2 of 128 ranks given)"
    assert where_seen([0, 1, 2], 16, 128) == "on ranks 0-2 (3 of the 16 ranks given, of 128)"
    assert where_seen([0, 1], 2, 2) == "on ranks 0-1 (2 of 2)"


def test_a_big_jobs_page_summarises_its_ranks(six_ranks: tuple[dict, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ROWS_SHOWN ranks the page shows the slowest, the fastest and the stragglers, and
    counts the per-trace checks per rule; report.json keeps every rank."""
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report import rank_table
    from stallscope.report.html import render_html

    report_json, out = six_ranks
    report = analyze_paths([out.parent / "job"], jobs=1)
    monkeypatch.setattr(rank_table, "ROWS_SHOWN", 3)
    monkeypatch.setattr(rank_table, "SLOWEST", 1)
    monkeypatch.setattr(rank_table, "FASTEST", 1)
    view = rank_table.rank_view(report)
    shown = {r["rank"] for r in view["rows"]}
    assert view["summarised"] and view["total"] == 6
    assert {2, 4} <= shown  # the named stragglers are always shown
    assert len(shown) <= 4
    checks = rank_table.check_rows(report)
    assert len(checks) < len(report_json["assessments"])
    assert any(c["where"].startswith("6 traces (ranks 0-5)") for c in checks)
    page = render_html(report)
    assert 'id="ranks-summarised"' in page
