"""Rules `blocking-h2d-copy`, `dataparallel`, `allocator-churn` on real and generated traces.

The real corpus has no DataParallel run, no steady-state allocator churn and no pinned copy that
blocks the host, so positives come from `sample_traces/make_synthetic.py`, generated afresh into
a temporary folder (the same bytes as the committed `sample_traces/synthetic-*` files).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from stallscope.diagnose.rules.allocator_churn import allocator_churn
from stallscope.diagnose.rules.blocking_h2d_copy import blocking_h2d_copy
from stallscope.diagnose.rules.dataparallel import dataparallel
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import SAMPLES, real_trace


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_synthetic", SAMPLES / "make_synthetic.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TraceModel]:
    out = tmp_path_factory.mktemp("synthetic")
    paths = _generator().main(out)
    return {p.name.split(".")[0].removeprefix("synthetic-"): build_model(load_trace(p))
            for p in paths}


def _real(name: str) -> TraceModel:
    return build_model(load_trace(real_trace(name)))


# --- the generator -----------------------------------------------------------------------------

def test_generator_is_deterministic_and_labels_its_output(tmp_path: Path):
    gen = _generator()
    first = {p.name: p.read_bytes() for p in gen.main(tmp_path)}
    second = {p.name: p.read_bytes() for p in gen.main(tmp_path)}
    assert len(first) >= 3 and first == second
    for name, data in first.items():
        assert name.startswith("synthetic-")
        doc = json.loads(gzip.decompress(data))
        assert "not a recording" in doc["stallscope_synthetic"]
        assert doc["deviceProperties"] and doc["deviceProperties"][0]["computeMajor"] >= 7
        committed = SAMPLES / name
        if committed.exists():
            assert committed.read_bytes() == data, f"{name} is stale: rerun make_synthetic.py"


def test_generated_traces_model_cleanly(synthetic: dict[str, TraceModel]):
    # The single-step inference trace has no ProfilerStep by design (tests/test_invariants.py).
    for name, model in synthetic.items():
        if name.startswith("inference"):
            continue
        assert model.notes == []
        assert model.steps_source == "ProfilerStep" and len(model.steps) >= 3
        assert (model.gpu["step"] >= 0).all()
        assert model.gpu["launch_ts"].notna().all()  # every GPU event has its runtime call


# --- blocking-h2d-copy -------------------------------------------------------------------------

def test_blocking_pinned_copy_is_found(synthetic: dict[str, TraceModel]):
    a = blocking_h2d_copy(synthetic["blocking-h2d"])
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["source_memory"] == ["Pinned"]
    assert ev["blocked_by"] == ["cudaStreamSynchronize"]
    assert ev["blocked_ms_per_step"] == pytest.approx(2.288, abs=0.01)
    assert "non_blocking=True" in a.finding.snippet
    assert 5 <= a.finding.estimated_saving_pct <= 15


def test_non_blocking_pinned_copy_is_clear(synthetic: dict[str, TraceModel]):
    assert blocking_h2d_copy(synthetic["allocator-steady"]).status == "clear"


@pytest.mark.parametrize("name", [
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz",
    "hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz",
    "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz",
    "hta/rank1of128_sampled.pt.trace.json.gz",
])
def test_real_pinned_copies_did_not_block(name: str):
    assert blocking_h2d_copy(_real(name)).status == "clear"


def test_pageable_copies_are_left_to_pageable_rule():
    a = blocking_h2d_copy(
        _real("kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"))
    assert a.status == "clear"
    assert "pageable-h2d-copy" in a.detail


# --- dataparallel ------------------------------------------------------------------------------

def test_dataparallel_is_found(synthetic: dict[str, TraceModel]):
    a = dataparallel(synthetic["dataparallel"])
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["gpus_with_kernels"] == ["0", "1", "2", "3"]
    assert {"Broadcast", "Scatter", "Gather", "BroadcastBackward"} <= set(ev["ops"])
    assert "DistributedDataParallel" in a.finding.snippet and "torchrun" in a.finding.snippet
    assert 0 < a.finding.estimated_saving_pct < 100


@pytest.mark.parametrize("name", [
    "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz",  # DDP with GatherBackward0
    "hta/rank0of128_sampled.pt.trace.json.gz",  # DDP, a user `Gather` module, aten::gather
    "hta/a100_rank0of2_nccl.pt.trace.json.gz",  # DDP broadcast
])
def test_ddp_is_not_dataparallel(name: str):
    assert dataparallel(_real(name)).status == "clear"


def test_dataparallel_not_assessed_without_gpu():
    a = dataparallel(_real("hta/cpu_only_rank0_dataloader.pt.trace.json.gz"))
    assert a.status == "not_assessed"


# --- allocator-churn ---------------------------------------------------------------------------

def test_empty_cache_churn_is_found(synthetic: dict[str, TraceModel]):
    a = allocator_churn(synthetic["allocator-churn"])
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["steady_state_steps"] == 3 and ev["steps_with_calls"] == 3
    assert ev["free_calls"] == 15 and ev["malloc_calls"] == 12
    assert "aten::linear > aten::empty" in ev["ops"]
    assert "empty_cache" in a.finding.recommendation
    assert "expandable_segments" in a.finding.snippet
    # Capped by the GPU's busy time: far below the 88% the calls take on the host.
    assert a.finding.estimated_saving_pct < ev["churn_share_pct"]


def test_growth_in_first_step_only_is_clear(synthetic: dict[str, TraceModel]):
    a = allocator_churn(synthetic["allocator-steady"])
    assert a.status == "clear"
    assert "first step" in a.detail


def test_whole_trace_window_is_not_assessed():
    a = allocator_churn(_real("hta/a100_alexnet_pageable_htod.pt.trace.json.gz"))
    assert a.status == "not_assessed"
    assert "24 malloc and 15 free" in a.detail


def test_real_steady_state_has_no_churn():
    a = allocator_churn(_real("hta/v100_rank1of2_trace_diff_test.pt.trace.json.gz"))
    assert a.status == "clear"
