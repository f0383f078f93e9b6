"""The fix plan: every finding's change replayed, then applied greedily, each on top of the ones
before, with the step time predicted after each. Findings are then ranked by what they save in
that plan, so the report's first line is the fix that helps most, with the number a user will
measure after it.

Steps: the first recorded step carries GPU work queued before the recording (the replay keeps
it where it was), so with three or more steps the predictions are medians over the others, and
the measured step they are compared with is the median of the same steps.

Intervals: each prediction is a median with a range. The range runs from the first to the third
quartile of the replayed steps used (the recorded steps' own spread, carried through the
change; not the extremes, which one slow step of a worker round sets), widened by MODEL_ERROR
(the replay's error against plain after-timings, measured), and never below the GPU work the
scenario keeps. The greedy still picks each round's change by its median: ranking by the ranges'
middles penalises a change whose steps scatter, and on a recorded pair that put the change
measured to save less first (docs/replay.md, "Ranges"). Where two medians sit inside each
other's range, their order is within the noise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stallscope.diagnose.common import MAX_REPLAY_STEPS, judged_steps, replay_window
from stallscope.diagnose.finding import Assessment, Finding, severity_for
from stallscope.diagnose.fixes import Change, apply
from stallscope.diagnose.registry import ALL_RULES, changes_for, flagged, no_change_reason
from stallscope.replay.engine import Replay, ReplayOrderError, replay
from stallscope.replay.graph import CALL, FILL, Graph, build_graph
from stallscope.replay.loader import (
    LoaderFacts,
    NotModelled,
    Rounds,
    pace_note,
    paced,
    workers_pace,
)
from stallscope.replay.models.common import (
    ONE_THREAD,
    ONE_THREAD_WHY,
    Context,
    h2d_bytes_per_step,
)
from stallscope.replay.threads import MAX_SCALE_PER_THREAD, MIN_SCALE, OneThread, scales
from stallscope.replay.unload import OtherWait, barrier_note, unload
from stallscope.replay.unprofile import ProfilerCost, from_run, op_counts, unprofile
from stallscope.text import plural
from stallscope.trace.intervals import Timeline
from stallscope.trace.model import TraceModel
from stallscope.units import ms, percent

# The replay's error against the plain, unprofiled after-timing of the same change, measured on
# recorded before/after pairs (benchmarks/bench_gpu_pairs.py; the figures are in docs/replay.md,
# "Ranges"): every predicted range is widened by it on both sides.
MODEL_ERROR = 0.15
# A change that saves less than this share of the step on top of the plan ends it.
MIN_GAIN_PCT = 0.5
# The workers' pace holds the step without the profiler's cost back when it adds at least this
# share of it (less is the replay's own jitter, not a loader that cannot keep up).
PACE_MIN_SHARE = 0.005
# Unreplayed bounds the floor does not cap, and why: changes that remove or overlap GPU work
# the floor counts (collectives, DataParallel's peer copies and broadcasts), and a saving per
# epoch that lives in the re-spawn steps the median step leaves out.
# Each rule declares its reason (RuleSpec.not_capped).
NOT_CAPPED = {spec.id: spec.not_capped for spec in ALL_RULES if spec.not_capped}
# Bounds on a base of their own: a cost paid once an epoch, in steps the median step (the
# plan's base) leaves out, is a share of the run's time over an epoch (the rule says so), not
# of a step that does not hold it. They neither take nor are capped by the step's room.
PER_EPOCH = frozenset(spec.id for spec in ALL_RULES if spec.per_epoch)
# Findings whose change is the loader's own (more or other workers): the workers' pace does not
# bound them.
LOADER_RULES = frozenset(spec.id for spec in ALL_RULES if spec.loader_pace)
# --what-if keys that change the loader's own pace (its workers, the threads they share cores
# with): the workers' pace does not bound them, their replay models it.
LOADER_KEYS = frozenset({"num_workers", "torch_threads"})
_FLOOR_WORDS = {"gpu": "the busiest GPU's work once the plan's changes are made",
                "host": "the stepping thread's own work once the plan's changes are made"}


@dataclass
class PlanEntry:
    id: str  # the finding whose change this is
    change: str  # "num_workers=4", "pin_memory=true + non_blocking=true"
    predicted_step_us: float  # after this change and every one before it
    # Its share of the plan's saving, of the baseline step (`_by_share`): what it adds averaged
    # over every order of making the plan's changes; the plan's order. The shares add up to the
    # baseline less the plan's end state.
    saving_pct: float
    assumptions: list[str] = field(default_factory=list)
    # [low, high] around predicted_step_us: the replayed steps' spread and MODEL_ERROR.
    predicted_range_us: list[float] = field(default_factory=list)


@dataclass
class Scenario:
    """The recorded graph with some changes made, its replay, and what that replay predicts."""

    graph: Graph
    replay: Replay
    step_us: float  # median replayed step over the steps used
    notes: list[str]  # the assumptions of its changes
    spread: tuple[float, float] = (0.0, 0.0)  # the replayed steps' quartiles (25%, 75%)


@dataclass
class Plan:
    trace: str
    measured_step_us: float  # median of the steps used, as recorded (under the profiler)
    replayed_step_us: float  # the unchanged graph replayed, over the same steps
    floor_us: float  # the busiest GPU's work per step once every change is made (host, if none)
    steps_used: list[str]
    floor_kind: str  # "gpu": the busiest GPU's remaining work; "host": the stepping thread's
    # The step the fixes start from: the measured one less other load and the
    # profiler's own cost on the host (replay/unload.py, replay/unprofile.py), as the replay of
    # the graph without them says, and for workers that lag at their pace (replay/loader.py
    # Rounds); `load`, `profiler` and `rounds` say how.
    baseline_step_us: float = 0.0
    profiler: dict[str, Any] = field(default_factory=dict)
    # Other tenants' share of the host's run-queue wait, taken out before the profiler's cost
    # (replay/unload.py); {} when the trace has no scheduler figures.
    load: dict[str, Any] = field(default_factory=dict)
    # The loader's workers' pace where it holds the baseline: a loader whose workers lag,
    # waited for once a round (replay/loader.py Rounds), or one the step without the profiler's
    # cost would outrun (`workers_pace`; no waited_steps). The steps replayed at that pace, and
    # what it adds to the median step (added_us, negative where the median step waited more
    # than the pace); {} otherwise.
    rounds: dict[str, Any] = field(default_factory=dict)
    # Why some recorded steps are not in the medians, or None when all are.
    steps_note: str | None = None
    min_gain_pct: float = MIN_GAIN_PCT
    model_error_pct: float = 100 * MODEL_ERROR
    entries: list[PlanEntry] = field(default_factory=list)
    not_replayed: dict[str, str] = field(default_factory=dict)  # finding id -> why
    what_if: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(model: TraceModel, assessments: list[Assessment],
              what_if: list[Change] | None = None) -> Plan | None:
    """Replay the findings' changes (and `what_if`) on `model`; updates the findings' savings,
    severities and predicted step times in place. None when the trace has no step to replay,
    or when its recorded dependencies cannot be replayed (said in the model's notes)."""
    try:
        return _make_plan(model, assessments, what_if)
    except ReplayOrderError:
        model.notes.append(
            "The recorded step cannot be replayed: its dependencies form a cycle (two events "
            "share a correlation id, or a launch is recorded after the wait for its work), "
            "which only a damaged or edited trace shows. The findings' savings are the rules' "
            "own estimates, without a replay's prediction.")
        return None


def _make_plan(model: TraceModel, assessments: list[Assessment],
               what_if: list[Change] | None) -> Plan | None:
    window = replay_window(len(model.steps))
    graph = build_graph(model, window)
    if graph is None or graph.steps == 0:
        return None
    steps = model.steps[window]
    recorded = np.array([s.duration_us for s in steps])
    skip = judged_steps(len(model.steps)).start - window.start  # the first, of 3 or more
    used = slice(skip, None) if skip else slice(None)
    base = replay(graph)
    cost = ProfilerCost.of(model)
    counts = op_counts(graph, model)
    # Other tenants' wait first: it stretched the profiler's bookkeeping as much as the work,
    # and the cost per op is the quiet machine's (measured in thread CPU time).
    others = OtherWait.of(model)
    note = barrier_note(model, others)
    if note is not None and note not in model.notes:
        model.notes.append(note)
    unloaded = base
    keep = 1.0
    if others is not None and others.others_share > 0:
        keep = 1.0 - others.others_share
        graph = unload(graph, others.others_share)
        unloaded = replay(graph)
    cost = from_run(model, cost, _median(unloaded, used), float(counts.sum()) / graph.steps,
                    keep)
    graph = unprofile(graph, counts, cost.op_us)
    unprofiled = replay(graph)
    measured = float(np.median(recorded[used]))
    steady, filled = _steady(recorded, base)
    load_us = max(0.0, _median(base, used) - _median(unloaded, used))
    profiler_us = max(0.0, _median(unloaded, used) - _median(unprofiled, used))
    facts = LoaderFacts.of(model.trace)
    # Workers that lag: the median step hides the round's wait, the steps at their pace do not.
    rounds = Rounds.of(steps[used], facts, model.loader_kind)
    rounds_us = 0.0
    as_recorded = (graph, unprofiled)  # the one-thread probe's scales are of these
    batch = facts.batch_bytes if facts.batch_bytes is not None else h2d_bytes_per_step(model)
    pace = rounds.pace_us if rounds is not None else workers_pace(facts, model.loader_kind)
    pace_said: dict[str, Any] = {}
    if pace is not None:
        # The workers deliver no faster than their pace: a lagging round's, or one the step
        # without the profiler's cost would outrun (a recording never met it).
        at_pace_graph = paced(graph, pace, batch)
        at_pace = replay(at_pace_graph)
        added = _median(at_pace, used) - _median(unprofiled, used)
        if rounds is not None:
            pace_said = {**rounds.to_dict(), "note": rounds.note()}
        elif added > PACE_MIN_SHARE * _median(unprofiled, used):
            pace_said = {"workers": facts.workers, "pace_us": round(pace, 1),
                         "worker_load_us": round(facts.worker_load_us or 0.0, 1),
                         "note": pace_note(facts, pace)}
        if pace_said:
            graph, unprofiled, rounds_us = at_pace_graph, at_pace, added
    plan = Plan(
        trace=model.trace.label,
        measured_step_us=measured,
        replayed_step_us=_median(base, used),
        floor_us=0.0,
        steps_used=[s.name for s in steps[used]],
        floor_kind="gpu" if len(graph.g_ts) else "host",
        steps_note=_steps_note(len(model.steps), window, used, filled[used]),
        baseline_step_us=max(float(np.median(steady[used])) - profiler_us - load_us
                             + rounds_us, 0.0),
        profiler={"op_us": round(cost.op_us, 3), "measured": cost.measured,
                  "source": cost.source,
                  "ops_per_step": round(float(counts.sum()) / graph.steps, 1),
                  "step_cost_us": round(profiler_us, 1)},
        load={**others.to_dict(), "step_cost_us": round(load_us, 1)} if others else {},
        rounds={**pace_said, "added_us": round(rounds_us, 1)} if pace_said else {},
    )
    memo: dict[str, Any] = {}
    one = OneThread.of(model)
    if one is not None:  # torch_threads=1 from run's one-thread steps (replay/threads.py)
        memo[ONE_THREAD] = scales(one, as_recorded[0], _median(as_recorded[1], used))
        if memo[ONE_THREAD] is None:
            memo[ONE_THREAD_WHY] = (
                "the steps timed at one intra-op thread before recording do not fit the "
                f"recorded ones (loading or other work scaled beyond {MIN_SCALE:g}x-"
                f"{MAX_SCALE_PER_THREAD * one.threads:g}x): they saw another phase of the run")

    def predict(g: Graph, applied: list[str], changes: list[Change]) -> Scenario:
        ctx = Context(model, facts, recorded, list(applied), memo)
        g2, notes = apply(g, ctx, changes)
        r = replay(g2)
        quartiles = np.percentile(r.paced_step_us[used], [25, 75])
        # The workers deliver no faster than their pace, however fast the host gets, until a
        # change to the loader itself (which replays its own pace, replay/loader.py).
        least = 0.0 if pace is None or LOADER_KEYS & {*applied, *(c.key for c in changes)} \
            else pace
        if least > _median(r, used):
            notes = [*notes, f"the DataLoader's workers deliver a batch no faster than every "
                             f"{ms(least, 'tenths')} ms, so the step is no shorter"]
        return Scenario(g2, r, max(_median(r, used), least), notes,
                        (max(float(quartiles[0]), least), max(float(quartiles[1]), least)))

    findings = [a.finding for a in assessments if a.finding is not None]
    options: dict[str, list[Change]] = {}
    alone: dict[str, float] = {}  # each change's step replayed alone
    # The greedy's first round is each change alone; of those only the best is kept whole:
    # a scenario holds a copy of the graph's changeable arrays and its replay (23 MB on a
    # 300 MB trace), and the others are never used again. A list, so that the greedy can take
    # it out and nothing holds it once a later round has moved on.
    first: list[tuple[str, Scenario]] = []
    for f in findings:
        changes = changes_for(f, model)
        if f.caused_by:
            plan.not_replayed[f.id] = f"an effect of {f.caused_by}: its change is that one's"
        elif not changes:
            plan.not_replayed[f.id] = no_change_reason(f, model)
        else:
            scenario, changes, why = _alone(predict, graph, changes)
            if scenario is None:
                plan.not_replayed[f.id] = why
                continue
            if _threads_left_out(f, changes, scenario.notes):
                scenario.notes = [
                    "torch_threads=1 is not replayed (`run` timed no steps at one intra-op "
                    "thread to scale the step by): the workers alone", *scenario.notes]
            if not first or scenario.step_us < first[0][1].step_us:
                first[:] = [(f.id, scenario)]
            f.predicted_step_us = round(scenario.step_us, 1)
            alone[f.id] = scenario.step_us
            options[f.id] = changes
            del scenario
    start = Scenario(graph, unprofiled, plan.baseline_step_us, [])
    final = _greedy(plan, start, options, predict, first, used)
    final, dropped = _by_share(plan, start, final, options, predict, used, alone)
    plan.floor_us = _floor(final.graph, final.replay, used)
    if what_if:
        plan.what_if = _what_if(plan, graph, what_if, predict, used)
    _rank(plan, findings, options, dropped, pace or 0.0)
    return plan


def _alone(predict: Any, graph: Graph, changes: list[Change]
           ) -> tuple[Scenario | None, list[Change], str]:
    """A finding's change replayed alone, and the change replayed; for threads + workers
    whose threads cannot replay (the one-thread steps do not fit the recording), the workers
    alone. None and why when nothing of it replays."""
    try:
        return predict(graph, [], changes), changes, ""
    except NotModelled as exc:
        rest = changes[1:] if len(changes) > 1 and changes[0].key == "torch_threads" else []
        if rest:
            try:
                s = predict(graph, [], rest)
            except NotModelled:
                pass
            else:  # the finding advises both: the prediction says what it left out, and why
                left = f"{changes[0].text} is not replayed ({exc}): the workers alone"
                s.notes = [left, *s.notes]
                return s, rest, ""
        return None, changes, str(exc)


# A recorded step that launched more GPU work than this times its own length was not steady:
# the host ran ahead of the GPU while the launch queue filled.
FILLING_RATIO = 1.02


def _steady(recorded: np.ndarray, base: Replay) -> tuple[np.ndarray, np.ndarray]:
    """Each recorded step as the run settles into it, and the GPU work of those the launch
    queue was filling in (NaN elsewhere). A host that runs ahead of a busy GPU ends its steps
    before their GPU work (the queue fills until launches block), so such a step's length is
    not the run's: there the unchanged replay's step, paced by the GPU work each step
    launched, is; elsewhere the recorded step is."""
    need = base.gpu_need if base.gpu_need is not None else np.zeros(len(recorded))
    filling = need > FILLING_RATIO * recorded
    return (np.where(filling, np.fmax(base.paced_step_us, recorded), recorded),
            np.where(filling, need, np.nan))


def _threads_left_out(f: Finding, changes: list[Change], notes: list[str]) -> bool:
    """The finding advises one intra-op thread beside its change, which the replay left out
    and no note says so yet: the prediction must not read as the advice's."""
    advised = (f.evidence or {}).get("suggested_torch_threads") == 1
    return (advised and all(c.key != "torch_threads" for c in changes)
            and not any(n.startswith("torch_threads=1 is not replayed") for n in notes))


def _steps_note(n: int, window: slice, used: slice, filled: np.ndarray) -> str | None:
    """Why some recorded steps are not in the medians or not taken as recorded, in the
    report's words. `filled`: the used steps' GPU work where the launch queue was filling."""
    said = []
    if window.stop - window.start < n:
        said.append(f"a long recording is replayed over {MAX_REPLAY_STEPS} consecutive steps "
                    "from its middle")
    if used != slice(None):
        said.append("the first replayed step is left out: it carries GPU work queued before "
                    "it, which the replay keeps where it was")
    need = filled[~np.isnan(filled)]
    if len(need):
        low, high = ms(float(need.min()), "tenths"), ms(float(need.max()), "tenths")
        said.append(
            f"{plural(len(need), 'step')} ended before the GPU work launched in "
            f"{'it' if len(need) == 1 else 'each'} ({low if low == high else f'{low}-{high}'} "
            "ms on the busiest GPU): the host ran ahead while the launch queue filled, so "
            f"{'it is' if len(need) == 1 else 'they are'} taken at the pace of that work, as "
            "the run settles")
    return "; ".join(said) or None


def _greedy(plan: Plan, start: Scenario, options: dict[str, list[Change]], predict: Any,
            first: list[tuple[str, Scenario]], used: slice) -> Scenario:
    """Each round, the change that takes most off the current prediction, until none saves
    MIN_GAIN_PCT. Findings that share a change (pageable and blocking copies) share one entry.
    Returns the scenario with every entry's change made. The start's step is the baseline (the
    measured one less the profiler's cost), so the entries' savings add up to the baseline
    minus the end state."""
    current = start
    applied: list[str] = []
    left = dict(options)
    while left:
        best: tuple[str, Scenario] | None = None
        if current is start:  # each change alone, replayed already: `first` holds the best
            best = first.pop() if first else None  # (lowest step, earliest on a tie, as below)
        else:
            for fid, changes in left.items():
                try:
                    s = predict(current.graph, applied, changes)
                except NotModelled:
                    continue
                if best is None or s.step_us < best[1].step_us:
                    best = (fid, s)
        if best is None:
            break
        fid, s = best
        gain = 100.0 * (current.step_us - s.step_us) / plan.baseline_step_us
        if gain < MIN_GAIN_PCT:
            break
        text = " + ".join(c.text for c in left[fid])
        plan.entries.append(PlanEntry(fid, text, round(s.step_us, 1), round(gain, 2), s.notes,
                                      _range(s, used)))
        applied += [c.key for c in left[fid]]
        current = s
        # Findings whose change this entry makes (pageable and blocking copies; the threads
        # that dataloader-bound sets with its workers) share it.
        same = [k for k, v in left.items() if set(v) <= set(left[fid])]
        for k in same:
            del left[k]
    return current


# The plan's first this many changes share its saving exactly (every subset of them replayed:
# at most 2^4 - 1, of which the greedy already replayed the prefixes and the changes alone); a
# change after them keeps what it adds on top of them (the smallest: the greedy found them last).
MAX_SHARED = 4


@dataclass
class _Outcome:
    """A set of changes replayed: its median step and, once a path needs them, its range and
    the assumptions of its changes (no graph: a subset's replay is let go at once)."""

    step_us: float
    range_us: list[float] | None = None
    notes: list[str] | None = None


def _by_share(plan: Plan, start: Scenario, final: Scenario, options: dict[str, list[Change]],
              predict: Any, used: slice, alone: dict[str, float]
              ) -> tuple[Scenario, dict[str, float]]:
    """Each entry's `saving_pct` its share of the plan's saving, the plan in that order, and
    the path (each entry's predicted step, with it and every change above it made) in that
    order; returns the scenario at the path's end, and the changes left out of the plan for a
    share under MIN_GAIN_PCT (id -> share, % of the baseline). `alone`: each change's step
    replayed alone (the greedy's first round).

    The greedy picks each round's change by what it saves on top of the last, so a change that
    pays off most beside others (an optimizer's launches that bind only once mixed precision
    shortened the kernels) came after one that saves more alone and little in the end. A
    change's share is its Shapley value: what it adds, averaged over every order of making the
    plan's changes. The shares add up to the plan's saving and do not depend on the order the
    changes are listed in, so the first entry is the change that saves the most on the whole.
    A change whose share is under MIN_GAIN_PCT (one that costs time alone and wins a little
    only after another) leaves the plan, and the others share its saving again. The replay's
    changes commute (graph.py `_find_joins`), so a set's step does not depend on the order its
    changes were made in.
    """
    entries = plan.entries
    base = plan.baseline_step_us
    if len(entries) < 2 or base <= 0:
        return final, {}
    shared, rest = entries[:MAX_SHARED], entries[MAX_SHARED:]
    ids = [e.id for e in shared]
    # Replayed already: the greedy's prefixes (with their ranges) and each change alone.
    memo: dict[frozenset[str], _Outcome] = {frozenset(): _Outcome(start.step_us)}
    memo.update({frozenset([i]): _Outcome(alone[i]) for i in ids if i in alone})
    for n, e in enumerate(shared, 1):
        memo[frozenset(ids[:n])] = _Outcome(e.predicted_step_us, e.predicted_range_us,
                                            e.assumptions)

    def outcome(subset: frozenset[str], whole: bool = False) -> _Outcome:
        known = memo.get(subset)
        if known is None or (whole and known.range_us is None):
            s = predict(start.graph, [], [c for i in ids if i in subset for c in options[i]])
            known = memo[subset] = _Outcome(s.step_us, _range(s, used), s.notes)
        return known

    dropped: dict[str, float] = {}
    kept = list(ids)
    try:
        share = _shapley(kept, lambda subset: outcome(subset).step_us)
        while len(kept) > 1 and min(share.values()) < MIN_GAIN_PCT * base / 100.0:
            least = min(kept, key=lambda i: (share[i], kept.index(i)))
            dropped[least] = round(100.0 * share[least] / base, 2)
            kept.remove(least)
            share = _shapley(kept, lambda subset: outcome(subset).step_us)
        order = sorted(kept, key=lambda i: -share[i])
        path = [outcome(frozenset(order[:n]), whole=True) for n in range(1, len(order) + 1)]
    except NotModelled:  # a subset the replay cannot make: keep the greedy's order
        return final, {}
    by_id = {e.id: e for e in entries}
    plan.entries = [
        PlanEntry(i, by_id[i].change, round(o.step_us, 1), round(100.0 * share[i] / base, 2),
                  list(o.notes or []), list(o.range_us or []))
        for i, o in zip(order, path, strict=True)] + rest
    if dropped:  # a smaller set: its end state, and the rest's path on top of it, replayed
        final = predict(start.graph, [], [c for i in order for c in options[i]])
        for e in rest:
            s = predict(final.graph, [c.key for i in order for c in options[i]],
                        options[e.id])
            e.predicted_step_us, e.predicted_range_us = round(s.step_us, 1), _range(s, used)
            final = s
    return final, dropped


def _shapley(ids: list[str], step: Any) -> dict[str, float]:
    """Each change's Shapley value (us): the step without it less the step with it, over every
    subset of the others, weighted |S|! (n - |S| - 1)! / n!. `step(subset)` replays a subset."""
    n = len(ids)
    out = {}
    for i in ids:
        others = [j for j in ids if j != i]
        total = 0.0
        for r in range(n):
            weight = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
            for subset in itertools.combinations(others, r):
                without = frozenset(subset)
                total += weight * (step(without) - step(without | {i}))
        out[i] = total
    return out


def _what_if(plan: Plan, graph: Graph, changes: list[Change], predict: Any,
             used: slice) -> dict[str, Any]:
    """Each requested change alone, then all of them together."""
    each = []
    for c in changes:
        try:
            s = predict(graph, [], [c])
            each.append({"change": c.text, "predicted_step_us": round(s.step_us, 1),
                         "predicted_range_us": _range(s, used), "assumptions": s.notes})
        except NotModelled as exc:
            each.append({"change": c.text, "predicted_step_us": None, "not_replayed": str(exc)})
    out: dict[str, Any] = {
        "changes": [c.text for c in changes],
        "measured_step_us": round(plan.measured_step_us, 1),
        "replayed_step_us": round(plan.replayed_step_us, 1),
        "baseline_step_us": round(plan.baseline_step_us, 1),
        "each": each,
    }
    try:
        s = predict(graph, [], changes)
        out["predicted_step_us"] = round(s.step_us, 1)
        out["predicted_range_us"] = _range(s, used)
        out["assumptions"] = s.notes
    except NotModelled as exc:
        out["predicted_step_us"] = None
        out["not_replayed"] = str(exc)
    return out


def _rank(plan: Plan, findings: list[Finding], options: dict[str, list[Change]],
          dropped: dict[str, float], pace_us: float = 0.0) -> None:
    """Savings from the plan: a finding in it claims its share of the plan's saving; one the
    replay cannot model keeps its rule's upper bound, labelled so, and capped so that savings
    and bounds together fit in the step (`_cap_bounds`). `dropped`: changes the plan left out
    for their share (`_by_share`); `pace_us`: the loader's workers deliver a batch no faster."""
    measured = plan.baseline_step_us
    by_id = {e.id: (i, e) for i, e in enumerate(plan.entries)}
    bounds = []
    for f in findings:
        if f.id in by_id:
            rank, entry = by_id[f.id]
            f.plan_rank = rank + 1
            f.saving_kind = "replayed"
            f.estimated_saving_pct = entry.saving_pct
            alone = f.predicted_step_us
            f.saving_basis = (
                f"replayed: {ms(measured, 'tenths')} -> {ms(alone, 'tenths')} ms per step with "
                f"{entry.change} alone; {percent(entry.saving_pct)} as its share of the fix "
                f"plan's saving (step {rank + 1} of it). Assumes: {'; '.join(entry.assumptions)}."
            )
        elif f.id in options:  # replayed, but it adds under MIN_GAIN_PCT to the plan
            shared = next((e for e in plan.entries
                           if set(options[f.id]) <= set(options.get(e.id, []))), None)
            f.estimated_saving_pct = 0.0
            f.saving_kind = "replayed"
            if f.id in dropped:
                why = (f"its share of the fix plan's saving (what it adds, averaged over every "
                       f"order of making the plan's changes) is {percent(dropped[f.id])}, "
                       f"under {MIN_GAIN_PCT}% of the step")
            elif shared and options[f.id] == options.get(shared.id):
                why = f"the same change as {shared.id}, counted there"
            elif shared:
                why = f"its change is part of {shared.id}'s ({shared.change}), counted there"
            elif plan.entries:
                why = (f"it adds under {MIN_GAIN_PCT}% of the step on top of the fix plan's "
                       "other changes")
            else:
                why = f"it saves under {MIN_GAIN_PCT}% of the step"
                note = profiler_bound_note(vars(plan))
                why += f"; {note}" if note else ""
            f.saving_basis = (
                f"replayed: {ms(measured, 'tenths')} -> {ms(f.predicted_step_us, 'tenths')} ms "
                f"per step alone; {why}")
        elif f.caused_by and f.caused_by in by_id:  # its time is its cause's to win back
            f.estimated_saving_pct = 0.0
            f.saving_kind = "counted"
            f.saving_basis = (f"counted in {f.caused_by}'s fix (step {by_id[f.caused_by][0] + 1} "
                              "of the fix plan): this time is lost to it")
        else:
            why = plan.not_replayed.get(f.id, "not replayed")
            f.saving_basis = f"upper bound, not replayed ({why}): {f.saving_basis}"
            bounds.append(f)
            continue
        f.severity = severity_for(f.estimated_saving_pct)
    _cap_bounds(plan, bounds, pace_us)
    for f in bounds:
        f.leads_plan = _leads(plan, f)


def _leads(plan: Plan, f: Finding) -> bool:
    """Whether an unreplayed cause outranks the fix plan: its bound (capped, on the plan's
    base) is larger than the plan's first share, and the replay does not say that change saves
    more: its range reaches the step unchanged (it may save nothing), or even its best case
    (the range's low end) saves less than the bound. A bound is a most, a prediction a median:
    where the prediction is sure to save and its best case beats the bound, it keeps the lead."""
    if f.caused_by or not plan.entries or plan.baseline_step_us <= 0:
        return False
    first, base = plan.entries[0], plan.baseline_step_us
    if f.estimated_saving_pct <= first.saving_pct:
        return False
    low, high = first.predicted_range_us or [first.predicted_step_us] * 2
    return high >= base or f.estimated_saving_pct > 100.0 * (base - low) / base


# The step without the profiler's cost is "at its GPU work" within this much: then the idle the
# recording shows is the profiler's own host time, which no change of the user's removes.
AT_FLOOR = 1.15


def profiler_bound_note(plan: dict[str, Any]) -> str | None:
    """Why nothing saves on a step the profiler made host-bound: the step without the
    profiler's cost (predicted) sits at the busiest GPU's work, though the recorded one did
    not. None otherwise. `plan`: Plan.to_dict()'s fields (the report keeps plans as dicts)."""
    base, floor = plan.get("baseline_step_us"), plan.get("floor_us")
    step = plan.get("measured_step_us")
    if plan.get("floor_kind") != "gpu" or not base or not floor or not step:
        return None
    if base > AT_FLOOR * floor or step <= AT_FLOOR * base:
        return None
    measured = (plan.get("profiler") or {}).get("measured")
    how = "" if measured else " (its cost per op assumed)"
    return (f"without the profiler{how} the step is predicted at {ms(base, 'tenths')} ms on "
            f"{ms(floor, 'tenths')} ms of GPU work: that idle is the profiler's own")


def _cap_bounds(plan: Plan, bounds: list[Finding], pace_us: float = 0.0) -> None:
    """Unreplayed bounds on the plan's base (the baseline step), causes first and then largest
    first, each capped to what the step has left: together with the plan's savings, no more
    than the step (one lost millisecond, one owner) and, but for NOT_CAPPED's, no more than its
    time above the floor.
    A rule's figure is a share of the recorded step; the base is the step without the
    profiler's cost, which the recorded idle and waits partly were."""
    base, step = plan.baseline_step_us, plan.measured_step_us
    if base <= 0 or step <= 0:
        return
    planned = sum(e.saving_pct for e in plan.entries) * base / 100.0
    left = max(base - planned, 0.0)  # the step's time no saving has claimed
    above = max(base - plan.floor_us - planned, 0.0)  # ...and of it, above the floor
    # The loader's workers deliver a batch no faster than their pace: no change but the
    # loader's own takes the step below it (the plan's end state already made its changes).
    end = plan.entries[-1].predicted_step_us if plan.entries else base
    paced = max(min(base, end) - pace_us, 0.0)
    # Causes before their effects (an effect's time is its cause's first), then largest first.
    for f in sorted(bounds, key=lambda f: (bool(f.caused_by), -f.estimated_saving_pct, f.id)):
        if f.estimated_saving_pct is None or not_estimated(f) or f.id in PER_EPOCH:
            continue
        claimed = f.estimated_saving_pct * step / 100.0
        room = left if f.id in NOT_CAPPED else min(left, above)
        if pace_us and f.id not in LOADER_RULES:
            room = min(room, paced)
        us = min(claimed, room)
        pct = round(100.0 * us / base, 2)
        if pct < round(100.0 * claimed / base, 2):
            floor = "" if f.id in NOT_CAPPED else (
                f" above its floor ({ms(plan.floor_us, 'tenths')} ms, "
                f"{_FLOOR_WORDS[plan.floor_kind]})")
            f.saving_basis += (
                f"; at most {percent(pct)} of the {ms(base, 'tenths')} ms step here (the rule's "
                f"figure was {percent(f.estimated_saving_pct)} of the recorded "
                f"{ms(step, 'tenths')} ms step): what the step has left{floor} once the fix "
                "plan's savings and the larger bounds are counted")
        f.estimated_saving_pct = pct
        f.severity = severity_for(pct)
        left -= us
        if f.id not in NOT_CAPPED:
            above -= us
        if f.id not in LOADER_RULES:
            paced = max(paced - us, 0.0)


def not_estimated(f: Finding) -> bool:
    """A finding that claims no saving of its own (the GPU bound: only faster GPU work helps,
    and its levers' gains are other findings' to replay; a rule about what fits, not time)."""
    return ((flagged(f.id, "bound") or flagged(f.id, "no_time_saving"))
            and f.saving_kind == "upper_bound")


def _range(s: Scenario, used: slice) -> list[float]:
    """[low, high] around a scenario's median: the replayed steps' first and third quartiles,
    less and plus MODEL_ERROR; the low end never below the busiest GPU's work that the scenario
    keeps (no step is shorter than the GPU work in it)."""
    lo, hi = s.spread
    low = max(lo * (1 - MODEL_ERROR), _floor(s.graph, s.replay, used) if len(s.graph.g_ts)
              else 0.0)
    return [round(min(low, s.step_us), 1), round(max(hi * (1 + MODEL_ERROR), s.step_us), 1)]


def _median(r: Replay, used: slice) -> float:
    """Median step over the steps used, each paced by the GPU when the host ran ahead of it."""
    return float(np.median(r.paced_step_us[used]))


def _floor(g: Graph, r: Replay, used: slice) -> float:
    """Per step, the busiest GPU's work in it (the union of the ops recorded in the step, at
    their replayed times or with the overlaps the recording shows, whichever is more: a change
    that lets the host end its step sooner neither takes that work out of the step nor makes
    it more concurrent; replay/engine.py `gpu_need`); with no GPU,
    the stepping thread's own work (its fill and calls) in the replayed step window. Median
    over the steps used, as the step it is compared with."""
    if len(g.g_ts) and r.gpu_need is not None:
        need = r.gpu_need[used]
        return float(np.median(need)) if len(need) else 0.0
    lo = r.host_start[g.step_start][used]
    hi = r.host_start[g.step_end][used]
    if not len(lo):
        return 0.0
    main = (g.h_thread == 0) & ((g.h_kind == FILL) | (g.h_kind == CALL))
    s, e = r.host_start[main], r.host_end[main]
    tl = Timeline.from_intervals((s, e), (lo, hi))
    return float(np.median(tl.sum_by(tl.cover(s, e), tl.bucket(lo, hi), len(lo))))
