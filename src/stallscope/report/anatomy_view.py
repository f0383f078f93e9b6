"""The DataLoader section's view of each loader's anatomy: where one batch's loading time goes.

`stallscope run` measures each loader inside its workers (capture/anatomy.py); report.json keeps
the raw figures under `dataloaders[].anatomy`. A reader needs them as one picture: a stacked bar
of a batch's time (computing, queued for a core, blocked on storage, collate, shipping to the
training process, pinning), the loader's class in words, and the functions the time went to.
Every figure here is a measurement, per batch, over the recorded steps.
"""

from __future__ import annotations

from typing import Any

# Segments of one batch's loading, in the order they happen, with the colour of each (dark
# enough for white text is not needed: labels sit in the legend, not on the bar).
SEGMENTS = (
    ("compute", "computing (fetch on a core)", "#2f6fb3"),
    ("queued", "runnable, waiting for a core", "#b36b00"),
    ("blocked", "blocked (storage, network, sleep)", "#8a8a8a"),
    ("collate", "collate_fn", "#6a3d9a"),
    ("transfer", "shipping to the training process", "#2e8b57"),
    ("pin", "pin-memory thread", "#b22222"),
)
COLORS = {key: color for key, _, color in SEGMENTS}

MEANING = {
    "waiting": "waiting: the workers are mostly off the CPU (storage, network, sleep), so more "
               "workers than cores can help",
    "cpu-bound": "cpu-bound: the workers compute (decode, augmentation) on cores that are in "
                 "use; more workers than free cores only contend",
    "collate/transfer-bound": "collate/transfer-bound: building or shipping the batch costs more "
                              "than fetching its samples",
    "main-process-bound": "main-process-bound: the training process itself spends the time "
                          "(receiving, unpickling, pinning or collating)",
}
TOP_ROWS = 5


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def segments(a: dict[str, Any]) -> list[dict[str, Any]]:
    """One batch's loading split into measured parts (ms per batch), zero parts dropped.

    Fetch time splits by the thread's own accounting: on a core (thread CPU), runnable but
    queued (schedstat), and the rest blocked. The queued share is measured over fetch and
    collate together; it is taken from the fetch, where nearly all of it falls."""
    fetch = _num(a.get("fetch_ms_per_batch"))
    if fetch is None:
        return []
    collate = _num(a.get("collate_ms_per_batch")) or 0.0
    compute = min(_num(a.get("fetch_cpu_ms_per_batch")) or 0.0, fetch)
    runq = _num(a.get("runq_share"))
    queued = min(runq * (fetch + collate), fetch - compute) if runq is not None else 0.0
    parts = {
        "compute": compute,
        "queued": max(queued, 0.0),
        "blocked": max(fetch - compute - max(queued, 0.0), 0.0),
        "collate": collate,
        "transfer": _num(a.get("transfer_ms_per_batch")) or 0.0,
        "pin": _num(a.get("pin_ms_per_batch")) or 0.0,
    }
    total = sum(parts.values())
    out = []
    for key, label, color in SEGMENTS:
        ms = parts[key]
        if ms <= 0 or total <= 0:
            continue
        out.append({"key": key, "label": label, "color": color, "ms": round(ms, 2),
                    "pct": round(100.0 * ms / total, 1)})
    return out


def loader_view(d: dict[str, Any]) -> dict[str, Any] | None:
    """What the report shows for one loader, or None when nothing was measured inside it."""
    a = d.get("anatomy")
    if not isinstance(a, dict) or not a:
        return None
    view: dict[str, Any] = {"call_site": d.get("call_site"), "rank": d.get("rank"),
                            "where": a.get("where"), "lost": a.get("lost")}
    bound = a.get("bound")
    view["bound"] = bound
    view["meaning"] = MEANING.get(bound or "", "")
    parts = segments(a)
    view["segments"] = parts
    view["total_ms"] = round(sum(p["ms"] for p in parts), 2)
    view["batches"] = a.get("batches")
    view["wait_ms"] = _num(a.get("wait_ms_per_batch"))
    workers = [w for w in a.get("workers") or [] if isinstance(w, dict)]
    view["workers"] = None
    if workers:
        busy = [b for w in workers if (b := _num(w.get("cpu_busy_share"))) is not None]
        rates = [r for w in workers if (r := _num(w.get("read_mb_per_s"))) is not None]
        view["workers"] = {
            "count": len(workers),
            "busy_pct": round(100.0 * sum(busy) / len(busy), 0) if busy else None,
            "read_mb_per_s": round(sum(rates), 1) if rates else None,
        }
    raw_stack = a.get("stack")
    stack: dict[str, Any] = raw_stack if isinstance(raw_stack, dict) else {}
    view["top"] = [t for t in stack.get("top") or [] if isinstance(t, dict)][:TOP_ROWS]
    view["samples"] = stack.get("samples")
    if not parts and not view["lost"]:
        return None
    return view


def loader_views(dataloaders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [v for v in (loader_view(d) for d in dataloaders) if v is not None]
