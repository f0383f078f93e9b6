"""Time `stallscope analyze` end to end on the largest real trace (run by hand, not in CI), and
each stage of it: load, model, diagnose, the replay and its fix plan, HTML.

    python benchmarks/bench_analyze.py [TRACE] [--repeat N]

Default TRACE: the largest file in sample_traces/public. Prints, as medians over N runs, the
wall time of the whole CLI in a fresh process (start-up included), of the in-process pipeline
stages, and of a plain `json.loads` of the same (decompressed) file for scale, plus the CLI's
peak resident memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "sample_traces" / "public"


def largest_real_trace() -> Path:
    files = [p for p in REAL.rglob("*") if p.is_file() and ".json" in p.name]
    if not files:
        sys.exit(f"no traces under {REAL}; pass a trace path")
    return max(files, key=lambda p: p.stat().st_size)


def read_bytes(path: Path) -> bytes:
    """The file's JSON text (gunzipped when it is gzip)."""
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace", nargs="?", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    trace = args.trace or largest_real_trace()

    from stallscope.commands.pipeline import analyze_paths
    from stallscope.diagnose import diagnose
    from stallscope.diagnose.plan import make_plan
    from stallscope.report.html import render_html
    from stallscope.trace.load import load_trace
    from stallscope.trace.model import build_model

    # The CLI first, while this process is small: a child's peak RSS counts the pages it
    # shares with its parent until it execs.
    cli_times, peaks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            cmd = [sys.executable, "-m", "stallscope", "analyze", str(trace), "-q",
                   "-o", f"{tmp}/o{i}"]
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            cli_times.append(time.perf_counter() - t)
            peaks.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    raw = read_bytes(trace)
    events = len(json.loads(raw)["traceEvents"])
    print(f"trace: {trace} ({trace.stat().st_size:,} bytes on disk, {len(raw):,} bytes JSON, "
          f"{events:,} events)")

    t_read = median_time(lambda: read_bytes(trace), args.repeat)
    t_json = median_time(lambda: json.loads(gzip.decompress(trace.read_bytes())
                                            if trace.suffix == ".gz" else trace.read_bytes()),
                         args.repeat)
    t_load = median_time(lambda: load_trace(trace), args.repeat)
    loaded = load_trace(trace)
    t_model = median_time(lambda: build_model(loaded), args.repeat)
    model = build_model(loaded)
    t_diag = median_time(lambda: diagnose(model), args.repeat)
    # The replay and fix plan (it updates the findings it is given: fresh ones each time).
    plans = []
    for _ in range(args.repeat):
        assessments = diagnose(model)
        t = time.perf_counter()
        make_plan(model, assessments)
        plans.append(time.perf_counter() - t)
    t_plan = statistics.median(plans)
    report = analyze_paths([trace])
    t_html = median_time(lambda: render_html(report), args.repeat)

    t_cli = statistics.median(cli_times)

    print(f"median of {args.repeat} runs:")
    print(f"  stallscope analyze (CLI, fresh process) {t_cli:7.3f} s   "
          f"peak RSS {max(peaks):.0f} MB")
    print(f"    read + gunzip                         {t_read:7.3f} s")
    print(f"    load (decode -> columns)              {t_load:7.3f} s")
    print(f"    model (steps, breakdowns, copies)     {t_model:7.3f} s")
    print(f"    diagnose (rules)                      {t_diag:7.3f} s")
    print(f"    replay + fix plan                     {t_plan:7.3f} s   "
          f"({100 * t_plan / t_cli:.0f}% of the CLI's time)")
    print(f"    render HTML                           {t_html:7.3f} s")
    print(f"  json.loads of the same file (gunzip+parse) {t_json:7.3f} s")
    print(f"  ratio analyze(in-process load+model+diagnose) / json.loads: "
          f"{(t_load + t_model + t_diag) / t_json:.2f}")


if __name__ == "__main__":
    main()
