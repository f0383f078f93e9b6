"""Record `stallscope watch` on a lent GPU, with the plain step times it should have seen.

Each case runs gpu_workload.py twice: plain (no stallscope; each step's wall time written by
`--step-times`), then under `stallscope watch`. OUT gets, per case, `plain-<case>.json` (the
plain step times), the watch's `report-<case>.json`, its step log `steps-<case>.jsonl`, its
recorded trace `real-<gpu>-watch-<case>.pt.trace.json.gz` and `<case>.log` (the commands, exit
codes, stderr). No case starts after `--deadline` seconds.

Cases (their truth is the workload's own switch):
- `slowdown`: 8 workers, 300 steps; from step 150 each sample costs 4x the CPU (no shuffle).
- `save`: 8 workers, 200 steps, a blocking checkpoint (GPU->host copy, write, fsync) every 25.
- `hostbound`: the host-bound CNN (many short kernels), 600 steps: watch's cost per step
  against the plain run's.

    python sample_traces/record_watch_gpu.py OUT [--only slowdown,save] [--deadline 200]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from publish_gpu_recordings import gpu_label  # noqa: E402

WORKLOAD = HERE / "gpu_workload.py"
W8 = ["--num-workers", "8", "--item-every", "1000000"]
CASES: dict[str, list[str]] = {
    "slowdown": [*W8, "--samples", str(128 * 300), "--slow-after-step", "150"],
    "save": [*W8, "--samples", str(128 * 200), "--save-every", "25"],
    "hostbound": [*W8, "--width", "8", "--side", "32", "--batch-size", "32", "--sample-ms", "0",
                  "--samples", str(32 * 600)],
}


def run(cmd: list[str], log: Path) -> int:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\nexit {proc.returncode} after "
                f"{time.perf_counter() - t:.1f} s\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n")
    return proc.returncode


def case(name: str, out: Path, label: str) -> None:
    args, log = CASES[name], out / f"{name}.log"
    run([sys.executable, str(WORKLOAD), *args, "--step-times", str(out / f"plain-{name}.json")],
        log)
    dest = out / "work" / name
    run([sys.executable, "-m", "stallscope", "watch", "-q", "-o", str(dest), str(WORKLOAD),
         *args], log)
    for src, to in ((dest / "report.json", f"report-{name}.json"),
                    (dest / "watch" / "steps.jsonl", f"steps-{name}.jsonl")):
        if src.exists():
            shutil.copyfile(src, out / to)
    traces = sorted((dest / "tensorboard").rglob("*.pt.trace.json.gz"))
    if traces:
        shutil.copyfile(traces[0], out / f"real-{label}-watch-{name}.pt.trace.json.gz")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--only", default="")
    p.add_argument("--deadline", type=float, default=0.0)
    p.add_argument("--extra", default="", help="arguments added to every case (a CPU dry run)")
    a = p.parse_args()
    import torch

    a.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    label = gpu_label(torch.cuda.get_device_name(0)) if cuda else "cpu"
    if a.extra:
        for k in CASES:
            CASES[k] = [*CASES[k], *shlex.split(a.extra)]
    start = time.perf_counter()
    for name in a.only.split(",") if a.only else list(CASES):
        if a.deadline and time.perf_counter() - start > a.deadline:
            print(f"{name}: not run, past the {a.deadline:.0f} s deadline", flush=True)
            continue
        case(name, a.out, label)
        print(f"{name}: done, t={time.perf_counter() - start:.0f} s", flush=True)
    (a.out / "env.json").write_text(json.dumps({
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None, "cases": CASES}, indent=1))
    shutil.rmtree(a.out / "work", ignore_errors=True)


if __name__ == "__main__":
    main()
