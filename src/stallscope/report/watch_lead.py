"""What a `stallscope watch` report leads with: the stretch of the run that lost the most time,
and the capture that diagnoses it.

A watched run is several stretches, each losing time of its own: a regime (wholerun/regimes.py)
what its steps took over the run's best steady level (measured), a recurring stall
(wholerun/periodic.py) its stalls' excess over a plain step (measured), and the best level
itself what its capture's fix plan predicts the first change saves there (predicted). The report
leads with the one that loses the most, with the diagnosis and plan of the capture recorded in
it: a capture taken while the run was fast must not speak for a run that slowed down later.

A regime that other load on the machine explains (`load` set by the whole-run analysis: other
processes holding the cores, not the script) is shown as "other load": it is no level of the
script's, never the best level, and never leads.
"""

from __future__ import annotations

from typing import Any

from stallscope.text import plural
from stallscope.units import millis, percent

LOAD_LABEL = "other load"


def is_load(regime: dict[str, Any]) -> bool:
    """A stretch other load on the machine explains, as the whole-run analysis marks it."""
    return bool(regime.get("load"))


def regime_labels(regimes: list[dict[str, Any]]) -> list[str]:
    """Each regime's name on every surface: "regime N" counting the script's own only,
    "other load" for the others."""
    labels, n = [], 0
    for r in regimes:
        if is_load(r):
            labels.append(LOAD_LABEL)
        else:
            n += 1
            labels.append(f"regime {n}")
    return labels


def _best_level(section: dict[str, Any]) -> dict[str, Any]:
    """The run's best steady level: its fastest regime of the script's own, else the whole
    run (no regime found, or every one other load)."""
    own = [r for r in section.get("regimes") or []
           if not is_load(r) and r.get("median_step_ms") is not None]
    if own:
        return min(own, key=lambda r: (r["median_step_ms"], r["first_step"]))
    return {"first_step": 1, "last_step": section.get("n_steps") or 0,
            "steps": section.get("measured_steps") or section.get("n_steps") or 0,
            "median_step_ms": section.get("median_step_ms")}


def _inside(capture: dict[str, Any], first: int, last: int) -> bool:
    at = capture.get("first_step")
    return at is not None and first <= at <= last


def _capture_of(stretch: dict[str, Any], captures: list[dict[str, Any]]) -> int | None:
    """The 1-based index of the capture recorded in `stretch`: for a level, one begun inside
    it (the one taken for it first: a regime's own, else the first); for a recurring stall, a
    periodic capture begun among its stalls."""
    first, last = stretch["first_step"], stretch["last_step"]
    if stretch["kind"] in ("periodic", "epoch_start"):
        reach = stretch.get("every_steps") or 0
        found = [i for i, c in enumerate(captures, 1) if c.get("kind") == "periodic"
                 and _inside(c, first - reach, last + reach)]
    else:
        order = {"regime": 0, "first": 1} if stretch["kind"] == "regime" else {"first": 0}
        ranked = sorted((order.get(c.get("kind") or "", 2), i)
                        for i, c in enumerate(captures, 1)
                        if c.get("kind") != "periodic" and _inside(c, first, last))
        found = [i for _, i in ranked]
    return found[0] if found else None


def _plan_saving_share(capture: dict[str, Any] | None) -> float:
    """What the first change of a capture's plan takes off its step, as a share of the step it
    starts from (0 without a plan): the verdict's "Fix first" prediction."""
    entries = (capture or {}).get("plan") or []
    if not entries or not entries[0].get("before_us"):
        return 0.0
    first = entries[0]
    return max(0.0, 1.0 - first["predicted_step_us"] / first["before_us"])


def stretches(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Every stretch that loses time, the best level first (it leads a tie), each with what it
    loses over the run (`lost_ms`, `basis`: measured or predicted) and its capture."""
    captures = section.get("captures") or []
    best = _best_level(section)
    level = {"kind": "steady", "first_step": best["first_step"], "last_step": best["last_step"],
             "steps": best.get("steps") or 0, "step_ms": best.get("median_step_ms"),
             "basis": "predicted"}
    level["capture"] = _capture_of(level, captures)
    share = _plan_saving_share(captures[level["capture"] - 1] if level["capture"] else None)
    level["lost_ms"] = share * (level["step_ms"] or 0.0) * level["steps"]
    out = [level]
    labels = regime_labels(section.get("regimes") or [])
    for r, label in zip(section.get("regimes") or [], labels, strict=True):
        if is_load(r) or r is best or r.get("median_step_ms") is None:
            continue
        lost = (r["median_step_ms"] - (best.get("median_step_ms") or 0.0)) * r["steps"]
        if lost > 0:
            out.append({"kind": "regime", "label": label, "first_step": r["first_step"],
                        "last_step": r["last_step"], "steps": r["steps"],
                        "step_ms": r["median_step_ms"], "lost_ms": lost, "basis": "measured"})
    for p in section.get("periodic") or []:
        if p.get("cost_ms") and p.get("first_step") is not None:
            out.append({"kind": p.get("kind") or "periodic", "first_step": p["first_step"],
                        "last_step": p["last_step"], "every_steps": p.get("every_steps"),
                        "count": p.get("count"), "excess_ms": p.get("median_excess_ms"),
                        "lost_ms": p["cost_ms"], "basis": "measured"})
    for s in out[1:]:
        s["capture"] = _capture_of(s, captures)
    return out


def headline(section: dict[str, Any]) -> dict[str, Any]:
    """report.json's `watch.headline`: the stretch that loses the most (the best level on a
    tie), its share of the run's time, the capture that diagnoses it, and the sentence every
    surface leads with. `diagnosed` is the capture the report's sections describe: the
    headline's, else the first (a stretch no capture recorded)."""
    found = stretches(section)
    lead = max(found, key=lambda s: s["lost_ms"])  # max keeps the first of a tie: the level
    wall = section.get("wall_ms") or 0.0
    lead["lost_ms"] = round(lead["lost_ms"], 3)
    lead["share_of_wall"] = round(lead["lost_ms"] / wall, 4) if wall > 0 else 0.0
    best = found[0]
    lead["best"] = {"first_step": best["first_step"], "last_step": best["last_step"],
                    "step_ms": best["step_ms"]}
    lead["text"] = lead_sentence(section, lead)
    return lead


def diagnosed(section: dict[str, Any]) -> int:
    """The capture the report's findings, plan and charts describe (1-based)."""
    lead = section.get("headline") or {}
    return lead.get("capture") or 1


def _time(ms_: float) -> str:
    return f"{ms_ / 1000:.1f} s" if ms_ >= 1000 else millis(ms_, "whole", unit=True)


def _what(section: dict[str, Any], lead: dict[str, Any]) -> str:
    """The stretch and what it lost, in words."""
    lost = (f"{_time(lead['lost_ms'])}, {percent(100 * lead['share_of_wall'])} of the run's "
            f"time ({lead['basis']})")
    best = lead["best"]
    if lead["kind"] == "regime":
        return (f"Steps {lead['first_step']}–{lead['last_step']} ({lead['label']}) lost the most "
                f"time: a median step of {millis(lead['step_ms'], 'tenths')} ms against "
                f"{millis(best['step_ms'], 'tenths')} ms at the run's best level (steps "
                f"{best['first_step']}–{best['last_step']}), {lost}.")
    if lead["kind"] in ("periodic", "epoch_start"):
        when = ("at each epoch's start" if lead["kind"] == "epoch_start"
                else f"every {lead['every_steps']} steps")
        return (f"A stall {when} lost the most time: {plural(lead['count'] or 0, 'stall')} of "
                f"{millis(lead['excess_ms'], 'tenths')} ms over a plain step, {lost}.")
    own = [r for r in section.get("regimes") or [] if not is_load(r)]
    level = (f"The run held one level: a median step of {millis(lead['step_ms'], 'tenths')} ms "
             f"over {plural(lead['steps'], 'step')} (measured)" if len(own) <= 1 else
             f"The run's best level (steps {lead['first_step']}–{lead['last_step']}, a median "
             f"step of {millis(lead['step_ms'], 'tenths')} ms) loses the most time")
    if lead["lost_ms"] > 0:
        return f"{level}: its first fix would save about {lost}."
    return f"{level}; no slower stretch lost time over it." if len(own) > 1 else f"{level}."


def lead_sentence(section: dict[str, Any], lead: dict[str, Any]) -> str:
    """The headline's sentence: the stretch, what it lost, and whose diagnosis follows."""
    captures = section.get("captures") or []
    k = lead.get("capture")
    if k:
        at = captures[k - 1].get("first_step")
        whose = (f" Capture {k} (from step {at}) recorded it; its diagnosis follows."
                 if len(captures) > 1 else "")
    else:
        at = captures[0].get("first_step") if captures else None
        whose = (" No capture recorded it; the diagnosis that follows is capture 1's"
                 + (f" (from step {at})." if at is not None else "."))
    return _what(section, lead) + whose


def title(section: dict[str, Any], finding_title: str | None) -> str:
    """The page title: the stretch the report leads with, its diagnosis, and the whole run in
    counts."""
    lead = section.get("headline") or {}
    kind = lead.get("kind")
    if kind == "regime":
        head = f"steps {lead['first_step']}–{lead['last_step']} lost the most"
    elif kind in ("periodic", "epoch_start"):
        head = ("a stall at each epoch's start lost the most" if kind == "epoch_start" else
                f"a stall every {lead.get('every_steps')} steps lost the most")
    else:
        head = "its steady level"
    return (f"{head}: {finding_title or 'no bottleneck found'} ({counts(section)})")


def counts(section: dict[str, Any]) -> str:
    """The whole run in counts: steps, regimes of the script's own, stretches of other load,
    captures, recurring stalls."""
    regimes = section.get("regimes") or []
    load = sum(1 for r in regimes if is_load(r))
    parts = [plural(section.get("n_steps") or 0, "step"), plural(len(regimes) - load, "regime")]
    if load:
        parts.append(plural(load, "stretch of other load", "stretches of other load"))
    parts += [plural(len(section.get("captures") or []), "capture"),
              plural(len(section.get("periodic") or []), "recurring stall")]
    return ", ".join(parts)


def plan_text(plan: list[dict[str, Any]] | None) -> str:
    """A capture's plan on one line, each change in backticks: "`num_workers=2` 10.5 -> 6.1
    ms" (replayed predictions, each on top of the ones before)."""
    if plan is None:
        return "no fix plan"
    if not plan:
        return "no change to replay"
    return "; ".join(f"`{e['change']}` {millis(e['before_us'] / 1000, 'tenths')} -> "
                     f"{millis(e['predicted_step_us'] / 1000, 'tenths')} ms" for e in plan)


def capture_items(section: dict[str, Any], verdicts: bool = True) -> list[str]:
    """Each capture in a line: where it began, why, its verdict (or its verdict's id, for the
    terminal), its plan, and which one the report's sections describe."""
    items = []
    for i, c in enumerate(section.get("captures") or [], 1):
        why = f", {c['why']}" if c.get("why") else ""
        said = c["verdict"]["text"] if verdicts else c["verdict"]["id"]
        mine = (" The findings and fix plan of this report are this capture's."
                if i == (section.get("diagnosed") or 1) else "")
        items.append(f"Capture {i} (from step {c.get('first_step')}{why}): {said.rstrip('.')}. "
                     f"Plan (replayed predictions): {plan_text(c.get('plan'))}.{mine}")
    return items


def regime_items(section: dict[str, Any]) -> list[str]:
    """Each regime in a line, named as on the page; those other load explains say so."""
    regimes = section.get("regimes") or []
    items = []
    for r, name in zip(regimes, regime_labels(regimes), strict=True):
        change = f" ({r['change']})" if r.get("change") else ""
        load = ("; other load on the machine explains it, not the script" if is_load(r) else "")
        items.append(f"{name.capitalize()}, steps {r['first_step']}–{r['last_step']}: median "
                     f"{millis(r['median_step_ms'], 'tenths')} ms, loader wait "
                     f"{percent(100 * r['loader_wait_share'], 0)} of the step, "
                     f"{percent(100 * r['share_of_wall'], 0)} of the run's time{change}{load}.")
    return items


def load_items(section: dict[str, Any]) -> list[str]:
    """Each stretch other load on the machine explains (`watch.load`): no regime, no capture."""
    return [f"Steps {s['first_step']}–{s['last_step']}: median "
            f"{millis(s['median_step_ms'], 'tenths')} ms, "
            f"{percent(100 * (s.get('share_of_wall') or 0.0), 0)} of the run's time (measured); "
            f"{str(s.get('why') or 'other load on the machine').rstrip('.')}. Not the script: "
            "no regime, no capture." for s in section.get("load") or []]


def periodic_items(section: dict[str, Any]) -> list[str]:
    """Each recurring stall in a line, with what it cost the run (measured)."""
    items = []
    for p in section.get("periodic") or []:
        when = ("At each epoch's start" if p.get("kind") == "epoch_start"
                else f"Every {p.get('every_steps')} steps")
        fix = (f"; fix: `{p['fix']['change']}`" if p.get("fix") else "")
        items.append(f"{when}: {plural(p.get('count') or 0, 'stall')}, "
                     f"{millis(p.get('median_excess_ms'), 'tenths')} ms over a plain step each, "
                     f"{percent(100 * (p.get('share_of_wall') or 0.0))} of the run's time "
                     f"(measured){fix}.")
    return items
