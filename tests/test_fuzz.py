"""A short run of the fuzzer (benchmarks/fuzz.py) in the test suite (issue 19).

40 seeded cases on the sample traces: damaged copies (wrong types, cut text, flipped bytes,
deep nesting, huge numbers, gzip variants) run through load, model, rules, plan and every
writer. None may end in an internal error or take over 10 s. The long run (10,000 cases, the
shared real traces too) is by hand; its figures are in docs/robustness.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
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
