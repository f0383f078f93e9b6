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
    # Each step recorded (3 asked; fewer when the epoch ran out first, which the notes say) is
    # judged, or set aside with its reason (a one-off first step)
    aside = report["traces"][0]["set_aside_steps"]
    recorded = report["run"]["steps_recorded"]
    assert len(report["steps"]) + len(aside) == recorded and len(report["steps"]) >= 2
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
    run_dir = out / "tensorboard" / "cpu-loader-bound"  # one run, named after the trace
    assert str(run_dir) in proc.stdout  # the summary says where they went
    report = json.loads((out / "report.json").read_text())
    acc = read_events(run_dir)
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
    run_dir = out / "tensorboard" / "sample_traces"  # the traces' folder names the run
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    report = json.loads((out / "report.json").read_text())
    acc = read_events(run_dir)
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
    (copy,) = (out / "tensorboard").glob("*/*.pt.trace.json.gz")
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
    # The Overview averages the steps the report judged (a step cut short when the script
    # ended is renamed in the copy), at the report's mean step time.
    names, step_ms, loader = overview_figures(plugin_overview(copy, tmp_path / "cache"))
    want_names, want_ms, want_loader = report_figures(report)
    assert names == want_names
    assert step_ms == pytest.approx(want_ms, abs=0.001)
    assert loader == pytest.approx(want_loader, abs=1.0)


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
    assert write_plugin_copy(source, tmp_path).path == source
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "host.script-profiler.original.json", "host.script-profiler.pt.trace.json"]
    assert (tmp_path / "host.script-profiler.original.json").read_bytes() == before
    (event,) = json.loads(source.read_text())["traceEvents"]
    assert event["cat"] == "cpu_op"


# ----------------------------------------------- the plugin's Overview against report.json


def needs_plugin() -> None:
    if importlib.util.find_spec("torch_tb_profiler") is None:
        pytest.skip("torch_tb_profiler (the PyTorch profiler TensorBoard plugin) is not "
                    "installed: pip install -e '.[tbplugin]' (.ci/run does)")


def plugin_overview(trace: Path, cache: Path) -> dict:
    """The Overview the plugin serves for one trace file, built by its own parser and
    generator (what its /overview route returns, less the environment)."""
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    cache.mkdir(parents=True, exist_ok=True)
    data = RunProfileData.parse("worker", None, str(trace), str(cache))
    return RunGenerator("worker", None, data).generate_run_profile().overview


def overview_figures(overview: dict) -> tuple[list[str], float, float]:
    """Step names, Average Step Time (ms) and DataLoader share (%) as the Overview shows them."""
    (perf,) = overview["performance"]
    parts = {c["name"]: c["extra"] for c in perf["children"]}
    return [row[0] for row in overview["steps"]["rows"]], perf["value"] / 1000, parts["DataLoader"]


def report_figures(report: dict) -> tuple[list[str], float, float]:
    """The judged steps' numbers, their mean step time (ms) and their loader wait (%)."""
    steps = report["steps"]
    total = sum(s["duration_us"] for s in steps)
    return ([s["name"].removeprefix("ProfilerStep#") for s in steps], total / len(steps) / 1000,
            100 * sum(s["dataloader_wait_us"] for s in steps) / total)


def gpu_step_spans(trace: Path) -> list[str]:
    import gzip

    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return [e["name"] for e in events if e.get("cat") == "gpu_user_annotation"
            and str(e.get("name", "")).startswith("ProfilerStep#")]


def test_plugin_overview_of_a_torch2_gpu_trace_has_the_reports_steps(tmp_path: Path):
    """torch 2.x writes every step twice (host and GPU lane): the plugin counted 12 steps for 6
    on this H200 recording and showed 42.9 ms / DataLoader 74.7% against the report's 79.0 ms
    mean / 81.2%. In the copy the GPU spans are renamed; the original keeps them."""
    source = SAMPLES / "real-h200-r1-w0.pt.trace.json.gz"
    before = source.read_bytes()
    out = tmp_path / "out"
    assert run_cli("analyze", "-q", "--tensorboard", "-o", str(out), str(source)).returncode == 0
    assert source.read_bytes() == before
    (copy,) = (out / "tensorboard" / "real-h200-r1-w0").glob("*.pt.trace.json.gz")
    assert len(gpu_step_spans(source)) == 6 and gpu_step_spans(copy) == []
    report = json.loads((out / "report.json").read_text())
    needs_plugin()
    names, step_ms, loader = overview_figures(plugin_overview(copy, tmp_path / "cache"))
    want_names, want_ms, want_loader = report_figures(report)
    assert names == want_names == ["1", "2", "3", "4", "5", "6"]
    assert step_ms == pytest.approx(want_ms, abs=0.001)
    assert loader == pytest.approx(want_loader, abs=1.0)
    assert f"{want_loader:.1f}%" in report["verdict"]["text"]  # the verdict's own figure
    # What the plugin made of the original: the bug this copy avoids.
    names, step_ms, _ = overview_figures(plugin_overview(source, tmp_path / "cache"))
    assert len(names) == 12 and step_ms < want_ms / 1.5


def test_plugin_overview_averages_only_the_steps_the_report_judges(tmp_path: Path):
    """A first step set aside by the report (here 1.6 s of start-up against 23.5 ms steps) is
    renamed in the copy, so the plugin's Average Step Time is over the same steps."""
    source = SAMPLES / "cpu-slow-first-step.pt.trace.json.gz"
    out = tmp_path / "out"
    assert run_cli("analyze", "-q", "--tensorboard", "-o", str(out), str(source)).returncode == 0
    report = json.loads((out / "report.json").read_text())
    (aside,) = report["traces"][0]["set_aside_steps"]
    (copy,) = (out / "tensorboard").glob("*/*.pt.trace.json.gz")
    text = findings_text(read_events(copy.parent))
    assert "PyTorch Profiler tab" in text and "the steps this report judges" in text
    needs_plugin()
    names, step_ms, loader = overview_figures(plugin_overview(copy, tmp_path / "cache"))
    want_names, want_ms, want_loader = report_figures(report)
    assert aside["name"].removeprefix("ProfilerStep#") not in names
    assert names == want_names
    assert step_ms == pytest.approx(want_ms, abs=0.001)
    assert loader == pytest.approx(want_loader, abs=1.0)
    assert f"Average Step Time {step_ms:.1f} ms, this report's mean" in text


def test_scalars_carry_the_verdicts_figure_and_the_fix_plan(tmp_path: Path):
    out = tmp_path / "out"
    source = SAMPLES / "real-h200-r1-w0.pt.trace.json.gz"
    assert run_cli("analyze", "-q", "--tensorboard", "-o", str(out), str(source)).returncode == 0
    report = json.loads((out / "report.json").read_text())
    acc = read_events(out / "tensorboard" / "real-h200-r1-w0")
    (point,) = acc.Scalars("stallscope/verdict/dataloader_wait_pct")
    assert f"{point.value:.1f}% of each step" in report["verdict"]["text"]
    plan = report["plan"]
    steps = acc.Scalars("stallscope/plan/step_ms")
    want = [plan["baseline_step_us"], *(e["predicted_step_us"] for e in plan["entries"])]
    assert [e.step for e in steps] == list(range(len(want)))
    assert [e.value for e in steps] == pytest.approx([w / 1000 for w in want], rel=1e-6)
    # The verdict's "72.0 -> about 17.5 ms, range 13.6-20.2" is the first two points.
    low = acc.Scalars("stallscope/plan/step_ms_low")
    high = acc.Scalars("stallscope/plan/step_ms_high")
    verdict = report["verdict"]["text"]
    assert f"{steps[0].value:.1f} -> about {steps[1].value:.1f} ms" in verdict
    assert f"range {low[1].value:.1f}-{high[1].value:.1f}" in verdict
    floor = [e.value for e in acc.Scalars("stallscope/plan/floor_ms")]
    assert floor == pytest.approx([plan["floor_us"] / 1000] * len(want), rel=1e-6)
    for i, step in enumerate(report["steps"]):  # the per-step loader wait sums to the verdict's
        wait = acc.Scalars("dataloader_wait_pct")[i].value
        assert wait == pytest.approx(100 * step["dataloader_wait_us"] / step["duration_us"],
                                     rel=1e-5)


def loopback_tensorboard(logdir: Path):
    """`tensorboard --logdir LOGDIR` on 127.0.0.1 (a free port), as a user starts it: the
    program with every installed plugin. Yields a GET that returns decoded JSON."""
    import re
    import subprocess
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
         "127.0.0.1", "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True)
    try:
        url = None
        assert proc.stderr is not None
        for line in proc.stderr:
            found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
            if found:
                url = found.group(1)
                break
        assert url, "tensorboard did not say where it serves"

        def get(path: str):
            with urllib.request.urlopen(url + path, timeout=60) as answer:
                return json.loads(answer.read())

        yield get
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_the_plugins_http_overview_matches_the_report_on_modern_and_legacy_traces(
        tmp_path: Path):
    """The Overview page's figures, read from the plugin's HTTP API on loopback, against
    report.json: a torch 2.x H200 recording and the kineto ResNet50 (torch 1.8, V100) whose
    Overview the plugin's own repository published (177,592 us, DataLoader 33.37%). Both runs
    have one name, in TensorBoard's scalars and in the plugin."""
    needs_plugin()
    traces = {"modern": SAMPLES / "real-h200-r1-w0.pt.trace.json.gz",
              "legacy": SAMPLES / "public" / "kineto"
              / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"}
    reports = {}
    for kind, source in traces.items():
        out = tmp_path / kind
        assert run_cli("analyze", "-q", "--tensorboard", "-o", str(out),
                       str(source)).returncode == 0
        reports[kind] = json.loads((out / "report.json").read_text())
    for get in loopback_tensorboard(tmp_path):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            runs = get("/data/plugin/pytorch_profiler/runs")
            if len(runs["runs"]) == 2 and not runs["loading"]:
                break
            time.sleep(0.5)
        scalar_runs = {r for r, tags in get("/data/plugin/scalars/tags").items() if tags}
        assert set(runs["runs"]) == scalar_runs == {
            "modern/tensorboard/real-h200-r1-w0",
            "legacy/tensorboard/resnet50_num_workers_0__worker0.1623143089861"}
        for run in runs["runs"]:
            kind = run.split("/")[0]
            (worker,) = get(f"/data/plugin/pytorch_profiler/workers?run={run}&view=Overview")
            spans = get(f"/data/plugin/pytorch_profiler/spans?run={run}&worker={worker}")
            span = f"&span={spans[0]}" if spans else ""
            overview = get(f"/data/plugin/pytorch_profiler/overview?run={run}&worker={worker}"
                           f"{span}")
            names, step_ms, loader = overview_figures(overview)
            want_names, want_ms, want_loader = report_figures(reports[kind])
            assert names == want_names
            assert loader == pytest.approx(want_loader, abs=1.0)
            text = get(f"/data/plugin/text/text?run={run}&tag={FINDINGS_TEXT}")
            said = str(text)
            if kind == "modern":  # host steps: the report's mean, to the plugin's microsecond
                assert step_ms == pytest.approx(want_ms, abs=0.001)
                assert f"Average Step Time {step_ms:.1f} ms, this report's mean" in said
            else:  # the GPU ran 16 ms behind the host at the last step: the text says so
                assert step_ms == pytest.approx(177.592)
                assert step_ms == pytest.approx(want_ms, rel=0.02) and step_ms > want_ms
                assert (f"Average Step Time {step_ms:.1f} ms: its steps end when the GPU "
                        "finishes the work they launched") in said


@pytest.mark.parametrize("name", ["real-h200-r1-w8", "synthetic-allocator-churn",
                                  "cpu-persistent-workers", "cpu-inference-loop"])
def test_the_verdict_scalar_is_the_figure_the_verdict_states(name: str):
    """pageable-h2d-copy (its saving), gpu-idle (its idle share), dataloader-bound (its loader
    wait), and "no bottleneck worth fixing" (the largest finding's saving)."""
    from stallscope.report.tensorboard import verdict_metric
    from stallscope.units import share_text
    from tests.conftest import report_of

    report = report_of(SAMPLES / f"{name}.pt.trace.json.gz")
    tag, value = verdict_metric(report)
    assert tag.endswith("_pct")
    assert share_text(value) in report.verdict
