"""Steady-state windows: which spans of a trace are the steps the user repeats.

Steps come from `ProfilerStep#N` when the trace has them. Without them (older
`torch.autograd.profiler` / `emit_nvtx` recordings, a script that profiles itself without a
schedule, inference loops) the iterations are cut at the iteration markers torch writes on the
busiest host thread, in this order: `Optimizer.step#...`, DataLoader `__next__`,
`Optimizer.zero_grad#...`. Only without them does a repeating user annotation, else the
shallowest op that repeats regularly, stand in; and a cut that the markers show to be shorter than
the iteration (a per-sample op repeating inside it) is refused rather than judged. Only when
nothing repeats is the whole trace one window.

One-off costs are not steps: start-up (CUDA context creation, cuDNN/cuBLAS initialisation, module
loading: runtime calls that take tens of milliseconds without waiting for the GPU) is set aside
and reported as start-up, and a first step far longer than the others (autotuning, compilation)
or whose GPU timeline is still busy with work launched before the recording is left out of the
verdict. See docs/metrics.md "Steps".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stallscope.trace.names import name_matches
from stallscope.units import fixed_size, ms, percent

OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
LOADER_NEXT = re.compile(r"^enumerate\((?:DataLoader|DataPipe)\)#.*__next__$")
ZERO_GRAD = re.compile(r"^Optimizer\.zero_grad#")
# Markers torch writes once per iteration, in order of preference, and whether a marker opens its
# iteration (windows run from one start to the next) or closes it (from one end to the next).
# The optimizer step comes first: under gradient accumulation one iteration draws several
# batches, and it is the step the user repeats.
KNOWN_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (OPTIMIZER_STEP, "closes"),
    (LOADER_NEXT, "opens"),
    (ZERO_GRAD, "opens"),
)
# When both the optimizer step and the loader's `__next__` repeat and the step occurs this many
# times as often or more, several optimizers step per batch (a GAN's generator and
# discriminator): the batch is the iteration. Between 1 and 1.5 the counts differ by the loop's
# last `__next__` (StopIteration) or a partial iteration at an edge of the recording.
STEPS_PER_BATCH = 1.5
MARKER_CATS = ("cpu_op", "user_annotation")
# A marker must occur at least this often (giving two iterations) to infer iterations from it.
MIN_MARKERS = 3
# Regular: at least this share of the intervals between markers within PERIOD_TOLERANCE of
# their median. The first interval may carry one-off work, and an op that runs twice per
# iteration alternates short and long intervals, which this rejects.
REGULAR_SHARE = 0.75
PERIOD_TOLERANCE = 0.30
# An inferred step shorter than this (us) while the iteration markers show longer iterations is
# a piece of an iteration (a per-sample op of the loader or the collate), not a step: refused.
# "A few milliseconds": an assumption, not a measurement; the shortest real iterations the
# project holds are 1.5 ms (hta/gp100_gpu_user_annotation, cut at its markers, not by this).
MIN_INFERRED_STEP_US = 5_000.0
# ... and the markers must show iterations at least this many times as long as the inferred step.
SUB_ITERATION_FACTOR = 2.0
# A host runtime call this long (us) that is not waiting for the GPU (sync, copy, event wait) is
# initialisation: context creation, library handles, module loading, first allocations. A
# steady-state launch or allocation takes microseconds to a few milliseconds.
STARTUP_CALL_US = 50_000.0
WAIT_CALL = re.compile(
    r"^(?:cuda|cu|hip)(?:Memcpy|Memset|.*Synchronize|StreamWaitEvent|EventQuery)")
# A copy size (bytes, host<->device) seen this many times or more is repeated work (a batch, a
# request, a metric read each iteration), not a one-off upload of weights or constants.
MIN_COPY_REPEATS = 3
# A first step this many times the median of the others is a one-off (autotuning, compilation,
# caches filling), not a step the user repeats. Only the first step: a long step later (an
# epoch boundary re-spawning workers) is a cost the user pays again, and rules judge it.
OUTLIER_FACTOR = 2.0
# A first step whose GPU is busy this share of its time with work launched before it straddles
# the recording's start: its GPU timeline belongs partly to an unrecorded step.
PRE_WINDOW_SHARE = 0.10
# Outliers are only set aside when at least this many steps were recorded.
MIN_STEPS_FOR_OUTLIERS = 3


@dataclass
class Iterations:
    """Inferred iteration windows and the marker they came from."""

    windows: np.ndarray
    names: list[str]
    marker: str
    period_us: float
    # How the windows were cut, for the note: "marker" (an iteration marker), "annotation" (a
    # repeating user annotation) or "op" (the shallowest op that repeats regularly).
    kind: str = "marker"
    # Why these windows are pieces of iterations, not steps (then nothing may be judged).
    refused: str | None = None
    # Said after the note: how the first window was opened, when not by the marker itself.
    detail: str = ""


@dataclass
class Startup:
    """One-off start-up set aside before the steady-state window."""

    start_us: float
    end_us: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    what: str = ""
    # The host-to-device copies made before the window of a one-window trace (startup_copies).
    uploads: dict[str, Any] | None = None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict[str, Any]:
        out = {"start_us": round(self.start_us, 3), "end_us": round(self.end_us, 3),
               "duration_us": round(self.duration_us, 3), "what": self.what,
               "calls": self.calls}
        if self.uploads is not None:
            out["uploads"] = self.uploads
        return out


def thread_depth(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Nesting depth of each range of one thread (0: top level), in the input order."""
    order = np.lexsort((-ends, starts))
    s = starts[order]
    depth_sorted = np.arange(len(s)) - np.searchsorted(np.sort(ends), s, side="right")
    depth = np.empty(len(s), dtype=np.int64)
    depth[order] = depth_sorted
    return depth


def infer_iterations(host: pd.DataFrame) -> Iterations | None:
    """Iterations of the stepping thread (`host`: its events): cut at its iteration markers,
    else at a repeating user annotation, else at the shallowest op that repeats regularly; None
    when nothing repeats. A cut that the markers show to be a piece of an iteration comes back
    with `refused` set: judging it would diagnose a per-sample op as a step."""
    ranges = host[host["cat"].isin(MARKER_CATS)].sort_values("ts", kind="stable")
    if len(ranges) < MIN_MARKERS:
        return None
    markers = _markers(ranges)
    marked = _from_markers(markers)
    if marked is not None:
        return marked
    names = ranges["name"].astype(str)
    counts = names.value_counts()
    repeated = ranges[names.isin(counts.index[counts >= MIN_MARKERS]).to_numpy()]
    if repeated.empty:
        return None
    found = _from_repeats(ranges, _outermost(repeated))
    if found is not None:
        found.refused = _piece_of_iteration(found, markers, ranges)
        if found.refused and len(markers[0][2]) == 1:
            # One iteration marker: the trace holds one iteration (a profiler opened around
            # each step), which is the window to judge, as a whole.
            return None
    return found


def _markers(ranges: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(name, opens|closes, outermost ranges) of each iteration marker on the thread, in order
    of preference; per marker the name that occurs most (two optimizer classes: either)."""
    out = []
    text: pd.Series | None = None
    for pattern, kind in KNOWN_MARKERS:
        hit = name_matches(ranges["name"], pattern).to_numpy()
        if not hit.any():
            continue
        text = ranges["name"].astype(str) if text is None else text
        counts = text[hit].value_counts(sort=False)
        name = str(counts.index[int(np.argmax(counts.to_numpy()))])
        out.append((name, kind, _outermost(ranges[(text == name).to_numpy()])))
    return out


def _from_markers(markers: list[tuple[str, str, pd.DataFrame]]) -> Iterations | None:
    """Windows cut at the preferred marker that occurs at least MIN_MARKERS times. Markers
    need not be regular: iterations of bucketed sequence lengths or of a slow first batch vary,
    and the marker still bounds each one."""
    usable = [m for m in markers if len(m[2]) >= MIN_MARKERS]
    if not usable:
        return None
    name, kind, marks = usable[0]
    loader = next((m for m in markers if LOADER_NEXT.match(m[0])), None)
    if (OPTIMIZER_STEP.match(name) and loader is not None and len(loader[2]) >= MIN_MARKERS
            and len(marks) >= STEPS_PER_BATCH * len(loader[2])):
        name, kind, marks = loader  # several optimizer steps per batch: the batch iterates
    edges = np.unique((marks["ts"] if kind == "opens" else marks["end"]).to_numpy(dtype=float))
    detail = ""
    if kind == "closes" and loader is not None and len(edges):
        # The loop's first iteration starts at its first batch, before any step closed one.
        first = loader[2]["ts"].to_numpy(dtype=float)
        first = first[first < edges[0]]
        if len(first):
            edges = np.insert(edges, 0, float(first.min()))
            detail = f" (the first opens at the first '{loader[0]}')"
    if len(edges) < 2:
        return None
    gaps = np.diff(edges)
    windows = np.column_stack([edges[:-1], edges[1:]])
    labels = [f"iteration {i}" for i in range(len(windows))]
    return Iterations(windows, labels, name, float(np.median(gaps)), "marker", None, detail)


def _from_repeats(ranges: pd.DataFrame, repeated: pd.DataFrame) -> Iterations | None:
    """Without markers: a repeating user annotation, else the op that repeats regularly."""
    all_depth = thread_depth(ranges["ts"].to_numpy(), ranges["end"].to_numpy())
    depth = pd.Series(all_depth, index=ranges.index).loc[repeated.index].to_numpy()
    names = repeated["name"].astype(str)
    notes = repeated["cat"].isin(("user_annotation",)).to_numpy()
    # A user annotation is the user's own unit of work: the shallowest, and of those the one
    # that repeats least (3 or more times), is the coarsest unit the loop repeats; a per-sample
    # annotation repeats more often. Its iterations may vary (bucketed lengths), so no
    # regularity is asked of it.
    for name in _ranked(repeated[notes], names[notes], depth[notes], fewest=True):
        it = _regular(repeated[(names == name).to_numpy()], name, "opens", regular=False)
        if it is not None:
            it.kind = "annotation"
            return it
    # Any op: the shallowest that repeats regularly (ties: the most occurrences, the earliest).
    for name in _ranked(repeated, names, depth, fewest=False):
        it = _regular(repeated[(names == name).to_numpy()], name, "opens")
        if it is not None:
            it.kind = "op"
            return it
    return None


def _ranked(ranges: pd.DataFrame, names: pd.Series, depth: np.ndarray, fewest: bool
            ) -> list[str]:
    """Names repeated MIN_MARKERS times or more, the shallowest first, then by count (fewest
    or most first), then the earliest."""
    if ranges.empty:
        return []
    table = ranges.assign(depth=depth).groupby(names, observed=True).agg(
        n=("ts", "size"), depth=("depth", "min"), first=("ts", "min"))
    table = table[table["n"] >= MIN_MARKERS].sort_values(
        ["depth", "n", "first"], ascending=[True, fewest, True])
    return [str(n) for n in table.index]


def _piece_of_iteration(it: Iterations, markers: list[tuple[str, str, pd.DataFrame]],
                        ranges: pd.DataFrame) -> str | None:
    """Why `it` cuts inside iterations, when its period is a few milliseconds or less and the
    iteration markers there are (too few to cut at) show iterations at least twice as long."""
    if it.period_us >= MIN_INFERRED_STEP_US or not markers:
        return None
    name, kind, marks = markers[0]
    edges = np.unique((marks["ts"] if kind == "opens" else marks["end"]).to_numpy(dtype=float))
    if len(edges) >= 2:
        iteration = float(np.median(np.diff(edges)))
        how = f"its {len(marks)} '{name}' ranges are {ms(iteration, 'tenths')} ms apart"
    else:
        # One marker, once per iteration: the thread's span holds its iteration and less than
        # one more on either side, so an iteration is longer than a third of the span.
        span = float(ranges["end"].max() - ranges["ts"].min())
        iteration = span / 3
        how = (f"its one '{name}' range marks iterations longer than {ms(iteration, 'tenths')} ms "
               f"(a third of the thread's {ms(span, 'tenths')} ms)")
    if iteration < SUB_ITERATION_FACTOR * it.period_us:
        return None
    return (f"what repeats most regularly, '{it.marker}', does so every "
            f"{ms(it.period_us, 'hundredths')} ms, a piece of an iteration: {how}")


def _outermost(ranges: pd.DataFrame) -> pd.DataFrame:
    """Drop ranges nested inside an earlier range of the same name (a wrapper and its inner
    call, both named `forward`): one marker per iteration."""
    key = ranges["name"].astype(str)
    prev_end = ranges.groupby(key, observed=True)["end"].transform(
        lambda e: e.cummax().shift(fill_value=-np.inf))
    return ranges[ranges["ts"].to_numpy() >= prev_end.to_numpy()]


def _regular(marks: pd.DataFrame, name: str, kind: str, regular: bool = True
             ) -> Iterations | None:
    """Windows between consecutive markers, when their period is regular (or `regular` is
    False: any period)."""
    if len(marks) < MIN_MARKERS:
        return None
    edges = (marks["ts"] if kind == "opens" else marks["end"]).to_numpy(dtype=float)
    edges = np.unique(edges)
    if len(edges) < MIN_MARKERS:
        return None
    gaps = np.diff(edges)
    period = float(np.median(gaps))
    if period <= 0:
        return None
    near = np.abs(gaps - period) <= PERIOD_TOLERANCE * period
    if regular and near.mean() < REGULAR_SHARE:
        return None
    windows = np.column_stack([edges[:-1], edges[1:]])
    labels = [f"iteration {i}" for i in range(len(windows))]
    return Iterations(windows, labels, name, period)


def startup_calls(runtime: pd.DataFrame, before_us: float | None = None) -> pd.DataFrame:
    """Runtime calls of the training process long enough to be initialisation (not waits), in
    time order; only those starting before `before_us` when given."""
    long = runtime[runtime["dur"] >= STARTUP_CALL_US]
    if long.empty:
        return long
    waits = long["name"].astype(str).str.match(WAIT_CALL.pattern)
    long = long[~waits.to_numpy()]
    if before_us is not None:
        long = long[long["ts"] < before_us]
    return long.sort_values("ts", kind="stable")


def describe_startup(calls: pd.DataFrame, first_call_ts: float, gap_us: float) -> tuple[
        list[dict[str, Any]], str]:
    """The start-up calls as report rows, and one phrase saying what they were."""
    rows: list[dict[str, Any]] = []
    parts: list[str] = []
    r: Any  # a row: its fields' types are the columns', known only when it runs
    for r in calls.itertuples():
        op = str(getattr(r, "top_op", "") or "")
        inner = str(getattr(r, "op", "") or "")
        kind = _startup_kind(str(r.name), inner or op, float(r.ts) <= first_call_ts)
        rows.append({"call": str(r.name), "ts_us": round(float(r.ts), 3),
                     "dur_us": round(float(r.dur), 3), "op": inner or op, "kind": kind})
    by_kind: dict[str, float] = {}
    for row in rows:
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0.0) + row["dur_us"]
    parts = [f"{k} ({v / 1e6:.2f} s)" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    if gap_us > 0:
        parts.append(f"{gap_us / 1e6:.2f} s before the first GPU work")
    return rows, "; ".join(parts)


def _startup_kind(call: str, op: str, first: bool) -> str:
    if first:
        return "CUDA context creation (the first CUDA call)"
    low = op.lower()
    if "cudnn" in low or "conv" in low:
        return "cuDNN initialisation and autotuning"
    if any(k in low for k in ("mm", "linear", "matmul", "cublas")):
        return "cuBLAS initialisation"
    if "Malloc" in call or "Free" in call:
        return "first device allocations"
    return "CUDA library and module loading"


def _recurring(copies: pd.DataFrame) -> np.ndarray:
    """Which host<->device copies are of a size the trace copies MIN_COPY_REPEATS times or
    more (per direction)."""
    key = copies["direction"].astype(str) + ":" + copies["bytes"].astype(str)
    counts = key.map(key.value_counts())
    host_device = copies["direction"].isin(("HtoD", "DtoH")).to_numpy()
    return host_device & (counts.to_numpy() >= MIN_COPY_REPEATS)


def repeats_under_way(copies: pd.DataFrame) -> float:
    """When the repeated work of a one-window trace is under way: the second copy of a size
    that recurs (the first may come before the first iteration's one-off set-up, as a batch
    copied before cuDNN autotunes the first forward); inf when no size recurs. A long call made
    later is a cost of that work (an allocation, a cache clear), not start-up."""
    if copies.empty:
        return np.inf
    rows = copies[_recurring(copies)]
    if rows.empty:
        return np.inf
    key = rows["direction"].astype(str) + ":" + rows["bytes"].astype(str)
    second = rows["ts"].groupby(key.to_numpy()).nsmallest(2).groupby(level=0).max()
    return float(second.min())


def startup_copies(copies: pd.DataFrame, start_us: float) -> tuple[str, dict[str, Any] | None]:
    """The host-to-device copies made before a one-window trace's judged window, as a phrase
    for the start-up and as evidence (bytes, rate, largest): one-off uploads (model weights,
    constants: no size recurs) are start-up; a copy of a size the trace copies again is the
    repeated work's, said as such and not called an upload."""
    before = copies[(copies["ts"] < start_us).to_numpy()
                    & (copies["direction"] == "HtoD").to_numpy()]
    if before.empty:
        return "", None
    again = _recurring(copies)[(copies["ts"] < start_us).to_numpy()
                               & (copies["direction"] == "HtoD").to_numpy()]
    once = before[~again]
    phrase = ""
    uploads = None
    if not once.empty:
        moved, took = float(once["bytes"].sum()), float(once["dur_gpu"].sum())
        big = once.loc[once["bytes"].idxmax()]
        pageable = bool((once["src"] == "Pageable").all())
        uploads = {
            "copies": len(once), "bytes": int(moved), "gpu_ms": round(took / 1000, 3),
            "achieved_gbps": round(moved / took / 1e3, 2) if took > 0 else None,
            "source": "Pageable" if pageable else "/".join(sorted(set(once["src"]))),
            "largest_bytes": int(big["bytes"]),
            "largest_gbps": (round(float(big["bytes"]) / float(big["dur_gpu"]) / 1e3, 2)
                             if big["dur_gpu"] > 0 else None),
            "ops": sorted({str(o) for o in once["top_op"] if isinstance(o, str) and o}),
        }
        rate = f" at {moved / took / 1e3:.1f} GB/s" if took > 0 else ""
        phrase = (f"; {len(once)} host-to-device copies{' from pageable memory' * pageable} "
                  f"({fixed_size(moved, 'MB', 0)}{rate}, {ms(took, 'tenths')} ms on the GPU), "
                  "one-off uploads: no size recurs")
    if again.any():
        phrase += (f"; {int(again.sum())} earlier copies of sizes the trace copies again (the "
                   "repeated work's first, judged where they recur)")
    return phrase, uploads


def judged_window_note(start_us: float, end_us: float, origin_us: float, after_startup: bool,
                       held: list[str]) -> str:
    """Which part of a one-window trace was judged, and the annotations it holds."""
    lo, hi = start_us - origin_us, end_us - origin_us
    where = (f"{lo / 1e6:.2f}-{hi / 1e6:.2f} s" if hi >= 1e6
             else f"{ms(lo, 'tenths')}-{ms(hi, 'tenths')} ms")
    what = "from the end of start-up to the end of the trace" if after_startup else "all of it"
    holds = f", holding {', '.join(held)}" if held else ""
    return (f"Judged window: {where} of the trace ({ms((end_us - start_us), 'tenths')} ms, "
            f"{what}){holds}.")


def first_step_outlier(durations: np.ndarray, pre_busy_us: float) -> str | None:
    """Why the first step is left out of the verdict, or None to keep it."""
    n = len(durations)
    if n < MIN_STEPS_FOR_OUTLIERS:
        return None
    rest = float(np.median(durations[1:]))
    first = float(durations[0])
    if rest > 0 and first > OUTLIER_FACTOR * rest:
        return (f"it took {ms(first, 'tenths')} ms, {first / rest:.1f}x the median of the other "
                f"steps ({ms(rest, 'tenths')} ms): one-off first-iteration work (autotuning, "
                "compilation, caches and allocator filling) that later steps do not repeat")
    if first > 0 and pre_busy_us >= PRE_WINDOW_SHARE * first:
        return (f"its GPU spent {ms(pre_busy_us, 'tenths')} ms "
                f"({percent(100 * pre_busy_us / first, 0)} of the step) on work launched before "
                "the recording began: its GPU timeline straddles the window's start")
    return None
