"""The recorded steps without other tenants' load: host segments lose the time the training
process's threads waited in a run queue because someone else held the cores.

`stallscope run` reads the kernel's schedstat over the recorded window (capture/hostload.py):
for every thread of the run's process tree, time on a core (`run`) and time runnable but
waiting for one (`wait`); and the same for the stepping thread. Waiting has two causes:

- the run's own threads want more cores than it has (intra-op threads beside loader workers):
  under fair sharing, a tree whose threads want D cores' worth of time on C cores waits
  `1 - C/D` of it. That is the program's own cost, and the cpu-oversubscription finding's;
  it stays in the step.
- other processes hold the cores: the wait beyond that share. A quiet machine has none; it is
  not the user's run, and it leaves.

The stepping thread's host segments (and the process's other host threads') then keep
`1 - others' share` of their recorded time, and so do the unexplained gaps between them (a
thread waiting for a core records nothing): its wait is spread over its busy time, which is
where a runnable thread waits. A segment or gap where the thread slept (a loader waiting on
storage) is shortened by the same share, which overstates the correction there by at most that
share of a sleep; such loops wait little in run queues, so their share is small.

Without the figures (a trace recorded elsewhere, a kernel without schedstat) nothing is taken
out and the report says the figures are as recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallscope.replay.graph import Graph
from stallscope.trace.model import TraceModel

# Never take out more than this share of a segment: the figures are window-wide averages.
MAX_SHARE = 0.8
# Below this share of other tenants' wait the correction is noise (ticks, wake-ups): none.
MIN_SHARE = 0.02


@dataclass(frozen=True)
class OtherWait:
    """The stepping thread's run-queue wait, the share of it the run's own threads explain,
    and the rest: other tenants' share of its runnable time, taken out of the host."""

    wait_share: float  # of the thread's runnable time (run + wait), 0-1
    own_share: float  # what the tree's own demand on its cores explains, 0-1
    demand_cores: float  # the tree's runnable threads, in cores' worth, over the window
    cores: int

    @property
    def others_share(self) -> float:
        share = self.wait_share - self.own_share
        return 0.0 if share < MIN_SHARE else min(share, MAX_SHARE)

    def to_dict(self) -> dict[str, Any]:
        return {"wait_share_pct": round(100 * self.wait_share, 1),
                "own_share_pct": round(100 * self.own_share, 1),
                "others_share_pct": round(100 * self.others_share, 1),
                "demand_cores": round(self.demand_cores, 2), "cores": self.cores}

    @classmethod
    def of(cls, model: TraceModel) -> OtherWait | None:
        """From the trace's `host.sched` metadata; None when it has none."""
        host = model.trace.capture.get("host")
        sched = host.get("sched") if isinstance(host, dict) else None
        cores = host.get("load_cores") if isinstance(host, dict) else None
        if not isinstance(sched, dict) or not isinstance(cores, int) or cores <= 0:
            return None
        try:
            window = float(sched["window_us"])
            tree_run, tree_wait = float(sched["tree_run_us"]), float(sched["tree_wait_us"])
        except (KeyError, TypeError, ValueError):
            return None
        if window <= 0 or tree_run + tree_wait <= 0:
            return None
        main_run, main_wait = sched.get("main_run_us"), sched.get("main_wait_us")
        shares = [tree_wait / (tree_run + tree_wait)]
        if isinstance(main_run, int | float) and isinstance(main_wait, int | float) and (
                main_run + main_wait > 0):
            # A preempted intra-op thread stalls the stepping thread while it spins (counted
            # as running): the tree's share then says more than the thread's own.
            shares.append(main_wait / (main_run + main_wait))
        demand = (tree_run + tree_wait) / window
        own = max(0.0, 1.0 - cores / demand) if demand > 0 else 0.0
        return cls(max(shares), own, demand, cores)


def unload(g: Graph, share: float) -> Graph:
    """A copy of `g` whose host nodes keep `1 - share` of their time: their work, and the
    unexplained gaps before them (a thread waiting in a run queue records nothing: on a busy
    2-core machine half of a CPU step's time sat in such gaps)."""
    if share <= 0:
        return g
    out = g.copy()
    out.h_dur = g.h_dur * (1.0 - share)
    out.h_lead = g.h_lead * (1.0 - share)
    return out

