"""What stallscope's step hooks cost while the profiler is idle (issue 3 target: < 2% of a step),
and `watch`'s per-step logging on top of them (issue 34 target: < 1% of a 5 ms step).

`stallscope run` wraps DataLoader construction, iteration and `__next__` and registers a global
optimizer step hook; during the skipped steps these only count step boundaries (the profiler is
started after them, and the hooks are removed once recording ends). This times step loops
plain, with those hooks (profiler idle), and plain again, in alternating order, using process
CPU time. The empty loop gives the hooks' own cost in microseconds; on real training steps
compare the difference with the plain-again control, the noise floor of the machine. The
`watch` condition is a watched run once its recorded window is over (the rest of the run, which
is nearly all of it): the hooks, a JSON line into the step log (capture/steplog.py) and two
TensorBoard scalars per step (the writer thread's CPU is in the process time measured). Each
hooked round runs one untimed pass of the loop first: the once-a-run work of a session's first
step boundaries (a read of the machine's load, a few ms) is not a cost per step.

    python benchmarks/bench_hooks.py [--steps 200] [--rounds 21] [--threads 1]
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
from torch.utils.tensorboard import SummaryWriter

from stallscope.capture.recapture import LaterCaptures
from stallscope.capture.session import CaptureSession, Schedule
from stallscope.capture.steplog import StepLog, captures_path

# (label, hidden width, batch size): an empty step (the loop is only the hooked calls, so the
# difference is the hooks' cost in microseconds, with little else to add noise), a very small
# training step (worst case for a fixed per-step cost) and a small but more typical one.
# Each round times the loop plain, with the hooks, and plain again (an A/A control whose
# difference from the first is the noise floor of this machine).
CONDITIONS = ["plain", "hooks", "watch", "plain again"]
LOOPS = [("empty step", 0, 0), ("tiny MLP step", 64, 32), ("small MLP step", 1024, 256),
         ("~5 ms MLP step", 768, 160)]


def make_loop(width: int, batch: int, steps: int):
    if width == 0:
        return make_empty_loop(steps)
    data = TensorDataset(torch.randn(steps * batch, width), torch.randint(0, 10, (steps * batch,)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch() -> float:
        loader = DataLoader(data, batch_size=batch)  # built inside: the __init__ hook counts
        start = time.process_time()
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.process_time() - start) / steps

    return epoch


def make_empty_loop(steps: int):
    """Batches are plain ints (no collation) and the optimizer has no gradients to apply: what
    is left is DataLoader.__next__ and optimizer.step() themselves, the calls the hooks wrap."""
    data = list(range(steps))
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.01)

    def epoch() -> float:
        loader = DataLoader(data, batch_size=None)
        start = time.process_time()
        for _ in loader:
            opt.step()
        return (time.process_time() - start) / steps

    return epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 keeps round-to-round noise down)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:  # why the step log averages its points
        writer = SummaryWriter(tmp)
        start = time.perf_counter()
        for i in range(5000):
            writer.add_scalar("x", 1.0, i)
        writer.close()
        print(f"TensorBoard add_scalar: {(time.perf_counter() - start) / 5000 * 1e6:.1f} us a "
              "point (the step log writes the mean of the steps since its last point, each "
              "half second)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.steps} steps x {args.rounds} rounds per condition")
    for label, width, batch in LOOPS:
        epoch = make_loop(width, batch, args.steps)
        epoch()  # warm caches and the allocator
        times: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                # Alternate the order so that neither condition always runs first.
                for cond in CONDITIONS if r % 2 == 0 else CONDITIONS[::-1]:
                    if cond not in ("hooks", "watch"):
                        times[cond].append(epoch())
                        continue
                    log = None
                    if cond == "watch":
                        log = StepLog(Path(tmp) / f"steps-{r}.jsonl",
                                      SummaryWriter(f"{tmp}/tb-{r}", flush_secs=5))
                    # Idle profiler: the schedule never leaves the skipped steps in this run.
                    session = CaptureSession(Schedule(skip=10**9, warmup=1, steps=1), "auto",
                                             Path(tmp), "bench", run_to_end=True,
                                             step_log=log)
                    session.start()
                    if cond == "watch":  # the rest of a watched run, once recording is over
                        session.recorder.done = True  # ... with the later captures' trigger
                        session.watch.later = LaterCaptures(captures_path(log.path), session, 0)
                    try:
                        epoch()  # untimed: the one-off work of a session's first steps
                        times[cond].append(epoch())
                    finally:
                        session.finish()
                    seen = log.steps if log is not None else session.boundaries
                    assert seen >= 2 * args.steps - 4, "hooks did not see the steps"
        med = {c: statistics.median(v) for c, v in times.items()}
        base = med["plain"]
        print(f"{label:>15}: plain {base * 1e3:7.3f} ms/step; with hooks "
              f"{(med['hooks'] - base) * 1e6:+6.1f} us/step = "
              f"{(med['hooks'] - base) / base * 100:+5.2f}%; watch (hooks + step log + "
              f"scalars) {(med['watch'] - base) * 1e6:+6.1f} us/step = "
              f"{(med['watch'] - base) / base * 100:+5.2f}%; noise floor (plain again) "
              f"{(med['plain again'] - base) * 1e6:+6.1f} us = "
              f"{(med['plain again'] - base) / base * 100:+5.2f}%")


if __name__ == "__main__":
    main()
