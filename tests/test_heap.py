"""Freed heap memory goes back to the system after a big read (stallscope/heap.py)."""

from __future__ import annotations

import sys

import pytest

from stallscope import heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_of_many_small_objects_is_returned_on_linux() -> None:
    import psutil

    me = psutil.Process()
    # 200 MB in 1 KB strings (glibc's heap, not mmap), then freed but for the last one, which
    # keeps the heap's top in use so that only a trim can give the rest back.
    held = [b"x" * 1000 + bytes([i % 256]) for i in range(200_000)]
    last = held[-1]
    del held
    before = me.memory_info().rss
    assert heap.trim()
    after = me.memory_info().rss
    assert last and before - after > 50e6, f"{(before - after) / 1e6:.0f} MB returned"


def test_elsewhere_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert heap.trim() is False
    finally:
        heap._malloc_trim.cache_clear()
