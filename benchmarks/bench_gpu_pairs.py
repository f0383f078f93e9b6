"""The replay's predictions against the GPU pairs recorded on a lent H200 (run by hand).

Each pair of sample_traces/real-h200-* recordings differs in one switch of
sample_traces/gpu_workload.py (see sample_traces/README.md). For each, the product's prediction
(`stallscope analyze BEFORE --what-if CHANGE`) is set against two measurements of the after
configuration: its recorded steps (the median `analyze` reports, under the profiler as the
before was) and the mean step of plain runs without any profiler (what a user sees;
sample_traces/real-h200-measured.json, two runs per recording session). Every recording session
(r1, r2) is predicted from its own before trace. The last columns set the predicted change of
the step against the recorded change and the plain runs' change (after / before - 1).

    python benchmarks/bench_gpu_pairs.py [--dir sample_traces]
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# before, the changes --what-if is given, after
PAIRS: list[tuple[str, tuple[str, ...], str]] = [
    ("w0", ("num_workers=4",), "w4"),
    ("w0", ("num_workers=8",), "w8"),
    ("w4", ("num_workers=8",), "w8"),
    ("w8", ("pin_memory=true", "non_blocking=true"), "w8-pinned"),
    ("w8-item-every-step", ("sync=off",), "w8"),
    ("w8", ("amp=bf16",), "w8-bf16"),
    ("w8-adam-forloop", ("optimizer=foreach",), "w8"),
    ("w8-adam-forloop", ("optimizer=fused",), "w8-adam-fused"),
    ("w8", ("optimizer=fused",), "w8-adam-fused"),
]


@functools.cache
def analyze(trace: Path, changes: tuple[str, ...], work: Path) -> dict:
    """report.json of `analyze TRACE --what-if ...`; each after trace serves several pairs."""
    out = work / "report"
    shutil.rmtree(out, ignore_errors=True)
    what = [a for c in changes for a in ("--what-if", c)]
    subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(trace), "-q", "-o",
                    str(out), *what], check=True)
    return json.loads((out / "report.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=ROOT / "sample_traces")
    a = p.parse_args()
    plain = json.loads((a.dir / "real-h200-measured.json").read_text())
    sessions = sorted(k for k in plain if not k.startswith("_"))
    print(f"{'session':7} {'before -> after':34} {'before':>7} {'predicted':>9} {'after':>7} "
          f"{'error':>7} | {'change: predicted':>17} {'recorded':>8} {'plain':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for session in sessions:
            def trace(name: str, s: str = session) -> Path:
                return a.dir / f"real-h200-{s}-{name}.pt.trace.json.gz"

            for before, changes, after in PAIRS:
                if not (trace(before).exists() and trace(after).exists()):
                    continue
                rep = analyze(trace(before), changes, Path(tmp))
                pred = rep["what_if"]["predicted_step_us"] / 1000
                meas_before = rep["plan"]["measured_step_us"] / 1000
                meas_after = analyze(trace(after), (), Path(tmp))["plan"]["measured_step_us"] / 1000
                pb = statistics.mean(plain[session][before]["plain_mean_step_ms"])
                pa = statistics.mean(plain[session][after]["plain_mean_step_ms"])
                err = 100 * (pred - meas_after) / meas_after
                print(f"{session:7} {before + ' -> ' + after:34} {meas_before:6.1f}ms "
                      f"{pred:8.1f}ms {meas_after:6.1f}ms {err:+6.1f}% | "
                      f"{100 * (pred / meas_before - 1):+16.1f}% "
                      f"{100 * (meas_after / meas_before - 1):+7.1f}% {100 * (pa / pb - 1):+6.1f}%"
                      f"  ({' '.join(changes)})", flush=True)


if __name__ == "__main__":
    main()
