"""The one list of rules: each rule module's `SPEC` (diagnose/spec.py), in the order they run
and are reported. Everything said about the rules as a set is read from here: which run on a
trace and which over a job, the `--what-if` vocabulary, each finding's change for the fix plan
and why a finding has none, and the generated docs (diagnose/docgen.py).
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose.rules import (
    allocator_churn,
    blocking_h2d_copy,
    comm_bound,
    compile_in_steps,
    cpu_oversubscription,
    dataloader_bound,
    dataparallel,
    device_memory,
    gpu_bound,
    gpu_idle,
    host_device_sync,
    no_mixed_precision,
    pageable_d2h_copy,
    pageable_h2d_copy,
    rank_imbalance,
    single_tensor_optimizer,
    worker_memory,
    worker_startup,
    zero_grad_kernels,
)
from stallscope.diagnose.spec import NO_CHANGE, Change, RuleSpec
from stallscope.trace.model import TraceModel

# The order rules run in on one trace, which is the order the report lists their assessments.
# A rule that reads another's finding (`reads`) comes after it.
TRACE_RULES: tuple[RuleSpec, ...] = (
    dataloader_bound.SPEC,
    pageable_h2d_copy.SPEC,
    pageable_d2h_copy.SPEC,
    host_device_sync.SPEC,
    blocking_h2d_copy.SPEC,
    gpu_idle.SPEC,
    comm_bound.SPEC,
    dataparallel.SPEC,
    allocator_churn.SPEC,
    no_mixed_precision.SPEC,
    single_tensor_optimizer.SPEC,
    zero_grad_kernels.SPEC,
    worker_startup.SPEC,
    worker_memory.SPEC,
    device_memory.SPEC,
    cpu_oversubscription.SPEC,
    gpu_bound.SPEC,
    compile_in_steps.SPEC,
)
# Rules over all the traces of one job (several ranks) at once.
JOB_RULES: tuple[RuleSpec, ...] = (rank_imbalance.SPEC,)
ALL_RULES: tuple[RuleSpec, ...] = TRACE_RULES + JOB_RULES
BY_ID: dict[str, RuleSpec] = {spec.id: spec for spec in ALL_RULES}


def what_if_keys() -> list[str]:
    """The `--what-if` keys: every key a rule declares, in rule order, each once."""
    return list(dict.fromkeys(key for spec in ALL_RULES for key in spec.what_if))


def changes_for(finding: Any, model: TraceModel) -> list[Change]:
    """The change a finding recommends, in what-if terms; [] when it has none to replay."""
    spec = BY_ID.get(finding.id)
    return spec.changes_for(finding, model) if spec else []


def no_change_reason(finding: Any, model: TraceModel) -> str:
    """Why `changes_for` gave nothing for this finding, in the report's words."""
    spec = BY_ID.get(finding.id)
    return spec.no_change_reason(finding) if spec else NO_CHANGE
