"""Making trace-derived strings safe, and bounded, for a terminal, Markdown and HTML.

Kernel, op, thread and file names come from other people's traces and folders: they may hold
control characters (terminal escape sequences, NUL, backspace), bidirectional overrides that
make text read differently from what it is, undecodable file-name bytes, backticks, pipes, HTML,
or 100 kB of text. The writers show them as inert text, cut to a length a reader can use; the
HTML writer escapes markup through jinja2's autoescaping and cleans and cuts through `display`.
report.json keeps every name whole.
"""

from __future__ import annotations

import re
from typing import Any

# Longest string shown whole in report.html and report.md (the longest real kernel names run to
# about 5,000 characters and read no better whole; prose from the rules stays under 1,000).
MAX_TEXT = 2000
# A fenced code block (a command, a snippet) may be longer: it is copied, not read.
MAX_CODE = 20_000
# Longest string in a terminal line: a screen is read, not scrolled.
MAX_TERMINAL = 300

# Terminal escape sequences, whole: CSI (colours, cursor moves: ESC [ ... final byte, or the
# one-byte C1 CSI), OSC (window titles, hyperlinks: ESC ] ... BEL or ESC \; unterminated, only
# its introducer goes), and the other two-byte ESC sequences. Dropping only the ESC byte would
# leave "[31m" in the text.
_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
)
# C0 controls but tab and newline, DEL, C1 controls (ESC sequences, BEL, CR, backspace, NUL),
# and the bidirectional embeddings, overrides and isolates that reorder what follows them.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Lone surrogates: file names with bytes that are not UTF-8 (Python's surrogateescape); no
# UTF-8 writer can encode them, so they show as the replacement character.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")
# What would start a block (a list item, a setext underline) at the beginning of a line; `#`
# and `>` are escaped wherever they are.
_MD_BULLET = re.compile(r"^(\s*)([-+=])")
_MD_ORDERED = re.compile(r"^(\s*\d+)([.)])")


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit:,} characters)"


def strip_escapes(text: object) -> str:
    """`text` without terminal escape sequences (colour codes a script put in its messages)."""
    return _ESCAPE.sub("", str(text))


def clean(text: object) -> str:
    """Escape sequences, controls and bidirectional overrides dropped, undecodable bytes shown
    as U+FFFD; newlines and tabs kept."""
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", strip_escapes(text)))


def plain(text: object, limit: int = MAX_TEXT) -> str:
    """Printable on one terminal line: controls (escape sequences included) dropped, newlines
    and tabs as spaces, cut to `limit` characters."""
    return clip(clean(text).replace("\n", " ").replace("\t", " "), limit)


def md(text: object, limit: int = MAX_TEXT) -> str:
    """Literal in Markdown, table cells and list items included: one line, no markup."""
    text = plain(text, limit).replace("&", "&amp;")
    escaped = _MD_SPECIAL.sub(r"\\\1", text)
    escaped = _MD_ORDERED.sub(r"\1\\\2", _MD_BULLET.sub(r"\1\\\2", escaped))
    # Entities, not backslashes, for angle brackets: renderers that allow inline HTML differ on
    # whether a backslash stops a tag.
    return escaped.replace("<", "&lt;").replace(">", "&gt;")


def md_code(text: object, limit: int = MAX_CODE) -> str:
    """Inside a fenced code block: only a fence could break out, so break fences."""
    return plain_multiline(text, limit).replace("```", "` ` `").replace("~~~", "~ ~ ~")


def plain_multiline(text: object, limit: int = MAX_CODE) -> str:
    return clip(clean(text), limit)


def bounded(value: Any, limit: int = MAX_TEXT) -> Any:
    """`value` with every string in it (nested ones too) cut to `limit` characters."""
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, dict):
        return {k: bounded(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded(v, limit) for v in value]
    return value


def speedup_text(speedup: float | None) -> str:
    """The one way every view of `compare` writes a speedup (before / after of the step time):
    "3.79x faster" or "1.25x slower", two decimals, never a bare ratio. A change that rounds
    to 1.00x either way is "1.00x (no change)"."""
    if speedup is None or not speedup > 0:
        return "n/a"
    if speedup >= 1.0:
        word, factor = "faster", speedup
    else:
        word, factor = "slower", 1.0 / speedup
    return "1.00x (no change)" if f"{factor:.2f}" == "1.00" else f"{factor:.2f}x {word}"


def speedup_range_text(low: float, high: float) -> str:
    """A speedup interval in the same notation: "3.24x to 4.44x faster", "1.43x to 1.67x
    slower", or across no change "1.11x slower to 1.20x faster"."""
    a, b = speedup_text(low), speedup_text(high)
    if a == b:
        return a
    (fa, wa), (fb, wb) = a.split(" ", 1), b.split(" ", 1)
    if wa == wb == "faster":
        return f"{fa} to {b}"
    if wa == wb == "slower":
        return f"{fb} to {a}"  # the smaller slowdown first
    return f"{a} to {b}"


def plural(count: float, word: str, many: str | None = None) -> str:
    """`count word` with the word's plural where the count is not one: "1 byte", "12 steps",
    "2 worker processes" (`many` for plurals other than word + "s")."""
    shown = f"{count:,.0f}" if isinstance(count, float) and count.is_integer() else f"{count:,}"
    return f"{shown} {word if count == 1 else many or word + 's'}"

