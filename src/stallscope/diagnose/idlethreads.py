"""What every thread of the training process did while the GPU waited for a launch: gpu-idle's
host-wait idle split by (thread, op) and by kind.

A host-wait gap ends when some thread's runtime call launches the next GPU work; that thread
(the gap's *launcher*) was late. While the stepping thread sits in `loss.backward()` the
autograd engine's thread is the launcher, so reading only the stepping thread calls the
backward's dispatch "no recorded op". Each instant of a host-wait gap gets one kind, first
that applies:

- `dataloader` / `sync`: the stepping thread waited for a batch / on the GPU;
- `launch`: a thread was launching: in a runtime call (a launch, or the runtime work around
  one) or inside an op that launched GPU work on its own thread; the launcher's when it was,
  else the first such thread. Launch overhead: what CUDA graphs and torch.compile remove;
- `graphed`: launch work inside a host op that launches a CUDA graph: already graphed;
- `pin-memory`: nothing in the process was recorded, right after a pin-memory thread's
  runtime calls, or the pin-memory thread ran while the launcher recorded nothing;
- `cpu-work`: the launcher was inside an op that launched nothing (or only inside a
  record_function range);
- `python`: the launcher was in a Python function (traces recorded with_stack);
- `untraced`: the launcher recorded nothing at all.

The last four are host time that is not launch overhead; a gap holding less than
CPU_WORK_MIN_GAP_US of them is counted as launch work (the Python between two launching ops).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallscope.diagnose.idlegaps import HostLayers, HostWaitGaps
from stallscope.trace.intervals import Timeline, enclosing
from stallscope.trace.model import TraceModel
from stallscope.trace.names import GRAPH_LAUNCH, column_isin, name_flags, name_mask, regex_hit
from stallscope.trace.threads import (
    AUTOGRAD,
    AUTOGRAD_OP,
    ISSUING_CALL,
    PIN_MEMORY,
    ROLE_ORDER,
    thread_roles,
)

KINDS = ("dataloader", "sync", "launch", "graphed", "pin-memory", "cpu-work", "python",
         "untraced")
NOT_LAUNCH = ("pin-memory", "cpu-work", "python", "untraced")
_K = {k: i for i, k in enumerate(KINDS)}
# A host-wait gap whose host ran this long (us) before the launch that ended it, outside any
# launching, was not launch overhead: a launch costs the host ~5-10 us and an ATen op's
# dispatch ~10-20 us, so 100 us without a launch is several ops' worth of host time that
# launched nothing (data preprocessing, tokenisation, Python bookkeeping, CPU tensor ops).
CPU_WORK_MIN_GAP_US = 100.0
# A stretch in which no thread of the process records anything, this long (us) or more and
# beginning at most PIN_HOLD_US after a pin-memory thread's runtime call ended, was held by
# that thread: a Python thread that holds the interpreter lets no other Python thread run, and
# the pin-memory thread's own copying is not recorded, only its calls into the runtime.
PIN_SILENCE_MIN_US = 100.0
PIN_HOLD_US = 250.0
UNTRACED = "(no recorded op: Python code or untraced work)"
BETWEEN = "(between ops)"
_AUTOGRAD_ROW = "autograd::engine::evaluate_function: *"


@dataclass(frozen=True)
class ThreadShare:
    """Idle time (us, summed over the steps) of one kind under one op of one thread."""

    thread: str  # the thread's role in words (trace/threads.py)
    tid: str
    op: str
    kind: str
    us: float


@dataclass(frozen=True)
class Attribution:
    us_by_kind: dict[str, float]  # every kind of KINDS, in that order
    rows: tuple[ThreadShare, ...]  # largest first
    roles: dict[str, str]  # tid -> role
    by_step: np.ndarray  # (windows, KINDS): each window's time of each kind



@dataclass(frozen=True)
class _Events:
    """Host events of the stepping process as arrays: ts, end, thread index, a code per event
    (ops: 0 a record_function range, 1 a cpu_op that launched nothing on its thread, 2 one
    that did; runtime calls: 1 one that issues GPU work, else 0), and each event's row in
    `names` (its table's name column), read only for the events a label needs."""

    ts: np.ndarray
    end: np.ndarray
    thread: np.ndarray
    code: np.ndarray
    pos: np.ndarray
    names: pd.Series

    def subset(self, mask: np.ndarray) -> _Events:
        return _Events(self.ts[mask], self.end[mask], self.thread[mask], self.code[mask],
                       self.pos[mask], self.names)

    def on(self, k: int, code: int | None = None,
           least: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Intervals of thread k (with this code, or at least this code)."""
        mine = self.thread == k
        if code is not None:
            mine &= (self.code >= code) if least else (self.code == code)
        return self.ts[mine], self.end[mine]


def _no_events() -> _Events:
    empty = np.empty(0, dtype=np.int64)
    return _Events(np.empty(0), np.empty(0), empty, empty, empty,
                   pd.Series([], dtype=object))


def graph_launches(model: TraceModel) -> int:
    """CUDA graph launches inside the steps."""
    rt = model.runtime
    if not len(rt):
        return 0
    return int((name_mask(rt["name"], GRAPH_LAUNCH) & (rt["step"].to_numpy() >= 0)).sum())


def attribute(model: TraceModel, hw: HostWaitGaps, windows: np.ndarray,
              host: HostLayers) -> Attribution:
    """The host-wait idle of one device's gaps `hw`, inside `windows`, by thread, op and kind."""
    roles = thread_roles(model)
    tids = sorted(roles, key=lambda t: (ROLE_ORDER.index(roles[t]), _tid_key(t)))
    empty = Attribution({k: 0.0 for k in KINDS}, (), roles,
                        np.zeros((len(windows), len(KINDS))))
    if not len(hw.start) or not tids:
        return empty
    index = {t: i for i, t in enumerate(tids)}
    pin = [index[t] for t in tids if roles[t] == PIN_MEMORY]
    wanted = _wanted(hw)
    # The quiet stretches a pin-memory thread held need every event; else only what a label
    # reads is kept (a long trace's host events are most of this rule's memory).
    every = _host_events(model, index, None if pin else wanted)
    holds = _holds(every, pin)
    if pin:
        every = _cut(every, wanted)
    near = _near(hw)
    ops, calls, py = (near(e) for e in every)
    spans = _graphed_spans(ops, calls)
    tl = Timeline.from_intervals((windows[:, 0], windows[:, 1]), (hw.start, hw.end),
                                 (hw.start, hw.launch), host.loader, host.sync,
                                 (ops.ts, ops.end), (calls.ts, calls.end), (py.ts, py.end),
                                 (holds.ts, holds.end), (spans.ts, spans.end))
    bucket = tl.bucket(windows[:, 0], windows[:, 1])
    seg = np.flatnonzero(tl.cover(hw.start, hw.end) & (bucket >= 0))
    if not len(seg):
        return empty
    gap = np.searchsorted(hw.start, tl.starts[seg], side="right") - 1
    main = index.get(str(model.main_tid), 0)
    launcher = np.array([index.get(t, main) for t in hw.tid.tolist()], dtype=np.int64)[gap]
    state = _State.of(tl, seg, len(tids), ops, calls, py, spans)
    kind, who = _classify(state, np.array([roles[t] == PIN_MEMORY for t in tids]), main,
                          launcher, tl.starts[seg] < hw.launch[gap],
                          (tl.cover(*host.loader)[seg], tl.cover(*host.sync)[seg],
                           tl.cover(holds.ts, holds.end)[seg]))
    lengths = tl.lengths[seg]
    kind, who = _gate(kind, who, launcher, gap, lengths, len(hw.start))
    kind = np.where(np.isin(kind, [_K["launch"], _K["cpu-work"], _K["python"]])
                    & state.graphed[who, np.arange(len(seg))], _K["graphed"], kind)
    label, names = _labels(tl.starts[seg], tl.edges[1:][seg], kind, who, (ops, calls, py),
                           every, holds, _Main(main, host.loader,
                                               [index[t] for t in tids if roles[t] == AUTOGRAD]))
    by_step = np.bincount(bucket[seg] * len(KINDS) + kind, weights=lengths,
                          minlength=len(windows) * len(KINDS)).reshape(len(windows), len(KINDS))
    return Attribution(_by_kind(kind, lengths),
                       _rows(kind, who, (label, names), lengths, tids, roles), roles, by_step)


def _tid_key(tid: str) -> tuple[int, str]:
    return (int(tid), "") if tid.isdigit() else (1 << 62, tid)


def _thread_index(col: pd.Series, index: dict[str, int]) -> np.ndarray:
    """Each row's thread as its index in `index` (-1: another thread), once per category."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        table = np.array([index.get(str(c), -1) for c in col.dtype.categories] + [-1],
                         dtype=np.int64)
        return table[col.array.codes]
    return np.array([index.get(str(t), -1) for t in col.tolist()], dtype=np.int64)


# A mask over events (ts, end, thread index): those to keep.
_Keep = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _events(table: pd.DataFrame, index: dict[str, int], code: np.ndarray,
            keep: _Keep | None = None) -> _Events:
    if not len(table):
        return _no_events()
    k = _thread_index(table["tid"], index)
    ts, end = table["ts"].to_numpy(dtype=float), table["end"].to_numpy(dtype=float)
    mask = k >= 0
    if keep is not None:
        mask &= keep(ts, end, k)
    rows = np.flatnonzero(mask)
    return _Events(ts[rows], end[rows], k[rows], code[rows], rows, table["name"])


def _host_events(model: TraceModel, index: dict[str, int],
                 keep: _Keep | None = None) -> tuple[_Events, _Events, _Events]:
    """The process's ops (cpu_op and record_function ranges), runtime calls and Python
    functions, on the threads in `index`, coded (see _Events); only those `keep` keeps."""
    rt = model.runtime
    issuing = (name_flags(rt["name"], lambda n: regex_hit(ISSUING_CALL, n, anywhere=True))
               if len(rt) else np.zeros(0, dtype=bool))
    issued = _issued(rt, index, issuing)
    calls = _events(rt, index, issuing.astype(np.int64), keep)
    ops = model.ops
    is_cpu = (name_flags(ops["cat"], lambda c: c == "cpu_op") if len(ops)
              else np.zeros(0, dtype=bool))
    o = _events(ops, index, is_cpu.astype(np.int64), keep)
    o = _Events(o.ts, o.end, o.thread, o.code + (_launched(o, issued) & (o.code == 1)),
                o.pos, o.names)
    ev = model.trace.events
    fn = ev[column_isin(ev["cat"], ("python_function",))] if len(ev) else ev
    return o, calls, _events(fn, index, np.zeros(len(fn), dtype=np.int64), keep)


def _issued(rt: pd.DataFrame, index: dict[str, int],
            issuing: np.ndarray) -> dict[int, np.ndarray]:
    """Per thread of `index`, the sorted starts of its runtime calls that issue GPU work."""
    if not len(rt):
        return {}
    k = _thread_index(rt["tid"], index)[issuing]
    ts = rt["ts"].to_numpy(dtype=float)[issuing]
    return {t: np.sort(ts[k == t]) for t in np.unique(k[k >= 0]).tolist()}


def _launched(ops: _Events, issued_by: dict[int, np.ndarray]) -> np.ndarray:
    """Per op, whether its thread issued GPU work during it."""
    out = np.zeros(len(ops.ts), dtype=bool)
    for k in np.unique(ops.thread).tolist():
        issued = issued_by.get(k, np.empty(0))
        mine = ops.thread == k
        out[mine] = (np.searchsorted(issued, ops.end[mine], side="left")
                     > np.searchsorted(issued, ops.ts[mine], side="left"))
    return out


def _overlapping(hw: HostWaitGaps) -> _Keep:
    """A mask of the events that overlap some host-wait gap (the gaps are disjoint)."""
    order = np.argsort(hw.start, kind="stable")
    starts, ends = hw.start[order], hw.end[order]

    def keep(ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, end, side="left") - 1
        ok = i >= 0
        ok[ok] = ends[i[ok]] > ts[ok]
        return ok

    return keep


def _near(hw: HostWaitGaps):  # noqa: ANN202 - a filter over _Events
    """A filter keeping the events that overlap some host-wait gap."""
    overlaps = _overlapping(hw)
    return lambda ev: ev.subset(overlaps(ev.ts, ev.end, ev.thread))


def _cut(every: tuple[_Events, _Events, _Events],
         keep: _Keep) -> tuple[_Events, _Events, _Events]:
    ops, calls, py = (e.subset(keep(e.ts, e.end, e.thread)) for e in every)
    return ops, calls, py


def _wanted(hw: HostWaitGaps) -> _Keep:
    """A mask of the events a label can read: those overlapping a host-wait gap, and on each
    thread those that ended last at or before a gap began (all that `_after` names time in a
    gap by: a later one overlaps the gap)."""
    overlaps = _overlapping(hw)
    starts = np.sort(hw.start)

    def keep(ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
        out = overlaps(ts, end, thread)
        for k in np.unique(thread[thread >= 0]).tolist():
            mine = np.flatnonzero(thread == k)
            # Each event's first gap that begins at or after its end; the last end before gap
            # j is the greatest end of the events whose first such gap is j or an earlier one
            # (the gaps are few, the events many: no sort of the events).
            e = end[mine]
            first = np.searchsorted(starts, e, side="left")
            before = first < len(starts)
            if not before.any():
                continue
            latest = np.full(len(starts), -np.inf)
            np.maximum.at(latest, first[before], e[before])
            lasts = np.unique(np.maximum.accumulate(latest))
            lasts = lasts[lasts > -np.inf]
            out[mine] |= np.isin(e, lasts)
        return out

    return keep


def _holds(every: tuple[_Events, _Events, _Events], pin: list[int]) -> _Events:
    """Stretches in which the process recorded nothing (no cpu_op, runtime call or Python
    function on any thread) that begin right after a pin-memory thread's runtime call: held
    by that thread, named by that call."""
    if not pin:
        return _no_events()
    ops, calls, py = every
    cpu = ops.code >= 1
    ts = np.concatenate([ops.ts[cpu], calls.ts, py.ts])
    end = np.concatenate([ops.end[cpu], calls.end, py.end])
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], np.maximum.accumulate(end[order])
    quiet = np.flatnonzero(ts[1:] - end[:-1] >= PIN_SILENCE_MIN_US)
    s, e = end[quiet], ts[quiet + 1]
    mine = np.flatnonzero(np.isin(calls.thread, pin))
    mine = mine[np.argsort(calls.end[mine], kind="stable")]
    last = np.searchsorted(calls.end[mine], s, side="right") - 1
    held = (last >= 0) & (s - calls.end[mine][np.clip(last, 0, None)] <= PIN_HOLD_US)
    at = mine[last[held]]
    return _Events(s[held], e[held], calls.thread[at], np.zeros(len(at), dtype=np.int64),
                   calls.pos[at], calls.names)


def _graphed_spans(ops: _Events, calls: _Events) -> _Events:
    """Per CUDA graph launch, the outermost op around it on its thread (the compiled region,
    the backward node that replays the graph), or the launch call itself."""
    graph = name_mask(calls.names, GRAPH_LAUNCH, calls.pos) if len(calls.pos) else \
        np.zeros(0, dtype=bool)
    g = calls.subset(graph)
    ts, end = g.ts.copy(), g.end.copy()
    for k in np.unique(g.thread).tolist():
        mine = np.flatnonzero(g.thread == k)
        on = ops.thread == k
        _, outer = enclosing(ops.ts[on], ops.end[on], g.ts[mine], g.end[mine])
        found = outer >= 0
        ts[mine[found]] = ops.ts[on][outer[found]]
        end[mine[found]] = ops.end[on][outer[found]]
    return _Events(ts, end, g.thread, g.code, g.pos, g.names)


@dataclass(frozen=True)
class _State:
    """Per thread (rows) and segment (columns): what the thread was in."""

    call: np.ndarray  # a runtime call
    issue: np.ndarray  # a call that issues GPU work
    cpu: np.ndarray  # a cpu_op
    busy: np.ndarray  # a cpu_op that launched GPU work on this thread
    op: np.ndarray  # any op, record_function ranges included
    py: np.ndarray  # a Python function
    graphed: np.ndarray  # an op that launches a CUDA graph

    @classmethod
    def of(cls, tl: Timeline, seg: np.ndarray, n: int, ops: _Events, calls: _Events,
           py: _Events, spans: _Events) -> _State:
        def rows(ev: _Events, code: int | None = None, least: bool = False) -> np.ndarray:
            return np.array([tl.cover(*ev.on(k, code, least))[seg] for k in range(n)],
                            dtype=bool).reshape(n, len(seg))

        return cls(call=rows(calls), issue=rows(calls, 1), cpu=rows(ops, 1, least=True),
                   busy=rows(ops, 2), op=rows(ops), py=rows(py), graphed=rows(spans))


def _classify(state: _State, is_pin: np.ndarray, main: int, launcher: np.ndarray,
              pre: np.ndarray, waits: tuple[np.ndarray, np.ndarray, np.ndarray],
              ) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's kind (index into KINDS) and the thread it is charged to (module doc)."""
    loader, sync, held = waits
    at = np.arange(len(pre))
    c = launcher
    launching = state.issue | state.busy | (state.call & ~is_pin[:, None])
    pin_rows = np.flatnonzero(is_pin)
    pin_ran = (state.call | state.op)[pin_rows].any(axis=0) if len(pin_rows) else \
        np.zeros(len(pre), dtype=bool)
    bare = ~state.cpu[c, at] & ~state.call[c, at] & ~state.py[c, at]
    pin_first = int(pin_rows[0]) if len(pin_rows) else -1
    pin_who = np.full(len(pre), pin_first) if len(pin_rows) else c
    if len(pin_rows):  # the thread the pin-memory thread was running on (first, else held)
        ran = (state.call | state.op)[pin_rows]
        pin_who = np.where(ran.any(axis=0), pin_rows[np.argmax(ran, axis=0)], pin_first)
    conds = [loader, sync & ~loader, ~pre, launching[c, at], launching.any(axis=0),
             held | (pin_ran & bare), state.cpu[c, at], state.py[c, at], state.op[c, at]]
    kinds = ["dataloader", "sync", "launch", "launch", "launch", "pin-memory", "cpu-work",
             "python", "cpu-work"]
    # Constant choices as scalars, which np.select broadcasts: no array per choice.
    whos = [np.int64(main), np.int64(main), c, c, np.argmax(launching, axis=0), pin_who, c, c,
            c]
    kind = np.select(conds, [np.int64(_K[k]) for k in kinds], np.int64(_K["untraced"]))
    return kind, np.select(conds, whos, c)


def _gate(kind: np.ndarray, who: np.ndarray, launcher: np.ndarray, gap: np.ndarray,
          lengths: np.ndarray, ngaps: int) -> tuple[np.ndarray, np.ndarray]:
    """Host time that is not launching, in a gap holding less than CPU_WORK_MIN_GAP_US of it:
    the Python between two launching ops, counted as launch work of the gap's launcher."""
    other = np.isin(kind, [_K[k] for k in NOT_LAUNCH])
    per_gap = np.bincount(gap[other], weights=lengths[other], minlength=ngaps)
    small = other & (per_gap[gap] < CPU_WORK_MIN_GAP_US)
    return np.where(small, _K["launch"], kind), np.where(small, launcher, who)


class _Names:
    """Labels as codes into one list of names, each distinct name made once (a trace has
    many segments and few names)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self._code: dict[str, int] = {}

    def code(self, name: str) -> int:
        name = _fold(name)
        if name not in self._code:
            self._code[name] = len(self.text)
            self.text.append(name)
        return self._code[name]

    def of(self, ev: _Events, at: np.ndarray, wrap: str = "{}") -> np.ndarray:
        """The codes of the names of `ev`'s events at positions `at`, each put in `wrap`."""
        col, rows = ev.names, ev.pos[at]
        if isinstance(col.dtype, pd.CategoricalDtype):
            raw, cats = col.array.codes[rows], col.dtype.categories
        else:
            raw, cats = pd.factorize(col.to_numpy()[rows])
        used, inverse = np.unique(raw, return_inverse=True)
        table = np.array([self.code(wrap.format(_fold(str(cats[c]) if c >= 0 else "")))
                          for c in used.tolist()], dtype=np.int64)
        return table[inverse] if len(used) else np.zeros(0, dtype=np.int64)


def _labels(starts: np.ndarray, ends: np.ndarray, kind: np.ndarray, who: np.ndarray,
            near: tuple[_Events, _Events, _Events], every: tuple[_Events, _Events, _Events],
            holds: _Events, main: _Main) -> tuple[np.ndarray, list[str]]:
    """Each segment's op, as a code into the names returned: the outermost op of its thread
    around it (a runtime call outside any), the innermost Python function, the pin-memory
    calls that held it, what the thread last did before time it recorded nothing in, or
    words."""
    ops, calls, py = near
    names = _Names()
    label = np.full(len(kind), names.code(UNTRACED), dtype=np.int64)
    label[kind == _K["dataloader"]] = names.code("DataLoader __next__ (waiting for a batch)")
    label[kind == _K["sync"]] = names.code("waiting on the GPU (a sync or a blocking copy)")
    named = np.isin(kind, [_K["launch"], _K["graphed"], _K["cpu-work"]])
    label[named] = names.code(BETWEEN)
    pin = kind == _K["pin-memory"]
    for k in np.unique(who).tolist():
        mine = who == k
        _name_by(label, names, mine & (named | pin), (starts, ends), calls, k, outer=True)
        _name_by(label, names, mine & (named | pin), (starts, ends), ops, k, outer=True)
        _name_by(label, names, mine & (kind == _K["python"]), (starts, ends), py, k,
                 outer=False)
        _after(label, names, mine & (kind == _K["untraced"]), starts, every, k, main)
    h = np.searchsorted(holds.ts, starts[pin], side="right") - 1
    inside = (h >= 0) & (starts[pin] < holds.end[np.clip(h, 0, None)])
    label[np.flatnonzero(pin)[inside]] = names.of(holds, h[inside])
    if pin.any():  # one row for the pin-memory thread: its calls, by name
        label[pin] = names.code("/".join(sorted({names.text[c] for c in label[pin].tolist()})))
    return label, names.text


def _name_by(label: np.ndarray, names: _Names, rows: np.ndarray,
             segments: tuple[np.ndarray, np.ndarray], ev: _Events, k: int,
             outer: bool) -> None:
    """Write the name of thread k's event (outermost or innermost) around each row's segment,
    where there is one."""
    at = np.flatnonzero(rows)
    mine = np.flatnonzero(ev.thread == k)
    if not len(at) or not len(mine):
        return
    starts, ends = segments
    inner, out = enclosing(ev.ts[mine], ev.end[mine], starts[at], ends[at])
    pick = out if outer else inner
    found = pick >= 0
    label[at[found]] = names.of(ev, mine[pick[found]])


def _after(label: np.ndarray, names: _Names, rows: np.ndarray, starts: np.ndarray,
           every: tuple[_Events, _Events, _Events], k: int, main: _Main) -> None:
    """Name time thread k recorded nothing in by what it recorded last before it (the
    outermost of the ops and calls that ended last). The stepping thread's DataLoader
    fetches count, and so does the autograd engine's work: the stepping thread waits in
    `loss.backward()` until the backward ends."""
    at = np.flatnonzero(rows)
    if not len(at):
        return
    ops, calls, _ = every
    threads = [k, *main.autograd] if k == main.thread else [k]
    picked = [(e, np.flatnonzero(np.isin(e.thread, threads))) for e in (ops, calls)]
    parts = [(e.ts[m], e.end[m], np.full(len(m), i), m) for i, (e, m) in enumerate(picked)]
    if k == main.thread:
        l_ts, l_end = main.loader
        parts.append((l_ts, l_end, np.full(len(l_ts), 2), np.arange(len(l_ts))))
    ts, end, src, row = (np.concatenate(c) for c in zip(*parts, strict=True))
    order = np.lexsort((-ts, end))  # by end; among equal ends the outermost last
    last = np.searchsorted(end[order], starts[at], side="right") - 1
    found = last >= 0
    ev, at = order[last[found]], at[found]
    wrap = "(no recorded op, after {})"
    for i, (e, _) in enumerate(picked):
        mine = src[ev] == i
        own = mine.copy()
        own[mine] = e.thread[row[ev[mine]]] == k
        label[at[own]] = names.of(e, row[ev[own]], wrap)
        label[at[mine & ~own]] = names.code(wrap.format("the backward (autograd engine)"))
    label[at[src[ev] == 2]] = names.code(wrap.format("DataLoader __next__"))


@dataclass(frozen=True)
class _Main:
    """The stepping thread's index, its DataLoader fetches, the autograd engine's threads."""

    thread: int
    loader: tuple[np.ndarray, np.ndarray]
    autograd: list[int]


def _fold(name: str) -> str:
    """The autograd engine's per-node ranges as one row."""
    return _AUTOGRAD_ROW if AUTOGRAD_OP.match(name) else name


def _by_kind(kind: np.ndarray, lengths: np.ndarray) -> dict[str, float]:
    sums = np.bincount(kind, weights=lengths, minlength=len(KINDS))
    return {k: float(sums[i]) for i, k in enumerate(KINDS)}


def _rows(kind: np.ndarray, who: np.ndarray, labels: tuple[np.ndarray, list[str]],
          lengths: np.ndarray, tids: list[str], roles: dict[str, str]) -> tuple[ThreadShare, ...]:
    """The (kind, thread, op) groups with their summed time, largest first."""
    code, names = labels
    key = (kind * len(tids) + who) * max(len(names), 1) + code
    group, keys = pd.factorize(key)
    sums = np.bincount(group, weights=lengths)
    out = []
    for key_, us in zip(keys.tolist(), sums.tolist(), strict=True):
        rest, name = divmod(key_, max(len(names), 1))
        k, w = divmod(rest, len(tids))
        out.append(ThreadShare(roles[tids[w]], tids[w], names[name], KINDS[k], us))
    return tuple(sorted(out, key=lambda r: (-r.us, r.kind, r.thread, r.tid, r.op)))
