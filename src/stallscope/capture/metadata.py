"""stallscope's facts in a trace, as Kineto can write them (the session's and each later
capture's: capture/session.py, capture/recapture.py)."""

from __future__ import annotations

import json
from typing import Any


def _kineto_safe(value: Any) -> Any:
    """Kineto writes metadata with every backslash turned into a slash: an escaped quote
    (a call site or a source line holding `"`) would break the whole trace file. Strings lose
    their quotes and backslashes instead (`"` -> `'`, `\\` -> `/`)."""
    if isinstance(value, str):
        text = value.replace("\\", "/").replace('"', "'")
        return "".join(c if c >= " " and c != "\x7f" else " " for c in text)
    if isinstance(value, dict):
        return {_kineto_safe(k): _kineto_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_kineto_safe(v) for v in value]
    return value


def metadata_text(meta: dict[str, Any]) -> str:
    """stallscope's metadata as Kineto can write it: JSON with no backslash anywhere (no
    escaped quotes or control characters: those become spaces; non-ASCII text written as
    itself rather than as \\u escapes)."""
    return json.dumps(_kineto_safe(meta), ensure_ascii=False)


# Where Kineto writes our metadata: one line `"stallscope": {...},` among the trace's top-level
# keys, before "traceEvents" (torch 2.x output_json.cpp).
_KEY = b'"stallscope": '
_EVENTS = b'"traceEvents"'


def patch_head(head: bytes, extra: dict[str, Any]) -> bytes | None:
    """`head` (the trace's first bytes, up to its events) with `extra`'s keys set in stallscope's
    metadata line; None when the line is not there or cannot be read (the trace is then written
    as Kineto wrote it). Lets a figure measured after recording, when no profiler may run
    beside the session's, reach the trace that recording wrote."""
    end = head.find(_EVENTS)
    at = head.find(_KEY, 0, end if end >= 0 else len(head))
    if at < 0:
        return None
    start = at + len(_KEY)
    stop = head.find(b"\n", start)
    if stop < 0:
        return None
    line = head[start:stop].rstrip()
    comma = line.endswith(b",")
    try:
        meta = json.loads(line[:-1] if comma else line)
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    meta.update(extra)
    text = metadata_text(meta).encode() + (b"," if comma else b"")
    return head[:start] + text + head[start + len(line):]
