"""A finding's evidence as small tables with units, for report.html.

Evidence is the rule's own dict (diagnose/*.py); nested values used to show as one line of JSON,
cut mid-string where it grew long. Here a dict becomes a two-column table, a list of dicts a
table with a column per key (columns empty in every row dropped, rows beyond MAX_ROWS counted
rather than shown), a list of plain values a comma list. The unit comes from the key's name
(report/schema.py's rule), read as its first unit word: `ms`, `us` (µs), `pct` (%), `mb`,
`bytes`, `gbps`, `s`.

Numbers follow one precision rule, the same as the rest of the report: integers as they are;
percentages to 1 decimal; other values to 3 significant figures, never in scientific notation
below a million (9.503 -> 9.50, 84.69 -> 84.7, 176078.0 -> 176078).
"""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup, escape

from stallscope.text import clean, clip

MAX_ROWS = 12  # rows of a nested table shown; the rest are counted
MAX_CELL = 200  # characters of one text cell
# A text with a run this long and no space in it (a kernel name, a path) cannot wrap between
# words: it shows on one line cut with an ellipsis, whole in its tooltip, instead of widening
# the page or breaking mid-word (tests/test_browser.py).
NAME_RUN = 32
UNITS = {"pct": "%", "ms": " ms", "us": " µs", "mb": " MB", "bytes": " B", "gbps": " GB/s",
         "s": " s"}


def unit_of(key: str) -> str:
    """The unit the key names (its first unit word: `wait_ms_per_step` -> ms, `bytes_max` -> B,
    `ms` -> ms), or "" for a count or a name."""
    return next((UNITS[w] for w in key.lower().split("_") if w in UNITS), "")


def figure(value: float, percent: bool = False) -> str:
    """The report's one precision rule (see the module docstring)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "n/a"
    if percent:
        return f"{value:.1f}"
    magnitude = abs(value)
    if magnitude >= 100 or value == 0:
        return f"{value:.0f}" if magnitude < 1e6 else f"{value:.3g}"
    digits = 2 - math.floor(math.log10(magnitude))  # 3 significant figures
    return f"{value:.{max(digits, 0)}f}"


def _scalar(key: str, value: Any) -> Markup:
    if value is None:
        return Markup('<span class="muted">none</span>')
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        unit = unit_of(key)
        return escape(figure(value, percent=unit == "%") + unit)
    if isinstance(value, bool):
        return escape(str(value).lower())
    return text_cell(str(value))


def text_cell(value: str, limit: int = MAX_CELL) -> Markup:
    """Text for a table cell: cut at `limit` characters; a name too long to wrap between words
    (a run of over NAME_RUN characters without a space) on one line, cut with an ellipsis by CSS,
    whole in its tooltip."""
    text = clip(clean(value), limit)
    if max(map(len, text.split()), default=0) > NAME_RUN:
        return Markup('<span class="clip" title="{}">{}</span>').format(text, text)
    return escape(text)


# Words of evidence keys as a reader says them; a unit word is dropped from the label (the value
# carries its unit: "wait_ms_per_step" reads "wait per step", its value "4.4 ms").
WORDS = {"gpu": "GPU", "cpu": "CPU", "h2d": "host-to-device", "d2h": "device-to-host",
         "htod": "host-to-device", "dtoh": "device-to-host", "nccl": "NCCL", "sm": "SM",
         "num": "number of", "pct": "", "ms": "", "us": "", "mb": "", "bytes": "bytes",
         "gbps": "", "s": "", "id": "ID", "amp": "AMP", "tf32": "TF32", "bf16": "bf16",
         "fp16": "fp16", "fp32": "fp32", "io": "I/O", "os": "OS"}


# Keys whose figure the page names elsewhere: the same name here (one name per quantity on a
# page), or a name that says how it differs from a figure it resembles.
LABELS = {
    "loader_share_pct": "Time in the loader",
    "wait_share_pct": "Loader wait (no GPU work)",
    "loader_ms_per_step": "Time in the loader per step",
    "wait_ms_per_step": "Loader wait (no GPU work) per step",
    "projected_step_ms": "Step with the loading hidden (the rule's projection)",
    "loader_fetch_ms_per_batch": "Dataset fetch per batch (collate aside)",
    "loader_collate_ms_per_batch": "Collate per batch",
    "loader_main_cpu_ms_per_batch": "The training process's CPU per batch",
    "idle_share_pct": "GPU idle",
}
# Keys the page does not repeat in a card: the mean step is the step-time line's, over the same
# recording (report.json keeps the key).
PAGE_DROPPED = frozenset({"step_ms_mean"})


def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, Any]]:
    """A card's evidence as the page lists it: every key but those it says elsewhere."""
    return [(k, v) for k, v in evidence.items() if k not in PAGE_DROPPED]


def label_of(key: str) -> str:
    """An evidence key in words: `gpu_idle_share_of_step_pct` -> "GPU idle share of step",
    `host_blocked_ms_per_step` -> "host blocked per step". A key that is not snake_case (a
    kernel's or an op's name used as a key) is kept as it is."""
    if key in LABELS:
        return LABELS[key]
    if not key or not key.replace("_", "").isalnum() or key != key.lower() or "_" not in key:
        return key
    words = [WORDS.get(w, w) for w in key.split("_")]
    text = " ".join(w for w in words if w)
    return (text[:1].upper() + text[1:]) if text else key


def key_text(key: str) -> Markup:
    """An evidence key as a label in words, the key itself in its tooltip (the name report.json
    uses); a label that is a long name may wrap between words only."""
    raw = clip(clean(str(key)), MAX_CELL)
    label = label_of(raw)
    if label == raw:
        return Markup(str(escape(raw)).replace("_", "_<wbr>"))
    return Markup('<span title="{}">{}</span>').format(raw, label)


def _is_plain(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def _cell(key: str, value: Any) -> Markup:
    if isinstance(value, dict):
        return _dict_table(value)
    if isinstance(value, (list, tuple)):
        return _list_view(key, list(value))
    return _scalar(key, value)


def _dict_table(value: dict[str, Any]) -> Markup:
    if not value:
        return Markup('<span class="muted">none</span>')
    rows = Markup("").join(
        Markup("<tr><td>{}</td><td>{}</td></tr>").format(key_text(k), _cell(str(k), v))
        for k, v in list(value.items())[:MAX_ROWS]
    )
    more = len(value) - MAX_ROWS
    tail = Markup('<tr><td colspan="2" class="muted">{} more</td></tr>').format(more) if (
        more > 0) else Markup("")
    return Markup('<table class="evidence nested">{}{}</table>').format(rows, tail)


def _list_view(key: str, items: list[Any]) -> Markup:
    if not items:
        return Markup('<span class="muted">none</span>')
    if all(_is_plain(v) for v in items):
        shown = Markup(", ").join(_scalar(key, v) for v in items[:MAX_ROWS * 2])
        more = len(items) - MAX_ROWS * 2
        return shown + (Markup(' <span class="muted">and {} more</span>').format(more)
                        if more > 0 else Markup(""))
    if all(isinstance(v, dict) for v in items):
        columns = [k for k in dict.fromkeys(k for v in items for k in v)
                   if any(v.get(k) not in (None, "", [], {}) for v in items)]
        head = Markup("").join(Markup("<th>{}</th>").format(key_text(c)) for c in columns)
        body = Markup("").join(
            Markup("<tr>{}</tr>").format(Markup("").join(
                Markup("<td>{}</td>").format(_cell(c, v.get(c))) for c in columns))
            for v in items[:MAX_ROWS]
        )
        more = len(items) - MAX_ROWS
        tail = Markup('<tr><td colspan="{}" class="muted">{} more</td></tr>').format(
            len(columns), more) if more > 0 else Markup("")
        return Markup('<table class="evidence nested"><tr>{}</tr>{}{}</table>').format(
            head, body, tail)
    return Markup("<br>").join(_cell(key, v) for v in items[:MAX_ROWS])


def _plain(value: Any) -> Any:
    """numpy arrays and scalars as Python lists and numbers (rules may leave either)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def evidence_value(key: str, value: Any) -> Markup:
    """One evidence entry's cell: a number with its unit, text, or a nested table."""
    return _cell(key, _plain(value))
