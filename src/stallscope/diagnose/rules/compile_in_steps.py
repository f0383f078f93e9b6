"""`compile-in-steps`: torch.compile compiling (or recompiling) inside the recorded steps.

A compiled model's first steps compile it: seconds of Python in dynamo and inductor. When the
recorded steps still hold that, every other figure is measured on steps the real run does not
have; when a compile id's second number grows (`0/1`, `0/2`: frame 0 recompiled), guards fail as
shapes or Python values change, and the run keeps paying it. The trace says both: dynamo wraps
each compile in a `_compile.compile_inner (dynamo_timed)` range (torch 2.x) with its
`compile_id=F/C` in a `*_data` range inside, and each run of compiled code is a
`Torch-Compiled Region: F/C` range. Under `stallscope run` the graph breaks dynamo counted while
recording (with their reasons) come from `torch._dynamo.utils.counters` in the metadata.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.trace.names import name_flags
from stallscope.units import millis, percent

RULE_ID = "compile-in-steps"
COMPILE_PREFIXES = ("_compile.compile_inner", "entire_frame_compile")
REGION = "Torch-Compiled Region"
_ID = re.compile(r"compile_id=(\d+)/(\d+)")
_REGION_ID = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")
DOCS = "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html"
MAX_REASONS = 3
# torch._dynamo.config.recompile_limit (cache_size_limit before torch 2.6): 8 by default. A
# compile id F/C with C at it is the attempt that gave up: the frame runs eagerly from then on.
RECOMPILE_LIMIT = 8


def compile_in_steps(model: TraceModel, context: RunContext | None = None) -> Assessment:
    ops = model.ops
    if not model.steps or ops.empty:
        return Assessment(RULE_ID, "not_assessed", "No steps or no CPU ops in the trace.")
    # The steps and a start-up step set aside before them (trace/windows.py): a step set aside
    # for its length is often the compilation itself, which this rule is about. Checked on
    # arrays first: most traces have no compiled code, and sub-frames would cost more.
    in_steps = ops["step"].to_numpy() >= 0
    aside, aside_us = _set_aside(model)
    is_region = name_flags(ops["name"], _is_region)
    is_compile = name_flags(ops["name"], _is_compile)
    dynamo = model.trace.capture.get("dynamo")
    dynamo = dynamo if isinstance(dynamo, dict) else {}
    if not ((in_steps | aside) & (is_region | is_compile)).any():
        total = dynamo.get("graphs_total")
        if isinstance(total, int | float) and total > 0:
            return _fell_back(model, dynamo, total)
        return Assessment(RULE_ID, "not_assessed",
                          "No torch.compile regions in the recorded steps (an eager model).")
    rows = np.concatenate([np.flatnonzero(aside), np.flatnonzero(in_steps)])  # set-aside first
    inside = ops.iloc[rows]
    regions = inside[is_region[rows]]
    compiles = _outermost(inside[is_compile[rows]])
    n = len(model.steps)
    ids, frames = _names(inside, regions)
    breaks = _graph_breaks(model)
    evidence: dict = {"compiled_regions_per_step": round(len(regions) / n, 1),
                      "compiled_frames": len(frames)}
    if breaks:
        evidence["graph_breaks_recorded"] = sum(breaks.values())
        evidence["graph_break_reasons"] = dict(list(breaks.items())[:MAX_REASONS])
    if compiles.empty:
        return Assessment(
            RULE_ID, "clear",
            f"torch.compile ran {plural(len(regions), 'compiled region')} in the recorded steps "
            "and compiled nothing there: compilation had settled before recording."
            + (f" {_breaks_text(breaks)}" if breaks else ""),
        )
    compile_us = float(compiles["dur"].sum())
    steps_hit = int(compiles["step"].nunique())
    n_all = n + (1 if aside_us else 0)
    recompiles = [f"{f}/{c}" for f, c in ids if int(c) > 0]
    limit = _limit_hit(dynamo, ids)
    share = pct(compile_us, model.total_step_us + aside_us)
    evidence.update({
        "compile_ms_in_steps": ms(compile_us),
        "compile_share_pct": share,
        "steps_with_compilation": steps_hit,
        "steps": n_all,
        "compile_ids": [f"{f}/{c}" for f, c in ids],
    })
    if recompiles and limit is not None:
        evidence["recompile_limit_hit"] = True
    title, rec, snippet, precondition, saving, basis = advise(
        evidence, compile_us, ids, recompiles, len(compiles), limit)
    rec += f" {_breaks_text(breaks)}" if breaks else ""
    return Assessment.found(Finding(
        id=RULE_ID, title=title, evidence=evidence, recommendation=rec, snippet=snippet,
        precondition=precondition, estimated_saving_pct=saving, saving_basis=basis, docs=DOCS,
    ))


def _names(inside: pd.DataFrame, regions: pd.DataFrame) -> tuple[list[Any], list[str]]:
    """The compile ids (frame, recompile count) and the compiled frames the ops name: over the
    distinct names (a categorical column's values), not every event."""
    ids = sorted({(m[1], m[2]) for name in map(str, inside["name"].unique())
                  if "compile_id=" in name and (m := _ID.search(name))}, key=_id_key)
    frames = sorted({m.group(1) for name in map(str, regions["name"].unique())
                     if (m := _REGION_ID.match(name))})
    return ids, frames


def _limit_hit(dynamo: dict[str, Any], ids: list[tuple[str, str]]) -> int | None:
    """Dynamo's recompile limit when a frame's compile id reached it, else None."""
    limit = dynamo.get("recompile_limit")
    limit = limit if isinstance(limit, int) and limit > 0 else RECOMPILE_LIMIT
    return limit if any(int(c) >= limit for _, c in ids) else None


def _set_aside(model: TraceModel) -> tuple[np.ndarray, float]:
    """The ops of the start-up step set aside before the steps (trace/windows.py), and its
    length (us)."""
    ops = model.ops
    step = ops["step"].to_numpy()
    startup = model.startup or {}
    if not isinstance(startup.get("start_us"), int | float):
        return np.zeros(len(ops), dtype=bool), 0.0
    ts = ops["ts"].to_numpy()
    aside = (step < 0) & (ts >= startup["start_us"]) & (ts < startup["end_us"])
    return aside, float(startup["end_us"] - startup["start_us"])


def advise(evidence: dict[str, Any], compile_us: float, ids: list[tuple[str, str]],
           recompiles: list[str], compiles: int,
           limit: int | None) -> tuple[str, str, str, str, float, str]:
    """Title, recommendation, snippet, precondition, saving and its basis: recompiles to stop
    (`limit`: dynamo's recompile limit, when a frame reached it), or a first compilation to
    record past."""
    share = evidence["compile_share_pct"]
    steps_hit, n_all = evidence["steps_with_compilation"], evidence["steps"]
    if recompiles:
        title = (f"torch.compile recompiled in {steps_hit} of {n_all} recorded steps "
                 f"({millis(ms(compile_us / n_all), 'tenths')} ms per step, {percent(share)})")
        rec = ("Compiled code was compiled again while recording (compile ids "
               f"{', '.join(recompiles)}: the second number counts recompiles of a frame): its "
               "guards failed, usually on a changing shape (the last batch of an epoch, variable "
               "sequence lengths) or a changing Python value. Each recompile costs "
               f"{millis(ms(compile_us / max(compiles, 1)), 'whole')} ms here, and the run "
               "pays it for every new shape (and again for old ones past dynamo's cache size "
               "limit, 8 by default). Mark the dynamic dimension, pad to fixed shapes, or drop the "
               "ragged last batch; TORCH_LOGS=recompiles prints which guard failed.")
        if limit is not None:
            rec += (f" Frame {ids[-1][0]} reached dynamo's recompile limit ({limit}): from then "
                    "on it runs eagerly, without compilation, so the steps after it lose what "
                    "torch.compile gave.")
        snippet = ("torch._dynamo.mark_dynamic(x, 0)  # before the first call: batch dim varies\n"
                   "# or: model = torch.compile(model, dynamic=True)\n"
                   "# or: DataLoader(..., drop_last=True)  # no ragged last batch\n"
                   "# find the guard: TORCH_LOGS=recompiles python train.py")
        precondition = ("Recompiles that recur in the real run (a shape or value that keeps "
                        "changing); a one-off recompile only costs its own steps.")
        saving = share
        basis = ("upper bound: the compile time inside the recorded steps, if no step "
                 "recompiled")
    else:
        title = (f"torch.compile was still compiling in {steps_hit} of {n_all} recorded steps "
                 f"({percent(share)} of their time): the figures include compilation")
        rec = ("The recorded steps include the model's first compilation: every figure in this "
               "report is measured on steps the rest of the run does not have. Record later "
               "steps: raise --skip past the compiling steps (stallscope run already waits for "
               "dynamo's graph count to settle, up to a limit).")
        snippet = "stallscope run --skip 10 train.py  # past compilation"
        precondition = "A run long enough that compilation is a one-off start-up cost."
        saving = 0.0
        basis = "none: a measurement caveat, not a saving in the real run"
    return title, rec, snippet, precondition, saving, basis


def _fell_back(model: TraceModel, dynamo: dict, graphs: float) -> Assessment:
    """torch.compile compiled graphs before recording, yet no compiled code ran while recording:
    the frames fell back to eager (dynamo's recompile limit) or the compiled function is not
    what the step calls. Either way the recorded steps are not what torch.compile was meant to
    give; the saving is unknown (no compiled step to compare with)."""
    limit = dynamo.get("recompile_limit") or RECOMPILE_LIMIT
    return Assessment.found(Finding(
        id=RULE_ID,
        title=(f"torch.compile compiled {plural(graphs, 'graph')} before recording, but the "
               "recorded "
               "steps ran no compiled code"),
        evidence={"graphs_compiled_before_recording": graphs, "recompile_limit": limit,
                  "compiled_regions_per_step": 0.0, "steps": len(model.steps)},
        recommendation=(
            "The script uses torch.compile, yet no Torch-Compiled Region ran in the recorded "
            "steps: the compiled frames fell back to eager, most often because they recompiled "
            f"past dynamo's recompile limit ({limit}) on changing shapes (the script's stderr "
            "then says 'torch._dynamo hit config.recompile_limit'), or the step calls the "
            "uncompiled module. Mark the dynamic dimension or use fixed shapes, and call the "
            "compiled module in the step."),
        snippet=("torch._dynamo.mark_dynamic(x, 0)  # or torch.compile(model, dynamic=True)\n"
                 "# find the guard: TORCH_LOGS=recompiles python train.py"),
        precondition="Steps that were meant to run compiled code.",
        estimated_saving_pct=0.0,
        saving_basis="not estimable: no compiled step was recorded to compare with",
        docs=DOCS,
    ))


def _is_region(name: str) -> bool:
    return name.startswith(REGION)


def _is_compile(name: str) -> bool:
    return name.startswith(COMPILE_PREFIXES) and "_data" not in name


def _id_key(fc: tuple[str, str]) -> tuple[int, int]:
    return int(fc[0]), int(fc[1])


def _outermost(events: pd.DataFrame) -> pd.DataFrame:
    """Compile ranges not nested in another one (the two names wrap each other)."""
    if events.empty:
        return events
    events = events.sort_values(["ts", "dur"], ascending=[True, False])
    end = events["ts"] + events["dur"]
    covered = end.cummax().shift(fill_value=float("-inf"))
    return events[events["ts"] >= covered]


def _graph_breaks(model: TraceModel) -> dict[str, int]:
    """Graph breaks dynamo counted while recording, by reason (`stallscope run` metadata)."""
    dynamo = model.trace.capture.get("dynamo")
    breaks = dynamo.get("graph_breaks") if isinstance(dynamo, dict) else None
    if not isinstance(breaks, dict):
        return {}
    counted = {k: v for k, v in breaks.items() if isinstance(v, int) and not isinstance(v, bool)}
    return {str(k): int(v) for k, v in sorted(counted.items(), key=lambda kv: -kv[1])
            if isinstance(v, int | float) and v > 0}


def _breaks_text(breaks: dict[str, int]) -> str:
    top = "; ".join(f"{reason} ({count}x)" for reason, count in list(breaks.items())[:MAX_REASONS])
    return (f"Dynamo counted {plural(sum(breaks.values()), 'graph break')} while recording: "
            f"{top}. Each "
            "break splits the model into separately compiled graphs with Python between them; "
            "torch._dynamo.explain(model)(inputs) lists them, fullgraph=True makes one an error.")


SPEC = RuleSpec(
    id=RULE_ID,
    title="torch.compile compiles inside the recorded steps",
    summary="torch.compile compiles (or recompiles) inside the recorded steps, or gave up and "
            "runs the frame eagerly",
    check=compile_in_steps,
    thresholds={"RECOMPILE_LIMIT": RECOMPILE_LIMIT},
    order=170,
    metric=Metric("compiling inside the recorded steps", "ms in the steps",
                  evidence_key("compile_ms_in_steps"), "compile_share_pct"),
)
