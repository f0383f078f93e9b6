"""What `run` reads of memory (capture/memory.py): smaps_rollup's sizes, the container's limit
(cgroup v2 up the hierarchy, v1, or a file a test names), the CUDA allocator's figures per step
(from synthetic `memory_stats()`, so the GPU path is checked on any machine), the dataset's
storage, and the sampler's series, bounded however long the run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from stallscope.capture import memory

ROLLUP = """55d0-7ffe ---p 00000000 00:00 0                          [rollup]
Rss:                1744 kB
Pss:                 191 kB
Shared_Clean:       1596 kB
Private_Clean:        40 kB
Private_Dirty:       108 kB
Swap:                  8 kB
"""


def test_rollup_text_gives_resident_proportional_and_unique_bytes():
    got = memory.parse_rollup(ROLLUP)
    assert got == {"rss": 1744 * 1024, "pss": 191 * 1024, "uss": 148 * 1024, "swap": 8 * 1024}
    assert memory.parse_rollup("nothing here") is None


def test_this_process_is_read_and_a_gone_one_is_none():
    me = memory.rollup(os.getpid())
    assert me is not None and me["rss"] >= me["uss"] > 0
    assert memory.rollup(2**22 + 12345) is None


def _cgroup(tmp_path: Path, lines: str) -> Path:
    f = tmp_path / "cgroup"
    f.write_text(lines)
    return f


def test_cgroup_v2_limit_is_the_tightest_up_the_hierarchy(tmp_path: Path):
    root = tmp_path / "fs"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "memory.max").write_text("2000000000\n")
    (root / "a" / "b" / "memory.max").write_text("max\n")
    (root / "a" / "memory.current").write_text("1500000000\n")
    got = memory.container_limit(str(_cgroup(tmp_path, "0::/a/b\n")), str(root), env={})
    assert got == {"bytes": 2_000_000_000, "source": str(root / "a" / "memory.max"),
                   "usage_bytes": 1_500_000_000}
    (root / "a" / "b" / "memory.max").write_text("1000000000\n")
    got = memory.container_limit(str(_cgroup(tmp_path, "0::/a/b\n")), str(root), env={})
    assert got is not None and got["bytes"] == 1_000_000_000


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path: Path):
    root = tmp_path / "fs"
    (root / "memory").mkdir(parents=True)
    f = _cgroup(tmp_path, "4:memory:/docker/abc\n0::/\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory.container_limit(str(f), str(root), env={}) is None
    (root / "memory" / "memory.limit_in_bytes").write_text("3000000000\n")
    got = memory.container_limit(str(f), str(root), env={})
    assert got is not None and got["bytes"] == 3_000_000_000  # namespaced: the root's file


def test_a_named_file_fakes_the_limit(tmp_path: Path):
    fake = tmp_path / "limit"
    fake.write_text("123456789")
    got = memory.container_limit(env={memory.LIMIT_FILE_ENV: str(fake)})
    assert got == {"bytes": 123456789, "source": str(fake)}


def test_device_figures_from_the_allocators_stats():
    stats = {"allocated_bytes.all.peak": 7 << 30, "reserved_bytes.all.peak": 9 << 30,
             "allocated_bytes.all.current": 2 << 30, "reserved_bytes.all.current": 9 << 30,
             "inactive_split_bytes.all.current": 1 << 29, "num_alloc_retries": 3,
             "num_ooms": 0}
    got = memory.device_figures(stats, 60 << 30, 80 << 30)
    assert got == {"peak_allocated_bytes": 7 << 30, "peak_reserved_bytes": 9 << 30,
                   "allocated_bytes": 2 << 30, "reserved_bytes": 9 << 30,
                   "inactive_split_bytes": 1 << 29, "num_alloc_retries": 3, "num_ooms": 0,
                   "free_bytes": 60 << 30, "total_bytes": 80 << 30}
    assert memory.device_figures({}, None, None)["num_ooms"] is None


def test_device_steps_record_nothing_without_cuda():
    steps = memory.DeviceSteps()
    steps.boundary(0)
    if not torch.cuda.is_available():
        assert steps.steps == []


class _Strings(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.items = [str(i) for i in range(5000)]
        self.labels = np.arange(5000)
        self.small = [1, 2]


def test_dataset_storage_names_python_objects_and_arrays():
    rows = {r["attr"]: r for r in memory.describe_storage(_Strings())}
    assert rows["items"] == {"attr": "items", "type": "list", "items": 5000, "element": "str",
                             "python_objects": True}
    assert rows["labels"]["type"] == "numpy.ndarray" and not rows["labels"]["python_objects"]
    assert "small" not in rows
    assert memory.describe_storage(object()) == []


def test_the_series_halves_when_full_so_a_long_run_costs_what_a_short_one_does():
    me = os.getpid()
    s = memory.MemorySampler(lambda: [("main", me, None, None)])
    for _ in range(memory.MAX_POINTS + 1):
        s.sweep()
    snap = s.snapshot()
    (proc,) = snap["processes"]
    assert len(proc["t_s"]) == len(proc["uss_bytes"]) <= memory.MAX_POINTS // 2 + 1
    assert len(snap["machine"]["available_bytes"]) == len(proc["t_s"])
    assert s._floor_s == 2 * memory.SAMPLE_S  # sweeps half as often from then on


def test_the_sampler_thread_reads_a_new_process_at_once_and_stops():
    me = os.getpid()
    s = memory.MemorySampler(lambda: [("main", me, None, None)])
    s.start()
    deadline = time.monotonic() + 5
    while s.sweeps == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    assert s.sweeps >= 1 and s.snapshot()["processes"][0]["role"] == "main"
