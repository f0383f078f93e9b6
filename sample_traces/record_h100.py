"""Record the real-h100 traces and their plain timings (GUIDE section 7), on a lent H100.

For each configuration of gpu_workload.py: `--repeats` runs timed without any profiler (the mean
step a user sees), then one `stallscope run` that records 6 steps after the loader's prefetched
batches are used up. Writes `real-h100-<name>.pt.trace.json.gz` and `h100-measured.json` (the
plain timings, the recorded traces' step medians come from the traces themselves) into OUT.

    python sample_traces/record_h100.py OUT [--only NAME,NAME]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "gpu_workload.py"
W = ["--num-workers", "8"]
# name -> the workload's arguments; pairs differ in one switch (see README.md).
CONFIGS: dict[str, list[str]] = {
    "w0": ["--num-workers", "0"],
    "w4": ["--num-workers", "4"],
    "w8": W,
    "w8-pinned": [*W, "--pin-memory", "--non-blocking"],
    "w8-bf16": [*W, "--amp", "bf16"],
    "w8-item-every-step": [*W, "--item-every", "1"],
    "w8-adam-forloop": [*W, "--optimizer", "forloop"],
    "w8-adam-fused": [*W, "--optimizer", "fused"],
    "w8-compile": [*W, "--compile"],
}
RUN = ["--skip", "24", "--warmup", "1", "--steps", "6"]


def plain(args: list[str], steps: int) -> float:
    proc = subprocess.run([sys.executable, str(WORKLOAD), *args, "--time", str(steps)],
                          capture_output=True, text=True, check=True)
    return float(re.search(r"MEAN_STEP_MS ([0-9.]+)", proc.stdout).group(1))


def record(name: str, args: list[str], out: Path, work: Path) -> float:
    dest = work / name
    shutil.rmtree(dest, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stallscope", "run", "-q", "-o", str(dest), *RUN,
                    str(WORKLOAD), *args], check=True)
    (trace,) = (dest / "tensorboard").rglob("*.pt.trace.json.gz")
    shutil.copyfile(trace, out / f"real-h100-{name}.pt.trace.json.gz")
    shutil.copyfile(dest / "report.json", out / f"report-{name}.json")
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--only", default="")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=70)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work"
    names = a.only.split(",") if a.only else list(CONFIGS)
    result_path = a.out / "h100-measured.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    import torch

    result["_env"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                      "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for name in names:
        args = CONFIGS[name]
        times = [plain(args, a.steps) for _ in range(a.repeats)]
        secs = record(name, args, a.out, work)
        result[name] = {"args": args, "plain_mean_step_ms": times, "record_s": round(secs, 1)}
        result_path.write_text(json.dumps(result, indent=1))
        print(f"{name:22} plain {' '.join(f'{t:7.2f}' for t in times)} ms  "
              f"(recorded in {secs:.0f} s)", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
