"""The profiler's own cost per recorded op, with and without each option, on this machine.

What `stallscope run` measures at its start (capture/opcost.py) for its own settings, here for
every setting: CPU ops under CPU activity, with and without `record_shapes`; and, where CUDA is
available, CPU ops and kernel-launching ops under CPU+CUDA activity. Each line: the host's cost
of one op plain and profiled, the difference (what the replay takes out per recorded op), the
op events one loop op recorded and the difference per event, and how long the measurement
itself took. Then the size cost: the bytes of Chrome trace
(`export_chrome_trace`, uncompressed, and gzipped as `run` writes it) per recorded op, for the
same loop exported with shapes off and on. `--json FILE` also writes the figures.

    python benchmarks/bench_profiler_cost.py [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from stallscope.capture.opcost import OPS, measure
from stallscope.capture.quiet import quiet_profiler_warnings, usdt_filtered


def cases() -> list[tuple[str, list[ProfilerActivity], bool, str]]:
    cpu = [ProfilerActivity.CPU]
    out = [(f"cpu ops, CPU activity, shapes {'on' if s else 'off'}", cpu, s, "cpu")
           for s in (False, True)]
    if torch.cuda.is_available():
        both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        for device in ("cpu", "cuda"):
            for s in (False, True):
                out.append((f"{device} ops, CPU+CUDA activity, shapes {'on' if s else 'off'}",
                            both, s, device))
    return out


def trace_bytes(activities: list[ProfilerActivity], record_shapes: bool,
                device: str) -> dict[str, float]:
    """Bytes of exported trace per recorded op: OPS tiny ops (as `measure` times them) under
    `profile(activities, record_shapes)`, exported, divided by the host ops the trace holds."""
    x = torch.zeros(1, device=device)
    with profile(activities=activities, record_shapes=record_shapes) as prof:
        y = x
        for _ in range(OPS):
            y = torch.add(y, 1)
        if device != "cpu":
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        prof.export_chrome_trace(str(path))
        raw = path.read_bytes()
    events = json.loads(raw).get("traceEvents", [])
    ops = sum(1 for e in events if e.get("cat") in ("cpu_op", "user_annotation"))
    dims = sum(1 for e in events if "Input Dims" in (e.get("args") or {}))
    return {"ops": ops, "with_input_dims": dims, "bytes_per_op": len(raw) / max(ops, 1),
            "gzip_bytes_per_op": len(gzip.compress(raw)) / max(ops, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    quiet_profiler_warnings()
    warnings.simplefilter("ignore")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, GPU {gpu}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<40} {'plain us':>9} {'profiled us':>12} {'added us':>9} "
          f"{'events/op':>9} {'us/event':>9} {'took s':>7}")
    rows = []
    for label, activities, shapes, device in cases():
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with usdt_filtered():
                cost = measure(activities, shapes, device)
            took = time.perf_counter() - t0
            per_event = cost.added_us_per_event
            print(f"{label:<40} {cost.plain_us:>9.2f} {cost.profiled_us:>12.2f} "
                  f"{cost.added_us:>9.2f} {cost.events_per_op or 0:>9.2f} "
                  f"{per_event if per_event is not None else float('nan'):>9.3f} {took:>7.2f}",
                  flush=True)
            rows.append({"case": label, "took_s": round(took, 3), **cost.to_dict()})
    print(f"\n{'case':<40} {'host ops':>9} {'Input Dims':>11} {'bytes/op':>9} "
          f"{'gzip bytes/op':>14}")
    sizes = []
    for label, activities, shapes, device in cases():
        with usdt_filtered():
            size = trace_bytes(activities, shapes, device)
        print(f"{label:<40} {size['ops']:>9} {size['with_input_dims']:>11} "
              f"{size['bytes_per_op']:>9.1f} {size['gzip_bytes_per_op']:>14.1f}", flush=True)
        sizes.append({"case": label, **size})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": gpu, "cores": os.cpu_count(),
                       "rows": rows, "trace_bytes": sizes}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
