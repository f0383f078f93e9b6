"""What `stallscope tune` measures on the loader-bound example: the speedup it finds and proves.

The tests only ask tune to find workers for a loader that sleeps (a win no machine load can
hide, tests/test_tune.py); how large the win is on a CPU-bound loader depends on the machine
and what else runs on it, so it is measured here, by hand, and reported with the machine's
state (tune's own A/A noise and busy reasons) beside it:

    python benchmarks/bench_tune.py [--repeats 2] [--budget 240] [--rounds 1]

Each round runs `stallscope tune` on examples/loader_bound.py (1,024 samples, as in
docs/usage.md) and prints the speedup, its interval, the change chosen and how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "loader_bound.py"


def one_round(repeats: int, budget: float, work: Path) -> dict:
    out = work / f"tune-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "stallscope", "tune", "-q", "-o", str(out), "--repeats",
         str(repeats), "--budget", str(budget), str(EXAMPLE), "--samples", "1024"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if not (out / "tune.json").is_file():
        sys.exit(f"tune failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    result = json.loads((out / "tune.json").read_text())
    return {"wall_s": wall, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget", type=float, default=240.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'round':>5} {'outcome':>26} {'speedup':>8} {'interval':>15} {'A/A noise':>9} "
          f"{'wall':>7}  change / busy")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            r = one_round(args.repeats, args.budget, Path(tmp))
            low, high = r.get("speedup_range") or (None, None)
            noise = r["statistics"].get("aa_noise")
            interval = f"{low:.2f}-{high:.2f}x" if low is not None else "-"
            noise_text = f"{noise:.0%}" if noise is not None else "-"
            print(f"{i + 1:>5} {r['outcome']:>26} {r['speedup']:>7.2f}x {interval:>15} "
                  f"{noise_text:>9} {r['wall_s']:>6.0f}s  {r['change']}")
            for why in r["busy"]:
                print(f"{'':>8}busy: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
