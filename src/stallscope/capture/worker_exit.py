"""How a dead DataLoader worker ended, when torch's message does not say.

torch words a worker's death "DataLoader worker (pid N) is killed by signal: Killed." when its
SIGCHLD handler notices first, but "DataLoader worker (pid(s) N) exited unexpectedly" when the
main process's queue timeout does: a race inside torch. The second hides the one fact a user
needs (SIGKILL is what the out-of-memory killer sends), yet the worker's exit status is still
known to this process: unreaped (waitid without reaping) or kept by the worker's
`multiprocessing.Process`, which the script's loader holds while its traceback is alive.
"""

from __future__ import annotations

import gc
import multiprocessing.process
import os
import re
import signal

_PIDS = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) exited unexpectedly")


def add_exit_status(death: str) -> str:
    """`death` with each named worker's exit status where torch left it out."""
    if "signal" in death or "exit code" in death:
        return death
    found = _PIDS.search(death)
    if found is None:
        return death
    pids = [int(p) for p in re.findall(r"\d+", found.group(1))]
    statuses = _exit_statuses(pids)
    said = [_describe(pid, statuses[pid]) for pid in pids if pid in statuses]
    if not said:
        return death
    return f"{death.rstrip('. ')}: {'; '.join(said)} (its exit status)"


def _describe(pid: int, exitcode: int) -> str:
    """torch's own wording for a worker's exit code (negative: the signal that ended it)."""
    if exitcode < 0:
        try:
            name = signal.strsignal(-exitcode) or signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"pid {pid} was killed by signal: {name}"
    return f"pid {pid} exited with exit code {exitcode}"


def _exit_statuses(pids: list[int]) -> dict[int, int]:
    """Exit codes as `multiprocessing` gives them (-N for signal N) of those pids known."""
    statuses: dict[int, int] = {}
    for pid in pids:
        code = _unreaped(pid)
        if code is not None:
            statuses[pid] = code
    missing = set(pids) - set(statuses)
    if missing:  # reaped already, by the Process's own is_alive(): it kept the code
        for obj in gc.get_objects():
            # type(), not isinstance(): that reads `__class__`, which some objects compute
            # (torch's deprecated `reduce_op` then warns on the user's terminal).
            if issubclass(type(obj), multiprocessing.process.BaseProcess):
                try:
                    pid, code = obj.pid, obj.exitcode
                except (ValueError, AssertionError, OSError):  # closed, or not our child
                    continue
                if pid in missing and code is not None:
                    statuses[pid] = code
    return statuses


def _unreaped(pid: int) -> int | None:
    """The exit code of a dead child not yet waited for, leaving it for its owner to reap."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return None
