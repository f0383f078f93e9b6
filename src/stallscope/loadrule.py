"""When a slower stretch of a run's steps is other load on the machine, not the script's own
change: one rule for `watch`'s report (wholerun/regimes.py) and its live trigger
(capture/later.py), so that no capture is spent on what the report calls load. Pure Python: the
trigger runs it in the training process.

Evidence, each figure a median over the stretch (NaN: not measured), the quieter stretch
against the slower one:

- the stepping thread's wait for a core (schedstat): past the quieter stretch's share of the
  step, it explains half the growth or more; or it became a material share of the step;
- the process's CPU time per wall ms, with that wait: intra-op threads spinning while other
  processes hold the cores burn CPU without more work;
- the cores other processes held (capture/loadsampler.py): they took more of them while the
  stepping thread waited for a core a material share of its step, and the process used no more
  CPU per wall ms than before. Where the machine was already oversubscribed, more load grows
  the step, the CPU time and the wait in proportion, which the first two cannot tell from more
  work; the script's own work takes no core from other processes;
- the CPU time of a fixed piece of work (the sampler's probe): the core itself ran slower (a
  hypervisor, a busy sibling hyperthread, a lower clock), by enough to explain half the growth.

More work of the script's own grows the step, the CPU time and the wait in proportion, and
moves neither the other processes' cores nor the probe: none of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stallscope.units import millis

LOAD_EXPLAINS = 0.5  # the evidence explains this much of a slower stretch's growth ...
LOAD_SHARE = 0.2  # ... or the wait for a core is this share of its step, at least ...
LOAD_SHARE_DELTA = 0.1  # ... and this much more than the quieter neighbour's
LOAD_SPIN = 1.5  # or CPU time per wall ms this many times the quieter's, with that wait
OTHERS_DELTA = 0.15  # other processes held this many more cores (with that wait) ...
CPU_KEPT = 1.1  # ... while the process's CPU per wall ms grew by less than this factor
CORE_SLOWER = 1.3  # or the probe's CPU time this many times the quieter stretch's


@dataclass(frozen=True)
class Figures:
    """A stretch's medians (ms, cores, us; NaN: not measured)."""

    step_ms: float
    runq_ms: float = math.nan
    cpu_ms: float = math.nan
    others_cores: float = math.nan
    probe_us: float = math.nan


def why_load(quiet: Figures, busy: Figures) -> str | None:
    """Why `busy` (slower than `quiet`) is other load, or None when the evidence does not say
    so (module docstring)."""
    grew = busy.step_ms - quiet.step_ms
    if not grew > 0:
        return None
    core = _core_slower(quiet, busy, grew)
    if core is not None:
        return core
    if not (math.isfinite(quiet.runq_ms) and math.isfinite(busy.runq_ms)):
        return None
    share_q = quiet.runq_ms / quiet.step_ms
    share_b = busy.runq_ms / busy.step_ms
    # the wait past the quiet stretch's share of the longer step: the script's own extra work
    # waits in that share too, on a machine that gives it part of a core
    waited = busy.runq_ms - share_q * busy.step_ms
    cpu_growth = _cpu_per_wall_growth(quiet, busy)
    spinning = share_b >= LOAD_SHARE and cpu_growth is not None and cpu_growth >= LOAD_SPIN
    took = busy.others_cores - quiet.others_cores  # NaN when either is unknown
    others = (share_b >= LOAD_SHARE and took >= OTHERS_DELTA
              and cpu_growth is not None and cpu_growth < CPU_KEPT)
    if not (waited >= LOAD_EXPLAINS * grew or spinning or others or (
            share_b >= LOAD_SHARE and share_b - share_q >= LOAD_SHARE_DELTA)):
        return None
    why = (f"the stepping thread waited for a core {millis(busy.runq_ms, 'tenths')} ms a step "
           f"(from {millis(quiet.runq_ms, 'tenths')} ms): other processes held the cores")
    if math.isfinite(took) and took >= OTHERS_DELTA:
        why += (f" ({busy.others_cores:.2f} cores on average, from "
                f"{quiet.others_cores:.2f})")
    cpu = cpu_ratio(quiet, busy)
    if cpu is not None and cpu >= 1.5:
        why += (f"; the process's CPU time per step {cpu:.1f}x for the same work (threads "
                "spinning while they wait)")
    return why


def _core_slower(quiet: Figures, busy: Figures, grew: float) -> str | None:
    """The probe says the core ran slower, by enough to explain half the growth of the step's
    CPU-bound part (the process's CPU time in it, at most the step)."""
    if not (quiet.probe_us > 0 and busy.probe_us > 0):
        return None
    slower = busy.probe_us / quiet.probe_us
    worked = min(quiet.cpu_ms, quiet.step_ms) if quiet.cpu_ms > 0 else quiet.step_ms
    if slower < CORE_SLOWER or worked * (slower - 1.0) < LOAD_EXPLAINS * grew:
        return None
    return (f"the cores ran {slower:.1f}x slower: a fixed piece of work took "
            f"{busy.probe_us:.0f} us of CPU time, from {quiet.probe_us:.0f} us (a hypervisor "
            "or another tenant of the host taking the core, or a lower clock)")


def _cpu_per_wall_growth(quiet: Figures, busy: Figures) -> float | None:
    """The process's CPU time per wall ms, the slower stretch's over the quieter's."""
    if not (quiet.cpu_ms > 0 and busy.cpu_ms > 0):
        return None
    return (busy.cpu_ms / busy.step_ms) / (quiet.cpu_ms / quiet.step_ms)


def cpu_ratio(prev: Figures, cur: Figures) -> float | None:
    """CPU time per step, `cur` over `prev`; None when either lacks it."""
    if not (prev.cpu_ms > 0 and cur.cpu_ms > 0):
        return None
    return cur.cpu_ms / prev.cpu_ms
