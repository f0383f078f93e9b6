"""Where reports are written: never over an earlier one without --force, never half a report.

An output folder that cannot be written, or a disk that fills up mid-write, ends in one line
and exit 2, leaving the previous report (if any) as it was and no report.* of the failed run.
A full disk is simulated with RLIMIT_FSIZE (writes past the limit fail with EFBIG, as they
fail with ENOSPC on a full disk; SIGXFSZ is ignored so the write returns the error instead of
killing the process); `test_the_full_disk_simulation_works` shows that it does.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

FILES = ("report.json", "report.html", "report.md")
SAMPLE = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
OTHER = SAMPLES / "cpu-persistent-workers.pt.trace.json.gz"


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("stallscope:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def run_limited(limit: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, preexec_fn=file_size_limit(limit))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in `folder`, hidden temporary files included."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_the_full_disk_simulation_works(tmp_path: Path):
    code = ("import os\nfd = os.open('f', os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'x' * 1000)\n"
            "try:\n    os.write(fd, b'x')\nexcept OSError as exc:\n    print(exc.strerror)")
    result = run_limited(1000, "-c", code, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "File too large", result
    assert (tmp_path / "f").stat().st_size == 1000


@pytest.fixture(scope="module")
def sizes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """The sizes of SAMPLE's report files, to set a limit that some of them fit under."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q").returncode == 0
    return {name: (out / name).stat().st_size for name in FILES}


def test_a_full_disk_keeps_the_previous_report_whole(tmp_path: Path, sizes: dict[str, int]):
    out = tmp_path / "out"
    assert run_cli("analyze", str(OTHER), "-o", str(out), "-q").returncode == 0
    before = snapshot(out)
    # report.json and report.md would fit, report.html would not: written one by one, the new
    # report.json would sit beside the old report.html.
    limit = (max(sizes["report.json"], sizes["report.md"]) + sizes["report.html"]) // 2
    assert max(sizes["report.json"], sizes["report.md"]) < limit < sizes["report.html"]
    result = run_limited(limit, "-m", "stallscope", "analyze", str(SAMPLE), "-o", str(out),
                         "--force", cwd=tmp_path)
    line = assert_one_line_error(result, 2)
    assert "cannot write" in line and "File too large" in line
    assert snapshot(out) == before  # the old report, byte for byte, and no temporary files


def test_a_full_disk_leaves_no_report_in_a_new_folder(tmp_path: Path, sizes: dict[str, int]):
    out = tmp_path / "new"
    result = run_limited(sizes["report.md"] + 1, "-m", "stallscope", "analyze", str(SAMPLE),
                         "-o", str(out), cwd=tmp_path)
    assert_one_line_error(result, 2)
    assert not out.exists()  # no report, and the empty folder this command made is gone


def test_an_output_path_under_a_file_is_one_line_and_exit_2(tmp_path: Path):
    """Unwritable for every user, root included: a folder cannot be made inside a file."""
    (tmp_path / "file").write_text("not a folder")
    for out in (tmp_path / "file", tmp_path / "file" / "out"):
        line = assert_one_line_error(
            run_cli("analyze", str(SAMPLE), "-o", str(out), "-q"), 2)
        assert str(out) in line
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_a_read_only_output_folder_is_one_line_and_exit_2(tmp_path: Path):
    out = tmp_path / "ro"
    out.mkdir(mode=0o500)
    try:
        line = assert_one_line_error(run_cli("analyze", str(SAMPLE), "-o", str(out), "-q"), 2)
        assert str(out) in line and "Permission denied" in line
        assert list(out.iterdir()) == []
    finally:
        out.chmod(0o700)


def test_a_folder_where_a_report_file_belongs_is_refused(tmp_path: Path):
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    line = assert_one_line_error(
        run_cli("analyze", str(SAMPLE), "-o", str(out), "-q", "--force"), 2)
    assert "report.html" in line and not (out / "report.json").exists()


@pytest.mark.parametrize("existing", FILES)
def test_any_one_earlier_report_file_is_kept_without_force(tmp_path: Path, existing: str):
    out = tmp_path / "out"
    out.mkdir()
    (out / existing).write_text("mine")
    line = assert_one_line_error(run_cli("analyze", str(SAMPLE), "-o", str(out), "-q"), 2)
    assert "--force" in line and existing in line
    assert snapshot(out) == {existing: b"mine"}


def test_compare_keeps_an_earlier_comparison_without_force(tmp_path: Path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("mine")
    result = run_cli("compare", str(SAMPLE), str(OTHER), "-o", str(out), "-q")
    assert "--force" in assert_one_line_error(result, 2)
    assert snapshot(out) == {"compare.md": b"mine"}


def test_reports_are_readable_like_any_new_file_and_keep_a_replaced_files_mode(tmp_path: Path):
    out = tmp_path / "out"
    umask = os.umask(0o022)
    try:
        assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q").returncode == 0
    finally:
        os.umask(umask)
    assert {stat.S_IMODE((out / f).stat().st_mode) for f in FILES} == {0o644}
    (out / "report.json").chmod(0o600)
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q", "--force").returncode == 0
    assert stat.S_IMODE((out / "report.json").stat().st_mode) == 0o600


def test_a_dangling_symlink_named_report_md_is_kept_without_force(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(tmp_path / "elsewhere.md")  # dangling
    line = assert_one_line_error(run_cli("analyze", str(SAMPLE), "-o", str(out), "-q"), 2)
    assert "report.md" in line and "--force" in line
    assert (out / "report.md").is_symlink() and not (tmp_path / "elsewhere.md").exists()
    assert not (out / "report.json").exists()


def test_a_symlink_is_replaced_not_followed_with_force(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "precious.md"
    target.write_text("mine")
    (out / "report.md").symlink_to(target)
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q", "--force").returncode == 0
    assert target.read_text() == "mine"
    assert not (out / "report.md").is_symlink() and "Verdict" in (out / "report.md").read_text()


def test_a_second_writer_to_the_same_folder_is_refused(tmp_path: Path):
    """Another process holding the folder (as a running `analyze`/`run` does) is exit 2, and the
    folder is left as it was."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = assert_one_line_error(run_cli("analyze", str(SAMPLE), "-o", str(out), "-q"), 2)
        assert "another stallscope process" in line
        assert snapshot(out) == {}
    finally:
        os.close(fd)
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q").returncode == 0
