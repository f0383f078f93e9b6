"""Text for report.md that CommonMark and Python-Markdown render alike, and that reads well raw.

Ticket systems run either kind of renderer, and people read the raw file too. So report.md
uses only what both parse the same way: ATX headings, `-` and `1.` lists with blank lines
around them and four-space nesting, fenced code blocks, code spans, `*`/`**` emphasis and
`<https://...>` links; no tables (neither renders them without an extension) and no backslash
escapes (Python-Markdown knows fewer of them than CommonMark, so `\\|` shows its backslash).

Names and identifiers (file names, paths, op and kernel names, `num_workers=4`, `aten::mm`)
go in code spans: both renderers show a code span's text literally, so a name needs no
escaping, and no `\\_` clutters the raw file. Prose from the rules is scanned for such tokens;
what is left is plain words, which hold no markup character. Lines are wrapped under
`WIDTH` characters, never inside a code span and never so that a line starts with a character
that would open a block (a list, a heading, a quote, a fence).
"""

from __future__ import annotations

import re
import shlex

from stallscope.text import clip, plain

# Target width of a wrapped line; a long code span can push a line past it, never past LIMIT.
WIDTH = 100
# No line of report.md is this long or longer (a ticket's raw view, a diff, a terminal).
LIMIT = 200
# Longest name shown in one code span: a longer one is cut (report.json keeps it whole).
MAX_NAME = 150

# A token is a name or identifier, not a word, when it holds a character that is markup in
# Markdown, or reads as code: `_`, `=`, `#`, `*`, a backslash, brackets, braces, `|`, `~`, a
# backtick, `::`, a call `f(`, `<tag`, an entity, a URL, a dotted name (`torch.compile`,
# `docs/replay.md`) or an absolute path.
_CODEY = re.compile(
    r"[_=#*\\\[\]{}|~`]|::|\w\((?!e?s\))|^\.\w|<[A-Za-z/!?]|&#?\w+;|://"
    r"|[A-Za-z_]\w+\.[A-Za-z_]|[A-Za-z_]\.[A-Za-z_]\w|^~?/\w"
)
_LEAD = re.compile(r"^[(\"']+")
_TRAIL = re.compile(r"[.,;:!?\"')]+$")
# What would open a block at the start of a line (or start a setext underline).
_BLOCKY = re.compile(r"^(?:[-+*]$|[-=]+$|#|>|\||<[A-Za-z/!?]|~~~|`{3}|\d{1,9}[.)]$)")
# A name the text itself already quotes in backticks.
_QUOTED = re.compile(r"`([^`\n]+)`")
# Longest run of tokens merged into one call, `.to(device, non_blocking=True)`.
_MAX_CALL = 8


def code(text: object, limit: int = MAX_NAME) -> str:
    """`text` as one code span, literal in every renderer. A backtick in a name becomes U+02CB
    (it looks the same): a span with a backtick inside needs longer delimiters, which the two
    renderers trim differently and which could open a fence at the start of a line."""
    shown = clip(plain(text, limit), limit).replace("`", "\u02cb").strip()
    return f"`{shown}`" if shown else "(none)"


def _split(token: str) -> tuple[str, str, str]:
    """Leading brackets and quotes, the core, and trailing punctuation of one token; a closing
    bracket or quote stays with the core when the core opened it (`SGD.step()`,
    `.to('cpu')`, `mode="max-autotune"`)."""
    lead = _LEAD.match(token)
    head = lead.group(0) if lead else ""
    rest = token[len(head):]
    trail = _TRAIL.search(rest)
    tail = trail.group(0) if trail else ""
    core = rest[: len(rest) - len(tail)]
    while tail and ((tail[0] == ")" and core.count("(") > core.count(")"))
                    or (tail[0] in "\"'" and core.count(tail[0]) % 2 == 1)):
        core, tail = core + tail[0], tail[1:]
    return head, core, tail


def _calls(tokens: list[str]) -> list[str]:
    """Tokens with a call's arguments merged back: `.to(device,` + `non_blocking=True)`."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token, j = tokens[i], i + 1
        _, core, _ = _split(token)
        if "(" in core and core.count("(") > core.count(")"):
            while j < len(tokens) and j - i < _MAX_CALL and token.count("(") > token.count(")"):
                token, j = f"{token} {tokens[j]}", j + 1
            if token.count("(") != token.count(")"):
                token, j = tokens[i], i + 1
        out.append(token)
        i = j
    return out


def _words(text: str) -> str:
    """Plain words as they are; names and identifiers among them in code spans."""
    words = []
    for token in _calls(text.split()):
        head, core, tail = _split(token)
        words.append(f"{head}{code(core)}{tail}" if core and _CODEY.search(core) else token)
    return " ".join(words)


def prose(text: object) -> str:
    """A sentence from a rule or the report, on one line: names and identifiers in code spans
    (what the rule already put in backticks too), every other word as it is (no word left
    holds a markup character)."""
    out = []
    for i, piece in enumerate(_QUOTED.split(plain(text))):
        if i % 2:
            out.append(code(piece))
        elif piece.strip():
            pad_left = " " if piece[0].isspace() else ""
            pad_right = " " if piece[-1].isspace() else ""
            out.append(pad_left + _words(piece) + pad_right)
        else:
            out.append(" " if piece else "")
    # code() never puts a backtick inside a span: "``" is two spans that touch, which would
    # read as one delimiter; a space keeps them two.
    return " ".join("".join(out).split()).replace("``", "` `")


def _atoms(line: str) -> list[str]:
    """`line` split at its spaces, except those inside code spans."""
    atoms, current, i = [], "", 0
    while i < len(line):
        ch = line[i]
        if ch == "`":
            end = line.find("`", i + 1)
            end = len(line) - 1 if end < 0 else end
            current += line[i: end + 1]
            i = end + 1
            continue
        if ch == " ":
            if current:
                atoms.append(current)
            current = ""
        else:
            current += ch
        i += 1
    return [*atoms, current] if current else atoms


def wrap(line: str, first: str = "", indent: str = "", width: int = WIDTH) -> list[str]:
    """`line` (Markdown already) wrapped under `width`, after the prefix `first` (a list
    marker) and `indent` on the lines after. A word that would open a block at the start of a
    line stays on the line before (or, first on its line, goes in a code span)."""
    atoms = _atoms(line)
    if not atoms:
        return [first.rstrip()] if first.strip() else []
    if _BLOCKY.match(atoms[0]):
        atoms[0] = code(atoms[0])
    lines: list[str] = []
    current = first + atoms[0]
    for atom in atoms[1:]:
        if len(current) + 1 + len(atom) <= width or _BLOCKY.match(atom):
            current += f" {atom}"
        else:
            lines.append(current)
            current = indent + atom
    return [*lines, current]


def paragraph(text: str) -> list[str]:
    """A paragraph of Markdown, wrapped, then the blank line that ends it."""
    return [*wrap(text), ""]


def bullets(items: list[str], ordered: bool = False, level: int = 0) -> list[str]:
    """A list, each item (Markdown already) wrapped with its continuation lines indented four
    spaces past the item's own indent: what Python-Markdown needs to keep them in the item."""
    pad = "    " * level
    lines: list[str] = []
    for i, item in enumerate(items, 1):
        marker = f"{i}. " if ordered else "- "
        lines += wrap(item, first=pad + marker, indent=pad + "    ")
    return lines


def command_lines(command: str) -> str:
    """A shell command for a fenced block, split over lines (`\\` continuations) so no line
    passes WIDTH; as it came when it does not parse (unbalanced quotes)."""
    try:
        words = [shlex.quote(w) for w in shlex.split(command)]
    except ValueError:
        return command
    lines, current = [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > WIDTH - 2:
            lines.append(current + " \\")
            current = "    " + word
        else:
            current = f"{current} {word}" if current else word
    return "\n".join([*lines, current])
