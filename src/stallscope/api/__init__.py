"""The Python API: what `import stallscope` offers besides the CLI (docs/usage.md, "Python API").

`analyze` (traces or a finished torch.profiler.profile -> Report), `profile` (a `with` block
around a running loop -> ProfileSession, whose `.report` is the Report), `watch` (the same,
every step timed and the whole block analysed), `step` (the step
marker), `Report`, and `StallscopeError`, the one exception class for errors a caller can
cause. This layer composes the commands' pipeline; nothing below it imports it.
"""

from __future__ import annotations

from stallscope.api.analysis import analyze
from stallscope.api.live import ProfileSession, profile, watch
from stallscope.api.result import Report
from stallscope.errors import StallscopeError
from stallscope.marker import step

__all__ = ["ProfileSession", "Report", "StallscopeError", "analyze", "profile", "step",
           "watch"]
