"""The code says what and why; the measurements that justify it live in docs/ beside the
benchmark that made them (docs/performance.md, docs/replay.md). So src/ (code, docstrings,
comments, `--help`) names no machine a figure was measured on, no date, no issue number and no
design document the repository lacks: such text goes stale the day the next measurement is made,
and contradicts the docs (as `run --help` once did on `--record-shapes`).

What the code reads or prints as data is allowed, line by line, in ALLOWED with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

SRC = ROOT / "src"
REFUSED = [
    (re.compile(r"\b(?:[AHV]100|H200)\b"), "a machine name"),
    (re.compile(r"\b2-core\b|\bthis VM\b|\bthe VM\b", re.IGNORECASE), "a machine name"),
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b2026-|\bsince 20\d\d\b", re.IGNORECASE), "a date"),
    (re.compile(r"\bissues? #?\d+|\(issue \d", re.IGNORECASE), "an issue number"),
    (re.compile(r"\bGUIDE\b"), "a design document the repository lacks"),
]
# (path under src/stallscope, the line stripped) -> why it may stay.
ALLOWED = {
    ("replay/models/no_mixed_precision.py",
     'sku = {7: "V100", 8: "A100", 9: "H100 SXM"}[min(major, 9)] + ('):
        "data: the SKU whose data-sheet rates the model uses, named in the prediction's "
        "assumptions",
}


def hits(root: Path = SRC / "stallscope") -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (rel, line.strip()) in ALLOWED:
                continue
            for pattern, what in REFUSED:
                if m := pattern.search(line):
                    out.append(f"{rel}:{n}: {what} ({m.group(0)!r}): {line.strip()}")
    return out


def test_src_holds_no_machine_names_dates_or_issue_numbers() -> None:
    found = hits()
    assert found == [], "move the figures to docs/ beside their benchmark:\n" + "\n".join(found)


def test_every_allowed_line_is_still_there() -> None:
    """An allowance outlives its line silently otherwise, and then excuses the next one."""
    lines = {(p.relative_to(SRC / "stallscope").as_posix(), ln.strip())
             for p in (SRC / "stallscope").rglob("*.py")
             for ln in p.read_text(encoding="utf-8").splitlines()}
    assert [key for key in ALLOWED if key not in lines] == []


@pytest.mark.parametrize("text", [
    "# On this project's 2-core VM it took 4.9 s.", "H100 hosts fit it best",
    "measured 2026-11-26", "as issue 36 found", "(issue 16)", "GUIDE §4", "Since 2026 it ..."])
def test_the_guard_refuses(text: str, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(f"x = 1\n{text}\n", encoding="utf-8")
    assert len(hits(tmp_path)) == 1


@pytest.mark.parametrize("text", ["np.searchsorted(issued, ops)", "draft/2020-12/schema",
                                  "real-h200-r1-w0", "the kernel sm90_xmma_gemm"])
def test_the_guard_passes_data(text: str, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(f"{text}\n", encoding="utf-8")
    assert hits(tmp_path) == []
