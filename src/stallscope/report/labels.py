"""How every writer names a number: measured, replayed, or an upper bound.

report.html, report.md and the terminal say the same thing about each figure, with the same
words, from the plan's and the findings' own fields (diagnose/plan.py sets them).
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose.finding import Finding
from stallscope.diagnose.plan import not_estimated
from stallscope.diagnose.registry import flagged
from stallscope.report.build import SAME_SHARE_PCT, Report
from stallscope.text import plural
from stallscope.units import ms, percent, share_text

# A plan's steps are named one by one up to this many, else as "first ... last".
MAX_STEP_NAMES = 4


def saving_label(f: Finding) -> tuple[str, str]:
    """What a finding's saving figure is, and a short cell for it: "replayed" (a prediction
    from replaying the steps with its change), "counted" (its time is another finding's to win
    back) or "upper bound" (the rule's bound; the replay could not model the change). A reader
    must never take a bound for a prediction. The text holds only numbers and finding ids
    (stallscope's own), so writers print it unescaped."""
    pct = share_text(f.estimated_saving_pct)
    if f.saving_kind == "replayed":
        return "replayed", f"{pct} (replayed)"
    if f.saving_kind == "counted":
        return "counted", f"counted in {f.caused_by}"
    if not_estimated(f):
        return "upper bound", "not estimated"
    return "upper bound", f"{pct} (upper bound)"


def plan_of(report: Report, trace: str) -> dict[str, Any] | None:
    """The fix plan of one trace (None when it had no step to replay)."""
    return next((t.get("plan") for t in report.traces if t["label"] == trace), None)


def floor_phrase(plan: dict[str, Any]) -> str:
    """What the plan's floor measures (no fix in the plan takes the step below it)."""
    return "busiest GPU's remaining work" if plan["floor_kind"] == "gpu" else "host work"


def steps_phrase(report: Report, plan: dict[str, Any]) -> str:
    """Which recorded steps the plan's medians use, and why some are left out, so a reader
    can match the measured step with their own timing."""
    used = plan["steps_used"]
    names = ", ".join(used) if len(used) <= MAX_STEP_NAMES else f"{used[0]} ... {used[-1]}"
    total = next((t["summary"]["steps"] for t in report.traces if t["label"] == plan["trace"]),
                 len(used))
    if plan.get("steps_note"):
        return f"{names} ({len(used)} of {total} recorded steps; {plan['steps_note']})"
    return f"{names} ({len(used)} step{'s' if len(used) != 1 else ''})"


def measured_phrase(report: Report, plan: dict[str, Any], arrow_free: bool = True) -> str:
    """The replayed steps' measured median, named as what it is: the plan leaves out a first
    step carrying earlier GPU work, so its median can differ from the recording's median step,
    which the page quotes as its step time; then both are said, each by its window."""
    measured = plan["measured_step_us"]
    summary: dict[str, Any] = next(
        (t["summary"] for t in report.traces if t["label"] == plan["trace"]), {})
    median = (summary.get("step_time_us") or {}).get("median")
    if median is None or ms(median) == ms(measured):
        return f"measured {ms(measured)} ms per step"
    return (f"those steps' own median {ms(measured)} ms (measured; the median step, "
            f"{ms(median)} ms, is over all {summary['steps']} recorded steps)")


def baseline(plan: dict[str, Any]) -> float:
    """The step the plan's fixes start from: the measured one without the profiler's cost
    (diagnose/plan.py), or the measured one in a report written before that existed."""
    return plan.get("baseline_step_us") or plan["measured_step_us"]


def with_before(plan: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """Each plan entry with the step predicted before it (the baseline for the first): every
    writer shows an entry as before -> after."""
    befores = [baseline(plan), *(e["predicted_step_us"] for e in plan["entries"])]
    return list(zip(plan["entries"], befores, strict=False))


def path_drop(plan: dict[str, Any], entry: dict[str, Any], before: float) -> float:
    """What an entry takes off the step on the plan's path (before -> its predicted step), in %
    of the baseline step."""
    return 100.0 * (before - entry["predicted_step_us"]) / (baseline(plan) or 1.0)


def shared_saving(plan: dict[str, Any], entry: dict[str, Any], before: float,
                  minus: str = "-", unit: str = "") -> str:
    """An entry's saving as every writer prints it after "before -> after": "-12.3%" when its
    share of the plan's saving (diagnose/plan.py `_by_share`) is the drop its line shows; where
    the change pays off beside others, both: "-6.1% here; its share of the plan: -29.6%".
    `unit` follows the first figure (" of the step")."""
    share, drop = entry["saving_pct"], path_drop(plan, entry, before)
    if abs(share - drop) < SAME_SHARE_PCT:
        return f"{minus}{percent(share)}{unit}"
    return f"{minus}{percent(drop)}{unit} here; its share of the plan: {minus}{percent(share)}"


def alone_phrase(plan: dict[str, Any] | None, f: Finding, arrow: str = "->") -> str:
    """The step with a finding's change alone, labelled as such; "" for the plan's first
    change (alone is its plan line) or where nothing was replayed. Where alone it saves nothing
    (it pays off only once the plan's earlier changes are made: workers first, then the
    copies), that is said, so the figure never reads as contradicting its saving in the plan."""
    us = f.predicted_step_us
    if us is None or not plan or f.plan_rank == 1:
        return ""
    base = baseline(plan)
    drop = 100.0 * (base - us) / base if base > 0 else 0.0
    said = f"{ms(base)} {arrow} {ms(us)} ms"
    if drop >= SAME_SHARE_PCT:
        return f"this change alone: {said} ({share_text(drop)} less)"
    if f.plan_rank is None:
        return f"this change alone saves nothing ({said})"
    return (f"this change alone saves nothing ({said}): it pays off once the plan's changes "
            "before it are made")


def span(item: dict[str, Any], dash: str = "-") -> str:
    """A prediction's range as every writer prints it after the median: " (21.0-29.3)"; ""
    for a report written before predictions had ranges."""
    rng = item.get("predicted_range_us")
    return f" ({ms(rng[0])}{dash}{ms(rng[1])})" if rng else ""


def predicted(item: dict[str, Any], dash: str = "-", inside: bool = False) -> str:
    """A predicted step with its range: "about 25.1 ms (21.0-29.3)", or inside brackets of the
    writer's own "about 25.1 ms, range 21.0-29.3"."""
    rng = item.get("predicted_range_us")
    if not rng:
        return f"{ms(item.get('predicted_step_us'))} ms"
    if inside:
        return (f"about {ms(item['predicted_step_us'])} ms, range "
                f"{ms(rng[0])}{dash}{ms(rng[1])}")
    return f"about {ms(item['predicted_step_us'])} ms{span(item, dash)}"


def range_phrase(plan: dict[str, Any]) -> str:
    """What the ranges after the predictions are, where a reader first meets them."""
    error = plan.get("model_error_pct")
    if error is None:
        return ""
    return ("Each prediction is the median of the replayed steps; in brackets, a range from their "
            f"first to their third quartile, widened by {percent(error, 0)} on each side (the "
            "replay's measured error against plain after-timings: docs/replay.md)")


def pct_of(plan: dict[str, Any], us: float) -> float:
    """`us` as a change from the plan's baseline step, in % (negative: faster)."""
    base = baseline(plan) or 1.0
    return 100.0 * (us - base) / base


def profiler_phrase(plan: dict[str, Any]) -> str:
    """The baseline and how it follows from the measured step, in one clause; "" when the
    profiler cost the recorded steps next to nothing (under 1%) and nothing else moved it."""
    cost = plan.get("profiler") or {}
    base, measured = baseline(plan), plan["measured_step_us"]
    rounds = rounds_note(plan)
    if not rounds and (not cost or measured - base < 0.01 * measured):
        return ""
    parts = []
    if cost:
        how = ("measured in this run" if cost.get("measured")
               else "assumed, as this trace does not say")
        parts.append(f"{cost['ops_per_step']:.0f} recorded host ops per step at "
                     f"{cost['op_us']:.1f} us each, {how}")
    if _others(plan):
        load = plan["load"]
        parts.append(f"{percent(load['others_share_pct'], 0)} of the host's time, the part of "
                     f"its wait for a core ({percent(load['wait_share_pct'], 0)} of its runnable "
                     "time, from the kernel's run-queue figures) that other load caused, "
                     f"beyond the {percent(load['own_share_pct'], 0)} this run's own threads on "
                     f"its {plural(load['cores'], 'core')} explain")
    if rounds:
        parts.append(rounds)
    return f"{baseline_name(plan)} about {ms(base)} ms (predicted: {'; and '.join(parts)})"


def _others(plan: dict[str, Any]) -> bool:
    load = plan.get("load") or {}
    return bool(load.get("others_share_pct")) and load.get("step_cost_us", 0) > 0


def _rounds(plan: dict[str, Any]) -> bool:
    """The plan replays a loader whose workers lag at their pace (diagnose/plan.py)."""
    rounds = plan.get("rounds") or {}
    return bool(rounds.get("note"))


def others_taken_out(plan: dict[str, Any]) -> bool:
    """The host's wait that other load caused is out of the baseline (replay/unload.py)."""
    return _others(plan)


def rounds_note(plan: dict[str, Any]) -> str | None:
    """How the baseline puts a lagging loader's round at the workers' pace, or None."""
    return (plan.get("rounds") or {}).get("note") if _rounds(plan) else None


def baseline_name(plan: dict[str, Any]) -> str:
    """What the step the fixes start from leaves out, and what it adds."""
    name = ("without the profiler or other load" if _others(plan)
            else "without the profiler")
    return name + (", at the DataLoader workers' pace" if _rounds(plan) else "")


# One name per category in every view (HTML, Markdown, terminal, TensorBoard text; report.json
# carries this map as `category_names`). `dataloader` is all the time the training thread spends
# inside DataLoader `__next__`; the dataloader-bound finding's figure is the part of it during
# which no GPU work ran (LOADER_WAIT), which is what a faster loader can win back.
LOADER_TIME = "time in the loader"
LOADER_WAIT = "loader wait (no GPU work)"
CATEGORY_NAMES = {
    "dataloader": LOADER_TIME,
    "sync": "waiting for the GPU (sync)",
    "h2d_copy": "host-to-device copies",
    "other_copy": "other copies",
    "host_compute": "host compute",
    "kernel": "GPU kernels",
    "memcpy": "GPU copies",
    "memset": "GPU memsets",
    "idle": "GPU idle",
}


def category_name(key: str) -> str:
    return CATEGORY_NAMES.get(key, key.replace("_", " "))


def loader_story(report: Report) -> str | None:
    """One sentence relating the two loader figures, where a reader sees both: the breakdown's
    time in the loader and the dataloader-bound finding's loader wait (no GPU work)."""
    f = next((f for f in report.findings if flagged(f.id, "loader_story")), None)
    if f is None:
        return None
    time_pct, wait_pct = f.evidence.get("loader_share_pct"), f.evidence.get("wait_share_pct")
    if not isinstance(time_pct, (int, float)) or not isinstance(wait_pct, (int, float)):
        return None
    if round(time_pct, 1) == round(wait_pct, 1):
        return (f"{LOADER_TIME.capitalize()}: {percent(time_pct)} of the step, all of it "
                f"{LOADER_WAIT}.")
    return (f"{LOADER_TIME.capitalize()}: {percent(time_pct)} of the step; {LOADER_WAIT}: "
            f"{percent(wait_pct)}, the part of it with nothing running on the GPU. The verdict and "
            "the saving use the wait: the rest overlapped GPU work queued before, which a faster "
            "loader does not win back.")
