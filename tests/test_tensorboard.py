"""TensorBoard views, read back with TensorBoard's own event reader after a real CLI run.

What a user opens with `tensorboard --logdir OUT/tensorboard`: per-step scalars that agree with
report.json, the findings as a Markdown table TensorBoard renders, in the same run folder as the
trace, and one set of points per report (a rerun replaces them, never doubles them).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from stallscope.text import md
from tests.conftest import ROOT, SAMPLES, run_cli

HOST = ("dataloader", "sync", "h2d_copy", "other_copy", "host_compute")
FINDINGS_TEXT = "stallscope/findings/text_summary"  # add_text stores the tag with this suffix


def read_events(run_dir: Path):
    """Every scalar and text point in `run_dir`, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    kinds = ("compressedHistograms", "images", "audio", "scalars", "histograms", "tensors")
    acc = EventAccumulator(str(run_dir), size_guidance=dict.fromkeys(kinds, 0))
    acc.Reload()
    return acc


def findings_text(acc) -> str:
    (event,) = acc.Tensors(FINDINGS_TEXT)
    return event.tensor_proto.string_val[0].decode()


def step_number(name: str, index: int) -> int:
    return int(name.split("#")[1]) if name.startswith("ProfilerStep#") else index


def assert_scalars_match(acc, steps: list[dict], prefix: str = "") -> None:
    tags = set(acc.Tags()["scalars"])
    times = acc.Scalars(f"{prefix}step_time_ms")
    assert len(times) == len(steps)  # one point per recorded step
    assert [e.step for e in times] == [step_number(s["name"], i) for i, s in enumerate(steps)]
    for event, step in zip(times, steps, strict=True):
        assert event.value == pytest.approx(step["duration_us"] / 1000, rel=1e-5)
    for category in HOST:
        assert f"{prefix}host_share_pct/{category}" in tags
        assert len(acc.Scalars(f"{prefix}host_share_pct/{category}")) == len(steps)
    for i, step in enumerate(steps):  # the shares split each step's wall time
        total = sum(acc.Scalars(f"{prefix}host_share_pct/{c}")[i].value for c in HOST)
        assert total == pytest.approx(100.0, abs=0.01)
        expected = 100 * step["breakdown_us"]["dataloader"] / step["duration_us"]
        got = acc.Scalars(f"{prefix}host_share_pct/dataloader")[i].value
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)


@pytest.mark.slow
def test_run_writes_scalars_and_findings_beside_the_trace(tmp_path: Path):
    out = tmp_path / "out"
    proc = run_cli("run", "-o", str(out), "--steps", "3",
                   str(ROOT / "examples" / "balanced.py"), "--samples", "512", "--width", "8")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    run_dir = out / "tensorboard" / "balanced"
    # One run folder: the profiler plugin's trace and stallscope's views open together.
    assert len(list(run_dir.glob("*.pt.trace.json.gz"))) == 1
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    acc = read_events(run_dir)
    # 3 steps recorded: each judged, or set aside with its reason (a one-off first step)
    aside = report["traces"][0]["set_aside_steps"]
    assert len(report["steps"]) + len(aside) == 3 and len(report["steps"]) >= 2
    assert_scalars_match(acc, report["steps"])
    # The verdict the terminal summary leads with is the text's headline.
    verdict = next(ln for ln in proc.stdout.splitlines() if ln.startswith("stallscope: "))
    assert f"**Verdict:** {md(verdict.removeprefix('stallscope: '))}" in findings_text(acc)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # tensorboard's vendored bleach
def test_analyze_tensorboard_on_the_cpu_sample(tmp_path: Path):
    out = tmp_path / "out"
    proc = run_cli("analyze", "--tensorboard", "-o", str(out),
                   str(SAMPLES / "cpu-loader-bound.pt.trace.json.gz"))
    assert proc.returncode == 0, proc.stderr
    assert str(out / "tensorboard") in proc.stdout  # the summary says where they went
    report = json.loads((out / "report.json").read_text())
    acc = read_events(out / "tensorboard")
    assert_scalars_match(acc, report["steps"])
    text = findings_text(acc)
    top = report["findings"][0]["id"]
    assert top == "dataloader-bound"
    assert f"`{top}`" in text and "| severity | id |" in text
    # TensorBoard's text dashboard renders it as a table, not as pipes.
    from tensorboard import plugin_util

    html = plugin_util.markdown_to_safe_html(text)
    assert "<table>" in html and "<code>dataloader-bound</code>" in html


def test_analyze_without_the_option_writes_no_tensorboard_files(tmp_path: Path):
    proc = run_cli("analyze", "-q", "-o", str(tmp_path / "out"),
                   str(SAMPLES / "cpu-loader-bound.pt.trace.json.gz"))
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "out" / "tensorboard").exists()


def test_several_traces_get_one_tag_prefix_each_and_force_replaces_the_points(tmp_path: Path):
    out = tmp_path / "out"
    files = [SAMPLES / "cpu-worker-startup.pt.trace.json.gz",
             SAMPLES / "cpu-persistent-workers.pt.trace.json.gz"]
    args = ["analyze", "-q", "--tensorboard", "-o", str(out), *map(str, files)]
    assert run_cli(*args).returncode == 0
    assert run_cli(*args, "--force").returncode == 0  # a rerun must not double the points
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    report = json.loads((out / "report.json").read_text())
    acc = read_events(out / "tensorboard")
    for f in files:
        label = f.name
        prefix = label.removesuffix(".pt.trace.json.gz") + "/"
        steps = [s for s in report["steps"] if s["trace"] == label]
        assert steps
        assert_scalars_match(acc, steps, prefix)
    assert "| trace |" in findings_text(acc)


@pytest.mark.slow
def test_pytorch_profiler_plugin_lists_the_run(tmp_path: Path):
    if importlib.util.find_spec("torch_tb_profiler") is None:
        pytest.skip("torch_tb_profiler (the PyTorch profiler TensorBoard plugin) is not "
                    "installed: pip install -e '.[tbplugin]' (.ci/run does)")
    from tensorboard.plugins import base_plugin
    from torch_tb_profiler.plugin import TorchProfilerPlugin
    from werkzeug.test import Client

    out = tmp_path / "out"
    proc = run_cli("run", "-q", "-o", str(out), "--steps", "2",
                   str(ROOT / "examples" / "balanced.py"), "--samples", "512", "--width", "8")
    assert proc.returncode == 0, proc.stderr
    plugin = TorchProfilerPlugin(base_plugin.TBContext(logdir=str(out / "tensorboard")))
    client = Client(plugin.get_plugin_apps()["/runs"])
    deadline = time.monotonic() + 60
    runs: list[str] = []
    while time.monotonic() < deadline:
        runs = json.loads(client.get("/runs").get_data())["runs"]
        if runs:
            break
        time.sleep(0.5)
    assert "balanced" in runs, f"plugin runs: {runs} ({sys.version})"


def plugin_loader_share(trace: Path, cache: Path) -> float:
    """DataLoader share of the step as the profiler plugin's own parser computes it (the number
    its Overview shows)."""
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    profile = RunProfileData.parse("worker", None, str(trace), str(cache))
    costs = profile.avg_costs.costs
    return 100.0 * costs[ProfileRole.DataLoader] / costs[ProfileRole.Total]


def loader_events(trace: Path) -> list[dict]:
    import gzip

    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return [e for e in events if str(e.get("name", "")).startswith("enumerate(DataLoader)#")]


def test_analyze_tensorboard_puts_a_trace_the_plugin_reads_into_the_logdir(tmp_path: Path):
    """torch 2.x writes the loader's __next__ as user_annotation, which torch-tb-profiler 0.4.3
    drops: its Overview said DataLoader 0% where the report said 85%. The logdir's copy makes
    them agree; the user's trace is left byte for byte as it was."""
    source = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
    before = source.read_bytes()
    out = tmp_path / "out"
    proc = run_cli("analyze", "-q", "--tensorboard", "-o", str(out), str(source))
    assert proc.returncode == 0, proc.stderr
    assert source.read_bytes() == before
    (copy,) = (out / "tensorboard").glob("*.pt.trace.json.gz")
    assert {e["cat"] for e in loader_events(source)} == {"user_annotation"}
    assert {e["cat"] for e in loader_events(copy)} == {"cpu_op"}
    report = json.loads((out / "report.json").read_text())
    # stallscope reads the copy exactly as it read the original.
    again = run_cli("analyze", "-q", "-o", str(tmp_path / "again"), str(copy))
    assert again.returncode == 0, again.stderr
    report_again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert report_again["verdict"]["text"] == report["verdict"]["text"]
    assert report_again["summary"]["breakdown_pct"] == report["summary"]["breakdown_pct"]
    if importlib.util.find_spec("torch_tb_profiler") is None:
        pytest.skip("torch_tb_profiler is not installed (pip install -e '.[tbplugin]'): "
                    "the plugin's own parser was not run")
    share = report["summary"]["breakdown_pct"]["dataloader"]
    assert share > 50
    assert plugin_loader_share(copy, tmp_path / "cache") == pytest.approx(share, abs=0.1)
    assert plugin_loader_share(source, tmp_path / "cache") == 0.0  # what it showed before


@pytest.mark.slow
def test_run_keeps_the_recorded_trace_beside_the_plugin_copy(tmp_path: Path):
    out = tmp_path / "out"
    proc = run_cli("run", "-q", "-o", str(out), "--steps", "3",
                   str(ROOT / "examples" / "balanced.py"), "--samples", "512", "--width", "8")
    assert proc.returncode == 0, proc.stderr
    run_dir = out / "tensorboard" / "balanced"
    (copy,) = run_dir.glob("*.pt.trace.json.gz")  # the plugin sees one file: one worker, one span
    (original,) = run_dir.glob("*.original.json.gz")
    assert original.name.removesuffix(".original.json.gz") + ".pt.trace.json.gz" == copy.name
    assert {e["cat"] for e in loader_events(original)} == {"user_annotation"}
    assert {e["cat"] for e in loader_events(copy)} == {"cpu_op"}
    if importlib.util.find_spec("torch_tb_profiler") is None:
        pytest.skip("torch_tb_profiler is not installed (pip install -e '.[tbplugin]'): "
                    "the plugin's own parser was not run")
    report = json.loads((out / "report.json").read_text())
    share = report["summary"]["breakdown_pct"]["dataloader"]
    assert plugin_loader_share(copy, tmp_path / "cache") == pytest.approx(share, abs=1.0)


def test_a_plain_json_trace_in_the_run_folder_stays_one_file_for_the_plugin(tmp_path: Path):
    """The script's own profiler may write `*.pt.trace.json` (no gzip) into the run folder: the
    copy keeps that name, so the plugin never sees a second file (a second span) beside it."""
    from stallscope.report.tensorboard_trace import write_plugin_copy
    from tests.conftest import write_trace

    loader = {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
              "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"}
    source = write_trace(tmp_path / "host.script-profiler.pt.trace.json", [loader],
                         stallscope_synthetic="tests/test_tensorboard.py")
    before = source.read_bytes()
    assert write_plugin_copy(source, tmp_path) == source
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "host.script-profiler.original.json", "host.script-profiler.pt.trace.json"]
    assert (tmp_path / "host.script-profiler.original.json").read_bytes() == before
    (event,) = json.loads(source.read_text())["traceEvents"]
    assert event["cat"] == "cpu_op"
