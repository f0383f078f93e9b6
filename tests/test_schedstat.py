"""The calling thread's schedstat, read at every step boundary from a descriptor kept open
(capture/schedstat.py): fresh on every read, per thread, and mended when a kept descriptor
stops working."""

from __future__ import annotations

import os
import threading
import time

import pytest

from stallscope.capture import schedstat

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                                reason="Linux schedstat")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_each_read_is_fresh_and_counts_this_threads_cpu() -> None:
    first = schedstat.thread_times_ns()
    _burn(0.03)
    second = schedstat.thread_times_ns()
    assert first is not None and second is not None
    assert second[0] - first[0] >= 25e6  # the 30 ms of CPU burnt in between, in ns


def test_another_thread_reads_its_own_figures() -> None:
    mine = schedstat.thread_times_ns()
    seen: list[tuple[int, int] | None] = []
    worker = threading.Thread(target=lambda: seen.append(schedstat.thread_times_ns()))
    worker.start()
    worker.join()
    assert mine is not None and seen[0] is not None
    assert seen[0][0] < mine[0]  # a thread just started has run far less than this one


def test_a_descriptor_that_stopped_working_is_opened_again(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A thread id reused after its thread ended leaves a descriptor that reads nothing: the
    figures are read afresh rather than given up for the rest of the run."""
    tid = threading.get_native_id()
    stale = os.open(os.devnull, os.O_RDONLY)
    os.close(stale)  # a closed descriptor: pread raises
    monkeypatch.setattr(schedstat, "_fds", {tid: stale})
    assert schedstat.thread_times_ns() is not None
    assert schedstat._available


def test_where_the_kernel_does_not_say_it_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedstat, "_PATH", "/proc/no-such-file")
    monkeypatch.setattr(schedstat, "_fds", {})
    monkeypatch.setattr(schedstat, "_available", True)
    assert schedstat.thread_times_ns() is None
    assert schedstat._available is False
