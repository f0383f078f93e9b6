"""What `watch`'s step log costs per step, and how much of it is the write(2) each line gets
(capture/steplog.py: unbuffered so that a kill loses only the step it interrupts).

Times StepLog.boundary (no scalars, no live page) into a file in DIR, and again with the
write replaced by a no-op (the formatting, clocks and schedstat read alone), in alternating
rounds; prints the medians per boundary.

    python benchmarks/bench_steplog.py [--steps 20000] [--rounds 11] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from stallscope.capture import steplog
from stallscope.capture.steplog import StepLog


def per_boundary(folder: Path, steps: int, write: bool) -> float:
    real = os.write
    if not write:
        steplog.os.write = lambda fd, data: len(data)  # type: ignore[assignment]
    try:
        log = StepLog(folder / "steps.jsonl")
        log.boundary(0.0, 0, False)
        start = time.perf_counter()
        for _ in range(steps):
            log.boundary(1000.0, 0, False)
        elapsed = time.perf_counter() - start
        log.close()
    finally:
        steplog.os.write = real  # type: ignore[assignment]
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--dir", default=None, help="where the step log goes (default: TMPDIR)")
    args = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            for write in (True, False) if r % 2 == 0 else (False, True):
                times[write].append(per_boundary(Path(tmp), args.steps, write))
    full, bare = statistics.median(times[True]), statistics.median(times[False])
    print(f"step log, {args.steps} boundaries x {args.rounds} rounds: {full * 1e6:.2f} us per "
          f"boundary, of which the write(2) {(full - bare) * 1e6:.2f} us "
          f"(without it {bare * 1e6:.2f} us)")


if __name__ == "__main__":
    main()
