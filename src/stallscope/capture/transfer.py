"""Between a worker and the step: shipping each batch, pinning it, bursts and worker restarts.

capture/anatomy.py says what a worker spends on a batch; this module says what happens to the
batch after: how long it sat ready before the training process received it, and how much of
`__next__` the training process spent receiving it (pickling, the queue, unpickling, pinning).
Both ends read `time.monotonic()`, CLOCK_MONOTONIC, one clock for every process on Linux:

- in each worker, the fetch wrapper stamps the end of every batch it made (`made`), keeping the
  last RING (sequence number, end time, fetch wall time) in the worker's JSON file;
- in the training process, each `_MultiProcessingDataLoaderIter._try_get_data` call that returns
  a batch is timed (`TransferTap.received`) and attributed to its worker through
  `it._task_info[idx]`, read before torch consumes it.

A worker puts its batches on the result queue in the order it made them, and the queue (and the
pin-memory thread, which reads it in order) keeps that order per worker: the training process's
n-th batch from a worker is the worker's n-th batch. What can break that, in torch 2.13's
`dataloader.py` and `_utils/worker.py`:

- a fetch that raises reaches the training process as `ExceptionWrapper` or
  `_IterableDatasetStopIteration`: counted on neither side (the wrapper counts only fetches that
  return); an `ExceptionWrapper` from the pin-memory thread, though, replaces a batch the worker
  did make, so with pin_memory that worker's figures are dropped;
- a persistent iterator's `_reset` (a new epoch, or a loop left early) empties `_task_info`
  before it drains the batches still in flight: those are attributed through the previous
  `_task_info`, kept aside; one that cannot be attributed drops the iterator's figures;
- a batch the worker made but never delivered (its queue's feeder could not pickle it): caught
  when the counts disagree (the training process received more batches from a worker than the
  worker's own file, written later, says it made) or a batch would be received before it was
  made: that worker's figures are dropped rather than mis-matched.

The pin-memory thread's `pin_memory()` calls are timed by replacing the module global
`torch.utils.data._utils.pin_memory.pin_memory`, which `_pin_memory_loop` looks up at each call
(torch 2.13), for the run, and accumulated per thread (`PinLedger`).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.worker import _IterableDatasetStopIteration

# Batches a worker keeps in its file: a batch is seen at most FLUSH_S + READ_S (0.25 s each)
# after it was made, so 512 cover 1,000 batches a second per worker.
RING = 512
# A loader is bursty when its workers keep up on average but some batches are slow: the 90th
# percentile of a batch's fetch at least BURST_RATIO times the median, and the step waiting on
# some batches only (at most WAITED_MAX_SHARE of them). A batch waited when its `__next__` took
# at least WAITED_MIN_MS and WAITED_OVER_MEDIAN times the median `__next__`: a batch already
# received costs well under a millisecond to hand over.
BURST_RATIO = 2.0
WAITED_MIN_MS = 1.0
WAITED_OVER_MEDIAN = 3.0
WAITED_MAX_SHARE = 0.5
MIN_BURST_BATCHES = 8
MAX_KEPT = 20_000  # per-batch figures kept per loader (a long recording keeps its first ones)


# ------------------------------------------------------------------------------ worker side


class _Ring:
    """One worker's last RING batches: the sequence number of the newest, and per batch its
    end time and fetch wall time, whole microseconds (monotonic clock): a file write then only
    copies two lists of ints (`json` writes ints fast, floats slowly)."""

    __slots__ = ("last", "ends", "walls", "wall_total")

    def __init__(self) -> None:
        self.last = 0
        self.ends: deque[int] = deque(maxlen=RING)
        self.walls: deque[int] = deque(maxlen=RING)
        self.wall_total = 0.0


def made(acct: Any, end: float) -> None:
    """Stamp the batch the worker's account has just counted (`acct.batches`, its sequence
    number) as made at `end`. Its fetch wall time is what the account's total grew by."""
    ring = acct.__dict__.get("made_ring")
    if ring is None:
        ring = acct.__dict__["made_ring"] = _Ring()
    if acct.batches != ring.last + 1:  # a batch went unstamped: the ring must stay consecutive
        ring.ends.clear()
        ring.walls.clear()
    ring.last = acct.batches
    ring.ends.append(int(end * 1e6))
    ring.walls.append(int(acct.fetch_wall_us - ring.wall_total))
    ring.wall_total = acct.fetch_wall_us


def ring_of(acct: Any) -> dict[str, Any] | None:
    """The ring as the worker's JSON carries it: `last` (sequence number of the newest batch),
    `end_us` (monotonic clock), `wall_us`, oldest first."""
    ring = acct.__dict__.get("made_ring")
    if ring is None or not ring.ends:
        return None
    return {"last": ring.last, "end_us": list(ring.ends), "wall_us": list(ring.walls)}


# ----------------------------------------------------------------------------- matching


def match(pending: deque[tuple[int, float, float]], ring: dict[str, Any], flushed_at: float,
          made_count: int) -> list[tuple[float, float]] | None:
    """Match one worker's received batches (sequence number, `_try_get_data` start, return;
    monotonic seconds, in order) with the batches its ring says it made, consuming them from
    `pending`. Returns (ready_to_received_us, transfer_us) per matched batch, or None when the
    two sides disagree: a batch received before it was made, or more batches received before
    the worker wrote its file than the file says it made. Receipts beyond the ring stay pending
    (the worker has not written them yet); those older than the ring are dropped unmatched."""
    ends = ring["end_us"]
    last = int(ring["last"])
    seq0 = last - len(ends) + 1
    for seq, _start, ret in pending:
        if seq > made_count:
            if ret < flushed_at:
                return None
            break
    out: list[tuple[float, float]] = []
    while pending:
        seq, start, ret = pending[0]
        if seq > last:
            break
        pending.popleft()
        if seq < seq0:
            continue
        end = ends[seq - seq0] / 1e6
        if ret < end:
            return None
        out.append(((ret - end) * 1e6, (ret - max(end, start)) * 1e6))
    return out


# ------------------------------------------------------------------------- pin-memory thread


@dataclass
class PinAccount:
    """One thread's `pin_memory()` calls while recording: batches, wall and thread-CPU us."""

    batches: int = 0
    wall_us: float = 0.0
    cpu_us: float = 0.0


class PinLedger:
    """Times `pin_memory()` per thread for the run; `active` while the steps are recorded.

    torch's `pin_memory` calls itself (by the same global name) for each element of a batch:
    only the outermost call of a thread counts, so a batch is one call."""

    def __init__(self) -> None:
        self.active = False
        self._accounts: weakref.WeakKeyDictionary[threading.Thread, PinAccount] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()
        self._local = threading.local()
        self._saved: tuple[Any, Callable[..., Any]] | None = None

    def account(self, thread: threading.Thread) -> PinAccount:
        with self._lock:
            acct = self._accounts.get(thread)
            if acct is None:
                acct = self._accounts[thread] = PinAccount()
            return acct

    def install(self) -> None:
        from torch.utils.data._utils import pin_memory as pin_mod

        orig = pin_mod.pin_memory
        self._saved = (pin_mod, orig)
        pin_mod.pin_memory = self.wrap(orig)

    def uninstall(self) -> None:
        if self._saved is not None:
            mod, orig = self._saved
            mod.pin_memory = orig
            self._saved = None

    def wrap(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        ledger, local = self, self._local

        def pin_memory(data: Any, *args: Any, **kwargs: Any) -> Any:
            if not ledger.active or getattr(local, "inside", False):
                return orig(data, *args, **kwargs)
            local.inside = True
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return orig(data, *args, **kwargs)
            finally:
                local.inside = False
                try:
                    acct = ledger.account(threading.current_thread())
                    acct.batches += 1
                    acct.wall_us += (time.perf_counter() - wall) * 1e6
                    acct.cpu_us += (time.thread_time() - cpu) * 1e6
                except Exception:  # the accounting is lost, never the batch
                    pass

        pin_memory.__wrapped__ = orig  # type: ignore[attr-defined]
        return pin_memory


# ---------------------------------------------------------------------- one loader's figures


@dataclass
class TransferTap:
    """What the training process saw of one loader's batches, and what it matched."""

    counts: dict[int, int] = field(default_factory=dict)  # pid -> batches received, all
    pending: dict[int, deque[tuple[int, float, float]]] = field(default_factory=dict)
    matched: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    broken: set[int] = field(default_factory=set)  # pids whose order could not be followed
    walls_seen: dict[int, int] = field(default_factory=dict)  # pid -> last seq taken
    fetch_walls_us: list[float] = field(default_factory=list)  # made in the recording
    waits_us: list[float] = field(default_factory=list)  # each recorded __next__
    gaps_us: list[float] = field(default_factory=list)  # a batch's return to the next call
    last_return: float | None = None
    pids: set[int] = field(default_factory=set)
    worker_starts: int = 0
    pins: list[PinAccount] = field(default_factory=list)

    def iterated(self, it: Any, recording: bool, ledger: PinLedger | None) -> None:
        """A new (or reset) iterator: its worker processes, new ones counted while recording,
        and its pin-memory thread."""
        pids = {w.pid for w in getattr(it, "_workers", ()) if w.pid is not None}
        new = pids - self.pids
        self.pids |= new
        if recording:
            self.worker_starts += len(new)
        thread = it.__dict__.get("_pin_memory_thread")
        if ledger is not None and isinstance(thread, threading.Thread):
            acct = ledger.account(thread)
            if not any(a is acct for a in self.pins):
                self.pins.append(acct)

    def received(self, it: Any, item: Any, start: float, ret: float, recording: bool) -> None:
        """One `_try_get_data` that returned `item` = (task index, payload)."""
        idx, payload = item
        if not isinstance(idx, int):  # a persistent worker's `_ResumeIteration` acknowledgement
            return
        tasks = it._task_info
        entry = tasks.get(idx)
        if entry is not None:
            it.__dict__["_stallscope_tasks"] = tasks
        else:  # drained by `_reset` after it replaced `_task_info`: the previous one has it
            prev = it.__dict__.get("_stallscope_tasks")
            entry = prev.get(idx) if prev is not None else None
        if not entry:
            self.broken |= {w.pid for w in it._workers}
            return
        pid = it._workers[entry[0]].pid
        if isinstance(payload, ExceptionWrapper):
            if getattr(it, "_pin_memory", False):  # maybe a batch the pin thread failed on
                self.broken.add(pid)
            return
        if isinstance(payload, _IterableDatasetStopIteration):
            return
        n = self.counts[pid] = self.counts.get(pid, 0) + 1
        if recording and pid not in self.broken:
            self.pending.setdefault(pid, deque()).append((n, start, ret))

    def waited(self, start: float, end: float) -> None:
        """One recorded `__next__`, perf_counter seconds: its wait, and the other step work
        since the previous one returned."""
        if len(self.waits_us) >= MAX_KEPT:
            return
        self.waits_us.append((end - start) * 1e6)
        if self.last_return is not None:
            self.gaps_us.append((start - self.last_return) * 1e6)
        self.last_return = end

    def stopped(self) -> None:
        """Recording paused: the next wait's gap would span the pause."""
        self.last_return = None

    def update(self, files: dict[int, dict[str, Any]], since: float) -> None:
        """Take what the workers' files (`anatomy.read_workers`) add: batches made since the
        recording started (`since`, monotonic), and matches for the batches received."""
        for pid, data in files.items():
            ring = data.get("made")
            if not isinstance(ring, dict) or not ring.get("end_us"):
                continue
            ends = np.asarray(ring["end_us"], dtype=float) / 1e6
            walls = np.asarray(ring["wall_us"], dtype=float)
            last = int(ring["last"])
            seq0 = last - len(ends) + 1
            first = max(self.walls_seen.get(pid, 0) + 1 - seq0, 0)
            fresh = walls[first:][ends[first:] >= since]
            room = MAX_KEPT - len(self.fetch_walls_us)
            self.fetch_walls_us.extend(fresh[:max(room, 0)].tolist())
            self.walls_seen[pid] = last
            pend = self.pending.get(pid)
            if not pend or pid in self.broken:
                continue
            got = match(pend, ring, float(data.get("t", 0.0)), int(data.get("batches") or 0))
            if got is None:
                self.broken.add(pid)
                pend.clear()
                self.matched.pop(pid, None)
            else:
                self.matched.setdefault(pid, []).extend(got)

    def figures(self, num_workers: int, anatomy: dict[str, Any]) -> dict[str, Any]:
        """The anatomy keys this module adds (docs/rules.md, dataloader-bound)."""
        out: dict[str, Any] = {}
        if num_workers > 0:
            out["worker_starts"] = self.worker_starts
            pairs = [p for pid, ps in self.matched.items() if pid not in self.broken for p in ps]
            if pairs:
                ready, ship = np.asarray(pairs).T / 1000.0
                out["ready_to_received_ms"] = {"median": round(float(np.median(ready)), 3),
                                               "p90": round(float(np.percentile(ready, 90)), 3)}
                out["transfer_ms_per_batch"] = round(float(np.median(ship)), 3)
                out["transfer_batches"] = len(pairs)
            if self.broken & self.pids:
                out["transfer_dropped_workers"] = len(self.broken & self.pids)
        pinned = sum(a.batches for a in self.pins)
        if pinned:
            out["pinned_batches"] = pinned
            out["pin_ms_per_batch"] = round(sum(a.wall_us for a in self.pins) / pinned / 1000, 3)
            out["pin_cpu_ms_per_batch"] = round(sum(a.cpu_us for a in self.pins) / pinned / 1000,
                                                3)
        if num_workers > 0:
            out.update(bursts(num_workers, self.fetch_walls_us, self.waits_us, self.gaps_us))
        return out


def bursts(num_workers: int, fetch_walls_us: list[float], waits_us: list[float],
           gaps_us: list[float]) -> dict[str, Any]:
    """Per-batch spread of the workers' fetches and of the step's waits, and whether the loader
    is bursty: its workers keep up on average (workers x the step's other work per batch >= the
    mean fetch) while the step waits on the slow batches only."""
    if len(fetch_walls_us) < MIN_BURST_BATCHES or len(waits_us) < MIN_BURST_BATCHES or not gaps_us:
        return {}
    fetch = np.asarray(fetch_walls_us) / 1000.0
    waits = np.asarray(waits_us) / 1000.0
    p50, p90 = float(np.median(fetch)), float(np.percentile(fetch, 90))
    compute = float(np.median(gaps_us)) / 1000.0
    waited = waits >= max(WAITED_MIN_MS, WAITED_OVER_MEDIAN * float(np.median(waits)))
    share = float(waited.mean())
    keeps_up = num_workers * compute >= float(fetch.mean())
    ratio = p90 / p50 if p50 > 0 else math.inf
    slow = fetch[fetch >= p90]  # the slowest tenth: what a deeper queue must cover
    return {
        "fetch_ms_p50": round(p50, 3), "fetch_ms_p90": round(p90, 3),
        "fetch_ms_mean": round(float(fetch.mean()), 3),
        "slow_fetch_ms": round(float(np.median(slow)), 3) if len(slow) else None,
        "wait_ms_p50": round(float(np.median(waits)), 3),
        "wait_ms_p90": round(float(np.percentile(waits, 90)), 3),
        "waited_share": round(share, 3),
        "compute_ms_per_batch": round(compute, 3),
        "bursty": bool(keeps_up and ratio >= BURST_RATIO and 0 < share <= WAITED_MAX_SHARE),
    }
