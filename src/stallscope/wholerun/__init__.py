"""The whole-run step analysis behind `stallscope watch`: pure, no torch.

The command times every step of a script that runs to its end and appends one JSON line per
step; this package turns that series into regimes (where the step-time mix changes), periodic
and epoch-start stalls (what they cost, where), and report.json's `watch` section.
"""

from __future__ import annotations

from stallscope.wholerun.series import StepSeries
from stallscope.wholerun.summary import summarise

__all__ = ["StepSeries", "summarise"]
