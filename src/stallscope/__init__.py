"""stallscope: find why a PyTorch training step stalls, from its torch.profiler trace."""

from __future__ import annotations

__version__ = "0.1.0"
