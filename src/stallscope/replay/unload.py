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

What leaves is absolute: the stepping thread's runnable time (run + wait) over the window times
others' part of its wait, as a share of the window's wall time. The host's segments and the
unexplained gaps between them (a thread waiting for a core records nothing) lose that share
of their time, spread evenly: a loop that mostly sleeps on storage is runnable little of the
window and loses little (a proportional share of its wait would have halved its sleeps).

Not modelled: intra-op threads stalled at each parallel op's barrier while one of them waits
for a core: beside busy loops such a step runs many times longer than the wait share
explains (docs/performance.md, "Figures behind the code", capture/threadprobe.py): a note
(`barrier_note`) says the recording is not the quiet run's.

Without the figures (a trace recorded elsewhere, a kernel without schedstat) nothing is taken
out, and the plan's baseline says only "without the profiler".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallscope.replay.graph import Graph
from stallscope.trace.model import TraceModel
from stallscope.units import percent

# Never take out more than this share of a segment: the figures are window-wide averages.
MAX_SHARE = 0.8
# Below this share of other tenants' wait the correction is noise (ticks, wake-ups): none.
MIN_SHARE = 0.02


@dataclass(frozen=True)
class OtherWait:
    """The stepping thread's run-queue wait, the share of it the run's own threads explain,
    and the rest: the share of the window's wall time the thread lost to other tenants, taken
    out of the host."""

    wait_share: float  # of the thread's runnable time (run + wait), 0-1
    own_share: float  # what the tree's own demand on its cores explains, 0-1
    runnable_share: float  # the thread's runnable time over the window's wall time, 0-1
    demand_cores: float  # the tree's runnable threads, in cores' worth, over the window
    cores: int

    @property
    def others_share(self) -> float:
        """Of the window's wall time, what the stepping thread waited for cores others held:
        a loop that sleeps on storage is runnable a little of the time and loses little."""
        share = max(0.0, self.wait_share - self.own_share) * min(self.runnable_share, 1.0)
        return 0.0 if share < MIN_SHARE else min(share, MAX_SHARE)

    def to_dict(self) -> dict[str, Any]:
        return {"wait_share_pct": round(100 * self.wait_share, 1),
                "own_share_pct": round(100 * self.own_share, 1),
                "runnable_share_pct": round(100 * self.runnable_share, 1),
                "others_share_pct": round(100 * self.others_share, 1),
                "demand_cores": round(self.demand_cores, 2), "cores": self.cores}

    @classmethod
    def of(cls, model: TraceModel) -> OtherWait | None:
        """From the trace's `host.sched` metadata; None when it has none."""
        return cls.from_host(model.trace.capture.get("host"))

    @classmethod
    def from_host(cls, host: Any) -> OtherWait | None:
        """From a window's load figures (capture/hostload.py other_load: `host`, or the
        one-thread probe's); None without the scheduler's."""
        sched = host.get("sched") if isinstance(host, dict) else None
        cores = host.get("load_cores") if isinstance(host, dict) else None
        if not isinstance(sched, dict) or not isinstance(cores, int) or cores <= 0:
            return None
        try:
            window = float(sched["window_us"])
            tree_run, tree_wait = float(sched["tree_run_us"]), float(sched["tree_wait_us"])
            main_run, main_wait = float(sched["main_run_us"]), float(sched["main_wait_us"])
        except (KeyError, TypeError, ValueError):
            return None
        if window <= 0 or tree_run + tree_wait <= 0 or main_run + main_wait <= 0:
            return None
        # A preempted intra-op thread stalls the stepping thread while it spins (counted as
        # running): the tree's share then says more than the thread's own.
        wait = max(tree_wait / (tree_run + tree_wait), main_wait / (main_run + main_wait))
        demand = (tree_run + tree_wait) / window
        own = max(0.0, 1.0 - cores / demand) if demand > 0 else 0.0
        return cls(wait, own, (main_run + main_wait) / window, demand, cores)


def steps_others_share(load: Any, main_run_us: float, main_wait_us: float,
                       window_us: float) -> float:
    """Others' share of a run of steps' wall time (`window_us`), from the stepping thread's
    run and run-queue wait over those steps and the tree's figures over a window around them
    (`load`: capture/hostload.py other_load); 0 without the figures. `tune` takes it out of
    each run's timed steps, as the plan takes `OtherWait.of` out of the recorded ones."""
    tree = OtherWait.from_host(load)
    if tree is None or window_us <= 0 or main_run_us + main_wait_us <= 0:
        return 0.0
    sched = load["sched"]
    tree_wait = float(sched["tree_wait_us"]) / (float(sched["tree_run_us"])
                                                 + float(sched["tree_wait_us"]))
    wait = max(tree_wait, main_wait_us / (main_run_us + main_wait_us))
    return OtherWait(wait, tree.own_share, (main_run_us + main_wait_us) / window_us,
                     tree.demand_cores, tree.cores).others_share


# From this share of the stepping thread's runnable time waiting for cores others held, a CPU
# step with several intra-op threads is not the quiet run's in any correctable way.
BARRIER_WAIT_SHARE = 0.25


def barrier_note(model: TraceModel, others: OtherWait | None) -> str | None:
    """A note when the recorded CPU steps ran several intra-op threads beside other load: each
    parallel op then waits for its slowest thread, which the others preempt, and the step runs
    many times longer than a quiet one; no share of the wait accounts for it."""
    host = model.trace.capture.get("host")
    threads = host.get("torch_threads") if isinstance(host, dict) else None
    if model.has_gpu or others is None or not isinstance(threads, int) or threads < 2:
        return None
    if others.wait_share - others.own_share < BARRIER_WAIT_SHARE:
        return None
    return (f"The recorded steps ran {threads} intra-op threads while other processes held the "
            f"cores (the stepping thread waited {percent(100 * others.wait_share, 0)} of its "
            "runnable time): each parallel op waits for its slowest thread, which they preempt, "
            "and such steps run many times longer than quiet ones (docs/replay.md gives a measured "
            "case: 35x). Taking out the wait does not give the quiet step: the "
            "figures here are not the quiet run's. Re-record on a quiet machine, or with --set "
            "torch_threads=1 (one thread does not wait at barriers).")


def unload(g: Graph, share: float) -> Graph:
    """A copy of `g` whose host nodes and the unexplained gaps before them (a thread waiting
    in a run queue records nothing: on a busy machine much of a CPU step's time sits in
    such gaps) lose `share` of their time: the stepping thread's share of the window's wall
    time spent waiting for cores others held, spread over the host's time."""
    if share <= 0:
        return g
    out = g.copy()
    out.h_dur = g.h_dur * (1.0 - share)
    out.h_lead = g.h_lead * (1.0 - share)
    return out
