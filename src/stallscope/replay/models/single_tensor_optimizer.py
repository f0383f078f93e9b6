"""single-tensor-optimizer's change, `optimizer=foreach|fused`: the optimizer step's host time
cut to what a multi-tensor implementation keeps, and each of its kernels' fixed cost gone.
"""

from __future__ import annotations

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.graph import CALL, FILL, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import Context, Model, optimizer_nodes
from stallscope.units import percent

# Host time left of an optimizer step with multi-tensor kernels (one launch per few hundred
# tensors instead of one per tensor), and the GPU time each per-tensor kernel loses: its fixed
# cost (launch ramp, tail) when it becomes part of one multi-tensor kernel. Assumptions.
OPTIMIZER_HOST_LEFT = {"foreach": 0.2, "fused": 0.1}
# On a CPU the optimizer's arithmetic is host time too, and multi-tensor Adam loops over the
# tensors in C++ rather than in Python: measured, not assumed (examples/python_heavy.py's 97
# small parameter tensors, this project's VM; 3 rounds of the method, then 3 of
# benchmarks/bench_optimizer_cpu.py): foreach keeps 0.60-0.70 and 0.61-0.68 of the for-loop
# step's time (0.61 used), fused 0.21-0.37 and 0.15-0.24 (0.21 used).
OPTIMIZER_HOST_LEFT_CPU = {"foreach": 0.61, "fused": 0.21}
PER_KERNEL_GPU_US = 2.0


def optimizer(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in OPTIMIZER_HOST_LEFT:
        raise NotModelled(f"optimizer takes {', '.join(OPTIMIZER_HOST_LEFT)}")
    nodes = optimizer_nodes(g, ctx)
    if not nodes.any():
        raise NotModelled("no optimizer.step() in the steps")
    kernels = ctx.once("optimizer kernels",
                       lambda: tf.launched_by(g, nodes) & (g.g_kind == "kernel"))
    g = g.copy(*tf.SCALES_HOST, *tf.SCALES_GPU)
    if not ctx.model.has_gpu:
        left = OPTIMIZER_HOST_LEFT_CPU[value]
        tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), left)
        return g, [f"the optimizer step keeps {percent(100 * left, 0)} of its time on the CPU "
                   f"({value}; "
                   "measured against a for-loop Adam on small tensors, see docs/replay.md)"]
    left = OPTIMIZER_HOST_LEFT[value]
    tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), left)
    g.g_dur[kernels] = np.maximum(g.g_dur[kernels] - PER_KERNEL_GPU_US, 0.1 * g.g_dur[kernels])
    return g, [f"the optimizer step keeps {percent(100 * left, 0)} of its host time and each of "
               "its kernels "
               f"loses {PER_KERNEL_GPU_US:g} us of fixed cost ({value}; an assumption, see "
               "docs/replay.md)"]


MODELS = {
    "optimizer": Model(optimizer, lambda v: v in OPTIMIZER_HOST_LEFT, "foreach or fused"),
}
