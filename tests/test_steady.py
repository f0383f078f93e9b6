"""The recording window starts once the run is steady (capture/steady.py): after the batches
the loader's workers prefetched at start-up, and once the unprofiled steps stop moving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallscope.capture import steady
from stallscope.capture.runner import window_note
from tests.conftest import run_process, storage_script


def test_prefetched_batches_are_never_a_steady_window():
    j = steady.judge([10_000.0] * 8, [9_000.0] * 8, prefetched_left=3, group=2)
    assert not j.steady and "3 batch(es)" in j.why


def test_two_groups_are_needed_to_judge():
    assert not steady.judge([10_000.0] * 3, [0.0] * 3, 0, group=2).steady
    assert steady.judge([10_000.0] * 4, [0.0] * 4, 0, group=2).steady


def test_a_step_time_still_falling_is_moving():
    j = steady.judge([90_000, 60_000, 30_000, 20_000], [0.0] * 4, 0, group=2)
    assert not j.steady and "75.0 -> 25.0 ms" in j.why


def test_a_loader_wait_still_rising_is_moving():
    """The prefetch queue draining: steps about as long, more of each spent waiting."""
    j = steady.judge([40_000, 40_000, 44_000, 44_000], [2_000, 2_000, 9_000, 9_000], 0, 2)
    assert not j.steady and "still rising (2.0 -> 9.0 ms" in j.why


def test_rounds_of_workers_are_judged_a_round_at_a_time():
    """4 workers: three quick steps, then one that waits for the round. Groups of 4 see the same
    mean each round; groups of 2 would see the pace jump."""
    rounds = [3_000.0, 3_000.0, 3_000.0, 58_000.0] * 2
    assert steady.group_size(4) == 4
    assert steady.judge(rounds, rounds, 0, steady.group_size(4)).steady
    assert not steady.judge(rounds, rounds, 0, 2).steady


def test_ranks_of_one_job_judge_counts_not_times():
    """Every rank must record the same steps: a rank's times are its own, its counts are not."""
    moving = [90_000, 60_000, 30_000, 20_000]
    assert not steady.judge(moving, [0.0] * 4, 0, 2).steady
    assert steady.judge(moving, [0.0] * 4, 0, 2, by_time=False).steady
    assert not steady.judge(moving[:3], [0.0] * 3, 0, 2, by_time=False).steady
    assert not steady.judge(moving, [0.0] * 4, 1, 2, by_time=False).steady


def test_group_size_is_a_round_of_workers_clipped():
    assert [steady.group_size(n) for n in (0, 1, 3, 8, 32)] == [2, 2, 3, 8, 8]


def test_the_note_says_which_steps_and_why_or_what_still_moved():
    assert window_note({"steady": True, "extra_steps": 0, "first_step": 4, "skip": 2}, 1) is None
    assert window_note({"steady": None, "extra_steps": 0, "first_step": 4, "skip": 2}, 1) is None
    waited = window_note({"steady": True, "extra_steps": 3, "first_step": 7, "skip": 2,
                          "why": "the last 2 ..."}, 1)
    assert waited.startswith("Recording began at step 7 (3 step(s) past --skip 2")
    capped = window_note({"steady": False, "extra_steps": 40, "first_step": 44, "skip": 2,
                          "why": "the step time was still moving (9.0 -> 20.0 ms ...)"}, 1)
    assert "although the run was still moving" in capped
    assert f"capped at {steady.MAX_EXTRA_STEPS} steps" in capped


def test_the_wait_ends_while_the_epoch_still_holds_the_window():
    """A one-epoch script of 16 batches must not be waited out: the window (1 warm-up + 5
    recorded steps, and the batch that ends the last) is started while it still fits."""
    assert steady.epoch_too_short(None, 6) == ""  # no length: an iterable dataset
    assert steady.epoch_too_short(8, 6) == ""  # one more step leaves 7 = 6 + 1
    assert "7 batch(es) were left in this epoch for a window of 6" in steady.epoch_too_short(7, 6)
    assert steady.epoch_too_short(0, 6) == ""  # the epoch ended: the next one decides
    note = window_note({"steady": False, "extra_steps": 5, "first_step": 11, "skip": 2,
                        "why": "the step time was still moving; recorded now: 7 batch(es) were "
                               "left in this epoch for a window of 6 step(s)"}, 1)
    assert "run more samples or epochs" in note and "capped at" not in note


# One spawn worker that sleeps 60 ms per batch: while the script builds its model (1 s) the
# worker prefetches its 4 batches, so the first steps after start-up take no time at all; the
# steady pace is 60 ms a step, and no machine load can make a step shorter than the sleep.
SPAWN_WORKER = storage_script(
    256, 0.06, 1, loader_args=', num_workers=1, multiprocessing_context="spawn", '
    "prefetch_factor=4",
    before_loop="loader = iter(loader); time.sleep(1.0)  # the worker prefetches meanwhile")


@pytest.mark.slow
def test_a_spawn_workers_start_up_prefetch_is_not_recorded(tmp_path: Path):
    (tmp_path / "train.py").write_text(SPAWN_WORKER)
    proc = run_process("run", "-q", "-o", "out", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    window = report["run"]["window"]
    assert window["steady"] and window["first_step"] > 4, window  # past the 4 prefetched
    recorded = sorted(s["duration_us"] for s in report["steps"])
    assert recorded[len(recorded) // 2] >= 50_000, recorded  # the worker's pace, not the queue
    assert report["findings"][0]["id"] == "dataloader-bound"
