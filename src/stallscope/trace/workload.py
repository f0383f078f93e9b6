"""Training or inference: what the recorded steps do, told from the names of their work.

Advice depends on it: an inference server has no optimizer, no loss and no backward pass, so a
report on one must not suggest GradScaler or `optimizer.step()`, and its "steps" are batches of
requests. A training step always runs a backward pass, which leaves names in the trace:
- host ops: autograd's `autograd::engine::evaluate_function: XBackward0`, the `XBackward0` nodes
  themselves, `aten::*_backward` ops, and `Optimizer.step#...` / `Optimizer.zero_grad#...`;
- kernels: `*_backward*` ATen kernels and cuDNN/cuBLAS `dgrad`/`wgrad` convolution kernels
  (traces cut to their GPU side, such as legacy Kineto exports, carry no host ops).

"inference" needs positive evidence that work was recorded (host ops or kernels) and none of it
is backward or optimizer work; "unknown" is for traces with neither (nothing to judge), and for
traces whose only parallel work is collectives without a backward pass: a fragment of a training
step that holds the gradient all-reduce but not the backward looks exactly like tensor-parallel
inference (the real trace hta/cpu_only_rank34of300_gloo is such a trainer fragment).
"""

from __future__ import annotations

import re

import pandas as pd

WORKLOADS = ("training", "inference", "unknown")

TRAINING_OP = re.compile(
    r"^autograd::engine::evaluate_function:|Backward\d*$|^aten::\w+_backward|"
    r"^Optimizer\.(?:step|zero_grad)#"
)
TRAINING_KERNEL = re.compile(r"backward|(?<![a-z])[dw]grad|_[dw]grad", re.IGNORECASE)
COLLECTIVE = re.compile(
    r"^(?:gloo|nccl|rccl|c10d)[:_]|^nccl|all_?reduce|all_?gather|reduce_?scatter", re.IGNORECASE
)


def _any_match(names: pd.Series, pattern: re.Pattern[str]) -> bool:
    """Whether any name matches, testing each distinct name once."""
    return any(pattern.search(str(n)) for n in pd.unique(names.dropna()))


def workload_of(ops: pd.DataFrame, gpu: pd.DataFrame) -> str:
    """"training", "inference" or "unknown" from the model's host op and GPU event tables
    (their `name` columns; `gpu` also needs `kind`)."""
    op_names = ops["name"] if "name" in ops else pd.Series(dtype=object)
    kernels = gpu[gpu["kind"] == "kernel"]["name"] if "kind" in gpu else pd.Series(dtype=object)
    if _any_match(op_names, TRAINING_OP) or _any_match(kernels, TRAINING_KERNEL):
        return "training"
    if _any_match(op_names, COLLECTIVE) or _any_match(kernels, COLLECTIVE):
        return "unknown"
    if len(op_names) or len(kernels):
        return "inference"
    return "unknown"


def step_word(workload: str) -> str:
    """What one recorded step is to the user: a training step, or a batch of requests."""
    return "batch" if workload == "inference" else "step"
