"""report.html: one self-contained page (inline CSS and SVG, no network), rendered by jinja2.

Every string a template prints goes through `display` (controls and bidirectional overrides
dropped, cut to MAX_TEXT characters) and then autoescaping; the data block is embedded with
`tojson`, which escapes `<`, `>` and `&` so a kernel name cannot close the script element, and
its strings are cut the same way (report.json beside the page keeps them whole).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache
from markupsafe import Markup, escape

from stallscope.diagnose.finding import Finding
from stallscope.diagnose.registry import flagged
from stallscope.report.anatomy_view import loader_views
from stallscope.report.build import Report
from stallscope.report.evidence_view import (
    NAME_RUN,
    evidence_rows,
    evidence_value,
    key_text,
    text_cell,
)
from stallscope.report.json_writer import report_data
from stallscope.report.kernel_view import gpu_summary_rows, host_rows, kernel_chart
from stallscope.report.labels import (
    alone_phrase,
    baseline,
    baseline_name,
    category_name,
    floor_phrase,
    loader_story,
    measured_phrase,
    others_taken_out,
    path_drop,
    pct_of,
    plan_of,
    profiler_phrase,
    range_phrase,
    rounds_note,
    saving_label,
    shared_saving,
    span,
    steps_phrase,
    with_before,
)
from stallscope.report.memory_view import MAX_ROWS as MEMORY_ROWS
from stallscope.report.memory_view import device_cells, host_item, worker_items
from stallscope.report.rank_table import ROWS_SHOWN, check_rows, rank_view
from stallscope.report.recording import recording_lines
from stallscope.report.watch_chart import watch_chart
from stallscope.report.watch_lead import counts as watch_counts
from stallscope.report.watch_lead import load_items, regime_labels
from stallscope.report.watch_lead import title as watch_title
from stallscope.text import MAX_CODE, MAX_TEXT, bounded, clean, clip
from stallscope.trace.model import HOST_CATEGORIES
from stallscope.units import fixed_size, millis, ms, percent, share_text

COLORS = {
    "dataloader": "#d62728",
    "sync": "#ff7f0e",
    "h2d_copy": "#9467bd",
    "other_copy": "#8c564b",
    "host_compute": "#1f77b4",
    "kernel": "#2ca02c",
    "memcpy": "#17becf",
    "memset": "#bcbd22",
}
LEGEND = {k: category_name(k) for k in COLORS}  # the names every view uses (labels.py)
# Chart geometry, in SVG user units. The charts scale to the page's width; 720 units is the
# content width of an 800 px window (785 px inside its scroll bar, less .75rem padding each
# side: 761 px) and of a printed A4/Letter page (about 720 px at 96 dpi), so text set at 11 units
# shows at 11 px or more there (tests/test_browser.py measures it), and larger on a wider screen.
CHART_WIDTH = 720
CHAR_WIDTH = 6.6  # average width of a 12-unit system-ui glyph; sizes the label column
MAX_LABEL_CHARS = 44
# A trace's file name where room is short (a table cell, a chart label): cut in the middle, the
# start and the end kept (recordings of one run differ at the end: "..._worker0.1623143089861"),
# the whole name in a tooltip and in report.json.
TRACE_LABEL_CHARS = 28
CHART_TRACE_CHARS = 24
_LONG_RUN = re.compile(rf"\S{{{NAME_RUN + 1},}}")  # a name in prose too long to wrap
_TRACE_SUFFIX = re.compile(r"(\.pt)?\.trace\.json(\.gz)?$|\.json(\.gz)?$")
LANE_HEIGHT = 22
# The per-step chart: a row per step, tighter past a dozen steps so that 24 steps still end
# inside the first screen at 1280 x 900 (the CPU samples' reports).
STEP_ROW = 20
STEP_ROW_TIGHT = 16
TIGHT_AFTER_STEPS = 12
SHORT_NAME_CHARS = 90
# The fix-plan waterfall: one row per bar, room after each bar for "116.1 ms (−34.3%)", and a
# line under the bars for the floor's label.
PLAN_ROW = 24
PLAN_VALUE_W = 130
PLAN_FLOOR_LABEL_H = 20
_TEMPLATE_ARGS = re.compile(r"<[^<>]*>")
_PARAMS = re.compile(r"\([^()]*\)")


def templates_dir() -> Path:
    """Inside an installed wheel the templates ship in the package; in a checkout (editable
    install) they live at the repository's top level."""
    packaged = Path(__file__).resolve().parent.parent / "templates"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "templates"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("stallscope's report templates are missing from this installation")


def jinja_env() -> jinja2.Environment:
    """The one way stallscope's pages are rendered: autoescaped, every printed string cleaned
    and bounded (`display`), strict about missing data."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        bytecode_cache=_bytecode_cache(),
        autoescape=True,
        finalize=display,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["code"] = code_text
    env.filters["path"] = path_text
    env.filters["prose"] = prose_text
    env.filters["percent"] = percent  # shares and durations as every other writer prints them
    env.filters["millis"] = millis
    env.globals["clipped"] = clipped
    env.globals["category_name"] = category_name
    env.globals["regime_names"] = regime_labels
    env.globals["load_items"] = load_items
    return env


class _Cache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept between runs: compiling report.html is a large part of
    writing a small report. Jinja keys an entry by the template's source checksum and its own
    and Python's versions, so an edited template is compiled again; a cache that cannot be read
    or written is passed by, never an error."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError, EOFError, ValueError):
            super().load_bytecode(bucket)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """The user's cache folder for compiled templates ($XDG_CACHE_HOME or ~/.cache, then
    stallscope/templates); none when it cannot be made, or STALLSCOPE_NO_CACHE is set."""
    if os.environ.get("STALLSCOPE_NO_CACHE"):
        return None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(root) / "stallscope" / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _Cache(str(folder))


def display(value: Any) -> Any:
    """What a template prints for `value`: strings cleaned (no controls, no bidirectional
    overrides) and cut to MAX_TEXT characters, so a hostile name stays inert and one 100 kB name
    cannot blow up the page; markup the templates build themselves passes unchanged."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return clip(clean(value), MAX_TEXT)


def trace_label(name: str, limit: int = TRACE_LABEL_CHARS) -> str:
    """A trace's name in at most `limit` characters: unchanged when it fits, else without its
    `.pt.trace.json.gz` ending and cut in the middle, so two recordings of one run still read
    apart."""
    if len(name) <= limit:
        return name
    stem = _TRACE_SUFFIX.sub("", name) or name
    return mid_cut(stem, limit)


def mid_cut(text: str, limit: int) -> str:
    """`text` in `limit` characters, its middle replaced by an ellipsis (more of the end kept)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 5
    tail = limit - 1 - head
    return text[:head] + "\u2026" + text[len(text) - tail:]


def clipped(name: str, limit: int = TRACE_LABEL_CHARS) -> Markup:
    """A long name where room is short: its short form on one line (CSS cuts it further with an
    ellipsis where even that does not fit), the whole name in the tooltip; no mid-word wrap."""
    full = display(str(name))
    return Markup('<span class="clip" title="{}">{}</span>').format(full, trace_label(full, limit))


def code_text(text: str) -> Markup:
    """A command to copy, escaped: cut only at MAX_CODE, past where `display` would cut it;
    a long path in it may wrap after a `/` (not copied: `<wbr>` is no character)."""
    return _slash_breaks(escape(clip(clean(text), MAX_CODE)))


def prose_text(text: str) -> Markup:
    """A sentence as `display` prints it, but a name in it too long to wrap between words (a
    120-character kernel name in a verdict) is kept on one line: cut with an ellipsis where the
    line is shorter, whole in its tooltip, rather than widening the page or breaking mid-word."""
    text = display(str(text))
    parts, last = [], 0
    for m in _LONG_RUN.finditer(text):
        parts += [escape(text[last:m.start()]),
                  Markup('<span class="clip" title="{}">{}</span>').format(m.group(), m.group())]
        last = m.end()
    return Markup("").join([*parts, escape(text[last:])])


def path_text(text: str) -> Markup:
    """A file path or call site, escaped, that wraps after a `/` rather than mid-name."""
    return _slash_breaks(escape(display(str(text))))


def _slash_breaks(escaped: Markup) -> Markup:
    return Markup(str(escaped).replace("/", "/<wbr>"))


def render_html(report: Report) -> str:
    env = jinja_env()
    env.filters["short_name"] = short_name
    env.filters["ms"] = partial(ms, missing="")
    env.filters["diff_lines"] = diff_lines
    env.filters["pretty_json"] = pretty_json
    env.globals["evidence_value"] = evidence_value
    env.globals["evidence_rows"] = evidence_rows
    env.filters["key"] = key_text
    env.filters["cell"] = lambda text: text_cell(str(text), MAX_TEXT)
    env.filters["delta"] = delta
    env.filters["saved"] = saved
    env.filters["share"] = share_text
    env.filters["span"] = lambda item: span(item, "\u2013")
    template = env.get_template("report.html.j2")
    return template.render(
        report=report,
        data=bounded(report_data(report)),
        chart=_steps_chart(report.steps),
        timeline=_timeline_chart(report.timeline),
        colors=COLORS,
        legend=LEGEND,
        loader_story=loader_story(report),
        categories=HOST_CATEGORIES,
        headline=_headline(report),
        fix_plan=_fix_plan(report),
        watch_chart=watch_chart(report.watch) if report.watch else None,
        watch_title=watch_title(report.watch, _lead_title(report)) if report.watch else None,
        watch_counts=watch_counts(report.watch) if report.watch else None,
        what_if=_what_if(report.what_if, report.plan),
        savings=[_saving_view(report, f) for f in report.findings],
        others=[others_of(report, f) for f in report.findings],
        reproduce=report.reproduce_command,
        trace_files=[t["path"] for t in report.traces],
        gpus=_gpu_lines(report.environment.get("devices", [])),
        loader_views=loader_views(report.dataloaders),
        rank_view=rank_view(report),
        kernels=kernel_chart(report),
        gpu_rows=gpu_summary_rows(report),
        host_comm_rows=host_rows(report),
        checks=check_rows(report),
        trace_rows=report.traces[:ROWS_SHOWN],
        recording=_recording(report),
        memory=_memory(report),
    )


def _memory(report: Report) -> dict[str, Any] | None:
    """The memory section (report/memory_view.py): its sentence, device table, host and
    worker lines."""
    mem = report.memory
    if not mem:
        return None
    devices = sorted(mem["devices"], key=lambda r: -(r["peak_pct_of_capacity"] or 0))
    return {"sentence": mem["sentence"], "devices": [device_cells(r) for r in devices][
        :MEMORY_ROWS], "several": len(report.traces) > 1, "host": host_item(mem),
            "workers": worker_items(mem, len(report.traces) > 1)}


def _lead_title(report: Report) -> str | None:
    """The finding a watch page's title names: the lead, unless every finding is minor."""
    if report.lead is None or report.verdict_id in ("no-bottleneck", "no-finding"):
        return None
    return report.lead.title


def _recording(report: Report) -> dict[str, Any] | None:
    """What recording cost (report/recording.py), its names in code spans."""
    shown = recording_lines(report.traces)
    if shown is None:
        return None
    text, others = shown
    parts = display(text).split("`")
    html = Markup("").join(escape(p) if i % 2 == 0 else Markup("<code>%s</code>") % p
                           for i, p in enumerate(parts))
    return {"text": html, "others": others}


def pretty_json(value: Any) -> Markup:
    """Nested evidence as readable, escaped JSON text: one list item per line, names kept as
    written (`tojson` would show `<` as \\u003c) but cleaned and cut one by one, so the
    evidence around a long name survives."""
    value = bounded(value, SHORT_NAME_CHARS * 4)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        text = "\n".join(json.dumps(v, ensure_ascii=False, default=str) for v in value)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return escape(clean(text))


def _gpu_lines(devices: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Identical GPUs counted once: "2 x <name> (sm 7.0, 32 GiB, 80 SMs)"."""
    lines: dict[str, int] = {}
    for d in devices:
        facts = []
        if _number(d.get("computeMajor")):
            facts.append(f"sm {d['computeMajor']}.{d.get('computeMinor', 0)}")
        if _number(d.get("totalGlobalMem")) and d["totalGlobalMem"] > 0:
            facts.append(fixed_size(d['totalGlobalMem'], 'GiB', 0))
        if _number(d.get("numSms")) and d["numSms"] > 0:
            facts.append(f"{d['numSms']} SMs")
        text = f"{d.get('name', 'unknown GPU')}" + (f" ({', '.join(facts)})" if facts else "")
        lines[text] = lines.get(text, 0) + 1
    return [(count, text) for text, count in lines.items()]


def _number(value: Any) -> bool:
    """A device property the trace wrote as a number (a hostile trace may write anything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def short_name(name: str, limit: int = SHORT_NAME_CHARS) -> str:
    """A C++ kernel name a reader can scan: parameters, then template arguments, collapsed to
    `(…)` / `<…>` only as far as needed, then cut. The full name stays in a title."""
    text = name[5:] if name.startswith("void ") else name
    for pattern, mark in ((_PARAMS, "(…)"), (_TEMPLATE_ARGS, "<…>")):
        if len(text) <= limit:
            break
        previous = None
        while previous != text:  # innermost first, until nested brackets are gone
            previous, text = text, pattern.sub("\x00", text)
        text = text.replace("\x00", mark)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diff_lines(snippet: str) -> list[tuple[str, str]] | None:
    """Lines tagged "del"/"add"/"ctx" when the snippet is written as a -/+ diff, else None."""
    lines = snippet.split("\n")
    if not any(line.startswith(("-", "+")) for line in lines):
        return None
    tag = {"-": "del", "+": "add"}
    return [(tag.get(line[:1], "ctx"), line) for line in lines]


def delta(pct: float) -> str:
    """A signed change in %, with a true minus sign: "−34.3%", "+0.0%"."""
    return f"{percent(pct, signed=True)}".replace("-", "\u2212")


def saved(pct: float) -> str:
    """A saving (a positive share of the step) as the change it makes: "−34.3%"."""
    return delta(-pct)


def others_of(report: Report, f: Finding) -> list[dict[str, Any]]:
    """The other recordings' figures of a cause (Finding.recordings, less the one shown),
    each with its saving as the table says it."""
    return [{**r, "saving": saving_label(_as_finding(f, r))[1]}
            for r in f.recordings if r["trace"] != f.trace]


def _as_finding(f: Finding, r: dict[str, Any]) -> Finding:
    """One recording's figures of `f` as a Finding, for the labels that read one."""
    return Finding(id=f.id, title=r["title"], evidence=r["evidence"], recommendation="",
                   snippet="", precondition="", estimated_saving_pct=r["estimated_saving_pct"],
                   saving_basis="", trace=r["trace"], severity=r["severity"],
                   caused_by=r.get("caused_by") or "", saving_kind=r["saving_kind"],
                   predicted_step_us=r["predicted_step_us"], plan_rank=r["plan_rank"])


def _headline(report: Report) -> dict[str, Any]:
    """The figures of the summary strip: step time, main finding, what fixing it can save and
    how busy the GPUs were, all of one trace (Report.shown_summary): the lead's, named, when
    the page covers several."""
    top = report.lead
    shown = report.shown_summary
    gpu = shown.get("gpu_pct") or {}
    busy = [100.0 - parts.get("idle", 0.0) for parts in gpu.values()]
    return {
        "step_ms": ms(shown["step_time_us"]["median"], missing="")
        if shown.get("step_time_us") else None,
        "top": top,
        # The step's bound (gpu-bound): the saving card says only faster GPU work helps.
        "top_is_bound": bool(top and flagged(top.id, "bound")),
        "top_saving": _saving_view(report, top) if top else None,
        "gpu_busy_pct": round(sum(busy) / len(busy), 1) if busy else None,
        "gpu_idle_pct": round(100.0 - sum(busy) / len(busy), 1) if busy else None,
        "whose": whose(report),
        # The step without the profiler's cost (diagnose/plan.py), when it differs.
        "unprofiled_ms": ms(baseline(report.plan), missing="") if report.plan and profiler_phrase(
            report.plan) else None,
        "unloaded": bool(report.plan and others_taken_out(report.plan)),
    }


def whose(report: Report) -> dict[str, Any] | None:
    """Whose figures the page quotes when it covers several traces: the lead trace (its label,
    and its rank in a job), and where the others' are."""
    label = report.figures_from
    if label is None:
        return None
    lead = report.lead_trace or {}
    return {"label": label, "rank": lead.get("rank") if report.ranks else None,
            "others": len(report.traces) - 1}


def _saving_view(report: Report, f: Finding) -> dict[str, Any]:
    """How one finding's saving is shown: its kind (replayed / counted / upper bound), the
    table cell, and, when replayed in the plan, the steps before and after its change, so the
    page never prints a bound where a prediction is expected, or the other way round."""
    kind, text = saving_label(f)
    plan = plan_of(report, f.trace)
    entry = report.plan_entry(f)
    before = next((b for e, b in with_before(plan) if e is entry), None) if plan else None
    return {
        "kind": kind,
        "text": text,
        "entry": entry,
        "before_us": before,
        "saving_text": shared_saving(plan, entry, before, "\u2212", " of the step")
        if plan and entry is not None and before is not None else "",
        "measured_us": baseline(plan) if plan else None,
        "unprofiled": bool(plan and profiler_phrase(plan)),
        "baseline_name": baseline_name(plan) if plan else "",
        "plan_size": len(plan["entries"]) if plan else 0,
        "steps_used": len(plan["steps_used"]) if plan else 0,
        "min_gain_pct": plan["min_gain_pct"] if plan else None,
        "alone": alone_phrase(plan, f, "\u2192"),
    }


def _fix_plan(report: Report) -> dict[str, Any] | None:
    """The "Fix plan" section: the waterfall, the entries with the finding card each comes
    from, and the findings the replay left out. None when there is nothing to plan."""
    plan = report.plan
    if not plan or not plan["entries"]:
        return None
    mine = [(i, f) for i, f in enumerate(report.findings, 1) if f.trace == plan["trace"]]
    card = {f.id: i for i, f in mine}
    alone = {f.id: alone_phrase(plan, f, "\u2192") for _, f in mine}
    entries = [{**e, "before_us": before, "card": card.get(e["id"]),
                "alone": alone.get(e["id"], ""),
                "saving_text": shared_saving(plan, e, before, "\u2212", " of the step")}
               for e, before in with_before(plan)]
    floor = floor_phrase(plan)
    return {
        "plan": plan,
        "entries": entries,
        "chart": _plan_chart(plan, floor, "measured" if measured_phrase(report, plan)
                             .startswith("measured") else "replayed steps, measured"),
        "floor": floor,
        "steps": steps_phrase(report, plan),
        "measured": measured_phrase(report, plan),
        "multi": len(report.traces) > 1,
        "not_replayed": [(k, v, card.get(k)) for k, v in plan["not_replayed"].items()],
        "left_out": [(f.id, f.predicted_step_us, i) for i, f in mine
                     if f.predicted_step_us is not None and f.plan_rank is None],
        "min_gain_pct": plan["min_gain_pct"],
        "profiler": profiler_phrase(plan),
        "ranges": range_phrase(plan),
    }


def _plan_chart(plan: dict[str, Any], floor: str, measured: str = "measured") -> dict[str, Any]:
    """A waterfall in SVG units: the measured step (`measured` names it: the replayed steps'
    median where it differs from the recording's median step), then each change's cumulative
    predicted step, the time it takes off drawn beside it, and the floor as a dashed line."""
    rows: list[tuple[str, float, float | None, float | None]] = [
        (measured, plan["measured_step_us"], None, None)]
    if profiler_phrase(plan):  # the profiler's cost taken out: the step the fixes start from
        rows.append((baseline_name(plan), baseline(plan), plan["measured_step_us"],
                     round(100 * (plan["measured_step_us"] - baseline(plan))
                           / plan["measured_step_us"], 1)))
    rows += [(f"{i}. {e['change']}", e["predicted_step_us"], before,
              path_drop(plan, e, before)) for i, (e, before) in enumerate(with_before(plan), 1)]
    labels = [(full, full if len(full) <= MAX_LABEL_CHARS else
               full[: MAX_LABEL_CHARS - 1] + "\u2026") for full, *_ in rows]
    # Labels are set at 11 units but sized as 12-unit text: changes are monospace-like
    # (`=`, `_`) and run wider than the average glyph.
    label_w = max(len(short) for _, short in labels) * CHAR_WIDTH + 12
    plot_w = CHART_WIDTH - label_w - PLAN_VALUE_W
    top = max([plan["measured_step_us"], plan["floor_us"], *(r[1] for r in rows)]) or 1.0
    scale = plot_w / top
    bars = []
    for (full, short), (_, us, prev, pct) in zip(labels, rows, strict=True):
        saved_w = max((prev - us) * scale, 0.0) if prev is not None else 0.0
        bars.append({
            "label": short,
            "full": full,
            "kind": "measured" if prev is None else "predicted",
            "width": max(us * scale, 0.5),
            "saved_x": label_w + us * scale,
            "saved_w": saved_w,
            "end": label_w + us * scale + saved_w,
            "us": us,
            "prev_us": prev,
            "saving_pct": pct,
        })
    height = len(bars) * PLAN_ROW
    floor_x = label_w + plan["floor_us"] * scale
    return {
        "bars": bars,
        "width": CHART_WIDTH,
        "label_w": label_w,
        "row": PLAN_ROW,
        "bars_h": height,
        "height": height + PLAN_FLOOR_LABEL_H,
        "floor_x": floor_x,
        # The floor's label reads away from the nearer edge so it stays inside the chart.
        "floor_anchor": "start" if floor_x < label_w + plot_w / 2 else "end",
        "floor_text": f"floor: {floor}, {ms(plan['floor_us'], missing='')} ms",
    }


def _what_if(what_if: dict[str, Any] | None,
             plan: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """`--what-if` as table rows: measured, replayed unchanged, each change alone, and all of
    them together; each row says whether its number is a measurement or a prediction."""
    if not what_if:
        return None
    rows = [
        {"what": "measured", "kind": "measurement", "us": what_if["measured_step_us"],
         "assumptions": [], "why": None},
        {"what": "replayed as recorded (no change)", "kind": "replay",
         "us": what_if["replayed_step_us"], "assumptions": [], "why": None},
    ]
    base = what_if.get("baseline_step_us")
    paced = rounds_note(plan or {})
    if base and (paced or what_if["measured_step_us"] - base >= 0.01 * what_if["measured_step_us"]):
        said = ["the profiler's cost per recorded op taken out of the host's work "
                "(replay/unprofile.py)"]
        if plan and others_taken_out(plan):
            said.append("the host's wait for a core that other load caused, taken out "
                        "(replay/unload.py)")
        if paced:
            said.append(paced)
        rows.append({"what": f"{baseline_name(plan or {})} (the changes start here)",
                     "kind": "replayed prediction", "us": base, "assumptions": said,
                     "why": None})
    changes = [(f"{c['change']} alone", c) for c in what_if["each"]]
    if len(what_if["each"]) > 1:
        changes.append(("all together: " + " + ".join(what_if["changes"]), what_if))
    for what, c in changes:
        us = c.get("predicted_step_us")
        rows.append({
            "what": what,
            "kind": "replayed prediction" if us is not None else "not replayed",
            "us": us,
            "range": c.get("predicted_range_us"),
            "assumptions": c.get("assumptions", []),
            "why": c.get("not_replayed"),
        })
    for r in rows:
        predicted = r["us"] is not None and r["kind"] != "measurement"
        r["pct"] = pct_of(what_if, r["us"]) if predicted else None
    return rows


def _steps_chart(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars in SVG units, with a label column as wide as the longest (capped) label."""
    labels = []
    for s in steps:
        full = f"{s['name']} ({s['trace']})" if s.get("trace") else s["name"]
        short = (f"{s['name']} ({trace_label(s['trace'], CHART_TRACE_CHARS)})"
                 if s.get("trace") else s["name"])
        short = short if len(short) <= MAX_LABEL_CHARS else mid_cut(short, MAX_LABEL_CHARS)
        labels.append((full, short))
    label_w = max((len(short) for _, short in labels), default=10) * CHAR_WIDTH + 12
    value_w = 70  # room for the duration printed after each bar
    plot_w = CHART_WIDTH - label_w - value_w
    longest = max((s["duration_us"] for s in steps), default=1.0) or 1.0
    bars = []
    for (full, short), s in zip(labels, steps, strict=True):
        x = label_w
        parts = []
        for c in HOST_CATEGORIES:
            w = plot_w * s["breakdown_us"][c] / longest
            if w > 0:
                parts.append({"category": c, "x": x, "width": w, "us": s["breakdown_us"][c]})
            x += w
        bars.append({"label": short, "full": full, "parts": parts, "end": x,
                     "duration_us": s["duration_us"]})
    row = STEP_ROW if len(bars) <= TIGHT_AFTER_STEPS else STEP_ROW_TIGHT
    bar_h = row - 6
    axis_y = len(bars) * row + 4
    ticks = [{"x": label_w + plot_w * t / longest, "ms": _tick_label(t)}
             for t in round_ticks(longest)]
    return {"bars": bars, "width": CHART_WIDTH, "label_w": label_w, "row": row,
            "bar_h": bar_h, "text_dy": 3 + bar_h // 2 + 4, "axis_y": axis_y, "ticks": ticks,
            "height": axis_y + 18}


def round_ticks(limit_us: float, target: int = 5) -> list[float]:
    """Tick positions (us) at round milliseconds (1, 2, 2.5 or 5 times a power of ten), about
    `target` of them from 0 up to `limit_us`, so a reader can read a bar off the axis."""
    if not 0 < limit_us < math.inf:
        return [0.0]
    raw = limit_us / 1000.0 / target
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    count = int(limit_us / 1000.0 / step + 1e-9)
    return [k * step * 1000.0 for k in range(count + 1)]


def _tick_label(us: float) -> str:
    """A round tick in ms, with no trailing zeros (0, 2.5, 50, 0.05)."""
    return f"{us / 1000.0:.6g}"


def _timeline_chart(timeline: dict[str, Any]) -> dict[str, Any] | None:
    """The representative step's lanes in SVG units, with time ticks at round milliseconds."""
    if not timeline or not timeline.get("lanes"):
        return None
    label_w = 120
    plot_w = CHART_WIDTH - label_w - 10
    dur = timeline["duration_us"] or 1.0
    scale = plot_w / dur
    lanes = []
    for i, lane in enumerate(timeline["lanes"]):
        y = 18 + i * LANE_HEIGHT
        rects = [
            {
                "x": label_w + r["start_us"] * scale,
                "w": max(r["dur_us"] * scale, 0.5),
                "kind": r["kind"],
                "name": r.get("name"),
                "count": r.get("count", 1),
                "ms": ms(r["dur_us"], missing=""),
            }
            for r in lane["rects"]
        ]
        lanes.append({"label": lane["label"], "y": y, "rects": rects,
                      "busy_pct": lane["busy_pct"]})
    ticks = [{"x": label_w + t * scale, "ms": _tick_label(t)} for t in round_ticks(dur)]
    kinds = [k for k in COLORS if any(r["kind"] == k for ln in lanes for r in ln["rects"])]
    return {
        "lanes": lanes,
        "ticks": ticks,
        "kinds": kinds,
        "width": CHART_WIDTH,
        "label_w": label_w,
        "height": 18 + len(lanes) * LANE_HEIGHT + 6,
        "lane_h": LANE_HEIGHT - 6,
    }
