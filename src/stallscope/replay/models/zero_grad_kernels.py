"""zero-grad-kernels' change, `zero_grad=none`: zero_grad() launches nothing and keeps a
sliver of its host time, as `set_to_none=True` does.
"""

from __future__ import annotations

from stallscope.replay import transforms as tf
from stallscope.replay.graph import CALL, FILL, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import Context, Model, zero_grad_nodes
from stallscope.units import percent

# zero_grad(set_to_none=True) only drops references: this share of its host time is left.
ZERO_GRAD_HOST_LEFT = 0.05


def zero_grad(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in ("none", "set_to_none"):
        raise NotModelled("only zero_grad=none is replayed")
    nodes = zero_grad_nodes(g, ctx)
    launched = ctx.once("zero_grad kernels", lambda: tf.launched_by(g, nodes))
    if not launched.any():
        raise NotModelled("zero_grad() launches no kernels in the steps")
    g = g.copy(*tf.REMOVES_GPU, *tf.SCALES_HOST)
    tf.remove_gpu(g, launched)
    tf.scale_host(g, nodes & ((g.h_kind == FILL) | (g.h_kind == CALL)), ZERO_GRAD_HOST_LEFT)
    return g, [f"zero_grad() launches nothing and keeps {percent(100 * ZERO_GRAD_HOST_LEFT, 0)} "
               "of its host "
               "time: gradients are set to None, not filled with zeros"]


MODELS = {"zero_grad": Model(zero_grad, lambda v: v == "none", "none")}
