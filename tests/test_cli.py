"""The command line as a user meets it: outputs, exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli, write_trace

SAMPLE = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> None:
    assert result.returncode == code
    lines = [line for line in result.stderr.splitlines() if line.startswith("stallscope:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_analyze_writes_json_html_markdown_and_a_summary(tmp_path: Path):
    result = run_cli("analyze", str(SAMPLE), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "dataloader-bound" in result.stdout
    assert len(result.stdout.splitlines()) <= 25  # one screen
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    for key in ("schema_version", "stallscope_version", "source", "environment", "steps",
                "summary", "findings"):
        assert key in data
    assert set(data["summary"]["step_time_us"]) >= {"median", "mean", "p90"}
    f = data["findings"][0]
    for key in ("id", "severity", "title", "evidence", "recommendation", "snippet",
                "precondition", "estimated_saving_pct"):
        assert key in f
    html = (tmp_path / "out" / "report.html").read_text()
    assert "dataloader-bound" in html and "<svg" in html
    assert "http://" not in html.split("PyTorch docs")[0]  # no external resources before links
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# stallscope report") and "1. **high** `dataloader-bound`: " in md


def test_console_script_and_module_give_the_same_report(tmp_path: Path):
    exe = Path(sys.executable).with_name("stallscope")
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # The same command line in two folders: the reports (which record it) must be identical.
    a = subprocess.run([str(exe), "analyze", str(SAMPLE), "-o", "out", "-q"],
                       capture_output=True, text=True, cwd=tmp_path / "a")
    b = run_cli("analyze", str(SAMPLE), "-o", "out", "-q", cwd=tmp_path / "b")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout == ""
    report = (tmp_path / "a/out/report.json").read_text()
    assert report == (tmp_path / "b/out/report.json").read_text()
    assert '"command": "stallscope analyze ' in report


def test_default_output_folder_is_derived_from_the_input(tmp_path: Path):
    result = run_cli("analyze", str(SAMPLE), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "stallscope-cpu-loader-bound" / "report.json").exists()


def test_refuses_to_overwrite_without_force(tmp_path: Path):
    out = tmp_path / "out"
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q").returncode == 0
    (out / "report.md").write_text("my edits")
    result = run_cli("analyze", str(SAMPLE), "-o", str(out), "-q")
    assert_one_line_error(result, 2)
    assert "--force" in result.stderr
    assert (out / "report.md").read_text() == "my edits"
    assert run_cli("analyze", str(SAMPLE), "-o", str(out), "-q", "--force").returncode == 0
    assert (out / "report.md").read_text() != "my edits"


def test_fail_on_returns_3_when_a_finding_reaches_the_level(tmp_path: Path):
    result = run_cli("analyze", str(SAMPLE), "-o", str(tmp_path / "o"), "-q", "--fail-on", "high")
    assert result.returncode == 3
    assert (tmp_path / "o" / "report.json").exists()  # the gate still leaves the report


def test_fail_on_passes_when_nothing_reaches_the_level(tmp_path: Path):
    # A trace with steps and no data loading: nothing can be flagged.
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
         "ts": i * 1000, "dur": 900}
        for i in range(3)
    ]
    trace = write_trace(tmp_path / "quiet.pt.trace.json", events)
    result = run_cli("analyze", str(trace), "-o", str(tmp_path / "o"), "-q", "--fail-on", "low")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "name,content",
    [
        ("empty.pt.trace.json", b""),
        ("truncated.pt.trace.json", b'{"traceEvents": [{"ph": "X", "name": "a"'),
        ("list.pt.trace.json", b"[1, 2, 3]"),
        ("object.pt.trace.json", b'{"hello": 1}'),
        ("truncated.pt.trace.json.gz", gzip.compress(b'{"traceEvents": []}' * 50, mtime=0)[:40]),
        ("binary.pt.trace.json", b"\xff\xfe\x00garbage"),
    ],
)
def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    result = run_cli("analyze", str(path), "-o", str(tmp_path / "o"))
    assert_one_line_error(result, 2)
    assert name in result.stderr


def test_missing_path_and_empty_folder(tmp_path: Path):
    assert_one_line_error(run_cli("analyze", str(tmp_path / "nope.json")), 2)
    (tmp_path / "empty").mkdir()
    result = run_cli("analyze", str(tmp_path / "empty"), "-o", str(tmp_path / "o"))
    assert_one_line_error(result, 2)
    assert "pt.trace.json" in result.stderr


def test_usage_errors_exit_2():
    assert run_cli().returncode == 2
    assert_one_line_error(run_cli("analyze"), 2)
    assert_one_line_error(run_cli("analyze", "x", "--fail-on", "bogus"), 2)
    assert_one_line_error(run_cli("analyze", "x", "--jobs", "0"), 2)


def test_the_command_line_starts_without_the_analysis_stack() -> None:
    # `stallscope --version`, `--help` and a usage error import no pandas, numpy, torch or
    # jinja2: the CLI imports only the command it runs (they cost 0.5 s and 60 MB at start).
    code = (
        "import sys\n"
        "from stallscope.cli import main\n"
        "for argv in (['--version'], ['--help'], ['bogus'], []):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'jinja2') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "analyze   diagnose traces recorded elsewhere" in proc.stdout + proc.stderr


def test_a_small_trace_pays_for_no_pool_and_no_child_process(tmp_path: Path) -> None:
    # One small file is read and analysed in this process: the pool's machinery (psutil,
    # multiprocessing) stays unimported and no process is started (ctypes.util.find_library
    # ran `ldconfig -p` to find the C library for heap.trim), each a cost on every small run.
    small = SAMPLES / "public" / "hta" / "a100_event_sync_small.pt.trace.json.gz"
    code = (
        "import subprocess, sys\n"
        "started = []\n"
        "class Refused(subprocess.Popen):\n"
        "    def __init__(self, *a, **k):\n"
        "        started.append(a)\n"
        "        super().__init__(*a, **k)\n"
        "subprocess.Popen = Refused\n"
        "from stallscope.cli import main\n"
        f"code = main(['analyze', {str(small)!r}, '-q', '-o', {str(tmp_path / 'out')!r}])\n"
        "print(code, started, sorted(m for m in ('psutil', 'multiprocessing') "
        "if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0 [] []"
    assert (tmp_path / "out" / "report.json").exists()


def test_each_command_lists_the_help_its_parser_has() -> None:
    from stallscope.cli import build_parser
    from stallscope.commands import COMMANDS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    listed = {c.dest: c.help for c in sub._choices_actions}
    assert listed == COMMANDS
