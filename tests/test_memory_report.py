"""The report's memory section and report.json's `memory`: each device's peak against its
capacity from a trace's profile_memory events (or only its rise above the recording's start,
said so, where the events carry sizes alone), `stallscope run`'s per-step device figures and
per-worker RAM, and "not assessed" with why where the recording holds none of it."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from stallscope.diagnose import diagnose
from stallscope.report.build import build_report
from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.markdown import render_markdown
from stallscope.report.schema import check
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import SAMPLES
from tests.rules.test_worker_memory import LAGGING_SCRIPT, _memory, _run

PUBLIC = SAMPLES / "public"
V100 = PUBLIC / "hta" / "v100_rank1of2_df_index_resolver.pt.trace.json.gz"
RESNET = PUBLIC / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
NO_MEMORY = PUBLIC / "hta" / "a100_event_sync_small.pt.trace.json.gz"
GB = 1 << 30


def _report(model: TraceModel):
    report = build_report([model], [diagnose(model)], [str(model.trace.path)])
    check(json.loads(render_json(report)))  # report.json holds it as the schema says
    return report


def test_v100_peak_is_read_against_its_34_gb_capacity():
    report = _report(build_model(load_trace(V100)))
    mem = report.memory
    assert mem["status"] == "measured"
    (d,) = mem["devices"]
    assert d["device"] == "cuda:1" and not d["relative_to_start"]
    assert d["capacity_bytes"] == 34089730048  # deviceProperties' totalGlobalMem of device 1
    assert d["peak_reserved_bytes"] == 12782141440  # the largest `Total Reserved`
    assert d["peak_allocated_bytes"] == 6629508096
    assert d["peak_pct_of_capacity"] == 37.5
    assert 0 < d["held_bytes"] < d["peak_allocated_bytes"]
    assert d["transient_bytes"] == d["peak_allocated_bytes"] - d["held_bytes"]
    assert "38% of its 31.7 GiB" in mem["sentence"]
    md = render_markdown(report)
    assert "## Memory" in md and "11.9 GiB reserved" in md
    assert 'id="memory-devices"' in render_html(report)


def test_a_kineto_trace_with_sizes_only_says_its_peak_is_relative():
    report = _report(build_model(load_trace(RESNET)))
    (d,) = report.memory["devices"]
    assert d["relative_to_start"] and d["peak_pct_of_capacity"] is None
    assert d["peak_reserved_bytes"] is None  # the events carry `Bytes` only
    assert d["peak_allocated_bytes"] > GB
    text = report.memory["sentence"]
    assert "above where they stood when the recording started" in text
    assert "is not assessed" in text


def test_a_trace_without_memory_figures_is_not_assessed_and_says_why():
    report = _report(build_model(load_trace(NO_MEMORY)))
    mem = report.memory
    assert mem["status"] == "not_assessed" and mem["devices"] == []
    assert "profile_memory=True" in mem["not_assessed"]
    assert mem["sentence"].startswith("Device memory not assessed")
    md = render_markdown(report)
    assert "## Memory" not in md  # nothing measured: the not-assessed list says why
    assert "- `device-memory`: The trace has no memory events" in md
    assert "Device memory not assessed" in render_html(report)


def _run_memory() -> dict[str, Any]:
    mem = _memory([40, 80, 130], workers=2, limit_mb=4000)
    step = {"peak_allocated_bytes": 30 * GB, "peak_reserved_bytes": 38 * GB,
            "allocated_bytes": 12 * GB, "reserved_bytes": 38 * GB,
            "inactive_split_bytes": 3 * GB, "num_alloc_retries": 5, "num_ooms": 0,
            "free_bytes": 1 * GB, "total_bytes": 40 * GB}
    mem["device"] = [{"step": i, **step, "allocated_bytes": (12 + i) * GB} for i in range(3)]
    return mem


def test_a_runs_metadata_gives_the_device_the_workers_and_the_container():
    model = copy.copy(build_model(load_trace(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")))
    model.trace.capture = {**model.trace.capture, "memory": _run_memory()}
    report = _report(model)
    mem = report.memory
    (d,) = mem["devices"]
    assert d["source"] == "stallscope run's per-step figures"
    assert d["peak_pct_of_capacity"] == 95.0 and d["held_bytes"] == 12 * GB
    assert d["alloc_retries"] == 5 and d["ooms"] == 0
    assert [w["unique_end_bytes"] for w in mem["workers"]] == [130 << 20, 130 << 20]
    assert mem["host"]["limit_bytes"] == 4000 << 20
    assert "the allocator retried 5 times" in mem["sentence"]
    assert "under a container limit of 3.9 GiB" in mem["sentence"]
    md = render_markdown(report).split("## Memory")[1]
    assert "own memory 40 MiB -> 130 MiB" in md and "container limit 3.9 GiB" in md


def test_memory_events_do_not_change_the_complete_events(tmp_path: Path):
    """The side path keeps `[memory]` events apart: the same trace without them has the same
    events, and no memory."""
    doc = json.loads(gzip.decompress(RESNET.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    with_mem, without = load_trace(RESNET), load_trace(bare)
    assert len(with_mem.memory) > 1000 and without.memory.empty
    assert with_mem.events.equals(without.events)


@pytest.mark.slow
def test_a_real_run_with_workers_reports_their_ram_and_the_container_limit(tmp_path: Path):
    limit = tmp_path / "memory.max"
    limit.write_text(str(8 << 30))
    report = _run(tmp_path / "run", LAGGING_SCRIPT, "--skip", "12", "--steps", "6",
                  env={"STALLSCOPE_MEMORY_LIMIT_FILE": str(limit)})
    mem = report["memory"]
    assert mem["status"] == "measured"
    assert mem["devices"] == [] and "did not use CUDA" in mem["not_assessed"]
    assert len(mem["workers"]) == 1
    w = mem["workers"][0]
    assert 0 < w["unique_end_bytes"] <= w["resident_bytes"]
    assert mem["host"]["limit_bytes"] == 8 << 30 and mem["host"]["job_bytes"] > 0
    assert "1 DataLoader worker held at most" in mem["sentence"]
    assert "under a container limit of 8.0 GiB" in mem["sentence"]
    md = (tmp_path / "run" / "out" / "report.md").read_text().split("## Memory")[1]
    assert "worker 0 (pid" in md
