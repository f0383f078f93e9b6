"""Facts about the machine and the process that the trace does not hold: cores, threads,
versions, GPU names. Read once the script has ended, so its own settings (threads) count."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_processes() -> int:
    """Training processes sharing this host (torchrun's LOCAL_WORLD_SIZE), at least 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def environment() -> dict[str, Any]:
    cores = cores_available()
    local = local_processes()
    # A mask narrower than the machine means the launcher pinned this process to its share;
    # otherwise the processes on this host share the same cores.
    pinned = cores < (os.cpu_count() or cores)
    gpus: list[str] = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "cpu": {
            "count": os.cpu_count(),
            "affinity": cores,
            "local_processes": local,
            "pinned": pinned,
            "cores_per_process": cores if pinned else max(1, cores // local),
            "torch_threads": torch.get_num_threads(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
        },
        "gpus": gpus,
        "platform": platform.platform(terse=True),
    }
