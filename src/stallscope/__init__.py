"""stallscope: find why a PyTorch training step stalls, from its torch.profiler trace.

The Python API (docs/usage.md, "Python API"): `analyze(path_or_profile)`, `with profile(): ...`,
`step()`, `Report`, and `StallscopeError` for every error a caller can cause. `step` and the
errors are defined below every stage and load at once; `analyze`, `profile` and `Report` load
the pipeline (pandas, the rules, the writers; torch for `profile`) on first use, so
`import stallscope` stays light for the CLI and for a `stallscope.step()` left in a loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stallscope.errors import StallscopeError
from stallscope.marker import step

if TYPE_CHECKING:
    from stallscope.api import ProfileSession, Report, analyze, profile, watch

__version__ = "0.1.0"
__all__ = ["ProfileSession", "Report", "StallscopeError", "analyze", "profile", "step",
           "watch"]
_LAZY = {"ProfileSession", "Report", "analyze", "profile", "watch"}


def __getattr__(name: str) -> Any:
    """The public API that needs the pipeline, imported on first use (PEP 562)."""
    if name in _LAZY:
        from stallscope import api

        return getattr(api, name)
    raise AttributeError(f"module 'stallscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
