"""`torch_threads=1` in the replay: the training process's host work at one intra-op thread,
grounded on the steps `stallscope run` timed that way just before recording
(capture/threadprobe.py).

The probe's steps ran under whatever load the machine had; with one thread there is no
parallel op's barrier for a preempted thread to stall, so the share of their time the thread
waited for cores others held (replay/unload.py, from the probe's own scheduler figures) comes
out and leaves the quiet one-thread step. Its loader wait (the fetches, when the training
process loads) and the rest are scaled separately: the recorded graph's host segments, already
without the profiler and other load, are stretched or shrunk to those two figures. A step
whose helper threads mostly idled comes out about as it was (docs/replay.md, "One intra-op
thread"); one that stalled at barriers beside other load comes out
several times shorter (in six busy runs the other work scaled to 0.04-0.24 of its recorded
time).

DataLoader workers always run one intra-op thread (torch sets it in each worker), so when the
replay moves in-process loading to workers each batch takes the probe's mean one-thread loading
time: one figure over its five steps, which beside other load is steadier than the recorded
fetches (each stretched by however long it sat in a run queue).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from stallscope.replay.graph import LOADER, Graph
from stallscope.replay.unload import OtherWait
from stallscope.trace.model import TraceModel
from stallscope.units import ms, percent

# A factor outside these bounds says the probe and the recording saw different runs (a phase
# change, an epoch's end): the replay then does not model the change. Down to 1/100: steps that
# stalled at barriers beside other load ran 35x their quiet time (328 against 9.2 ms, and on
# examples/loader_bound.py the recorded compute shrank 20-30x at one thread); up to twice the
# thread count, since one thread cannot be slower than N threads working perfectly in parallel.
MIN_SCALE = 0.01
MAX_SCALE_PER_THREAD = 2.0
MINOR_PART = 0.1


@dataclass(frozen=True)
class OneThread:
    """The probe's one-thread steps, as measured and without other load."""

    threads: int  # the script's intra-op threads, as recorded
    measured_us: float  # mean probe step, as timed
    step_us: float  # ...less the share its thread waited for cores others held
    load_us: float  # of which waiting on the DataLoader (in-process loading: the fetches)
    others_share: float
    steps: int

    @classmethod
    def of(cls, model: TraceModel) -> OneThread | None:
        """From the trace's `thread_probe` metadata; None without a probe."""
        probe = model.trace.capture.get("thread_probe")
        if not isinstance(probe, dict) or probe.get("probe_threads") != 1:
            return None
        steps, waits, threads = probe.get("steps_us"), probe.get("loader_wait_us"), \
            probe.get("threads")
        try:
            # a missing list is empty: no steps, or not one wait per step, so None below
            steps = [float(v) for v in steps or ()]
            waits = [float(v) for v in waits or ()]
        except (TypeError, ValueError):
            return None
        if not steps or len(waits) != len(steps) or not isinstance(threads, int) or threads < 2:
            return None
        # Means, not medians: the other load's share is the window's, and the window is the
        # sum of the steps (beside two busy loops one probe step in four ran twice as long).
        others = OtherWait.from_host(probe)
        share = others.others_share if others is not None else 0.0
        measured = statistics.fmean(steps)
        keep = 1.0 - share
        return cls(threads, measured, measured * keep,
                   statistics.fmean([min(w, s) for w, s in zip(waits, steps, strict=True)])
                   * keep, share, len(steps))


@dataclass(frozen=True)
class ThreadScales:
    """What one intra-op thread does to the baseline graph's loader fetches and to the rest,
    and one batch's loading at one thread (what a DataLoader worker takes per batch)."""

    load: float
    rest: float
    note: str
    batch_load_us: float | None = None


def scales(one: OneThread, g: Graph, base_step_us: float) -> ThreadScales | None:
    """The factors that take `g` (its replay: `base_step_us` per step, without the profiler
    and other load) to the probe's quiet one-thread step; None when they are out of bounds."""
    loads = g.h_kind == LOADER
    loader_us = float(np.sum(g.h_dur[loads])) / max(g.steps, 1)
    rest_us = base_step_us - loader_us
    one_rest = one.step_us - one.load_us
    load = one.load_us / loader_us if loader_us > 0 and one.load_us > 0 else 1.0
    if rest_us <= 0 or one_rest <= 0:
        return None
    rest = one_rest / rest_us
    top = MAX_SCALE_PER_THREAD * one.threads
    for scale, part in ((load, loader_us), (rest, rest_us)):
        # A part under a tenth of the step (a few fetches of a ready tensor) says nothing by
        # its ratio: it is held inside the bounds rather than refused.
        if not MIN_SCALE <= scale <= top and part >= MINOR_PART * base_step_us:
            return None
    load, rest = (float(np.clip(v, MIN_SCALE, top)) for v in (load, rest))
    load_part = (f"; its loading {ms(one.load_us, 'tenths')} ms against "
                 f"{ms(loader_us, 'tenths')} ms" if loader_us > 0 else "")
    others = (f", less the {percent(100 * one.others_share, 0)} its thread waited for cores other "
              "processes held" if one.others_share > 0 else "")
    note = (f"one intra-op thread: the {one.steps} steps run timed that way before recording "
            f"took {ms(one.measured_us, 'tenths')} ms (mean{others}: "
            f"{ms(one.step_us, 'tenths')} ms) against the {ms(base_step_us, 'tenths')} ms "
            f"baseline with {one.threads}{load_part}; the host's other work is scaled by "
            f"{rest:.2f}, assumed even across its segments")
    batches = int(np.count_nonzero(loads))
    per_batch = one.load_us * g.steps / batches if batches and one.load_us > 0 else None
    return ThreadScales(load, rest, note, per_batch)


def one_thread(g: Graph, s: ThreadScales, loading_in_process: bool) -> Graph:
    """A copy of `g` at one intra-op thread: the fetches (when the training process still
    loads) and the rest of the host's work at the probe's pace."""
    out = g.copy()
    loads = g.h_kind == LOADER
    f = np.where(loads, s.load if loading_in_process else 1.0, s.rest)
    out.h_dur = g.h_dur * f
    out.h_lead = g.h_lead * f
    return out

