"""What `watch`'s whole-run analysis costs on a long run, by hand (not in CI).

    python benchmarks/bench_watch_scale.py [--steps 2000000] [--work DIR]

Writes a synthetic step file as `watch` writes it (benchmarks/watch_synth.py: 5 ms steps with
the shared VM's noise, 1.5x slower from halfway, epochs of 5,000 steps, a CPU time per step),
once per size, then in a fresh process reads it (`StepSeries.from_jsonl`) and analyses it
(`summarise`, report.json's `watch` section), printing each stage's time and the process's
peak resident memory after it (Linux: /proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import watch_synth  # noqa: E402

MEASURE = """
import json, sys, time
from stallscope.wholerun.series import StepSeries
from stallscope.wholerun.summary import summarise
def peak():  # this process's own high-water mark (ru_maxrss keeps the parent's across exec)
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("VmHWM")) / 1e3
t = time.perf_counter(); series = StepSeries.from_jsonl(sys.argv[1]); read = time.perf_counter() - t
read_peak = peak()
t = time.perf_counter(); section = summarise(series); took = time.perf_counter() - t
size = len(json.dumps(section))
print(f"  read   {read:6.2f} s   peak {read_peak:6.0f} MB")
print(f"  analyse {took:5.2f} s   peak {peak():6.0f} MB   ({len(section['regimes'])} regimes, "
      f"{len(section['steps']):,} steps kept, {size / 1e6:.1f} MB of JSON)")
"""


def write_steps(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    step, wait = watch_synth.steady(n, rng, "busy", step_ms=5.0)
    step[n // 2:] *= 1.5
    with open(path, "w", encoding="utf-8") as fh:
        for rec in watch_synth.records(step, wait, epoch_len=5000):
            rec["cpu_ms"] = rec["step_ms"] * 0.9
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--work", type=Path, help="folder for the step file (kept)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="stallscope-watch-"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"steps-{args.steps}.jsonl"
    if not path.exists():
        write_steps(path, args.steps)
    print(f"{args.steps:,} steps, {path.stat().st_size / 1e6:.0f} MB step file")
    subprocess.run([sys.executable, "-c", MEASURE, str(path)], check=True)


if __name__ == "__main__":
    main()
