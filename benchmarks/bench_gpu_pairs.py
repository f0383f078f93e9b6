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

The `base err` column is the before recording's baseline against its own plain before-timing:
pairs where it misses by more than BASELINE_MISS_PCT are summarised apart, as the error there
is the baseline's (the profiler's residue on the host), not the change's.

    python benchmarks/bench_gpu_pairs.py [--dir sample_traces] [--gpu all|h200|h100] [--only AFTER]
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
    # The transformer series (real-h200-xfmr-*, one session): precision and compile.
    ("fp32", ("amp=tf32",), "tf32"),
    ("fp32", ("amp=bf16",), "bf16"),
    ("tf32", ("amp=bf16",), "bf16"),
    ("fp32", ("compile=true",), "compile"),
]
# Pairs whose before recording's baseline (its step without the profiler) misses the plain
# before-timing by more than this are listed apart: the error there is the baseline's.
BASELINE_MISS_PCT = 10.0


@functools.cache
def analyze(trace: Path, changes: tuple[str, ...], work: Path) -> dict:
    """report.json of `analyze TRACE --what-if ...`; each after trace serves several pairs."""
    out = work / "report"
    shutil.rmtree(out, ignore_errors=True)
    what = [a for c in changes for a in ("--what-if", c)]
    subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(trace), "-q", "-o",
                    str(out), *what], check=True)
    return json.loads((out / "report.json").read_text())


def sessions_of(root: Path, gpus: list[str]) -> list[tuple[str, str, dict]]:
    """(gpu, session, plain timings) for every recording session with plain timings: the CNN
    sessions of real-<gpu>-measured.json (r1, r2, ...) and the transformer series of
    real-<gpu>-xfmr-measured.json (session `xfmr`)."""
    out = []
    for gpu in gpus:
        for path, named in ((root / f"real-{gpu}-measured.json", None),
                            (root / f"real-{gpu}-xfmr-measured.json", "xfmr")):
            if not path.exists():
                continue
            plain = json.loads(path.read_text())
            if named:
                out.append((gpu, named, plain))
            else:
                out += [(gpu, k, v) for k, v in sorted(plain.items()) if not k.startswith("_")]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=ROOT / "sample_traces")
    p.add_argument("--gpu", default="all", help="the recordings' label: h200, h100 or all")
    p.add_argument("--only", default="", help="only the pairs whose after configuration is "
                   "this (e.g. w8-bf16)")
    a = p.parse_args()
    gpus = ["h200", "h100"] if a.gpu == "all" else [a.gpu]
    print(f"{'session':12} {'before -> after':30} {'recorded':>8} {'without':>8} "
          f"{'base err':>8} {'predicted':>9} {'range':>11} {'plain':>7} {'error':>7} | "
          f"{'after w/o':>9} {'error':>7} | {'change':>7} {'plain':>7}")
    rows: list[tuple[float, float, bool]] = []  # (|error|, |change error|, baseline within)
    inside: list[bool] = []  # the plain after-timings (each run) inside the predicted range
    with tempfile.TemporaryDirectory() as tmp:
        for gpu, session, plain in sessions_of(a.dir, gpus):
            def trace(name: str, s: str = session, g: str = gpu) -> Path:
                return a.dir / f"real-{g}-{s}-{name}.pt.trace.json.gz"

            for before, changes, after in PAIRS:
                if a.only and after != a.only:
                    continue
                if not (trace(before).exists() and trace(after).exists()
                        and plain.get(after, {}).get("plain_mean_step_ms")):
                    continue
                rep = analyze(trace(before), changes, Path(tmp))
                pred = rep["what_if"]["predicted_step_us"] / 1000
                lo, hi = (v / 1000 for v in rep["what_if"]["predicted_range_us"])
                recorded = rep["plan"]["measured_step_us"] / 1000
                without = rep["plan"]["baseline_step_us"] / 1000
                after_plan = analyze(trace(after), (), Path(tmp))["plan"]
                after_without = after_plan["baseline_step_us"] / 1000
                pa = statistics.mean(plain[after]["plain_mean_step_ms"])
                err = 100 * (pred - pa) / pa
                inside += [lo <= t <= hi for t in plain[after]["plain_mean_step_ms"]]
                err_after = 100 * (pred - after_without) / after_without
                # The change as a ratio, predicted (from the step without the profiler) and
                # measured (plain after over plain before): free of the baseline's own error.
                pb = (statistics.mean(plain[before]["plain_mean_step_ms"])
                      if plain.get(before, {}).get("plain_mean_step_ms") else float("nan"))
                base_err = 100 * (without - pb) / pb
                rel, rel_plain = 100 * (pred / without - 1), 100 * (pa / pb - 1)
                rows.append((abs(err), abs(rel - rel_plain),
                             not abs(base_err) > BASELINE_MISS_PCT))
                print(f"{gpu + ' ' + session:12} {before + ' -> ' + after:30} {recorded:7.1f}ms "
                      f"{without:7.1f}ms {base_err:+7.1f}% {pred:8.1f}ms {lo:5.1f}-{hi:4.1f} "
                      f"{pa:6.1f}ms {err:+6.1f}% | {after_without:8.1f}ms {err_after:+6.1f}% | "
                      f"{rel:+6.1f}% {rel_plain:+6.1f}%  ({' '.join(changes)})", flush=True)
    if not rows:
        return

    def line(label: str, sel: list[tuple[float, float, bool]]) -> None:
        if not sel:
            print(f"{label}: none")
            return
        errors = [r[0] for r in sel]
        rel = [r[1] for r in sel if r[1] == r[1]]
        print(f"{label}: {len(sel)} pairs, median |error| {statistics.median(errors):.1f}%, "
              f"worst {max(errors):.1f}%, within 15%: {sum(e <= 15 for e in errors)}; the "
              f"change as a share of the step: median |difference| "
              f"{statistics.median(rel) if rel else float('nan'):.1f} points")

    line("prediction against the plain after-timing, all pairs", rows)
    line(f"  baseline within {BASELINE_MISS_PCT:g}% of its plain before-timing",
         [r for r in rows if r[2]])
    line(f"  baseline off by more than {BASELINE_MISS_PCT:g}% (listed apart)",
         [r for r in rows if not r[2]])
    print(f"plain runs inside the predicted range: {sum(inside)} of {len(inside)}")


if __name__ == "__main__":
    main()
