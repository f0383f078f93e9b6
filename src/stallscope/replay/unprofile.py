"""The recorded steps without the profiler: each host segment loses what the profiler added to
the ops it recorded there.

Every op the host records pays the profiler's bookkeeping (capture/opcost.py measures it at
the start of `stallscope run`). A host segment of the graph (the CPU time before a runtime
call, a DataLoader fetch in the training process, the call itself) that holds n recorded ops
ran n times that cost longer than it does in the user's own run. Taking it out gives the
step the user has; the fixes are then replayed on that graph, so a step the profiler made
host-bound is GPU-bound again where it is (docs/replay.md, "The profiler's cost").

Each segment keeps at least `KEEP` of its recorded time: a cost measured on tiny ops and
applied to bigger ones can only be too large, never make a segment vanish.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stallscope.replay.graph import FILL, Graph
from stallscope.trace.model import TraceModel
from stallscope.trace.names import column_equals_text, column_isin
from stallscope.units import ms

# Per recorded op (us), when the trace does not carry run's own measurement: the median of
# benchmarks/bench_profiler_cost.py on a lent GPU host (docs/performance.md, "Figures behind the
# code").
DEFAULT_OP_US = 4.5
DEFAULT_SOURCE = ("assumed: 4.5 us per recorded op, the profiler's cost measured on a GPU "
                  "host (benchmarks/bench_profiler_cost.py, docs/replay.md); this trace "
                  "does not say what it cost where it was recorded")
KEEP = 0.1
# The recorded events that each cost the host one op's bookkeeping.
RECORDED_CATS = ("cpu_op", "user_annotation", "Operator")


@dataclass(frozen=True)
class ProfilerCost:
    """What one recorded op cost the host, and where that figure comes from."""

    op_us: float
    measured: bool
    source: str

    @classmethod
    def of(cls, model: TraceModel) -> ProfilerCost:
        """The cost `run` measured (trace metadata), else the stated default."""
        # The trace's metadata is the file's, not ours: any field may hold anything.
        cost = model.trace.capture.get("profiler_cost")
        cpu = cost.get("cpu_op") if isinstance(cost, dict) else None
        added = cpu.get("added_us") if isinstance(cpu, dict) else None
        if isinstance(added, int | float) and 0 <= added < 1000:
            return cls(float(added), True, f"measured: {added:.1f} us per recorded op in "
                                             "this run, on tiny ops (capture/opcost.py)")
        return cls(DEFAULT_OP_US, False, DEFAULT_SOURCE)


def from_run(model: TraceModel, cost: ProfilerCost, recorded_us: float, ops_per_step: float,
             keep: float = 1.0) -> ProfilerCost:
    """For a CPU-only trace, the cost per op as this run paid it: the recorded step (less other
    processes' load) against the steps `run` timed without the profiler just before, per
    recorded op; never above the tiny-op measurement, never below zero. A CPU step is host
    work through and through, so the difference is the profiler's, and it holds for these ops
    (nested C++ ops cost the profiler less than the Python-called `aten::add` opcost measures;
    docs/replay.md has the figures). A GPU trace keeps `cost`: its
    host may be off the critical path, where the difference says nothing of the host's cost.
    `keep` is the share the load correction kept of the recorded host time; the unprofiled
    steps ran under the same load."""
    plain = model.trace.capture.get("unprofiled_steps_us")
    if model.has_gpu or not isinstance(plain, list) or len(plain) < 2 or ops_per_step <= 0:
        return cost
    try:
        quiet_plain = float(np.median([float(v) for v in plain])) * keep
    except (TypeError, ValueError):
        return cost
    per_op = max(0.0, recorded_us - quiet_plain) / ops_per_step
    # The tiny-op figure bounds it, but one round of it can read low on a busy VM (0.6 us in
    # one of three recordings where the others read 3.1 and 5.7 us, and the run's own steps
    # said 2.3 us): the bound is never below the stated default.
    bound = max(cost.op_us, DEFAULT_OP_US)
    if per_op >= bound:
        return cost if cost.op_us >= DEFAULT_OP_US else ProfilerCost(
            DEFAULT_OP_US, False, f"{DEFAULT_SOURCE}; the run's own steps said more")
    start = (f"the measurement of {cost.op_us:.1f} us on tiny Python-called ops is "
             "an upper bound" if per_op < cost.op_us else
             f"above the measurement of {cost.op_us:.1f} us on tiny ops, which read "
             f"low; never above {DEFAULT_OP_US:g} us")
    return ProfilerCost(per_op, True, (
        f"measured: {per_op:.2f} us per recorded op, the recorded steps against the "
        f"{len(plain)} steps timed without the profiler just before them "
        f"({ms(quiet_plain, 'tenths')} ms), over {ops_per_step:.0f} recorded ops per step "
        f"({start})"))


def op_counts(g: Graph, model: TraceModel) -> np.ndarray:
    """Per host node, the recorded ops that began inside it on its thread: a fill holds those
    from its start to its POI, a POI those inside its own span."""
    ev = model.trace.events
    counts = np.zeros(len(g.h_ts))
    if ev.empty or not len(g.h_ts):
        return counts
    ts = ev["ts"].to_numpy(dtype=float)
    recorded = column_isin(ev["cat"], RECORDED_CATS)
    for t_index, thread in enumerate(g.thread_ids):
        nodes = np.flatnonzero(g.h_thread == t_index)
        if not len(nodes):
            continue
        starts = np.sort(ts[recorded & column_equals_text(ev["tid"], thread)])
        lo = g.h_ts[nodes]
        hi = g.h_rec_end[nodes].copy()
        fills = g.h_kind[nodes] == FILL
        # A fill's own end is its CPU time packed up; its ops lie up to the POI after it.
        nxt = np.append(lo[1:], hi[-1])
        hi[fills] = np.maximum(hi[fills], nxt[fills])
        counts[nodes] = (np.searchsorted(starts, hi, side="left")
                         - np.searchsorted(starts, lo, side="left"))
    return counts


def unprofile(g: Graph, counts: np.ndarray, op_us: float) -> Graph:
    """A copy of `g` whose host nodes lose `op_us` per recorded op, keeping KEEP of each."""
    out = g.copy()
    out.h_dur = np.maximum(g.h_dur - counts * op_us, g.h_dur * KEEP)
    return out
