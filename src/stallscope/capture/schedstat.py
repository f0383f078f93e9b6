"""The calling thread's scheduler figures (Linux schedstat), cheap enough for every step.

`/proc/thread-self/schedstat` holds the thread's time on a core and its time runnable but
waiting for one (ns). The step hooks read it at every step boundary, and the loader watch around
every recorded fetch. Opening, reading and closing the file cost far more than `pread` on a
descriptor kept open per thread, where the kernel writes the text afresh on every read from
offset 0 (docs/performance.md, "Figures behind the code").
"""

from __future__ import annotations

import contextlib
import os
import threading

_PATH = "/proc/thread-self/schedstat"
# One open descriptor per thread, by its kernel thread id (unique across processes, so a forked
# DataLoader worker never reads its parent's thread).
_fds: dict[int, int] = {}
_MAX_FDS = 64  # threads come and go: never hold more descriptors than this
_available = True


def thread_times_ns() -> tuple[int, int] | None:
    """(on a core, runnable but waiting) in ns for the calling thread; None where the kernel
    does not say (no schedstat, no /proc)."""
    global _available
    if not _available:
        return None
    tid = threading.get_native_id()
    fd = _fds.get(tid)
    if fd is not None:
        try:
            return _parse(os.pread(fd, 128, 0))
        except (OSError, ValueError, IndexError):  # a thread id reused after its thread ended
            _forget(tid)
    try:
        if len(_fds) >= _MAX_FDS:
            for old in list(_fds):
                _forget(old)
        fd = _fds[tid] = os.open(_PATH, os.O_RDONLY | os.O_CLOEXEC)
        return _parse(os.pread(fd, 128, 0))
    except (OSError, ValueError, IndexError):
        _forget(tid)
        _available = False
        return None


def _parse(text: bytes) -> tuple[int, int]:
    run, wait = text.split()[:2]
    return int(run), int(wait)


def _forget(tid: int) -> None:
    fd = _fds.pop(tid, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
