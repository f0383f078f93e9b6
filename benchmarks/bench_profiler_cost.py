"""The profiler's own cost per recorded op, with and without each option, on this machine.

What `stallscope run` measures at its start (capture/opcost.py) for its own settings, here for
every setting: CPU ops under CPU activity, with and without `record_shapes`; and, where CUDA is
available, CPU ops and kernel-launching ops under CPU+CUDA activity. Each line: the host's cost
of one op plain and profiled, the difference (what the replay takes out per recorded op), and
how long the measurement itself took. `--json FILE` also writes the figures.

    python benchmarks/bench_profiler_cost.py [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch
from torch.profiler import ProfilerActivity

from stallscope.capture.opcost import measure
from stallscope.capture.quiet import quiet_profiler_warnings, usdt_filtered


def cases() -> list[tuple[str, list[ProfilerActivity], bool, str]]:
    cpu = [ProfilerActivity.CPU]
    out = [(f"cpu ops, CPU activity, shapes {'on' if s else 'off'}", cpu, s, "cpu")
           for s in (False, True)]
    if torch.cuda.is_available():
        both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        for device in ("cpu", "cuda"):
            for s in (False, True):
                out.append((f"{device} ops, CPU+CUDA activity, shapes {'on' if s else 'off'}",
                            both, s, device))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    quiet_profiler_warnings()
    warnings.simplefilter("ignore")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, GPU {gpu}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<40} {'plain us':>9} {'profiled us':>12} {'added us':>9} {'took s':>7}")
    rows = []
    for label, activities, shapes, device in cases():
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with usdt_filtered():
                cost = measure(activities, shapes, device)
            took = time.perf_counter() - t0
            print(f"{label:<40} {cost.plain_us:>9.2f} {cost.profiled_us:>12.2f} "
                  f"{cost.added_us:>9.2f} {took:>7.2f}", flush=True)
            rows.append({"case": label, "took_s": round(took, 3), **cost.to_dict()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": gpu, "cores": os.cpu_count(),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
