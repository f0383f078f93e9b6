"""DataLoader worker processes, as the replay models them.

With N workers, a fetch in the training process only receives a batch another process made:
it takes the cost of receiving one (FETCH_BASE_US plus the batch's bytes at FETCH_BYTES_PER_US,
the page mapping and unpickling of a shared-memory batch), but batches arrive no faster than
one per load time / N (producer and consumer, with the queue never empty at the start: steady
state with persistent workers). The load time per batch is what a fetch took in the process
when it loaded in-process (num_workers=0), plus writing the batch into new shared memory, as a
worker's collate does; when W workers already lag, what `run` measured inside them, else W mean
steps per batch.

Rounds: W workers that lag deliver W batches per load time, and the step waits once a round (or
a few times) while the others wait for nothing: the median step hides the wait that sets the
pace. Such a recording is replayed with its batches arriving at the workers' pace
(`Rounds`, `paced`), so its steps carry the round's wait evenly, as a user timing many steps
sees it.

Cores: when the trace says how many cores the run had (the process's, as `stallscope run`
recorded them, else the recording machine's: trace/cores.py), a step cannot end before its CPU
work and the workers' CPU work share those cores: (cores used by the step's work x its time +
CPU time per batch of loading) / cores. How much CPU the step's own work used (all threads) and
how much of a fetch was CPU rather than waiting on storage are `run`'s measurements; without
them the step's work is taken as one busy core and a fetch as all CPU, and the prediction says
so. A loader that waits on storage takes no cores, so its workers can outnumber them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stallscope.replay.engine import replay
from stallscope.replay.graph import LOADER, Graph
from stallscope.text import plural
from stallscope.trace.cores import Cores, cores_of
from stallscope.trace.load import Trace
from stallscope.trace.model import Step
from stallscope.trace.otherload import OtherLoad, load_from
from stallscope.units import fixed_size, ms, percent

# Receiving one batch from a worker (queue get, unpickling, fetching each tensor's shared-memory
# handle from the worker, mapping it): a base cost and a rate per byte, fitted with
# `benchmarks/bench_replay.py fetch` (workers always ahead). Bare metal is faster, so on such hosts
# this cost, and the prediction, is pessimistic by a few ms per step (docs/performance.md, "Figures
# behind the code").
FETCH_BASE_US = 2000.0
FETCH_BYTES_PER_US = 5700.0
# What a change to the fetches writes in place (Graph.copy).
FETCHES = ("h_dur", "h_after", "h_ret")
# A fetch whose CPU time is under this share of its wall time mostly waits (storage, network):
# its workers need not have a core each (capture/anatomy.py classifies by the same share).
WAITING_CPU_SHARE = 0.5
# Writing a batch into new shared memory inside a worker, per 4 KiB page of the batch, beyond the
# same loading in the training process: a worker's default_collate stacks the samples into a
# tensor in shared memory (for the training process to map), each page allocated and zeroed at
# its first write, where the training process's stack reuses warm memory. The lent GPU hosts'
# recordings (their workers' collate against the same script's in-process one) and
# benchmarks/bench_shm_collate.py measure it: docs/replay.md.
SHM_WRITE_US = 2.0
PAGE_BYTES = 4096.0
# A loader with workers whose wait falls on a few steps (the median step waits under
# ROUND_MEDIAN_SHARE of the mean wait) is replayed at its workers' pace once the mean wait is at
# least ROUND_MIN_SHARE of the mean step: below it, the waits are noise, not a round.
ROUND_MIN_SHARE = 0.05
ROUND_MEDIAN_SHARE = 0.5


class NotModelled(Exception):
    """This change cannot be replayed on this trace; the message says why."""


@dataclass
class LoaderFacts:
    """What `stallscope run` measured about loading, read from the trace's own metadata."""

    workers: int | None  # the training loader's num_workers
    fetch_wall_us: float | None  # per batch
    fetch_cpu_us: float | None  # per batch, the fetching thread
    fetch_process_cpu_us: float | None  # per batch, the whole process
    batch_bytes: float | None
    cores: int | None  # cores this process may use
    window_wall_us: float | None  # the recorded steps
    window_cpu_us: float | None  # CPU time of the whole process over them
    other_load: OtherLoad | None = None  # other processes held the cores (trace/otherload.py)
    # Inside the loader (capture/anatomy.py): its class, and, measured in the workers, the CPU
    # share of a batch's loading and its fetch + collate wall time.
    bound: str | None = None
    worker_cpu_share: float | None = None
    worker_load_us: float | None = None
    # Of a fetch's wall time, the share it sat runnable in a run queue (capture/anatomy.py):
    # a core held by someone else, which the fetch's own CPU need does not include.
    runq_share: float | None = None
    # What `cores` counts (trace/cores.py): None when it is `run`'s own or unknown.
    cores_read: Cores | None = None

    @classmethod
    def of(cls, trace: Trace) -> LoaderFacts:
        """`run`'s facts from the trace's metadata, with the cores wherever the metadata
        carries them: the process's as `run` recorded them, else the recording machine's."""
        facts = cls.from_capture(trace.capture)
        cores = cores_of(trace)
        if facts.cores is not None or cores is None:
            return facts
        return replace(facts, cores=cores.count, cores_read=cores)

    @property
    def cores_said(self) -> str:
        """The cores, and where the count comes from, for the predictions' notes."""
        if self.cores_read is not None:
            return self.cores_read.said
        return plural(self.cores or 0, "core")

    @classmethod
    def from_capture(cls, capture: dict[str, Any]) -> LoaderFacts:
        raw_host = capture.get("host")
        host: dict[str, Any] = raw_host if isinstance(raw_host, dict) else {}
        listed = capture.get("loaders")
        loaders = [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []
        busiest = max(loaders, key=lambda d: _num(d.get("batches")) or 0, default={})
        n = _num(busiest.get("batches")) or 0

        def per_batch(key: str) -> float | None:
            v = _num(busiest.get(key))
            return v / n if v is not None and n > 0 else None

        workers = busiest.get("num_workers")
        cores = host.get("cores_per_process")
        raw_anatomy = busiest.get("anatomy")
        anatomy: dict[str, Any] = raw_anatomy if isinstance(raw_anatomy, dict) else {}
        in_workers = anatomy.get("where") == "workers"
        fetch_ms = _num(anatomy.get("fetch_ms_per_batch"))
        bound = anatomy.get("bound")
        return cls(
            workers=workers if isinstance(workers, int) else None,
            fetch_wall_us=per_batch("fetch_wall_us"),
            fetch_cpu_us=per_batch("fetch_cpu_us"),
            fetch_process_cpu_us=per_batch("fetch_process_cpu_us"),
            batch_bytes=per_batch("fetch_bytes"),
            cores=cores if isinstance(cores, int) and cores > 0 else None,
            window_wall_us=_num(host.get("recorded_wall_us")),
            window_cpu_us=_num(host.get("recorded_cpu_us")),
            other_load=load_from(host),
            bound=bound if isinstance(bound, str) else None,
            worker_cpu_share=_num(anatomy.get("cpu_busy_share")) if in_workers else None,
            runq_share=_num(anatomy.get("runq_share")),
            worker_load_us=(1000.0 * (fetch_ms + (_num(anatomy.get("collate_ms_per_batch"))
                                                  or 0.0))
                            if in_workers and fetch_ms else None),
        )

    def workers_now(self, loader_kind: str | None) -> int | None:
        """The training loader's worker count: as `run` recorded it, else 0 for a trace whose
        fetches are single-process, else unknown."""
        if self.workers is not None:
            return self.workers
        return 0 if loader_kind == "single-process" else None

    @property
    def cpu_share(self) -> float | None:
        """How much of a fetch computed rather than waited on storage (0..1): in the process
        when it loaded there, else as measured inside the workers. Time runnable in a run
        queue is neither: beside other load a CPU-bound fetch spends part of its wall time
        queued, and it still needs a whole core, as on a quiet machine."""
        share = None
        if self.fetch_wall_us and self.fetch_cpu_us is not None and self.workers == 0:
            share = self.fetch_cpu_us / self.fetch_wall_us
        elif self.worker_cpu_share is not None:
            share = self.worker_cpu_share
        if share is None:
            return None
        if self.runq_share is not None and 0.0 <= self.runq_share < 1.0:
            share /= 1.0 - self.runq_share
        return float(np.clip(share, 0.0, 1.0))

    @property
    def mostly_waits(self) -> bool:
        """Whether a fetch was measured to wait more than it computed (False when unknown)."""
        share = self.cpu_share
        return share is not None and share < WAITING_CPU_SHARE

    def compute_cores(self, loader_us_per_step: float, steps: int) -> float | None:
        """Cores the step's own work kept busy (all threads, spinning ones included): the
        process's CPU over the recorded steps without the fetches, over their time."""
        if not (self.window_wall_us and self.window_cpu_us is not None and self.fetch_wall_us):
            return None
        fetch_cpu = (self.fetch_process_cpu_us or 0.0) * steps
        wall = self.window_wall_us - loader_us_per_step * steps
        if wall <= 0:
            return None
        return float(max((self.window_cpu_us - fetch_cpu) / wall, 0.1))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and np.isfinite(v) else None


def worker_batch_us(in_process_us: Any, batch_bytes: float | None) -> Any:
    """A batch's loading inside a worker, from its loading in the training process (a figure or
    an array): the same work, plus writing the batch into new shared memory (SHM_WRITE_US)."""
    return in_process_us + shm_write_us(batch_bytes)


def shm_write_us(batch_bytes: float | None) -> float:
    """What writing a batch of `batch_bytes` into new shared memory costs a worker."""
    return (batch_bytes or 0.0) / PAGE_BYTES * SHM_WRITE_US


@dataclass(frozen=True)
class Rounds:
    """A loader whose workers lag: the step waits once a round of the workers (or a few
    times), while the other steps wait for nothing, so the median step hides the wait that sets
    the pace. The steady step is the workers' pace: W workers that each take L per batch deliver
    one every L / W; without L measured, the recorded steps' mean (whole rounds of batches)."""

    workers: int
    pace_us: float  # one batch per pace_us
    worker_load_us: float | None  # a batch's loading inside a worker, as `run` measured it
    steps: int  # the steps judged
    waited: int  # of which the ones that held the round's wait (at least the mean wait)
    mean_wait_us: float
    median_wait_us: float
    max_wait_us: float

    @classmethod
    def of(cls, steps: Sequence[Step], facts: LoaderFacts, loader_kind: str | None
           ) -> Rounds | None:
        """From the judged steps; None unless the loader has workers (their count recorded)
        and its wait is a round's: at least ROUND_MIN_SHARE of the mean step, concentrated."""
        workers = facts.workers
        if not workers or workers < 1 or loader_kind != "multi-process" or len(steps) < 2:
            return None
        waits = [s.loader_wait_us for s in steps]
        mean_wait = statistics.fmean(waits)
        mean_step = statistics.fmean([s.duration_us for s in steps])
        median_wait = statistics.median(waits)
        if mean_wait < ROUND_MIN_SHARE * mean_step or median_wait >= ROUND_MEDIAN_SHARE * mean_wait:
            return None
        load = facts.worker_load_us
        pace = load / workers if load else mean_step
        return cls(workers, pace, load, len(steps), sum(1 for w in waits if w >= mean_wait),
                   mean_wait, median_wait, max(waits))

    def note(self) -> str:
        """What the replay assumed, in the report's words."""
        source = (f"{plural(self.workers, 'worker')} each take {ms(self.worker_load_us, 'tenths')} "
                  "ms a batch (fetch and collate, measured inside them), one batch every "
                  f"{ms(self.pace_us, 'tenths')} ms" if self.worker_load_us else
                  f"{plural(self.workers, 'worker')} deliver one batch per mean step, "
                  f"{ms(self.pace_us, 'tenths')} ms")
        return (f"the DataLoader's wait falls on {self.waited} of {self.steps} steps (up to "
                f"{ms(self.max_wait_us, 'tenths')} ms; {ms(self.mean_wait_us, 'tenths')} ms a "
                f"step on average, {ms(self.median_wait_us, 'tenths')} ms at the median), once a "
                f"round of its workers: {source}, and the steps are replayed at that pace")

    def to_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "pace_us": round(self.pace_us, 1),
                "worker_load_us": None if self.worker_load_us is None
                else round(self.worker_load_us, 1),
                "steps": self.steps, "waited_steps": self.waited,
                "mean_wait_us": round(self.mean_wait_us, 1),
                "median_wait_us": round(self.median_wait_us, 1),
                "max_wait_us": round(self.max_wait_us, 1)}


def paced(g: Graph, pace_us: float, batch_bytes: float) -> Graph:
    """A copy of `g` whose batches arrive at the workers' pace, as `with_workers` replays
    workers: each fetch takes what it took, at most receiving a batch of `batch_bytes`
    (`receive_us`: a fetch that waited for the round is mostly that wait), and ends no sooner
    than `pace_us` after the one before."""
    loads = np.flatnonzero(g.h_kind == LOADER)
    if len(loads) < 2:
        return g
    g = g.copy(*FETCHES)
    g.h_dur[loads] = np.minimum(g.h_dur[loads], receive_us(batch_bytes))
    g.h_after[loads[1:]] = loads[:-1]
    g.h_ret[loads[1:]] = pace_us
    return g


def workers_pace(facts: LoaderFacts, loader_kind: str | None) -> float | None:
    """One batch every this many us: W workers that each take what `run` measured inside them
    per batch (fetch and collate) deliver no faster. None without both figures. A recording
    slower than that (the profiler's own host time) never met the pace; a run without the
    profiler, or after a change that speeds the host, waits for it."""
    if loader_kind != "multi-process" or not facts.workers or not facts.worker_load_us:
        return None
    return facts.worker_load_us / facts.workers


def pace_note(facts: LoaderFacts, pace_us: float) -> str:
    """The workers' pace, in the report's words, where it holds the step back."""
    return (f"{plural(facts.workers or 0, 'worker')} each take "
            f"{ms(facts.worker_load_us or 0.0, 'tenths')} ms a batch (fetch and collate, "
            f"measured inside them): one batch every {ms(pace_us, 'tenths')} ms, which the step "
            "without the profiler's cost would outrun, so it is replayed at that pace")


def receive_us(batch_bytes: float) -> float:
    """Receiving a batch of `batch_bytes` from a worker in the training process."""
    return FETCH_BASE_US + batch_bytes / FETCH_BYTES_PER_US


def _steady_mean(step_us: np.ndarray) -> float:
    """The mean step, less the first of three or more (it carries work queued before it)."""
    return float(np.mean(step_us[1:] if len(step_us) >= 3 else step_us))


@dataclass
class WorkersPlan:
    """The graph with N workers, and what the prediction assumed."""

    graph: Graph
    assumptions: list[str]


def with_workers(g: Graph, n: int, facts: LoaderFacts, loader_kind: str | None,
                 step_us: np.ndarray, copy_bytes_per_step: float,
                 batch_load_us: float | None = None, one_thread: bool = False) -> WorkersPlan:
    """A copy of `g` with the training loader's fetches served by `n` worker processes.
    `batch_load_us`: a batch's in-process loading at one intra-op thread, as `run` timed it
    (replay/threads.py): a worker's pace; `one_thread`: the step's own work runs one intra-op
    thread, so it keeps at most one core busy."""
    loads = np.flatnonzero(g.h_kind == LOADER)
    if not len(loads):
        raise NotModelled("no DataLoader fetches on the stepping thread to replay")
    workers_now = facts.workers_now(loader_kind)
    if workers_now is None:
        raise NotModelled("the DataLoader already uses workers, and how many is not in the "
                          "trace (record it with `stallscope run`)")
    if n <= workers_now:
        raise NotModelled(f"the DataLoader already has {plural(workers_now, 'worker')}")
    # The step as the graph has it now (without the profiler, where the plan took it out):
    # its own work is what is left once the fetches it waited on are gone.
    before = replay(g).step_us
    own = np.maximum(before - _per_step(g, loads, g.h_dur[loads]), 1.0)
    g = g.copy(*FETCHES)
    notes: list[str] = []
    nbytes = facts.batch_bytes if facts.batch_bytes is not None else copy_bytes_per_step
    shm = (f", plus {ms(shm_write_us(nbytes), 'tenths')} ms writing its "
           f"{fixed_size(nbytes, 'MB')} into new shared memory ({SHM_WRITE_US:g} us per 4 KiB "
           "page, measured: docs/replay.md)"
           if shm_write_us(nbytes) >= 50.0 else "")  # said where it reads 0.1 ms or more
    if workers_now == 0 and batch_load_us:
        load = np.full(len(loads), worker_batch_us(batch_load_us, nbytes))
        notes.append(f"each batch takes a worker {ms(batch_load_us, 'tenths')} ms, the in-process "
                     "loading per batch in the steps run timed at one intra-op thread (a "
                     f"worker runs one){shm}")
    elif workers_now == 0:
        load = worker_batch_us(g.h_dur[loads], nbytes)  # each batch as it loaded in-process
        notes.append("each batch takes a worker as long as it took the training process "
                     f"(measured per batch){shm}")
    elif facts.worker_load_us:
        load = np.full(len(loads), facts.worker_load_us)
        notes.append(f"each batch takes a worker {ms(facts.worker_load_us, 'tenths')} ms (fetch "
                     "and collate, measured inside the workers)")
    else:
        # Whole rounds: the mean step, not the median, which hides the step of each round
        # that waits for the batches.
        load = np.full(len(loads), workers_now * _steady_mean(before))
        notes.append(f"the {workers_now} workers now deliver one batch per mean step, so each "
                     f"takes {workers_now} mean steps per batch")
    fetch = receive_us(nbytes)
    notes.append(f"receiving a batch from a worker costs {ms(fetch, 'hundredths')} ms in the "
                 f"training process ({fixed_size(nbytes, 'MB')}; see docs/replay.md)")
    g.h_dur[loads] = np.minimum(fetch, g.h_dur[loads]) if workers_now else fetch
    g.h_after[loads[1:]] = loads[:-1]
    g.h_ret[loads[1:]] = load[1:] / n
    share = facts.cpu_share
    if facts.cores is None:
        notes.append("the workers are assumed to get CPU cores of their own (the trace does "
                     "not say how many cores the process had)")
        return WorkersPlan(g, notes)
    # Cores: the step's CPU work and the workers' share them.
    steps = len(step_us)
    loader_per_step = float(np.sum(g.h_rec_end[loads] - g.h_ts[loads])) / max(steps, 1)
    measured = facts.compute_cores(loader_per_step, steps)
    u = measured or 1.0
    if one_thread:
        u = min(u, 1.0)
    s = 1.0 if share is None else share
    notes.append(_cores_note(facts, u, measured is not None, s, share is not None))
    if facts.other_load is not None:
        notes.append(f"{facts.other_load.clause}: the prediction assumes the "
                     f"{plural(facts.cores, 'core')} are free for this run, which they were not "
                     "then (lower "
                     "confidence)")
    first = replay(g).step_us
    k = own  # the step's own work, per step
    # ...and receiving each batch (unpickling, mapping its pages) is the training process's CPU
    # work too.
    received = _per_step(g, loads, g.h_dur[loads])
    need = (u * k + received + s * _per_step(g, loads, load)) / facts.cores
    # Where they need more than the cores give, everything on them slows alike (fair
    # sharing): the step's own work and the workers' pace, until the step takes `need`. Slowing
    # only the step's own work left a step bound by the batches' arrival at its unshared pace
    # (examples/loader_bound.py, 2 workers and 1 thread on 2 cores: 13.4 ms predicted where the
    # replay's own figures needed about 17 ms of the cores per step (one recording: 27.0 ms of
    # one-thread loading, 4.7 ms of other work and 2.3 ms of receiving on 2 cores), and the
    # plain step measured 19.4 ms).
    stretch = np.where(need > first, need / np.maximum(first, 1.0), 1.0)
    if (stretch > 1.0).any():
        _stretch_steps(g, stretch)
        notes.append("the cores cannot run both at full speed: the step's own work and the "
                     "workers' pace are slowed alike to fit")
    return WorkersPlan(g, notes)


def _cores_note(facts: LoaderFacts, busy: float, busy_measured: bool, cpu: float,
                cpu_measured: bool) -> str:
    """How the step's work and the workers share the cores, saying what was measured and what
    was taken as given."""
    step = (f"{busy:.1f} cores busy while it ran" if busy_measured
            else f"taken as {busy:.1f} core busy: the trace does not say")
    fetch = (f"{percent(100 * cpu, 0)} of a fetch was CPU" if cpu_measured
             else f"a fetch taken as {percent(100 * cpu, 0)} CPU: the trace does not say how much "
             "of it waited on storage")
    return f"{facts.cores_said} shared by the step's own work ({step}) and the workers' " \
           f"loading ({fetch})"


def _step_of(g: Graph, ts: np.ndarray) -> np.ndarray:
    """The step each recorded time falls in, -1 outside every step."""
    starts, ends = g.h_ts[g.step_start], g.h_ts[g.step_end]
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _per_step(g: Graph, loads: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Load time of the batches fetched in each step (by the fetch's recorded start)."""
    idx = _step_of(g, g.h_ts[loads])
    out = np.zeros(g.steps)
    ok = idx >= 0
    np.add.at(out, idx[ok], load[ok])
    return out


def _stretch_steps(g: Graph, stretch: np.ndarray) -> None:
    """Host work that is not a fetch, and the workers' time between batches, take
    `stretch[k]` times longer in step k."""
    idx = _step_of(g, g.h_ts)
    ok = (idx >= 0) & (g.h_kind != LOADER)
    g.h_dur[ok] *= stretch[idx[ok]]
    loads = (idx >= 0) & (g.h_kind == LOADER)
    g.h_ret[loads] *= stretch[idx[loads]]
