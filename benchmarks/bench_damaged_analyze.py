"""Seconds per MB of `stallscope analyze` on damaged traces of growing size (issue 48).

    python benchmarks/bench_damaged_analyze.py [--sizes 2,8,32,64] [--kinds none,events,header]

For each size and kind a trace is made with benchmarks/damaged.py (a real trace's events tiled
end to end in time) and the whole `stallscope analyze FILE -o OUT -q` (load, step model,
rules, replay, fix plan, every writer) runs on it in a fresh process, which times the command
alone (after one run on a small trace, so neither the interpreter's start nor the imports are
counted) and reads its own peak resident size (VmHWM). Kinds:

- `none`: no damage, the reference;
- `events`: damage in the events, one in 20 (a wrong byte) plus one lone surrogate escape;
- `header`: damage in the header, half the file: `damaged.hostile_header` (a byte-order mark,
  a stray byte and a lone surrogate escape in a name, the `traceEvents` key nested by the
  thousand, tiny objects by the megabyte, runs of whitespace) before intact events.

Linear reading keeps the seconds per MB of each kind flat as the size grows. One row a line,
then the table docs/robustness.md quotes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from damaged import MB, damaged_text, hostile_header, with_header  # noqa: E402

# The command in this interpreter, after one run on a small intact trace (argv[1]) so that the
# imports and first-call costs are not counted; its exit status, seconds and peak resident size
# (kB) printed as one JSON line.
_TIMED_ANALYZE = """
import json, sys, time
from stallscope.cli import main
warm, path, *rest = sys.argv[1:]
main(["analyze", warm, *rest])
t0 = time.perf_counter()
try:
    rc = main(["analyze", path, *rest])
except SystemExit as exc:
    rc = exc.code
wall = time.perf_counter() - t0
kb = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print(json.dumps({"exit": rc, "wall_s": wall, "peak_kb": int(kb[0])}))
"""


def make(kind: str, size: int) -> bytes:
    """A trace of about `size` bytes with the damage of `kind`."""
    if kind == "none":
        return damaged_text(size, every=0, escapes=0, seed=1).text
    if kind == "events":
        return damaged_text(size, every=20, escapes=1, seed=1).text
    if kind == "header":
        events = damaged_text(size // 2, every=0, escapes=0, seed=1).text
        return with_header(events, hostile_header(size // 2, seed=1))
    raise ValueError(kind)


def run(kind: str, mb: float, folder: Path) -> dict[str, object]:
    """One row: the size, the exit status, seconds, seconds per MB and peak memory."""
    text = make(kind, int(mb * MB))
    path = folder / f"synthetic-damaged-{kind}.pt.trace.json"
    path.write_bytes(text)
    size = len(text) / MB
    del text
    warm = folder / "warm-up.pt.trace.json"
    if not warm.exists():
        warm.write_bytes(make("none", 100_000))
    proc = subprocess.run([sys.executable, "-c", _TIMED_ANALYZE, str(warm), str(path), "-q",
                           "--force",
                           "-o", str(folder / "report")],
                          capture_output=True, text=True, check=False)
    path.unlink()
    try:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"kind": kind, "mb": size, "exit": proc.returncode, "wall_s": None,
                "s_per_mb": None, "peak_mb": None, "error": proc.stderr[-400:]}
    return {"kind": kind, "mb": size, "exit": got["exit"], "wall_s": got["wall_s"],
            "s_per_mb": got["wall_s"] / size, "peak_mb": got["peak_kb"] / 1024}


def table(rows: list[dict[str, object]], kinds: list[str]) -> str:
    """Markdown: one line a size, seconds per MB (and total seconds) of each kind."""
    head = "| MB | " + " | ".join(f"{k}: s/MB (s; peak MB)" for k in kinds) + " |"
    lines = [head, "|---:|" + "---:|" * len(kinds)]
    sizes = sorted({round(float(r["mb"])) for r in rows})  # type: ignore[arg-type]
    for mb in sizes:
        cells = []
        for k in kinds:
            r = next((x for x in rows if x["kind"] == k and round(float(x["mb"])) == mb), None)
            if r is None or r["wall_s"] is None:
                cells.append("-" if r is None else f"failed (exit {r['exit']})")
            else:
                cells.append(f"{r['s_per_mb']:.3f} ({r['wall_s']:.1f} s; {r['peak_mb']:.0f})")
        lines.append(f"| {mb} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,8,32,64", help="MB, comma-separated")
    parser.add_argument("--kinds", default="none,events,header",
                        help="comma-separated: none, events, header")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (float(s) for s in args.sizes.split(",")):
            for kind in kinds:
                row = run(kind, mb, Path(tmp))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(table(rows, kinds))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
