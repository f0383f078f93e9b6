"""Record the replay's CPU validation pairs: `cpu-replay-<load>-w<N>.pt.trace.json.gz`, the same
training script (replay_workload.py) at num_workers=0 and at N workers, recorded back to back
with `stallscope run` (so each trace carries the facts `run` measures: cores, the CPU the process
used, what each fetch cost). tests/test_replay.py predicts the N-worker step from the 0-worker
trace and compares it with the N-worker trace's measured median.

Two loaders: one that burns CPU per sample (`cpu`, 1 worker: the step then waits for the
worker, which the replay's producer model predicts) and one that waits on storage (`io`, 4
workers: more workers than cores, since waiting takes no core). Not 2 CPU-burning workers on 2
cores: there the scheduler starves the training loop at random (the step's own work ranged
36-102 ms, p10-p90, in one recording), so no single pair is a stable test; the live benchmark
(benchmarks/bench_replay.py live) measures that case with repeats instead. Run from the
repository root, on a machine with nothing else running:

    python sample_traces/record_replay_pairs.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "replay_workload.py"
# (load, sample-ms, workers): see the module docstring.
PAIRS = (("cpu", "3", 1), ("io", "6", 4))
# Enough skipped steps that batches prefetched while the workers started are used up (the
# steady state is what the replay predicts), and enough recorded ones for a stable median.
RUN = ["--skip", "20", "--warmup", "1", "--steps", "24"]


def record(load: str, sample_ms: str, workers: int, tmp: Path) -> Path:
    out = tmp / f"{load}-w{workers}"
    subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), *RUN,
         "--set", f"num_workers={workers}", str(WORKLOAD), "--load", load,
         "--sample-ms", sample_ms],
        check=True,
    )
    (trace,) = (out / "tensorboard").rglob("*.pt.trace.json.gz")
    dest = HERE / f"cpu-replay-{load}-w{workers}.pt.trace.json.gz"
    shutil.copyfile(trace, dest)
    return dest


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for load, sample_ms, workers in PAIRS:
            for n in (0, workers):
                print("recorded", record(load, sample_ms, n, Path(tmp)).name)


if __name__ == "__main__":
    main()
