"""Make large Kineto traces from a real one by tiling it in time (used by bench_scale.py).

Tile k is the source's events shifted by k trace spans, with correlation ids, External ids and
ProfilerStep numbers offset so that the result is one longer, self-consistent recording rather
than ten overlapping copies. Metadata events (`ph: "M"`) are written once. The output is
streamed tile by tile, so a 3 GB file is written with the memory of one tile.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id", "Ev Idx", "Python id", "Python parent id")


def tile_trace(
    source: Path,
    out: Path,
    tiles: int,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> int:
    """Write `tiles` copies of `source` end to end in time into `out` (gzip if it ends .gz).

    Returns the number of events written.
    """
    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events: list[dict[str, Any]] = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + float(e.get("dur", 0) or 0) for e in timed)
    span = (t1 - t0) + 1000.0  # a millisecond between tiles
    steps = [int(m.group(1)) for e in events if (m := STEP.match(str(e.get("name", ""))))]
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    id_span = 1 + max(
        (int(v) for e in events for k in ID_ARGS
         if isinstance(v := (e.get("args") or {}).get(k), int)),
        default=0,
    )
    meta = {k: v for k, v in doc.items()}
    if rank is not None:
        meta["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    meta["traceName"] = f"tiled x{tiles} from {source.name} (benchmark input, not a recording)"

    written = 0
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wb") as fh:  # type: ignore[operator]
        head = msgspec.json.encode(meta)
        fh.write(head[:-1] + (b',' if len(meta) else b'') + b'"traceEvents":[')
        first = True
        for k in range(tiles):
            batch = [_shift(e, k, span, step_span, id_span) for e in events
                     if k == 0 or e.get("ph") != "M"]
            written += len(batch)
            _write_batch(fh, batch, first)
            first = False
        fh.write(b"]}")
    return written


def _shift(e: dict[str, Any], k: int, span: float, step_span: int, id_span: int) -> dict:
    if k == 0:
        return e
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * span
    m = STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_span}"
    args = e.get("args")
    if isinstance(args, dict) and any(key in args for key in ID_ARGS):
        args = dict(args)
        for key in ID_ARGS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] += k * id_span
        e["args"] = args
    if isinstance(e.get("id"), int):  # flow events link by id
        e["id"] += k * id_span
    return e


def _write_batch(fh: BinaryIO, batch: list[dict[str, Any]], first: bool) -> None:
    body = msgspec.json.encode(batch)[1:-1]
    if not body:
        return
    if not first:
        fh.write(b",\n")
    fh.write(body)
