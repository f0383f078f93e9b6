"""A short run of the fuzzer (benchmarks/fuzz.py) in the test suite (issue 19).

40 seeded cases on the sample traces: damaged copies (wrong types, cut text, flipped bytes,
deep nesting, huge numbers, gzip variants) run through load, model, rules, plan and every
writer. None may end in an internal error or take over 10 s. The long run (10,000 cases, the
shared real traces too) is by hand; its figures are in docs/robustness.md.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES

ROOT = Path(__file__).resolve().parent.parent


def load_fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_forty_fuzz_cases_end_in_a_report_or_one_clear_line(tmp_path: Path, monkeypatch):
    fuzz = load_fuzzer()
    samples = sorted((ROOT / "sample_traces").glob("*.pt.trace.json.gz"))
    monkeypatch.setattr(fuzz, "seeds", lambda small_only=False: samples)
    summary = fuzz.fuzz(40, seed=11, out=tmp_path, timeout=10.0)
    assert summary["cases"] == 40
    bad = summary["internal_errors"] + summary["hangs"]
    assert not bad, [(r["key"], r["what"], r["detail"][-400:]) for r in bad]
    assert summary["outcomes"].get("ok", 0) >= 10  # most damage still leaves a report


def test_the_fuzzer_says_its_progress_and_checks_each_case_against_the_limits(
        tmp_path: Path, monkeypatch, capsys):
    """A progress line every --progress cases and a one-line summary; each case's CPU seconds
    and peak memory are kept, and a case over the memory limit in the fuzzing process (here a
    limit of 1 MB, so every case) is analysed again alone in a fresh process, whose peak is
    the one counted."""
    fuzz = load_fuzzer()
    small = [ROOT / "sample_traces" / "cpu-loader-bound.pt.trace.json.gz"]
    monkeypatch.setattr(fuzz, "seeds", lambda small_only=False: small)
    monkeypatch.setattr(fuzz, "JOB_SHARE", 0.0)
    monkeypatch.setattr(fuzz, "LIMIT_MB", 1.0)
    summary = fuzz.fuzz(3, seed=2, out=tmp_path, timeout=60.0, progress=2)
    out = capsys.readouterr().out
    assert [ln.split(",")[0] for ln in out.splitlines() if ln.startswith("progress:")] == [
        "progress: 2/3 cases", "progress: 3/3 cases"]
    results = json.loads((tmp_path / "partial.json").read_text())
    assert len(results) == 3 and all(r["cpu_s"] > 0 for r in results)
    # Measured again: the fresh process's own peak, not the fuzzing process's.
    assert all(r["rss_mb"] != r["in_process_rss_mb"] and r["rss_mb"] > 1 for r in results)
    assert summary["over_memory"] == 3 and len(summary["over_memory_cases"]) == 3
    line = fuzz.summary_line(summary)
    assert line.startswith("summary: 3 cases, seed 2, 0 internal errors, 0 hangs")
    assert "over 10 s CPU" in line and "3 over 0.000976562 GB" in line


def test_a_stopped_run_resumes_with_the_cases_it_had_not_run(tmp_path: Path, monkeypatch):
    """A long run stopped part way (its process ended) is finished with --resume: the cases
    partial.json holds are kept as they were, only the others run, and they are the cases the
    whole run would have made (each from the seed and its number)."""
    fuzz = load_fuzzer()
    small = [ROOT / "sample_traces" / "cpu-loader-bound.pt.trace.json.gz"]
    monkeypatch.setattr(fuzz, "seeds", lambda small_only=False: small)
    whole = fuzz.fuzz(4, seed=3, out=tmp_path / "whole", timeout=60.0)
    cases = json.loads((tmp_path / "whole" / "partial.json").read_text())
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    kept = [dict(r, marker=True) for r in cases if r["case"] in (0, 2)]
    (stopped / "partial.json").write_text(json.dumps(kept))
    resumed = fuzz.fuzz(4, seed=3, out=stopped, timeout=60.0, resume=True)
    after = sorted(json.loads((stopped / "partial.json").read_text()), key=lambda r: r["case"])
    assert [r["case"] for r in after] == [0, 1, 2, 3] and resumed["cases"] == whole["cases"]
    assert [r.get("marker", False) for r in after] == [True, False, True, False]
    assert [r["what"] for r in after] == [r["what"] for r in sorted(cases,
                                                                     key=lambda r: r["case"])]
    assert fuzz._runs([1, 3, 4, 5, 6, 9], 3) == [(1, 1), (3, 3), (6, 1), (9, 1)]


def test_a_job_case_with_dead_ranks_gives_a_report_that_lists_them(tmp_path: Path):
    """The fuzzer's job case (issue 36): ranks that died beside good ones must be listed as
    left out, in a report of the rest; before, the first empty file refused the job."""
    fuzz = load_fuzzer()
    data = (ROOT / "sample_traces" / "cpu-gloo-ddp-rank0.pt.trace.json.gz").read_bytes()
    text = gzip.decompress(data)
    for key in ("a-1", "b-2", "c-3", "d-4"):
        dead, how = fuzz.write_job(tmp_path / key, key, data, text)
        assert how.startswith("job-dead-ranks (") and dead
        outcome, detail = fuzz.run_case(tmp_path / key, 30.0, dead)
        assert (outcome, detail) == ("ok", ""), how


def test_dense_damage_rows_say_time_per_mb(tmp_path: Path):
    rows = load_fuzzer().dense_damage([0.5], tmp_path)
    assert [(r["every"], r["header"], r["outcome"]) for r in rows] == [
        (20, False, "ok"), (2, False, "ok"), (20, True, "ok")]  # the last behind a hostile header
    assert all(r["s_per_mb"] > 0 and r["skipped"] == r["damaged"] > 5 for r in rows)



def test_the_header_mutator_makes_each_shape_and_its_cases_are_read_or_refused(
        tmp_path: Path) -> None:
    """Each header shape, on a sample trace: a report or one line, never an internal error."""
    fuzz = load_fuzzer()
    raw = gzip.decompress((SAMPLES / "cpu-loader-bound.pt.trace.json.gz").read_bytes())
    shapes = set()
    for seed in range(40):
        mutated, how = fuzz.header(random.Random(seed), raw)
        shapes.add(how)
        if seed < 12:
            path = tmp_path / f"case{seed}.json"
            path.write_bytes(mutated)
            outcome, detail = fuzz.run_case(path, timeout=60)
            assert outcome in ("ok", "refused"), (how, detail)
    assert {f"header-{s}" for s in ("nested-key", "tiny-objects", "stray-byte",
                                     "lone-surrogate", "bom", "whitespace-run")} <= shapes
