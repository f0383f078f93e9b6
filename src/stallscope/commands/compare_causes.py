"""Which findings of BEFORE and AFTER are the same cause, and each cause's figure on each side.

A cause is (rule, device, rank), never a file: two recordings of one job have different file
names, and a side may hold several recordings of one configuration. Each cause appears once in
the comparison, in one group.

A side with several recordings pools a cause's figure as the median over the recordings that
found it (what each recording measured is kept beside it); its words (title, severity, saving)
come from one recording, named in `trace_before` / `trace_after`: the one whose figure is the
pooled median's (the lower of the middle two when the count is even). A cause is on a side when
more than half of that side's recordings that assessed the rule found it; a cause found in some
recordings of one side and in none of the other's (near its threshold: it crosses it in one
recording and not in the next) is "in some recordings", neither new nor resolved, and no gate
counts it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from stallscope.commands.compare_metrics import METRICS, figure_of
from stallscope.diagnose.registry import ALL_RULES

# Rules whose evidence "device" names the device index the finding is about (one finding per
# device); other rules' "device", where present, names the GPU model and is no place.
# Each rule declares it (RuleSpec.per_device).
PER_DEVICE = frozenset(spec.id for spec in ALL_RULES if spec.per_device)

Key = tuple[str, str, str]  # (rule, device or "", rank or "job" or "")


@dataclass
class SideCause:
    """One cause on one side: the recordings that found it (label, finding) and how many of
    the side's recordings assessed its rule (found it or found it clear)."""

    found: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    assessed: set[str] = field(default_factory=set)
    not_assessed: set[str] = field(default_factory=set)

    @property
    def count(self) -> int:
        return len({label for label, _ in self.found})

    @property
    def majority(self) -> bool:
        """Found in more than half the recordings that assessed the rule."""
        return 2 * self.count > max(len(self.assessed), self.count)


def _ranks(data: dict[str, Any]) -> dict[str, str]:
    """Trace label -> its rank as the key holds it ("" when the trace names none)."""
    return {str(t.get("label")): ("" if t.get("rank") is None else str(t["rank"]))
            for t in data.get("traces", [])}


def _key(f: dict[str, Any], ranks: dict[str, str]) -> Key:
    rule, trace = str(f.get("id")), str(f.get("trace"))
    ev = f.get("evidence")
    device = ev.get("device") if rule in PER_DEVICE and isinstance(ev, dict) else None
    rank = "job" if trace == "job" else ranks.get(trace, "")
    return rule, "" if device is None else str(device), rank


def side_causes(data: dict[str, Any]) -> dict[Key, SideCause]:
    """Every cause found on one side, with its recordings, in the order first found."""
    ranks = _ranks(data)
    causes: dict[Key, SideCause] = {}
    for f in _per_recording(data.get("findings", [])):
        causes.setdefault(_key(f, ranks), SideCause()).found.append((str(f.get("trace")), f))
    for key, cause in causes.items():
        _assess(cause, key, data, ranks)
    return causes


def _per_recording(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recording's own finding: a report over several recordings holds one finding per
    cause, with every recording's figures in its `recordings`."""
    out = []
    for f in findings:
        recordings = f.get("recordings") or []
        out += [{**f, **r, "recordings": []} for r in recordings if isinstance(r, dict)] or [f]
    return out


def _assess(cause: SideCause, key: Key, data: dict[str, Any], ranks: dict[str, str]) -> None:
    """Fill in which of the side's recordings (of the cause's rank) assessed its rule."""
    rule, _, rank = key
    for a in data.get("assessments", []):
        label = str(a.get("trace"))
        if a.get("rule") != rule or ("job" if label == "job" else ranks.get(label, "")) != rank:
            continue
        (cause.not_assessed if a.get("status") == "not_assessed" else cause.assessed).add(label)
    cause.assessed.update(label for label, _ in cause.found)


def absent_cause(key: Key, data: dict[str, Any]) -> SideCause:
    """A cause the side did not find: which of its recordings assessed the rule clear."""
    cause = SideCause()
    _assess(cause, key, data, _ranks(data))
    return cause


def place(key: Key) -> str:
    """Where the cause is, for people: "rank 3, device 1", "device 0", "job" or "all
    recordings" (one process, one device: every recording of the side)."""
    _, device, rank = key
    if rank == "job":
        return "job"
    parts = ([f"rank {rank}"] if rank else []) + ([f"device {device}"] if device else [])
    return ", ".join(parts) or "all recordings"


def _figures(rule: str, cause: SideCause) -> list[tuple[str, float | None, float | None,
                                                        dict[str, Any]]]:
    """(label, figure, share, finding) for each recording that found the cause, sorted by the
    figure (unmeasured last), then the label: a fixed order whatever the input's."""
    rows = [(label, *figure_of(rule, f), f) for label, f in cause.found]
    return sorted(rows, key=lambda r: (r[1] is None, r[1] or 0.0, r[0]))


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def pooled(rule: str, cause: SideCause) -> tuple[float | None, float | None,
                                                  dict[str, Any] | None, list[dict[str, Any]]]:
    """The side's figure and share (median over the recordings that found the cause), the
    finding whose words are quoted (the pooled median's recording), and each recording's own
    figure."""
    rows = _figures(rule, cause)
    if not rows:
        return None, None, None, []
    measured = [r for r in rows if r[1] is not None]
    words = (measured or rows)[(len(measured or rows) - 1) // 2][3]
    figure = _median([r[1] for r in measured if r[1] is not None])
    share = _median([r[2] for r in measured if r[2] is not None])
    each = [{"trace": label, "figure": None if fig is None else round(fig, 3),
             "share_pct": None if sh is None else round(sh, 3)} for label, fig, sh, _ in rows]
    return figure, share, words, each


def how_pooled(count: int, assessed: int) -> str:
    """How the side's figure was made, for people."""
    if count <= 1:
        return "one recording" if assessed <= 1 else f"one recording of {assessed}"
    return f"median over {count} recordings" + (f" of {assessed}" if assessed > count else "")


def has_metric(rule: str) -> bool:
    return rule in METRICS
