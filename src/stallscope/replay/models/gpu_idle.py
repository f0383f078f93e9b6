"""gpu-idle's changes, by the idle's cause: `cuda_graphs` (launch overhead: the model's forward
and backward replayed as CUDA graphs) and `allocator=steady` (cudaMalloc/cudaFree leave the
steps), which allocator-churn declares too.
"""

from __future__ import annotations

from stallscope.replay import transforms as tf
from stallscope.replay.graph import CALL, FILL, LOADER, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import (
    Context,
    Model,
    h2d_calls,
    optimizer_nodes,
    zero_grad_nodes,
)
from stallscope.trace.names import ALLOC_CALL, FREE_CALL, GRAPH_LAUNCH
from stallscope.units import percent

# CUDA graphs: one graph launch replays the captured kernels; what is left of the host time
# between a step's launches, and the gap between kernels on a stream. Assumptions.
GRAPH_HOST_LEFT = 0.02
GRAPH_KERNEL_GAP_US = 1.0


def cuda_graphs(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value != "true":
        raise NotModelled("only cuda_graphs=true is replayed")
    if not len(g.g_ts):
        raise NotModelled("no GPU work to capture")
    in_steps = (g.h_ts >= g.h_ts[g.step_start[0]]) & (g.h_ts < g.h_ts[g.step_end[-1]])
    graphs = int((in_steps & (g.h_kind == CALL)
                  & g.host_named(lambda n: bool(GRAPH_LAUNCH.match(n)))).sum())
    if graphs:
        raise NotModelled(
            f"the steps already launch CUDA graphs ({graphs / len(g.step_start):.1f} "
            "cudaGraphLaunch per step): the change is made; what stays outside the graphs "
            "(the loss, the optimizer step, the fetch) is not what it replays")
    # What torch.compile(model, mode="reduce-overhead") or make_graphed_callables(model)
    # captures is the model's forward and backward: the loader, the input copies, host waits,
    # the optimizer step and zero_grad stay as they are (the hostbound-graphs
    # recording kept Adam.step's host time: sample_traces/README.md).
    outside = optimizer_nodes(g, ctx) | zero_grad_nodes(g, ctx)
    keep = (g.h_kind == LOADER) | h2d_calls(g) | (g.h_wait >= 0) | outside
    nodes = in_steps & ((g.h_kind == FILL) | (g.h_kind == CALL)) & ~keep
    g = g.copy(*tf.SCALES_HOST, *tf.TIGHTENS)
    tf.scale_host(g, nodes, GRAPH_HOST_LEFT)
    tf.tighten_streams(g, tf.launched_by(g, nodes), GRAPH_KERNEL_GAP_US)
    return g, ["the model's forward and backward replay as CUDA graphs: "
               f"{percent(100 * GRAPH_HOST_LEFT, 0)} "
               f"of the host time between their launches is left and their kernels follow "
               f"each other within {GRAPH_KERNEL_GAP_US:g} us; the optimizer step, zero_grad, "
               "the loader and the input copies keep their time (needs static shapes and no "
               "host syncs inside the captured region)"]


def allocator(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    calls = g.host_named(lambda n: bool(ALLOC_CALL.match(n) or FREE_CALL.match(n))) & (
        g.h_kind == CALL)
    if not calls.any():
        raise NotModelled("no cudaMalloc/cudaFree calls in the steps")
    g = g.copy(*tf.UNBLOCKS)
    tf.unblock(g, calls)
    g.h_dur[calls] = 0.0
    return g, ["cudaMalloc/cudaFree (and the device syncs cudaFree implies) leave the steps: "
               "the caching allocator keeps its blocks"]


MODELS = {
    "cuda_graphs": Model(cuda_graphs, lambda v: v == "true", "true"),
    "allocator": Model(allocator, lambda v: v == "steady", "steady"),
}
