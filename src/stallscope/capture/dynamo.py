"""torch.compile as the capture sees it: steps skipped while dynamo still compiles, and what it
compiled and broke over the recording.

A script that compiles would otherwise have its first compilation inside the recorded steps;
one that compiles step after step is recompiling (a changing shape), which the recording must
show, not wait out. dynamo is never imported here: its counters are read only when the script
already loaded it, so a script without torch.compile pays nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from stallscope import progress

# At most this many steps skipped beyond --skip while dynamo still compiles. The first
# compilation settles within a step or two; a script that compiles step after step is
# recompiling, and dynamo gives up after 8 recompiles and runs the frame eagerly (the evidence
# would be gone).
COMPILE_WAIT_MAX = 3


class CompileWatch:
    """Extra steps skipped because dynamo was still compiling (at most COMPILE_WAIT_MAX), and
    dynamo's counters when recording began (the trace's `dynamo` metadata counts from them)."""

    def __init__(self) -> None:
        self.wait = 0
        self._graphs_seen: int | None = None
        self._start: dict[str, Any] | None = None

    def boundary(self, last: bool) -> None:
        """At each skipped boundary, dynamo's graph count (a dict read, only when the script
        uses torch.compile); at the last one, if a graph was compiled during the step that just
        ended, skip one more: compilation has not settled and recorded steps would hold it."""
        graphs = _counter("stats", "unique_graphs")
        if graphs is None:
            return
        before, self._graphs_seen = self._graphs_seen or 0, graphs
        if last and graphs > before and self.wait < COMPILE_WAIT_MAX:
            self.wait += 1
            if self.wait == 1:
                progress.say("torch.compile is still compiling: recording waits for it")

    def metadata(self) -> dict[str, Any] | None:
        """The trace's `dynamo`: graphs compiled and graph breaks since recording began (its
        first call); None when the script does not use torch.compile."""
        dynamo = _counters()
        if dynamo is None:
            return None
        if self._start is None:
            self._start = dynamo
        start = self._start
        return {
            "graphs_compiled": dynamo["graphs"] - start["graphs"],
            "graph_breaks": {k: v - start["breaks"].get(k, 0)
                             for k, v in dynamo["breaks"].items()
                             if v > start["breaks"].get(k, 0)},
            "compile_wait_steps": self.wait,
            "graphs_total": dynamo["graphs"],
            "recompile_limit": dynamo["limit"],
        }


def _counter(group: str, key: str) -> int | None:
    """One of dynamo's counters, when the script uses torch.compile (never imports dynamo)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters[group][key]) if utils is not None else None
    except Exception:
        return None


def _counters() -> dict[str, Any] | None:
    """Graphs compiled so far and graph breaks by reason (reasons clipped to one line)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        counters = utils.counters
        breaks = {str(k).splitlines()[0][:200]: int(v)
                  for k, v in dict(counters["graph_break"]).items()}
        config = sys.modules.get("torch._dynamo.config")
        limit = getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None))
        return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": breaks,
                "limit": int(limit) if isinstance(limit, int) else None}
    except Exception:
        return None
