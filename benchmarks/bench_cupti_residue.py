"""Does a finished profiler session leave the process slower? (needs a CUDA GPU; run by hand)

`stallscope run` measured the profiler's cost per op at its start until 2026-11-29 (since then
after its recording: capture/opcost.py), under a profiler set up as the session's: with CUDA
activity, that attaches CUPTI. Kineto calls
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
    python benchmarks/bench_cupti_residue.py --under-stallscope [--only hostbound,w8] [--runs 3]

Modes: `default` (Kineto's own default), `teardown` (TEARDOWN_CUPTI=1 set before torch is
imported), `cpu-only` (the session records CPU activity only: no CUPTI), and `none` (the
control: the same steps with no profiler session, so a drift of the process or machine over
time shows there too). A ratio after/before well above `none`'s in `default`, and near it in
the other two, says the profiler's residue is what slows the process.

`--under-stallscope` checks stallscope itself on the same host, per configuration of
sample_traces/record_h100.py, alternating: `--runs` plain runs (the mean step over 100 steps
after the first 25), `--runs` `stallscope run`s (the median of the steps it timed without the
profiler before recording: its baseline), and one `stallscope watch` of the whole run (the median
unprofiled step before its first capture against the median after it, start-up steps left
out). `run` within 5% of plain and `watch` after/before within 5% say no profiler residue
reaches the figures a user reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def _plain(config: list[str]) -> float | None:
    proc = subprocess.run([sys.executable, str(ROOT / "sample_traces" / "gpu_workload.py"),
                           *config, "--time", "100", "--time-from", "25"],
                          capture_output=True, text=True, check=False)
    found = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("MEAN_STEP_MS")]
    return float(found[-1]) if found else None


def _stallscope(command: str, config: list[str], out: Path, extra: list[str]) -> dict | None:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "stallscope", command, "-q", "-o", str(out),
                           *extra, str(ROOT / "sample_traces" / "gpu_workload.py"), *config],
                          capture_output=True, text=True, check=False)
    report = out / "report.json"
    if proc.returncode != 0 or not report.is_file():
        print(json.dumps({"command": command, "failed": proc.returncode,
                          "stderr": proc.stderr[-500:]}), flush=True)
        return None
    return json.loads(report.read_text())


def _watch_ratio(report: dict) -> dict:
    """The median unprofiled step before the first capture and after it (the first 25 steps
    and the 10 after a capture left out: start-up and the capture's own ending)."""
    steps = report.get("watch", {}).get("steps") or []
    profiled = [s["step"] for s in steps if s.get("profiled")]
    if not profiled:
        return {"watch": "no capture"}
    first, end = profiled[0], profiled[0]
    while end + 1 in set(profiled):
        end += 1
    before = [s["step_ms"] for s in steps if 25 <= s["step"] < first and not s.get("profiled")]
    after = [s["step_ms"] for s in steps if s["step"] > end + 10 and not s.get("profiled")]
    if not before or not after:
        return {"watch": "too few steps around the capture"}
    b, a = statistics.median(before), statistics.median(after)
    return {"watch_before_ms": round(b, 3), "watch_after_ms": round(a, 3),
            "watch_ratio": round(a / b, 3)}


def under_stallscope(names: list[str], runs: int, scratch: Path) -> None:
    sys.path.insert(0, str(ROOT / "sample_traces"))
    from record_h100 import CONFIGS, RUN

    for name in names:
        config = CONFIGS[name]
        plain, baseline = [], []
        for i in range(runs):  # alternating: the host drifts between calls
            plain.append(_plain(config))
            report = _stallscope("run", config, scratch / f"{name}-run{i}", RUN)
            steps = (report or {}).get("run", {}).get("unprofiled_steps_us") or []
            baseline.append(statistics.median(steps[-12:]) / 1000 if steps else None)
        watched = _stallscope("watch", config, scratch / f"{name}-watch", [])
        ok_plain = [v for v in plain if v]
        ok_base = [v for v in baseline if v]
        row: dict = {"config": name, "plain_ms": plain, "run_unprofiled_ms": baseline}
        if ok_plain and ok_base:
            row["run_over_plain"] = round(statistics.median(ok_base)
                                          / statistics.mean(ok_plain), 3)
        if watched:
            row.update(_watch_ratio(watched))
        print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1,
                   help="sweeps over the modes, each in the reverse order of the last")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--under-stallscope", action="store_true",
                   help="time `run`'s baseline and a watched run's steps against plain runs")
    p.add_argument("--only", default="hostbound,w8", help="record_h100.py configurations")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scratch", type=Path, default=Path("/tmp/bench_cupti_residue"))
    a = p.parse_args()
    if a.under_stallscope:
        under_stallscope(a.only.split(","), a.runs, a.scratch)
        return
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
