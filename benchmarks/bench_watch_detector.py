"""How often does `watch` report a regime change or a period on a run that has none, and how
well does it find the ones that exist? (issue 34: the change-point detector's false alarms)

    python benchmarks/bench_watch_detector.py [--runs 100] [--real 3] [--betas 2,3,4,6]

Tables:
1. False alarms on steady synthetic runs, per noise shape (watch_synth.NOISES) and length:
   the share of runs with any raw change point (the penalised search alone, at each penalty
   factor beta), with any regime change after merging (what the user sees, at the chosen
   PEN_BETA), and with any periodic stall.
2. Detection on runs whose loader slows down at the middle step, per size of the slowdown:
   the share of runs whose report has exactly one regime change within 5% of the steps of
   the truth, and the median distance in steps.
3. Real step series timed in this process: a small MLP trained on CPU for 300 steps
   (steady; a loader that sleeps 10 ms per batch from step 150; a torch.save and a 50 ms
   write every 50 steps), each
   repeated --real times: what the report says about each.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import watch_synth as synth  # noqa: E402

from stallscope.capture.later import Trigger  # noqa: E402
from stallscope.wholerun import StepSeries, regimes, spikes, summarise  # noqa: E402


def _regime_count(step: np.ndarray, wait: np.ndarray, beta: float) -> tuple[int, int]:
    """(raw change points, regimes after merging) at penalty factor `beta`."""
    sp = spikes.find_spikes(step)
    raw = len(regimes.change_points(step, wait, sp.mask, beta)) - 1
    merged = len(regimes.find_regimes(step, wait, sp.mask, beta)) - 1
    return raw, merged


def false_alarms(runs: int, betas: list[float]) -> None:
    print("\n1. Steady runs: share of runs with a false alarm")
    raw_cols = " ".join(f"raw b={b:g}" for b in betas)
    print(f"{'noise':10} {'steps':>6} {raw_cols} {'regimes':>8} {'periodic':>8} {'ms/run':>7}")
    for kind in synth.NOISES:
        for n in (200, 1000, 5000):
            reps = runs if n < 5000 else max(1, runs // 5)
            raw = dict.fromkeys(betas, 0)
            merged = periodic_hits = 0
            spent = 0.0
            for seed in range(reps):
                rng = np.random.default_rng(seed * 7919 + n)
                step, wait = synth.steady(n, rng, kind)
                for b in betas:
                    raw[b] += _regime_count(step, wait, b)[0] > 0
                t0 = time.perf_counter()
                out = summarise(StepSeries.from_records(synth.records(step, wait)))
                spent += time.perf_counter() - t0
                merged += len(out["regimes"]) > 1
                periodic_hits += bool(out["periodic"])
            cells = " ".join(f"{raw[b] / reps:>{len(f'raw b={b:g}')}.3f}" for b in betas)
            print(f"{kind:10} {n:>6} {cells} {merged / reps:>8.3f} {periodic_hits / reps:>8.3f}"
                  f" {1e3 * spent / reps:>7.1f}   ({reps} runs)")


def detection(runs: int) -> None:
    print("\n2. Loader slows down at the middle step (400 steps, 100 ms steps, 3% wait): "
          "found = one change within 20 steps")
    print(f"{'noise':10} {'slower by':>9} {'found':>6} {'median |err|':>12} {'extra':>6}")
    for kind in synth.NOISES:
        for extra in (10.0, 15.0, 25.0, 50.0, 100.0):
            found = extra_changes = 0
            errs: list[int] = []
            for seed in range(runs):
                rng = np.random.default_rng(seed + 17)
                step, wait = synth.loader_slows(400, 200, rng, kind, extra_ms=extra)
                regs = summarise(StepSeries.from_records(synth.records(step, wait)))["regimes"]
                firsts = [r["first_step"] for r in regs[1:]]
                near = [f for f in firsts if abs(f - 200) <= 20]
                found += len(firsts) == 1 and bool(near)
                extra_changes += len(firsts) > 1
                errs.extend(abs(f - 200) for f in near[:1])
            med = statistics.median(errs) if errs else math.nan
            print(f"{kind:10} {f'{extra:g}%':>9} {found / runs:>6.2f} {med:>12.1f} "
                  f"{extra_changes / runs:>6.2f}")


def online(runs: int) -> None:
    """`watch`'s online trigger of later captures (capture/later.py), fed the same series step
    by step as the training process feeds it: how often it asks for a capture on steady runs,
    and how soon after a loader slows down."""
    print("\n3. The online trigger of later captures: steady runs (share of runs asking for one)"
          " and the 400-step slowdown at step 200 (asked within 60 steps after it)")
    print(f"{'noise':10} {'steady 1000':>11} {'steady 5000':>11} {'slow +25%':>9} "
          f"{'slow +100%':>10} {'median delay':>12} {'us/step':>8}")
    for kind in synth.NOISES:
        cells, delays, spent, fed = [], [], 0.0, 0
        for n in (1000, 5000):
            hits = 0
            for seed in range(runs if n < 5000 else max(1, runs // 5)):
                step, wait = synth.steady(n, np.random.default_rng(seed * 7919 + n), kind)
                t0 = time.perf_counter()
                hits += bool(_starts(step, wait))
                spent, fed = spent + time.perf_counter() - t0, fed + n
            cells.append(hits / (runs if n < 5000 else max(1, runs // 5)))
        for extra in (25.0, 100.0):
            found = 0
            for seed in range(runs):
                step, wait = synth.loader_slows(400, 200, np.random.default_rng(seed + 17), kind,
                                                extra_ms=extra)
                at = [s for s in _starts(step, wait) if s >= 200]
                found += bool(at) and at[0] - 200 <= 60
                delays.extend(at[:1])
            cells.append(found / runs)
        delay = statistics.median(d - 200 for d in delays) if delays else math.nan
        print(f"{kind:10} {cells[0]:>11.3f} {cells[1]:>11.3f} {cells[2]:>9.2f} {cells[3]:>10.2f}"
              f" {delay:>12.0f} {1e6 * spent / fed:>8.2f}")


def _starts(step: np.ndarray, wait: np.ndarray) -> list[int]:
    trigger = Trigger()
    return [i for i, (ms, w) in enumerate(zip(step, wait, strict=True), 1)
            if trigger.add(i, float(ms), float(w)) is not None]


SLOW_S = 0.010  # the loader's extra wait per batch after the slowdown
SAVE_S = 0.050  # the checkpoint's write


def _real_run(case: str, steps: int = 300) -> list[dict[str, float]]:
    """Time `steps` steps of a small MLP on CPU: the per-step records `watch` would write."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(256, 512), torch.randint(0, 10, (256,))) for _ in range(16)]

    def batches():
        for i in range(steps):
            if case == "loader-slows" and i >= steps // 2:
                time.sleep(SLOW_S)  # the dataset moved to slower storage
            yield data[i % len(data)]

    recs: list[dict[str, float]] = []
    it = batches()
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if case == "save-every-50" and i % 50 == 49:
            buf = io.BytesIO()
            torch.save(model.state_dict(), buf)  # a blocking checkpoint
            buf.getvalue()
            time.sleep(SAVE_S)  # the write to slow storage
        t2, c2 = time.perf_counter(), time.process_time()
        recs.append({"step": i, "step_ms": (t2 - t0) * 1e3, "loader_wait_ms": (t1 - t0) * 1e3,
                     "cpu_ms": (c2 - c0) * 1e3, "start_s": t0})
    return recs


def _ratio(regime: dict) -> str:
    step = regime["median_step_ms"] / regime["prev_step_ms"]
    cpu = regime["cpu_ratio"]
    return f"{step:.2f}x / {cpu:.2f}x" if cpu is not None else f"{step:.2f}x"


def real(repeats: int) -> None:
    print("\n3. Real CPU step series (MLP 512-1024-10, batch 256, 1 thread, 300 steps)")
    print("   raw: change points of the search alone; >=15%: after merging regimes too alike to "
          "act on, before merging those under 1 s; starts: what the report says")
    print("   starts: first step (step time ratio / process CPU time per step ratio)")
    print(f"{'case':14} {'run':>3} {'median ms':>9} {'raw':>4} {'>=15%':>5} {'starts':>24} "
          f"{'periodic':>20} {'outliers':>8}")
    for case in ("steady", "loader-slows", "save-every-50"):
        for r in range(repeats):
            series = StepSeries.from_records(_real_run(case))
            ok = series.valid
            step, wait = series.step_ms[ok], series.loader_wait_ms[ok]
            raw = _regime_count(step, wait, regimes.PEN_BETA)[0]
            keep, regimes.MIN_REGIME_MS = regimes.MIN_REGIME_MS, 0.0
            floor_only = _regime_count(step, wait, regimes.PEN_BETA)[1]
            regimes.MIN_REGIME_MS = keep
            out = summarise(series)
            for prev, g in zip(out["regimes"][:-1], out["regimes"][1:], strict=True):
                g["prev_step_ms"] = prev["median_step_ms"]
            starts = ",".join(f"{g['first_step']} ({_ratio(g)})" for g in out["regimes"][1:])
            starts = starts or "-"
            per = ",".join(f"every {p['every_steps']} ({100 * p['share_of_wall']:.1f}%)"
                           for p in out["periodic"]) or "-"
            print(f"{case:14} {r:>3} {out['median_step_ms']:>9.2f} {raw:>4} {floor_only:>5} "
                  f"{starts:>24} {per:>20} {out['outliers']['count']:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--real", type=int, default=3)
    ap.add_argument("--betas", default="2,3,4,6")
    args = ap.parse_args()
    betas = [float(b) for b in args.betas.split(",")]
    print(f"chosen: PEN_BETA={regimes.PEN_BETA}, MIN_STEP_RATIO={regimes.MIN_STEP_RATIO}, "
          f"MIN_SHARE_DELTA={regimes.MIN_SHARE_DELTA}, spike z={spikes.SPIKE_Z}")
    false_alarms(args.runs, betas)
    detection(max(1, args.runs // 2))
    online(args.runs)
    if args.real:
        real(args.real)


if __name__ == "__main__":
    main()
