"""Advice spelled for the torch that recorded the trace (trace/version.py).

A snippet that a user's torch cannot run is worse than none: `torch.compile` needs 2.0,
`torch.amp.GradScaler("cuda")` 2.3, `torch.autocast` 1.10, `set_float32_matmul_precision` and
the optimizers' `foreach=` 1.12, `zero_grad()` sets gradients to None by default from 2.0,
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments` 2.1, `torchrun` 1.10. When the version is
unknown, snippets use today's spelling and say they are for torch 2.x.
"""

from __future__ import annotations

from stallscope.trace.model import TraceModel


def torch_version(model: TraceModel) -> tuple[int, int] | None:
    return model.trace.torch_version


def has(model: TraceModel, since: tuple[int, int]) -> bool:
    """Whether the trace's torch has an API added in `since`; unknown versions count as modern."""
    version = torch_version(model)
    return version is None or version >= since


def for_torch(model: TraceModel) -> str:
    """The snippet's first comment line: which torch it is written for, and how that is known."""
    info = model.trace.torch_info
    if info.version is None:
        return "# torch 2.x spelling (the trace does not say which torch recorded it)"
    how = {"recorded": "recorded by stallscope run",
           "metadata": "written in its recording metadata"}.get(
        info.source, "read from its legacy Kineto event categories")
    return f"# for torch {info.text}, the trace's torch ({how})"


def autocast(model: TraceModel, dtype: str) -> str:
    """The autocast context manager for CUDA: device-generic from 1.10, torch.cuda.amp before."""
    if has(model, (1, 10)):
        return f"torch.autocast(device_type=\"cuda\", dtype=torch.{dtype})"
    return "torch.cuda.amp.autocast()"


def grad_scaler(model: TraceModel) -> str:
    if has(model, (2, 3)):
        return "torch.amp.GradScaler(\"cuda\")"
    return "torch.cuda.amp.GradScaler()"
