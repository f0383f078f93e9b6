"""Making trace-derived strings safe for a terminal and for Markdown.

Kernel and op names come from other people's traces: they may hold control characters,
backticks, pipes or HTML. The HTML writer relies on jinja2's autoescaping instead.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def plain(text: object) -> str:
    """Printable for a terminal: control characters (escape sequences included) dropped."""
    return _CONTROL.sub("", str(text))


def md(text: object) -> str:
    """Literal in Markdown, table cells included."""
    escaped = _MD_SPECIAL.sub(r"\\\1", plain(text)).replace("\n", " ")
    # Entities, not backslashes, for angle brackets: renderers that allow inline HTML differ on
    # whether a backslash stops a tag.
    return escaped.replace("<", "&lt;").replace(">", "&gt;")


def md_code(text: object) -> str:
    """Inside a fenced code block: only a fence could break out, so break fences."""
    return plain_multiline(text).replace("```", "` ` `")


def plain_multiline(text: object) -> str:
    return "\n".join(plain(line) for line in str(text).split("\n"))
