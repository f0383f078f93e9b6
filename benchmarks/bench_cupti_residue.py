"""Does a finished profiler session leave the process slower? (needs a CUDA GPU; run by hand)

`stallscope run` measures the profiler's cost per op at its start (capture/opcost.py), under a
profiler set up as the session's: with CUDA activity, that attaches CUPTI. Kineto calls
`cuptiFinalize` when a session stops only with `TEARDOWN_CUPTI=1` (pytorch/pytorch#144455), so
CUPTI may stay attached for the rest of the run: the unprofiled steps `run` times before
recording, and the user's run after it with `--run-to-end`. The recordings hint at it: on the
H200 r5 host-bound configuration the unprofiled steps under `run` took 7.8 ms against 5.4-5.7 ms
in plain runs (+41%), and `opcost`'s plain CUDA op (timed after its first profiled round) costs
about 10 us where a CPU op costs 3 us. This script tests it directly, each mode in a fresh
process: a launch-bound training step (the host-bound CNN of sample_traces/gpu_workload.py,
data already on the GPU) timed, then one profiler session with CPU and CUDA activity (as
opcost's), then timed again.

    python benchmarks/bench_cupti_residue.py [--steps 200] [--rounds 3] [--repeat 1]

Modes: `default` (Kineto's own default), `teardown` (TEARDOWN_CUPTI=1 set before torch is
imported), `cpu-only` (the session records CPU activity only: no CUPTI), and `none` (the
control: the same steps with no profiler session, so a drift of the process or machine over
time shows there too). A ratio after/before well above `none`'s in `default`, and near it in
the other two, says the profiler's residue is what slows the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "default", "teardown", "cpu-only")


def child(mode: str, steps: int, rounds: int) -> dict:
    if mode == "teardown":
        os.environ["TEARDOWN_CUPTI"] = "1"
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT / "sample_traces"))
    from gpu_workload import make_model

    if not torch.cuda.is_available():
        return {"mode": mode, "skipped": "no CUDA device"}
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = make_model(8).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    x = torch.rand(32, 3, 32, 32, device=dev)
    y = torch.randint(0, 100, (32,), device=dev)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def timed() -> list[float]:
        out = []
        for _ in range(rounds):
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - start) * 1000 / steps)
        return out

    before = timed()
    acts = [ProfilerActivity.CPU]
    if mode != "cpu-only":
        acts.append(ProfilerActivity.CUDA)
    if mode == "none":  # the control: the same steps, no profiler session
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    else:
        with profile(activities=acts, record_shapes=True):  # what opcost does, once
            for _ in range(5):
                step()
            torch.cuda.synchronize()
    after = timed()
    return {"mode": mode, "before_ms": [round(v, 3) for v in before],
            "after_ms": [round(v, 3) for v in after],
            "ratio": round(statistics.median(after) / statistics.median(before), 3),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1,
                   help="sweeps over the modes, each in the reverse order of the last")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.rounds)))
        return
    sweeps = [MODES if i % 2 == 0 else MODES[::-1] for i in range(a.repeat)]
    for mode in (m for sweep in sweeps for m in sweep):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--steps",
                               str(a.steps), "--rounds", str(a.rounds)],
                              capture_output=True, text=True, check=False)
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        print(line or f'{{"mode": "{mode}", "failed": {proc.returncode}, '
                      f'"stderr": {json.dumps(proc.stderr[-500:])}}}', flush=True)


if __name__ == "__main__":
    main()
