"""The report must render from a built wheel as well as from this checkout (editable install)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES

RENDER = (
    "import sys, stallscope.report.html as h;"
    "from stallscope.commands.pipeline import analyze_paths;"
    "r = analyze_paths([__import__('pathlib').Path(sys.argv[1])]);"
    "print(h.templates_dir()); print(len(h.render_html(r)))"
)


def test_editable_checkout_finds_the_top_level_templates():
    from stallscope.report.html import templates_dir

    assert (templates_dir() / "report.html.j2").exists()


@pytest.mark.slow
def test_report_renders_from_a_built_wheel(tmp_path: Path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
         str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("stallscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stallscope/templates/report.html.j2" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # Import stallscope from the unpacked wheel only (its dependencies from this environment).
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {RENDER}",
         str(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    where, size = result.stdout.split()
    assert Path(where).is_relative_to(site)
    assert int(size) > 1000
