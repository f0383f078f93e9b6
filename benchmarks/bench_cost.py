"""The tool's own cost (issue 33), every figure in one run, by hand (not in CI).

    python benchmarks/bench_cost.py [--work DIR] [--repeat 5] [--big TRACE] [--small TRACE]

Fresh processes, medians of --repeat (the VM's speed drifts 10-30% within a minute, so the
ratios are taken from runs interleaved with each other):
  1. `stallscope --version` and `--help`: wall time and peak resident memory;
  2. `stallscope analyze` of a small trace (default: the 2.9 KB hta/a100_event_sync_small),
     end to end, three report files written;
  3. the big trace (default: kineto/resnet50_num_workers_0 tiled 10 times by tiling.py, 302 MB
     of JSON): a bare typed msgspec decode of it (a fresh process that reads the file and
     decodes `traceEvents` into structs of the fields stallscope reads: the least any reader
     of these fields must do), against `stallscope analyze` end to end (replay and the three
     reports included) on every core, and with `--jobs 1`. Peak memory is the whole process
     tree's, sampled every 20 ms: the sum of resident memory (pages a forked worker shares with
     its parent counted in both) and, in one more run of each apart from the timed ones (reading
     smaps slows the processes it reads), the sum of proportional memory (PSS: shared pages
     split).
  4. the in-process stage timings of one analysis of the big trace (docs/performance.md);
  5. the recording's cost, by the two benchmarks that measure it, each in its own process:
     bench_profiler_cost.py (the profiler's cost per op with and without each option, and the
     trace bytes per op) and bench_hooks.py (what run's step hooks and watch's per-step log
     add to a step). `--no-recording` leaves them out (they need torch, and
     take several minutes: bench_hooks' MLP loops are most of it).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import statistics
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
PUBLIC = ROOT / "sample_traces" / "public"
SMALL = PUBLIC / "hta" / "a100_event_sync_small.pt.trace.json.gz"
SOURCE = PUBLIC / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
MB = 1e6

TYPED_DECODE = textwrap.dedent("""
    import sys, msgspec
    from stallscope.trace.decode import Event
    class Trace(msgspec.Struct):
        traceEvents: list[Event] = []
    with open(sys.argv[1], "rb") as fh:
        msgspec.json.decode(fh.read(), type=Trace, strict=False)
""")


@dataclass
class Run:
    wall_s: float
    rss: int  # peak of the tree's summed resident memory
    pss: int  # peak of the tree's summed proportional memory (0 when not sampled)


# As an installed package runs: from compiled bytecode (pip compiles it at install). A shell with
# PYTHONDONTWRITEBYTECODE=1 would otherwise compile stallscope's modules from source on every
# start (about 0.1 s on this VM), which no user pays.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(cmd: list[str], pss: bool = False) -> Run:
    """`cmd` in a fresh process, its tree's memory sampled every 20 ms until it exits."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    top = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        rss = pss_sum = 0
        with contextlib.suppress(psutil.Error):
            for p in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # it may have just exited
                    if pss:
                        info = p.memory_full_info()
                        rss, pss_sum = rss + info.rss, pss_sum + info.pss
                    else:
                        rss += p.memory_info().rss
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss_sum)
        time.sleep(0.02)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode not in (0, 3):
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return Run(wall, peak_rss, peak_pss)


def medians(runs: list[Run]) -> Run:
    return Run(statistics.median(r.wall_s for r in runs), max(r.rss for r in runs),
               max(r.pss for r in runs))


def line(label: str, r: Run) -> str:
    pss = f"  PSS {r.pss / MB:6.0f} MB" if r.pss else ""
    return f"  {label:<46} {r.wall_s:6.3f} s   RSS {r.rss / MB:6.0f} MB{pss}"


def stages(trace: Path) -> list[tuple[str, float]]:
    """One analysis in this process, stage by stage (imports first, from a fresh process's
    point of view they are paid once)."""
    t = time.perf_counter()
    from stallscope.diagnose import diagnose
    from stallscope.diagnose.plan import make_plan
    from stallscope.report.build import report_from
    from stallscope.report.digest import digest
    from stallscope.report.html import render_html
    from stallscope.report.markdown import render_markdown
    from stallscope.trace.load import load_trace
    from stallscope.trace.model import build_model

    out = [("imports (pandas, rules, writers)", time.perf_counter() - t)]

    def timed(label: str, fn):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        value = fn()
        out.append((label, time.perf_counter() - t0))
        return value

    from stallscope.fanout import usable_cores

    cores = usable_cores()
    trace_obj = timed(f"load, {cores} processes (decode -> columns)",
                      lambda: load_trace(trace, cores=cores))
    timed("load, 1 process", lambda: load_trace(trace, cores=1))
    model = timed("model (steps, breakdowns, copies)", lambda: build_model(trace_obj))
    verdict = timed("diagnose (rules)", lambda: diagnose(model, None))
    plan = timed("replay + fix plan", lambda: make_plan(model, verdict, None))
    dig = timed("digest (what the report keeps)", lambda: digest(model, plan, draw=True))
    report = timed("report assembly", lambda: report_from([dig], [verdict], [str(trace)]))
    timed("render HTML", lambda: render_html(report))
    timed("render Markdown", lambda: render_markdown(report))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="folder for the tiled trace (kept)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--big", type=Path, help="the big trace (default: built by tiling)")
    ap.add_argument("--small", type=Path, default=SMALL)
    ap.add_argument("--no-stages", action="store_true")
    ap.add_argument("--no-recording", action="store_true")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="stallscope-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    big = args.big or work / "tiled10.pt.trace.json"
    if not big.exists():
        tile_trace(SOURCE, big, 10)
    py = sys.executable
    cli = [py, "-m", "stallscope"]
    import stallscope

    compileall.compile_dir(Path(stallscope.__file__).parent, quiet=1)
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cores} cores, load average {os.getloadavg()[0]:.2f}; python "
          f"{sys.version.split()[0]}; medians of {args.repeat} fresh processes")

    version = medians([run([*cli, "--version"]) for _ in range(args.repeat)])
    helps = medians([run([*cli, "--help"]) for _ in range(args.repeat)])
    out = work / "out"
    small = medians([run([*cli, "analyze", str(args.small), "-q", "--force", "-o",
                          str(out / "small")]) for _ in range(args.repeat)])
    print("\nstart-up and a small trace:")
    print(line("stallscope --version", version) + "   target < 0.15 s")
    print(line("stallscope --help", helps) + "   target < 0.15 s")
    print(line(f"analyze {args.small.name} ({args.small.stat().st_size:,} B)", small)
          + "   target < 0.4 s")
    floor = medians([run([py, "-c", "import pandas"]) for _ in range(args.repeat)])
    print(line("  (python -c 'import pandas', for scale)", floor))

    size = big.stat().st_size
    typed, every, one = [], [], []
    commands = {
        "typed": [py, "-c", TYPED_DECODE, str(big)],
        "every": [*cli, "analyze", str(big), "-q", "--force", "-o", str(out / "big")],
        "one": [*cli, "analyze", str(big), "-q", "--force", "--jobs", "1", "-o",
                str(out / "one")],
    }
    for _ in range(args.repeat):  # interleaved, so drift falls on all three alike
        typed.append(run(commands["typed"]))
        every.append(run(commands["every"]))
        one.append(run(commands["one"]))
    # Memory apart: reading every process's smaps for PSS each 20 ms slows what it samples.
    pss = {name: run(cmd, pss=True) for name, cmd in commands.items()}
    typed_m, every_m, one_m = medians(typed), medians(every), medians(one)
    for m, name in ((typed_m, "typed"), (every_m, "every"), (one_m, "one")):
        m.pss = pss[name].pss
    print(f"\n{big.name}: {size / MB:,.0f} MB of JSON")
    print(line("typed msgspec decode (read + decode)", typed_m))
    print(line(f"stallscope analyze, {cores} cores (end to end)", every_m))
    print(line("stallscope analyze --jobs 1", one_m))
    ratio = statistics.median(e.wall_s / t.wall_s for e, t in zip(every, typed, strict=True))
    ratio1 = statistics.median(o.wall_s / t.wall_s for o, t in zip(one, typed, strict=True))
    print(f"  analyze / typed decode, time: {ratio:.2f}x on {cores} cores, {ratio1:.2f}x on one "
          "(target at most 1.0x on 2 cores)")
    print(f"  peak / file: RSS {every_m.rss / size:.2f}x, PSS {every_m.pss / size:.2f}x on "
          f"{cores} cores; RSS {one_m.rss / size:.2f}x on one (target at most 0.5x)")

    if not args.no_stages:
        print(f"\nstages of one analysis of {big.name}, in one process:")
        for label, s in stages(big):
            print(f"  {label:<46} {s:6.3f} s")

    if not args.no_recording:
        for script in ("bench_profiler_cost.py", "bench_hooks.py"):
            print(f"\nthe recording's cost: benchmarks/{script}", flush=True)
            subprocess.run([py, str(Path(__file__).parent / script)], check=True, env=ENV)


if __name__ == "__main__":
    main()
