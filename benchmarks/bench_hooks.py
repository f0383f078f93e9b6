"""What stallscope's step hooks cost while the profiler is idle (issue 3 target: < 2% of a step).

`stallscope run` wraps DataLoader construction, iteration and `__next__`, registers a global
optimizer step hook, and calls `prof.step()` at every step boundary, also during the skipped
steps before recording and, with --run-to-end, never after it. This times a training step loop
with and without those hooks (profiler created but never recording), alternating the two so
that drift in the machine hits both alike, and reports the per-step overhead.

    python benchmarks/bench_hooks.py [--steps 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stallscope.capture.session import CaptureSession, Schedule

# (label, hidden width, batch size): an empty step (the loop is only the hooked calls, so the
# difference is the hooks' cost in microseconds, with little else to add noise), a very small
# training step (worst case for a fixed per-step cost) and a small but more typical one.
LOOPS = [("empty step", 0, 0), ("tiny MLP step", 64, 32), ("small MLP step", 1024, 256)]


def make_loop(width: int, batch: int, steps: int):
    if width == 0:
        return make_empty_loop(steps)
    data = TensorDataset(torch.randn(steps * batch, width), torch.randint(0, 10, (steps * batch,)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch() -> float:
        loader = DataLoader(data, batch_size=batch)  # built inside: the __init__ hook counts
        start = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - start) / steps

    return epoch


def make_empty_loop(steps: int):
    """Batches are plain ints (no collation) and the optimizer has no gradients to apply: what
    is left is DataLoader.__next__ and optimizer.step() themselves, the calls the hooks wrap."""
    data = list(range(steps))
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.01)

    def epoch() -> float:
        loader = DataLoader(data, batch_size=None)
        start = time.perf_counter()
        for _ in loader:
            opt.step()
        return (time.perf_counter() - start) / steps

    return epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 keeps round-to-round noise down)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.steps} steps x {args.rounds} rounds per condition")
    for label, width, batch in LOOPS:
        epoch = make_loop(width, batch, args.steps)
        epoch()  # warm caches and the allocator
        plain, hooked = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                plain.append(epoch())
                # Idle profiler: the schedule never reaches warm-up within this run.
                session = CaptureSession(Schedule(skip=10**9, warmup=1, steps=1), "auto",
                                         Path(tmp), "bench", run_to_end=True)
                session.start()
                try:
                    hooked.append(epoch())
                finally:
                    session.finish()
                assert session.boundaries >= args.steps - 1, "hooks did not see the steps"
        # This VM's round-to-round noise is tens of percent, far above the hooks' cost, so the
        # fastest round of each condition (least disturbed, as timeit does) is compared; the
        # median of paired differences is shown beside it.
        p, h = min(plain), min(hooked)
        paired = statistics.median(b - a for a, b in zip(plain, hooked, strict=True))
        spread = (statistics.median(plain) - p) / p * 100
        print(f"{label:>15}: plain {p * 1e3:7.3f} ms/step, with hooks {h * 1e3:7.3f} ms/step "
              f"(fastest rounds): overhead {(h - p) * 1e6:+6.1f} us/step = "
              f"{(h - p) / p * 100:+5.2f}%; median paired difference {paired * 1e6:+6.1f} us "
              f"(plain median is {spread:.0f}% above its fastest round)")

if __name__ == "__main__":
    main()
