"""The synthetic traces of `sample_traces/make_synthetic.py` (positives the real corpus lacks:
DataParallel, steady-state allocator churn, a pinned copy that blocks the host): generated
afresh they are the committed bytes, labelled as generated, and they model cleanly.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from stallscope.trace.model import TraceModel
from tests.conftest import SAMPLES, make_synthetic


def test_generator_is_deterministic_and_labels_its_output(tmp_path: Path):
    gen = make_synthetic()
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
