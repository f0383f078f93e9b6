"""Which torch recorded a trace, so advice can be spelled for it.

Kineto traces do not carry the torch version. Three things tell it: `stallscope run` writes
`torch.__version__` into the trace's own `stallscope` metadata (exact), the scripts that recorded
this project's sample traces write it into theirs (`stallscope_sample`, exact), and the legacy
category names (`Operator`, `Runtime`, `Kernel`, `Memcpy`), which only torch 1.8 and 1.9 wrote
(torch 1.10 renamed them to `cpu_op`, `cuda_runtime`, ...). Anything else is unknown: the
advice then uses today's spelling and says it is for torch 2.x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)")
# The oldest torch with torch.profiler's Kineto traces; legacy categories end with 1.9.
LEGACY_VERSION = (1, 8)


@dataclass(frozen=True)
class TorchVersion:
    """The torch version a trace was recorded with (major, minor), and how it is known."""

    version: tuple[int, int] | None
    source: str  # "recorded", "metadata", "legacy-categories" or "unknown"
    text: str  # for people: "2.4.1+cu121", "1.8 or 1.9", "unknown"

    @property
    def label(self) -> str:
        """How a report names it: 'torch 2.4.1+cu121 (recorded by stallscope run)'."""
        if self.source == "recorded":
            return f"torch {self.text} (recorded by stallscope run)"
        if self.source == "metadata":
            return f"torch {self.text} (the trace's recording metadata)"
        if self.source == "legacy-categories":
            return f"torch {self.text} (legacy Kineto event categories)"
        return "torch version unknown (the trace does not record it): advice is for torch 2.x"


def parse_version(text: Any) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '2.4.1+cu121' or '1.8.0a0'; None otherwise."""
    match = _VERSION.match(text) if isinstance(text, str) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def read_torch_version(capture: dict[str, Any], schema: str,
                       recording: dict[str, Any] | None = None) -> TorchVersion:
    """The version from stallscope's metadata, else from the recording script's, else from the
    legacy schema, else unknown."""
    for meta, source in ((capture, "recorded"), (recording, "metadata")):
        written = meta.get("torch") if isinstance(meta, dict) else None
        parsed = parse_version(written)
        if parsed is not None:
            return TorchVersion(parsed, source, str(written).strip())
    if schema == "legacy":
        return TorchVersion(LEGACY_VERSION, "legacy-categories", "1.8 or 1.9")
    return TorchVersion(None, "unknown", "unknown")
