"""Scale benchmark (issue 7): stallscope analyze on big traces and many ranks, run by hand.

    python benchmarks/bench_scale.py [--source TRACE] [--tiles 10] [--gzip] [--huge]
                                     [--ranks 16] [--hta-python PYTHON] [--work DIR]

Builds, from a real trace (default: kineto/resnet50_num_workers_0 in sample_traces/public), a
tiled trace of `--tiles` copies end to end, then times in fresh processes, one at a time:
  1. a plain `json.loads` of the file (read + gunzip + parse): the yardstick;
  2. `stallscope analyze` end to end (CLI, interpreter start-up and report writing included);
  3. HolisticTraceAnalysis's `TraceAnalysis` load, when `--hta-python` names an interpreter
     with HTA installed (kept out of stallscope's environment: it pins its own pandas);
  4. `--ranks` copies of the source as the ranks of one job: one rank alone, then all of them;
  5. with `--huge`, a trace ten times larger again (3 GB+) through `stallscope analyze`.
Peak memory is the largest total resident memory of the process tree (workers included),
sampled every 20 ms with psutil. Prints each target of issue 7 with the measured figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiling import tile_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "sample_traces" / "public"
DEFAULT_SOURCE = REAL / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
GB = 1e9


@dataclass
class Measured:
    wall_s: float
    peak_bytes: int
    inner_s: float | None = None  # time the child reports for its own work, if it does


def measure(cmd: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run `cmd`, sampling the resident memory of it and all its descendants."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    peak = 0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [ps, *ps.children(recursive=True)]
            total = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):  # it may have just exited
                    total += p.memory_info().rss
            peak = max(peak, total)
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    inner = None
    for line in out.splitlines():
        if line.startswith("inner_s="):
            inner = float(line.split("=", 1)[1])
    return Measured(wall, peak, inner)


JSON_LOADS = textwrap.dedent("""
    import gzip, json, sys, time
    t = time.perf_counter()
    with open(sys.argv[1], "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = gzip.decompress(raw)
    json.loads(raw)
    print(f"inner_s={time.perf_counter() - t}")
""")

HTA_LOAD = textwrap.dedent("""
    import sys, time
    t = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    TraceAnalysis(trace_dir=sys.argv[1])
    print(f"inner_s={time.perf_counter() - t}")
""")


def analyze(paths: list[Path], out: Path, *extra: str) -> Measured:
    cmd = [sys.executable, "-m", "stallscope", "analyze", *map(str, paths), "-q", "--force",
           "-o", str(out), *extra]
    return measure(cmd)


def text_bytes(path: Path) -> int:
    from stallscope.fanout import text_size

    return text_size(path)


def row(label: str, m: Measured) -> str:
    inner = f" (work {m.inner_s:6.2f} s)" if m.inner_s is not None else ""
    return f"  {label:<44} {m.wall_s:7.2f} s{inner:<18} peak {m.peak_bytes / GB:5.2f} GB"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--tiles", type=int, default=10)
    ap.add_argument("--gzip", action="store_true", help="write the tiled traces gzipped")
    ap.add_argument("--huge", action="store_true", help="also a trace 10x larger (3 GB+)")
    ap.add_argument("--ranks", type=int, default=16, help="rank files for the job test (0: off)")
    ap.add_argument("--hta-python", help="a python with holistictraceanalysis installed")
    ap.add_argument("--work", type=Path, help="folder for the generated traces (kept)")
    args = ap.parse_args()
    if not args.source.exists():
        sys.exit(f"no source trace at {args.source}; pass --source")
    work = args.work or Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if args.gzip else ".pt.trace.json"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {cores} cores, {psutil.virtual_memory().total / GB:.1f} GB memory; "
          f"python {sys.version.split()[0]}")

    tiled = work / f"tiled{args.tiles}{suffix}"
    if not tiled.exists():
        t = time.perf_counter()
        n = tile_trace(args.source, tiled, args.tiles)
        print(f"built {tiled.name}: {n:,} events in {time.perf_counter() - t:.1f} s")
    size = text_bytes(tiled)
    print(f"\n{tiled.name}: {tiled.stat().st_size / 1e6:,.0f} MB on disk, "
          f"{size / 1e6:,.0f} MB of JSON")
    loads = measure([sys.executable, "-c", JSON_LOADS, str(tiled)])
    ours = analyze([tiled], work / "out-tiled")
    print(row("json.loads (read + parse)", loads))
    print(row("stallscope analyze (end to end)", ours))
    if args.hta_python:
        hta_dir = work / "hta-input"
        shutil.rmtree(hta_dir, ignore_errors=True)
        hta_dir.mkdir()
        (hta_dir / tiled.name).symlink_to(tiled)
        hta = measure([args.hta_python, "-c", HTA_LOAD, str(hta_dir)])
        print(row("HolisticTraceAnalysis TraceAnalysis load", hta))
        print(f"  stallscope / HTA time: {ours.wall_s / hta.wall_s:.2f}, "
              f"memory: {ours.peak_bytes / hta.peak_bytes:.2f}")
    time_ratio = ours.wall_s / loads.inner_s
    mem_ratio = ours.peak_bytes / size
    print(f"  target: analyze <= 0.6x json.loads time: {time_ratio:.2f}x  "
          f"-> {verdict(time_ratio <= 0.6)}")
    print(f"  target: peak <= 3x file text:           {mem_ratio:.2f}x  "
          f"-> {verdict(mem_ratio <= 3.0)}")

    if args.ranks:
        job = work / f"job{args.ranks}"
        job.mkdir(exist_ok=True)
        files = []
        for r in range(args.ranks):
            f = job / f"rank{r}{suffix}"
            if not f.exists():
                tile_trace(args.source, f, 1, rank=r, world_size=args.ranks)
            files.append(f)
        one = analyze([files[0]], work / "out-one")
        every = analyze([job], work / "out-job")
        ideal = one.wall_s * args.ranks / cores
        print(f"\n{args.ranks} rank files of {text_bytes(files[0]) / 1e6:.0f} MB JSON each:")
        print(row("one rank", one))
        print(row(f"all {args.ranks} ranks (parallel, default jobs)", every))
        print(f"  target: ~ one x {args.ranks} / {cores} cores = {ideal:.1f} s: measured "
              f"{every.wall_s:.1f} s ({every.wall_s / ideal:.2f}x of it)")

    if args.huge:
        huge = work / f"tiled{args.tiles * 10}{suffix}"
        if not huge.exists():
            t = time.perf_counter()
            n = tile_trace(args.source, huge, args.tiles * 10)
            print(f"\nbuilt {huge.name}: {n:,} events in {time.perf_counter() - t:.1f} s")
        hsize = text_bytes(huge)
        big = analyze([huge], work / "out-huge")
        print(f"\n{huge.name}: {huge.stat().st_size / GB:.2f} GB on disk, "
              f"{hsize / GB:.2f} GB of JSON")
        print(row("stallscope analyze (end to end)", big))
        print(f"  target: peak under 4 GB: {big.peak_bytes / GB:.2f} GB "
              f"-> {verdict(big.peak_bytes < 4 * GB)}")
    print(f"\n(traces kept in {work})")


if __name__ == "__main__":
    main()
