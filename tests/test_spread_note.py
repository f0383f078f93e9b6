"""Run reports say when their steps spread over 2x (issue 18: a busy machine is said in tune,
compare and run reports alike): every median and saving assumes the steps alike."""

from __future__ import annotations

from stallscope.report.digest import spread_note


def test_steps_spread_over_twice_are_said_with_their_figures() -> None:
    # 4 workers delivering in rounds, or a machine busy half the time: p10 10 ms, p90 52 ms.
    note = spread_note([10_000.0, 11_000.0, 10_500.0, 52_000.0, 10_000.0, 55_000.0, 10_200.0])
    assert note is not None
    assert note.startswith("Step times spread ") and "p10 10.0 ms" in note
    assert "less certain" in note


def test_steady_steps_and_too_few_say_nothing() -> None:
    assert spread_note([10_000.0, 12_000.0, 11_000.0, 13_000.0, 10_500.0, 19_000.0]) is None
    assert spread_note([10_000.0, 90_000.0, 10_000.0, 90_000.0]) is None  # 4 steps: too few
