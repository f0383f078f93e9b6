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
