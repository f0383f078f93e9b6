"""Physics as properties, over every committed trace and every what-if a rule offers (each
finding's change alone, as the plan replays it, beside the what-ifs tests/test_invariants.py
asks of every trace).

The GPU work a step keeps is measured here from the trace itself (the ops the step launched,
each device's busy time as the union of its kernels, copies and memsets), not from the replay
whose floor is under test. Per report:
 (a) the plan's floor is no less than the busiest device's recorded work that its changes keep
     (collectives included unless the plan overlaps them, comm=overlap), median over the steps
     the plan judges, as the floor is;
 (b) no prediction (plan entries, each finding's change alone, what-ifs, the low ends of their
     ranges) is below the recorded work that its changes keep, and no baseline below the work
     its steps launch;
 (c) savings and bounds are shares of one step, the baseline the report quotes: the plan's
     savings add up to that step less the plan's end; every finding's saving, replayed or an
     upper bound, adds up to at most 100% with the others, and with the plan's savings to at
     most the floor gap ((baseline - floor) / baseline);
 (d) every share a user reads is at most 100%: shares of spans that overlap (one op on two
     threads) are their union, not their sum.

Every case holds. A cost paid once an epoch (worker-startup) is a share of the run's time over an
epoch, its own base, not of the median step that does not hold it: it is checked on its own.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.plan import PER_EPOCH
from stallscope.diagnose.registry import changes_for
from stallscope.report.hotspots import host_op_totals, top_rows
from stallscope.report.json_writer import report_data
from stallscope.report.markdown import render_markdown
from stallscope.trace.kernels import COMM_NAME
from tests.conftest import SAMPLES, committed_traces, real_trace, write_trace
from tests.test_invariants import PCT_SLACK, US_SLACK, _model, report

# What each change leaves of the recorded GPU work: most move host time only and keep every
# op as long as it was; these shorten or remove some (pinned copies run faster, autocast and
# compile shorten kernels, fused optimizers fold them, set_to_none drops the zeroing), and
# comm=overlap lets the collectives overlap compute, so only the rest keeps its recorded union.
DROPS = {
    "pin_memory": ("memcpy",),
    "amp": ("kernel",),
    "compile": ("kernel",),
    "optimizer": ("kernel",),
    "zero_grad": ("kernel", "memset"),
    "comm": ("collective",),
}
# Bounds that the floor does not limit: their changes remove or overlap GPU work the floor
# counts (collectives; DataParallel's peer copies and broadcasts).
FLOOR_FREE = ("comm-bound", "dataparallel")


# Every committed trace, named by its path under sample_traces/.
TRACES = [pytest.param(p, id=p.relative_to(SAMPLES).as_posix()) for p in committed_traces()]


# --- the recorded GPU work, from the trace ------------------------------------------------------

@cache
def _busy(path: Path, drop: frozenset[str]) -> np.ndarray:
    """Per recorded step, the busiest device's busy time (union) over the GPU ops it launched
    (ops without a recorded launch by where they started), leaving out the kinds in `drop`
    (`collective`: NCCL/RCCL kernels). A step's GPU work is what it launched, wherever it ran:
    counted by where ops started, a step also holds the spill of the steps before it (while the
    launch queue fills, more than its own length)."""
    model = _model(path)
    gpu = model.gpu
    keep = ~gpu["kind"].astype(str).isin(drop)
    if "collective" in drop:
        keep &= ~gpu["name"].astype(str).str.contains(COMM_NAME)
    gpu = gpu[keep.to_numpy()]
    step = _launched_by(gpu, model.windows)
    out = np.zeros(len(model.steps))
    inside = gpu.assign(at=step)[step >= 0]
    for (i, _), ops in inside.groupby([inside["at"], inside["device"].astype(str)]):
        out[i] = max(out[i], _union(ops["ts"].to_numpy(), ops["end"].to_numpy()))
    return out


def _launched_by(gpu: pd.DataFrame, windows: np.ndarray) -> np.ndarray:
    """Per GPU op, the step whose window holds its launch. An op with no recorded launch goes
    with the op before it on its stream, and one before its stream's first recorded launch was
    queued before the recording (-1); a stream with no recorded launch at all by where its ops
    started."""
    out = np.full(len(gpu), -1)
    launch = gpu["launch_ts"].to_numpy(dtype=float)
    start = gpu["ts"].to_numpy(dtype=float)
    keys = gpu["device"].astype(str) + "/" + gpu["stream"].astype(str)
    for _, rows in pd.Series(np.arange(len(gpu))).groupby(keys.to_numpy()):
        rows = rows.to_numpy()[np.argsort(start[rows.to_numpy()], kind="stable")]
        at = launch[rows]
        if np.isnan(at).all():
            out[rows] = _step_of(start[rows], windows)
            continue
        # The latest recorded launch at or before each op on its stream (NaN before the first).
        filled = pd.Series(at).ffill().to_numpy()
        out[rows] = np.where(np.isnan(filled), -1,
                             _step_of(np.nan_to_num(filled, nan=-np.inf), windows))
    return out


def _step_of(ts: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Per time, the step whose window holds it, else -1."""
    i = np.searchsorted(windows[:, 0], ts, side="right") - 1
    inside = (i >= 0) & (ts < windows[np.clip(i, 0, None), 1])
    return np.where(inside, i, -1)


def _union(start: np.ndarray, end: np.ndarray) -> float:
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    before = np.r_[-np.inf, np.maximum.accumulate(e)[:-1]]
    return float(np.clip(e - np.maximum(s, before), 0.0, None).sum())


def _kept(path: Path, keys: list[str]) -> float:
    """The recorded GPU work that changes of `keys` keep, median over the steps the plan judges
    (see `_busy`)."""
    drop = frozenset(k for key in keys for k in DROPS.get(key, ()))
    plan = report(path).plan
    used = set(plan["steps_used"])
    per = _busy(path, drop)
    chosen = [per[i] for i, s in enumerate(_model(path).steps) if s.name in used]
    return float(np.median(chosen)) if chosen else 0.0


def _keys(change: str) -> list[str]:
    """`pin_memory=true + non_blocking=true` -> its keys."""
    return [part.split("=", 1)[0].strip() for part in change.split("+")]


def _gpu_plan(path: Path) -> dict:
    plan = report(path).plan
    if plan is None or plan["floor_kind"] != "gpu":
        pytest.skip("no replayed GPU step")
    return plan


# --- (a) and (b): floors, baselines and predictions ---------------------------------------------

@pytest.mark.parametrize("path", TRACES)
def test_the_floor_holds_the_gpu_work_the_plan_keeps(path: Path) -> None:
    plan = _gpu_plan(path)
    keys = [k for e in plan["entries"] for k in _keys(e["change"])]
    kept = _kept(path, keys)
    assert plan["floor_us"] >= kept - US_SLACK, (keys, plan["floor_us"], kept)


@pytest.mark.parametrize("path", TRACES)
def test_no_baseline_below_the_recorded_gpu_work(path: Path) -> None:
    """The step without the profiler is a run's steady step: no shorter than the GPU work each
    step launches (steps that launch more than they last are a queue filling, which no run
    keeps up)."""
    plan = _gpu_plan(path)
    kept = _kept(path, [])
    assert plan["baseline_step_us"] >= kept - US_SLACK, (plan["baseline_step_us"], kept)
    assert plan["replayed_step_us"] >= kept - US_SLACK, (plan["replayed_step_us"], kept)


def _predictions(path: Path) -> list[tuple[str, list[str], float]]:
    """Every prediction of the report: (label, the keys of the changes it makes, step us)."""
    r = report(path)
    plan = r.plan
    out: list[tuple[str, list[str], float]] = []
    keys: list[str] = []
    for e in plan["entries"]:
        keys = keys + _keys(e["change"])
        out += [(f"plan {e['change']}", keys, e["predicted_step_us"]),
                (f"plan {e['change']} (range low)", keys, e["predicted_range_us"][0])]
    for f in r.findings:
        if f.predicted_step_us is not None:
            alone = [c.key for c in changes_for(f, _model(path))]
            out.append((f"{f.id} alone", alone, f.predicted_step_us))
    wi = plan.get("what_if") or {}
    for e in wi.get("each", []):
        if e.get("predicted_step_us") is not None:
            out += [(f"what-if {e['change']}", _keys(e["change"]), e["predicted_step_us"]),
                    (f"what-if {e['change']} (range low)", _keys(e["change"]),
                     e["predicted_range_us"][0])]
    if wi.get("predicted_step_us") is not None:
        every = [k for c in wi["changes"] for k in _keys(c)]
        out += [("what-if all", every, wi["predicted_step_us"]),
                ("what-if all (range low)", every, wi["predicted_range_us"][0])]
    return out


@pytest.mark.parametrize("path", TRACES)
def test_no_prediction_below_the_gpu_work_it_keeps(path: Path) -> None:
    _gpu_plan(path)
    low = [(label, us, round(_kept(path, keys), 1)) for label, keys, us in _predictions(path)
           if us < _kept(path, keys) - US_SLACK]
    assert not low, low


# --- (c) savings and bounds on one base ---------------------------------------------------------

def _plan_or_skip(path: Path) -> dict:
    plan = report(path).plan
    if plan is None or plan["baseline_step_us"] <= 0:
        pytest.skip("no plan: no baseline step")
    return plan


def _bounds(path: Path, floor_free: bool = True) -> list[tuple[str, float]]:
    """The unreplayed upper bounds a user reads beside the plan's savings, as shares of the
    step (a cost paid once an epoch is a share of the run's time over the epoch, its own base:
    diagnose/plan.py PER_EPOCH)."""
    return [(f.id, f.estimated_saving_pct) for f in report(path).findings
            if f.saving_kind == "upper_bound" and f.estimated_saving_pct
            and f.id not in PER_EPOCH and (floor_free or f.id not in FLOOR_FREE)]


def _gap_pct(plan: dict) -> float:
    base = plan["baseline_step_us"]
    return 100.0 * max(base - plan["floor_us"], 0.0) / base


@pytest.mark.parametrize("path", TRACES)
def test_replayed_savings_are_shares_of_the_baseline_step(path: Path) -> None:
    """Each entry's saving is its share of the plan's saving, a share of the baseline the report
    quotes: the shares add up to the baseline less the plan's end state, none is negative, the
    plan is listed largest first, and a finding in the plan claims its entry's share."""
    plan = _plan_or_skip(path)
    base, entries = plan["baseline_step_us"], plan["entries"]
    if not entries:
        pytest.skip("an empty fix plan")
    total = 100.0 * (base - entries[-1]["predicted_step_us"]) / base
    shares = [e["saving_pct"] for e in entries]
    assert sum(shares) == pytest.approx(total, abs=PCT_SLACK * len(entries)), shares
    assert all(p >= 0 for p in shares) and shares == sorted(shares, reverse=True), shares
    claimed = {f.id: f.estimated_saving_pct for f in report(path).findings
               if f.plan_rank is not None}
    for e in entries:
        assert claimed[e["id"]] == e["saving_pct"]


@pytest.mark.parametrize("path", TRACES)
def test_savings_and_bounds_together_are_at_most_the_step(path: Path) -> None:
    r = report(path)
    total = [(f.id, f.estimated_saving_pct) for f in r.findings if f.estimated_saving_pct
             and f.id not in PER_EPOCH]
    assert sum(p for _, p in total) <= 100.0 + PCT_SLACK * max(len(total), 1), total
    # A per-epoch cost on its own base (the run's time over an epoch): at most all of it.
    assert all(f.estimated_saving_pct <= 100.0 for f in r.findings if f.id in PER_EPOCH)


@pytest.mark.parametrize("path", TRACES)
def test_savings_and_bounds_together_fit_the_floor_gap(path: Path) -> None:
    plan = _plan_or_skip(path)
    saved = [(e["id"], e["saving_pct"]) for e in plan["entries"]] + _bounds(path, False)
    gap = _gap_pct(plan)
    assert sum(p for _, p in saved) <= gap + PCT_SLACK * max(len(saved), 1), (saved,
                                                                               round(gap, 2))


@pytest.mark.parametrize("path", TRACES)
def test_no_bound_above_the_floor_gap_of_the_quoted_step(path: Path) -> None:
    plan = _plan_or_skip(path)
    gap = _gap_pct(plan)
    over = [(fid, pct) for fid, pct in _bounds(path, False) if pct > gap + PCT_SLACK]
    assert not over, (over, round(gap, 2))


# --- (d) every share at most 100% ---------------------------------------------------------------

SHARE_KEY = re.compile(r"pct|share|percent")
PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


def _shares(value: object, path: str = "") -> list[tuple[str, float]]:
    """Every number under a key that names a share (`..._pct`, `share...`), with its path."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _shares(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [s for v in value for s in _shares(v, f"{path}[]")]
    key = path.rsplit(".", 1)[-1].removesuffix("[]")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and SHARE_KEY.search(key):
        return [(path, float(value))]
    return []


@pytest.mark.parametrize("path", TRACES)
def test_every_share_a_user_reads_is_at_most_whole(path: Path) -> None:
    r = report(path)
    over = [(k, v) for k, v in _shares(report_data(r)) if v > 100.0 + PCT_SLACK]
    assert not over, over
    text = [m.group(0) for m in PERCENT.finditer(render_markdown(r))
            if float(m.group(1)) > 100.0 + PCT_SLACK]
    assert not text, text


def test_host_ops_on_two_threads_at_once_are_their_union() -> None:
    """hta/cpu_only_rank34of300_gloo: two threads each run `gloo:all_reduce` (173.2 and
    170.5 ms) over the same stretch of the one 209.6 ms step; the table read 343.7 ms per step,
    163.6% of the step. The time either ran is 178.8 ms: the 85.1% the comm-bound finding
    measures as exposed."""
    path = real_trace("hta/cpu_only_rank34of300_gloo.pt.trace.json.gz")
    row = next(o for o in analyze_paths([path]).top_host_ops if o["name"] == "gloo:all_reduce")
    assert row["calls"] == 2
    assert row["total_us"] == pytest.approx(343_681, abs=1)  # inclusive, summed over calls
    assert row["per_step_us"] == pytest.approx(178_777, abs=1)
    assert row["share_pct"] == pytest.approx(85.09, abs=0.01)


def test_a_nested_and_a_concurrent_call_count_once(tmp_path: Path) -> None:
    """One op nested in a call of its own name, and the same op on a second thread at the same
    time: the per-step time and share are the time any of them ran."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 100,
         "dur": 600},
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 200,
         "dur": 300},
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 2, "ts": 400,
         "dur": 500},
    ]
    trace = write_trace(tmp_path / "t.pt.trace.json", events)
    model = _model(trace)
    row = next(o for o in top_rows(host_op_totals(model)) if o["name"] == "outer")
    assert row["total_us"] == pytest.approx(1400)
    assert row["per_step_us"] == pytest.approx(800)  # 100..900
    assert row["share_pct"] == pytest.approx(80.0)

