"""Record the real GPU traces and their plain timings (sample_traces/README.md), on a lent
H100/H200.

For each configuration of gpu_workload.py: `--repeats` runs timed without any profiler (the mean
step a user sees, over `--steps` steps after the first 25, so the loader's prefetched batches
are used up as in the recording), then one `stallscope run` that records 6 steps after 24
skipped. Writes `real-<gpu>-<name>.pt.trace.json.gz` (h100, h200: the GPU it ran on), the
run's `report-<name>.json` and `measured.json` (the plain timings, each run's exit status
and time; the recorded steps come from the traces themselves) into OUT. A configuration that
fails is logged (`<name>.log`) and the next one runs; none starts after `--deadline` seconds,
so a lease that runs out still returns what was recorded.

    python sample_traces/record_h100.py OUT [--only NAME,NAME] [--deadline 420]
    python sample_traces/publish_gpu_recordings.py r1=OUT   # label them for sample_traces/
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
W = ["--num-workers", "8"]
# name -> the workload's arguments; pairs differ in one switch (see README.md). The order is
# the order of value: if the lease runs out, the pairs the replay models come back first.
CONFIGS: dict[str, list[str]] = {
    "w0": ["--num-workers", "0"],
    "w8": W,
    "w8-pinned": [*W, "--pin-memory", "--non-blocking"],
    "w8-item-every-step": [*W, "--item-every", "1"],
    "w8-bf16": [*W, "--amp", "bf16"],
    "w8-adam-forloop": [*W, "--optimizer", "forloop"],
    "w8-adam-fused": [*W, "--optimizer", "fused"],
    "w4": ["--num-workers", "4"],
    "w8-compile": [*W, "--compile"],
    # pinned memory alone: a blocking copy from pinned memory (no non_blocking)
    "w8-pinned-blocking": [*W, "--pin-memory"],
    # a step the host bounds: a narrow CNN on small images, many short kernels per step
    "hostbound": [*W, "--width", "8", "--side", "32", "--batch-size", "32", "--sample-ms", "0"],
    # the host-bound step compiled (fused kernels), and compiled with CUDA graphs
    "hostbound-compile": [*W, "--width", "8", "--side", "32", "--batch-size", "32",
                          "--sample-ms", "0", "--compile"],
    "hostbound-graphs": [*W, "--width", "8", "--side", "32", "--batch-size", "32",
                         "--sample-ms", "0", "--compile", "--compile-mode", "reduce-overhead"],
}
RUN = ["--skip", "24", "--warmup", "1", "--steps", "6"]
TIME_FROM = 25


def plain(args: list[str], steps: int, log: Path) -> float | None:
    proc = subprocess.run([sys.executable, str(WORKLOAD), *args, "--time", str(steps),
                           "--time-from", str(TIME_FROM)], capture_output=True, text=True)
    found = re.search(r"MEAN_STEP_MS ([0-9.]+)", proc.stdout)
    if proc.returncode or not found:
        with log.open("a") as f:
            f.write(f"plain run exit {proc.returncode}\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-4000:]}\n")
        return None
    return float(found.group(1))


def record(name: str, args: list[str], out: Path, work: Path, log: Path, label: str,
           run: list[str]) -> dict:
    dest = work / name
    shutil.rmtree(dest, ignore_errors=True)
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(dest), *run,
           str(WORKLOAD), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\nexit {proc.returncode} after {secs:.1f} s\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n")
    traces = sorted((dest / "tensorboard").rglob("*.pt.trace.json.gz"))
    if traces:
        shutil.copyfile(traces[0], out / f"real-{label}-{name}.pt.trace.json.gz")
    if (dest / "report.json").exists():
        shutil.copyfile(dest / "report.json", out / f"report-{name}.json")
    return {"run_exit": proc.returncode, "record_s": round(secs, 1), "traces": len(traces)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--only", default="")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=60, help="timed steps per plain run")
    p.add_argument("--deadline", type=float, default=0.0,
                   help="start no configuration after this many seconds (0: no limit)")
    p.add_argument("--extra", default="", help="arguments added to every run (a CPU dry run)")
    p.add_argument("--run-args", default="",
                   help="arguments added to every `stallscope run` (e.g. --record-shapes)")
    p.add_argument("--record-steps", type=int, default=6, help="steps each run records")
    p.add_argument("--interleave", action="store_true",
                   help="time the plain runs round-robin over the configurations (a host that "
                        "drifts during the lease then shifts every configuration alike), "
                        "then record each")
    a = p.parse_args()
    start = time.perf_counter()
    run = [*RUN[:-1], str(a.record_steps), *shlex.split(a.run_args)]
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work"
    names = a.only.split(",") if a.only else list(CONFIGS)
    result_path = a.out / "measured.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    import torch

    cuda = torch.cuda.is_available()
    result["_env"] = {
        "interleaved": a.interleave,
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name(0) if cuda else None, "cpus": os.cpu_count(),
        "run": run, "time_from": TIME_FROM, "timed_steps": a.steps, "extra": a.extra,
    }
    extra = shlex.split(a.extra)
    label = gpu_label(result["_env"]["gpu"]) if cuda else "cpu"
    timed: dict[str, list[float | None]] = {}
    if a.interleave:
        for _ in range(a.repeats):
            for name in names:
                args = [*CONFIGS[name], *extra]
                timed.setdefault(name, []).append(plain(args, a.steps, a.out / f"{name}.log"))
            print(f"plain round: t={time.perf_counter() - start:.0f} s", flush=True)
    for name in names:
        if a.deadline and time.perf_counter() - start > a.deadline:
            print(f"{name:22} not run: past the {a.deadline:.0f} s deadline", flush=True)
            continue
        args = [*CONFIGS[name], *extra]
        log = a.out / f"{name}.log"
        times = timed.get(name) or [plain(args, a.steps, log) for _ in range(a.repeats)]
        rec = record(name, args, a.out, work, log, label, run)
        result[name] = {"args": args, "plain_mean_step_ms": times, **rec}
        result_path.write_text(json.dumps(result, indent=1))
        shown = " ".join("failed" if t is None else f"{t:7.2f}" for t in times)
        print(f"{name:22} plain {shown} ms  run exit {rec['run_exit']} "
              f"({rec['record_s']:.0f} s)  t={time.perf_counter() - start:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
