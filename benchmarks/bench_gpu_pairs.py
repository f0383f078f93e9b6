"""The replay's predictions against the GPU pairs recorded on a lent H200 or H100 (by hand).

Each pair of sample_traces/real-h200-* recordings differs in one switch of
sample_traces/gpu_workload.py (see sample_traces/README.md). For each, the product's prediction
(`stallscope analyze BEFORE --what-if CHANGE`) is set against two measurements of the after
configuration: the mean step of plain runs without any profiler (what a user sees;
sample_traces/real-<gpu>-measured.json, two runs per recording session), and the after
recording's own step without the profiler's cost (its plan's baseline), as the prediction is.
Every recording session (r1, r2) is predicted from its own before trace. The columns: the
before trace's recorded step, its step without the profiler (where the changes start), the
prediction, the plain after-timing and the prediction's error against it; then the after
recording's step without the profiler and the error against that.

    python benchmarks/bench_gpu_pairs.py [--dir sample_traces] [--gpu h200|h100] [--only AFTER]
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
    ("w8", ("pin_memory=true",), "w8-pinned-blocking"),
    ("hostbound", ("cuda_graphs=true",), "hostbound-graphs"),
    ("w8", ("compile=true",), "w8-compile"),  # H200 r1 and H100 r2 only: skipped elsewhere
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
    p.add_argument("--gpu", default="h200", help="the recordings' label: h200 or h100")
    p.add_argument("--only", default="", help="only the pairs whose after configuration is "
                   "this (e.g. w8-bf16)")
    a = p.parse_args()
    plain = json.loads((a.dir / f"real-{a.gpu}-measured.json").read_text())
    sessions = sorted(k for k in plain if not k.startswith("_"))
    print(f"{'session':7} {'before -> after':34} {'recorded':>8} {'without':>8} "
          f"{'predicted':>9} {'range':>11} {'plain':>7} {'error':>7} | {'after w/o':>9} "
          f"{'error':>7} | {'change':>7} {'plain':>7}")
    errors: list[float] = []
    rel_errors: list[float] = []
    inside: list[bool] = []  # the plain after-timings (each run) inside the predicted range
    with tempfile.TemporaryDirectory() as tmp:
        for session in sessions:
            def trace(name: str, s: str = session) -> Path:
                return a.dir / f"real-{a.gpu}-{s}-{name}.pt.trace.json.gz"

            for before, changes, after in PAIRS:
                if a.only and after != a.only:
                    continue
                if not (trace(before).exists() and trace(after).exists()
                        and after in plain[session]):
                    continue
                rep = analyze(trace(before), changes, Path(tmp))
                pred = rep["what_if"]["predicted_step_us"] / 1000
                lo, hi = (v / 1000 for v in rep["what_if"]["predicted_range_us"])
                recorded = rep["plan"]["measured_step_us"] / 1000
                without = rep["plan"]["baseline_step_us"] / 1000
                after_plan = analyze(trace(after), (), Path(tmp))["plan"]
                after_without = after_plan["baseline_step_us"] / 1000
                pa = statistics.mean(plain[session][after]["plain_mean_step_ms"])
                err = 100 * (pred - pa) / pa
                errors.append(abs(err))
                inside += [lo <= t <= hi for t in plain[session][after]["plain_mean_step_ms"]]
                err_after = 100 * (pred - after_without) / after_without
                # The change as a ratio, predicted (from the step without the profiler) and
                # measured (plain after over plain before): free of the baseline's own error.
                pb = statistics.mean(plain[session][before]["plain_mean_step_ms"]) \
                    if before in plain[session] else float("nan")
                rel, rel_plain = 100 * (pred / without - 1), 100 * (pa / pb - 1)
                if rel_plain == rel_plain:
                    rel_errors.append(abs(rel - rel_plain))
                print(f"{session:7} {before + ' -> ' + after:34} {recorded:7.1f}ms "
                      f"{without:7.1f}ms {pred:8.1f}ms {lo:5.1f}-{hi:4.1f} {pa:6.1f}ms "
                      f"{err:+6.1f}% | "
                      f"{after_without:8.1f}ms {err_after:+6.1f}% | {rel:+6.1f}% {rel_plain:+6.1f}%"
                      f"  ({' '.join(changes)})", flush=True)
    if errors:
        print(f"prediction against the plain after-timing: median |error| "
              f"{statistics.median(errors):.1f}%, worst {max(errors):.1f}%, within 15%: "
              f"{sum(e <= 15 for e in errors)} of {len(errors)}; plain runs inside the predicted "
              f"range: {sum(inside)} of {len(inside)}")
    if rel_errors:
        print(f"the change as a share of the step, predicted against plain runs: median "
              f"|difference| {statistics.median(rel_errors):.1f} points, within 15 points: "
              f"{sum(e <= 15 for e in rel_errors)} of {len(rel_errors)}")


if __name__ == "__main__":
    main()
