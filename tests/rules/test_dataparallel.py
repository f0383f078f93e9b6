"""`dataparallel`: torch.nn.DataParallel re-copies the model and batch every step. The real
corpus has no DataParallel run, so the positive comes from `sample_traces/make_synthetic.py`,
generated afresh into a temporary folder."""

from __future__ import annotations

import pytest

from stallscope.diagnose.rules.dataparallel import dataparallel
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import real_trace


def _real(name: str) -> TraceModel:
    return build_model(load_trace(real_trace(name)))


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
