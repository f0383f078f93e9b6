"""What a user reads for every committed trace, pinned: report.md of each trace in
sample_traces/ (the project's recordings, the synthetic ones and the public real traces) is
compared with its snapshot in tests/__snapshots__/test_snapshots/.

A change that alters a report fails here with the diff; when the change is meant, review the
diff and accept it with `python -m pytest tests/test_snapshots.py --snapshot-update`, then
commit the updated snapshots with the change. report.md carries every figure the verdict, the
plan and the findings print, rounded as users read them, so the snapshots do not depend on the
last bits of a float sum (which differ between CPUs and numpy builds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from tests.conftest import SAMPLES, committed_traces


class MarkdownSnapshot(SingleFileSnapshotExtension):
    """One `.md` file per trace, readable and diffable in review."""

    _write_mode = WriteMode.TEXT
    file_extension = "md"
    _file_extension = "md"  # the name older syrupy releases read


@pytest.fixture
def snapshot_md(snapshot):
    return snapshot.use_extension(MarkdownSnapshot)


def _id(path: Path) -> str:
    return path.relative_to(SAMPLES).as_posix().replace("/", "__").split(".pt.trace")[0]


@pytest.mark.parametrize("path", committed_traces(), ids=_id)
def test_report_md_is_its_snapshot(path: Path, analysed, snapshot_md) -> None:
    result, out = analysed(path)
    assert result.returncode == 0, result.stderr
    report = out / "report.md"
    assert report.is_file(), result.stderr
    assert report.read_text() == snapshot_md

