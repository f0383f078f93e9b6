"""How many CPU cores the recorded run had, where its trace says so.

`stallscope run` writes the cores the process may use (its affinity, shared among the local
ranks: capture/facts.py) into the trace's own metadata; the scripts that recorded this
project's sample traces write the machine's (`os.cpu_count()`) beside theirs. Advice and
replays that share cores between the step and its loader workers read them from here, and say
which they read, or that they assumed cores when the trace says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.text import plural
from stallscope.trace.load import Trace


@dataclass(frozen=True)
class Cores:
    """A core count and what it counts: "process" (the cores this process may use, as
    `stallscope run` measured them) or "machine" (the recording machine's, as the recording's
    metadata gives them: the process may have had fewer)."""

    count: int
    kind: str

    @property
    def said(self) -> str:
        """`2 cores (the recording machine's, as the trace's metadata says)`."""
        whose = ("this process's, as stallscope run recorded them" if self.kind == "process"
                 else "the recording machine's, as the trace's metadata says")
        return f"{plural(self.count, 'core')} ({whose})"


def cores_of(trace: Trace) -> Cores | None:
    """The cores the trace's metadata records: the process's when `stallscope run` recorded
    it, else the recording machine's; None when it says neither."""
    host = trace.capture.get("host")
    count = _whole(host.get("cores_per_process") if isinstance(host, dict) else None)
    if count is not None:
        return Cores(count, "process")
    count = _whole(trace.recording.get("cpus"))
    return Cores(count, "machine") if count is not None else None


def _whole(value: object) -> int | None:
    """A count of at least one, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None
