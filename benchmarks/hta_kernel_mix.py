"""stallscope's kernel-type split on HolisticTraceAnalysis' own kernel selection, to check that
the definitions agree (docs/metrics.md, "GPU kernels by type").

HTA keeps the GPU work launched before the last ProfilerStep starts and measures over the whole
span of it; the report measures over the judged steps. Run on the same selection, the figures
should equal HTA's `get_comm_comp_overlap` and `get_temporal_breakdown` compute time:

    python benchmarks/hta_kernel_mix.py sample_traces/public/hta/rank0of128_sampled.pt.trace.json.gz
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from stallscope.report.kernel_mix import _device_mix
from stallscope.trace.kernels import COMM_NAME
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from stallscope.trace.names import name_mask


def hta_selection_mix(path: Path) -> dict:
    """The kernel split (report/kernel_mix.py's definitions) over HTA's own selection: the GPU
    work launched before the last ProfilerStep, over its whole span."""
    trace = load_trace(path)
    model = build_model(trace)
    names = trace.events["name"].astype(str)
    last = trace.events["ts"][names.str.startswith("ProfilerStep#")].max()
    gpu = model.gpu
    keep = gpu["launch_ts"].to_numpy() < last
    kernel = gpu["kind"].to_numpy() == "kernel"
    comm = kernel & name_mask(gpu["name"], COMM_NAME)
    ts, end = gpu["ts"].to_numpy(), gpu["end"].to_numpy()
    window = np.array([[ts[keep].min(), end[keep].max()]])
    kinds = {"compute": kernel & ~comm & keep, "communication": comm & keep,
             "memory": ~kernel & keep}
    return _device_mix("all", window, {k: (ts[m], end[m]) for k, m in kinds.items()})


def hta_selection(path: Path) -> str:
    """One line: the overlap and the union times, over HTA's kernels."""
    mix = hta_selection_mix(path)
    us = mix["per_step_us"]
    return (f"{path.name}: comm hidden {mix['comm_hidden_pct']}%, compute {us['compute']:.0f} us, "
            f"communication {us['communication']:.0f} us, memory {us['memory']:.0f} us")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(hta_selection(Path(arg)))
