"""How well the replay predicts what users measure (run by hand on a quiet machine, not in CI).

    python benchmarks/bench_replay.py fidelity   # the unchanged replay vs every real trace
    python benchmarks/bench_replay.py pairs      # recorded before/after pairs (kineto, committed)
    python benchmarks/bench_replay.py live       # the same script at 0 and N workers, run now
    python benchmarks/bench_replay.py fetch      # what receiving a batch from a worker costs

`fidelity` replays each shared real trace twice: as built (every slack taken from the trace,
which must reproduce it) and with the GPU's slacks replaced by typical ones (each op starts a
typical launch latency after its launch, or a few us after its stream's previous op, or after
the cross-stream op it waited for), which shows how much of the timing the graph's edges explain
on their own. `live` runs sample_traces/replay_workload.py with a CPU-burning and a
storage-waiting loader through `stallscope run`, each N-worker run right after a 0-worker run
(this kind of machine drifts by 10-20% in speed over a minute), predicts each N-worker step from
the 0-worker trace with `stallscope analyze --what-if num_workers=N`, and prints every error.
Each run skips SKIP steps before recording: the replay predicts the steady state of a long
epoch, and a loader-bound run with workers first drains the batches its workers prefetched
(two per worker) while starting, which takes about 30 steps of the 2-worker storage-waiting
run. The summary compares the median prediction with the median measurement over the repeats.
docs/replay.md holds the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "sample_traces" / "public"
WORKLOAD = ROOT / "sample_traces" / "replay_workload.py"
KINETO = REAL / "kineto"
COMMITTED = (("cpu", 1), ("io", 4))  # sample_traces/cpu-replay-<load>-w<N>
LIVE = {"cpu": ("3", (1, 2, 4)), "io": ("6", (1, 2, 4, 8))}  # sample-ms, worker counts
SKIP, STEPS = 60, 24  # live: steps skipped (prefetched batches drained), steps recorded


def fidelity() -> None:
    from stallscope.replay.engine import replay
    from stallscope.replay.graph import READY_US, build_graph
    from stallscope.trace.load import load_trace
    from stallscope.trace.model import build_model

    print(f"{'trace':46} {'steps':>5} {'as built':>9} {'typical slack: median':>22} {'max':>7}")
    for path in sorted(p for p in REAL.rglob("*.json*") if p.is_file()):
        model = build_model(load_trace(path))
        g = build_graph(model)
        if g is None or model.steps_source != "ProfilerStep":
            continue
        measured = np.array([s.duration_us for s in model.steps])
        exact = np.abs(replay(g).step_us - measured) / measured * 100
        t = g.copy()
        launched = t.g_launch >= 0
        t.g_lat[launched] = g.launch_us
        t.g_gap[:] = np.minimum(t.g_gap, READY_US)
        t.g_cgap[:] = np.minimum(t.g_cgap, READY_US)
        t.g_anchor[launched] = -np.inf
        typical = np.abs(replay(t).step_us - measured) / measured * 100
        print(f"{path.name[:46]:46} {len(measured):5d} {exact.max():8.3f}% "
              f"{np.median(typical):21.1f}% {typical.max():6.1f}%")


def predicted(trace: Path, workers: int, work: Path) -> float:
    """The product's prediction: `stallscope analyze TRACE --what-if num_workers=N`."""
    out = work / "predict"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "stallscope", "analyze", str(trace), "-q", "-o",
                    str(out), "--what-if", f"num_workers={workers}"], check=True)
    what = json.loads((out / "report.json").read_text())["what_if"]
    return float(what["predicted_step_us"])


def measured_median(trace: Path) -> float:
    from stallscope.trace.load import load_trace
    from stallscope.trace.model import build_model

    return float(np.median([s.duration_us for s in build_model(load_trace(trace)).steps]))


def pairs() -> None:
    print(f"{'before -> after':70} {'predicted':>9} {'measured':>9} {'error':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for before in sorted(KINETO.glob("resnet50_num_workers_0_*")):
            pred = predicted(before, 4, Path(tmp))
            for after in sorted(KINETO.glob("resnet50_num_workers_4_*")):
                _row(f"{before.name[:33]} -> {after.name[:33]}", pred, measured_median(after))
        for load, n in COMMITTED:
            before = ROOT / "sample_traces" / f"cpu-replay-{load}-w0.pt.trace.json.gz"
            after = ROOT / "sample_traces" / f"cpu-replay-{load}-w{n}.pt.trace.json.gz"
            _row(f"{before.name} -> {after.name}", predicted(before, n, Path(tmp)),
                 measured_median(after))


def _row(name: str, pred: float, meas: float) -> float:
    err = 100 * (pred - meas) / meas
    print(f"{name:70} {pred / 1000:8.1f}ms {meas / 1000:8.1f}ms {err:+6.1f}%", flush=True)
    return err


def run_workload(load: str, sample_ms: str, workers: int, out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "stallscope", "run", "-q", "-o", str(out), "--skip", str(SKIP),
         "--warmup", "1", "--steps", str(STEPS), "--set", f"num_workers={workers}", str(WORKLOAD),
         "--load", load, "--sample-ms", sample_ms],
        check=True, capture_output=True,
    )
    (trace,) = (out / "tensorboard").rglob("*.pt.trace.json.gz")
    return trace


def live(repeats: int, loads: list[str]) -> None:
    print(f"{'loader':7} {'N':>2} {'rep':>3} {'0 workers':>10} {'predicted':>10} "
          f"{'measured':>9} {'error':>7}")
    errors: dict[tuple[str, int], list[float]] = {}
    pairs_us: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for rep in range(repeats):
            for load in loads:
                sample_ms, counts = LIVE[load]
                for n in counts:
                    before = run_workload(load, sample_ms, 0, work / "w0")
                    after = run_workload(load, sample_ms, n, work / "wn")
                    pred, meas = predicted(before, n, work), measured_median(after)
                    err = 100 * (pred - meas) / meas
                    errors.setdefault((load, n), []).append(err)
                    pairs_us.setdefault((load, n), []).append((pred, meas))
                    print(f"{load:7} {n:2d} {rep:3d} {measured_median(before) / 1000:8.1f}ms "
                          f"{pred / 1000:8.1f}ms {meas / 1000:7.1f}ms {err:+6.1f}%", flush=True)
    print("\nover the repeats: median predicted vs median measured (single errors min .. max):")
    for (load, n), errs in errors.items():
        pred = statistics.median(p for p, _ in pairs_us[(load, n)])
        meas = statistics.median(m for _, m in pairs_us[(load, n)])
        print(f"  {load:4} N={n}: {pred / 1000:6.1f} ms vs {meas / 1000:6.1f} ms "
              f"{100 * (pred - meas) / meas:+6.1f}%  ({min(errs):+.1f} .. {max(errs):+.1f})")


def fetch() -> None:
    """Receiving a batch from workers that are always ahead: median time of `next(it)`."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __init__(self, side: int) -> None:
            self.side = side

        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.ones(3, self.side, self.side), i % 10

    for side in (8, 64, 128, 224):
        loader = DataLoader(Images(side), batch_size=32, num_workers=2, persistent_workers=True,
                            prefetch_factor=4)
        it = iter(loader)
        for _ in range(8):
            next(it)
        times = []
        for _ in range(30):
            time.sleep(0.05)  # the workers are ahead: the fetch only receives
            t = time.perf_counter()
            batch = next(it)
            times.append((time.perf_counter() - t) * 1e6)
        nbytes = batch[0].nelement() * 4 + batch[1].nelement() * 8
        print(f"{nbytes / 1e6:7.2f} MB per batch: median {statistics.median(times):7.0f} us "
              f"(min {min(times):.0f}, max {max(times):.0f})")
        del it, loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("fidelity", "pairs", "live", "fetch"))
    parser.add_argument("--repeats", type=int, default=3, help="live: runs of every pair")
    parser.add_argument("--loads", default="cpu,io", help="live: cpu, io or both")
    args = parser.parse_args()
    if args.what == "fidelity":
        fidelity()
    elif args.what == "pairs":
        pairs()
    elif args.what == "live":
        live(args.repeats, args.loads.split(","))
    else:
        fetch()


if __name__ == "__main__":
    main()
