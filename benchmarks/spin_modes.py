"""A steady MLP on intra-op threads beside busy loops: its step time against what each of its
threads did (docs/watch.md, "Other load": the limit of the load rule).

The script (no stallscope: a plain loop writing each step's wall and CPU time) runs beside
`--burners` processes spinning `while True: pass`; every half second this process reads each of
its threads' time on a core and waiting for one (/proc/PID/task/TID/schedstat) and its voluntary
and involuntary context switches (status). Printed every `--every` seconds: the median step and
CPU time per step over that stretch, and per thread its share of the wall time on a core and
waiting for one, and its switches per half second.

    python benchmarks/spin_modes.py [--seconds 60] [--threads 2] [--burners 2] [--every 6]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

LOOP = textwrap.dedent(
    """
    import sys, time, torch
    torch.set_num_threads(int(sys.argv[3]))
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    out = open(sys.argv[1], "w")
    end = time.time() + float(sys.argv[2])
    last, cpu = time.perf_counter(), time.process_time()
    while time.time() < end:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        time.sleep(0.002)
        now, c = time.perf_counter(), time.process_time()
        out.write(f"{time.time():.4f} {(now - last) * 1e3:.3f} {(c - cpu) * 1e3:.3f}\\n")
        last, cpu = now, c
    out.close()
    """
)


def _spin() -> None:
    while True:
        pass


def threads(pid: int) -> dict[str, tuple[int, int, int, int]]:
    """Per thread: ns on a core, ns waiting for one, voluntary and involuntary switches."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            task = Path(f"/proc/{pid}/task/{tid}")
            run, wait = (task / "schedstat").read_text().split()[:2]
            status = dict(line.split(":", 1) for line in
                          (task / "status").read_text().splitlines() if ":" in line)
            out[tid] = (int(run), int(wait), int(status["voluntary_ctxt_switches"]),
                        int(status["nonvoluntary_ctxt_switches"]))
        except (OSError, KeyError, ValueError):
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--every", type=float, default=6.0)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    burners = [ctx.Process(target=_spin, daemon=True) for _ in range(args.burners)]
    for p in burners:
        p.start()
    with tempfile.TemporaryDirectory() as tmp:
        script, steps = Path(tmp) / "loop.py", Path(tmp) / "steps.txt"
        script.write_text(LOOP)
        proc = subprocess.Popen([sys.executable, str(script), str(steps), str(args.seconds),
                                 str(args.threads)])
        reads: list[tuple[float, dict[str, tuple[int, int, int, int]]]] = []
        time.sleep(2.0)  # torch's import: no steps yet
        while proc.poll() is None:
            reads.append((time.time(), threads(proc.pid)))
            time.sleep(0.5)
        for p in burners:
            p.kill()
        rows = [tuple(map(float, line.split())) for line in steps.read_text().splitlines()]
    t0 = reads[0][0]
    k = max(1, round(args.every / 0.5))
    for (a, before), (b, after) in zip(reads[::k], reads[k::k], strict=False):
        in_it = [r for r in rows if a <= r[0] < b]
        if not in_it:
            continue
        cells = []
        for tid in sorted(after):
            if tid not in before:
                continue
            d = [y - x for x, y in zip(before[tid], after[tid], strict=True)]
            if d[0] + d[1] < 0.01 * (b - a) * 1e9:  # an idle thread
                continue
            per_half = 0.5 / (b - a)
            cells.append(f"thread {tid}: core {100 * d[0] / ((b - a) * 1e9):.0f}% "
                         f"waiting {100 * d[1] / ((b - a) * 1e9):.0f}%, switches "
                         f"{d[2] * per_half:.0f} voluntary {d[3] * per_half:.0f} not")
        print(f"{a - t0:5.1f}-{b - t0:5.1f} s: {len(in_it):4d} steps, median "
              f"{statistics.median(r[1] for r in in_it):6.1f} ms, CPU "
              f"{statistics.median(r[2] for r in in_it):6.1f} ms | " + "; ".join(cells))


if __name__ == "__main__":
    main()
