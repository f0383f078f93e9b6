"""host-device-sync's change, `sync=off`: the host's waits on the GPU (stream and device syncs,
device-to-host copies) no longer block the step, as when `.item()` is read every N steps.
"""

from __future__ import annotations

from stallscope.replay import transforms as tf
from stallscope.replay.graph import CALL, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import (
    DTOH,
    Context,
    Model,
    calls_launching,
    followers,
    gpu_named,
    h2d_calls,
)
from stallscope.text import plural
from stallscope.trace.model import SYNC_CALLS


def sync_off(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    if value not in ("off", "false", "none"):
        raise NotModelled("only sync=off is replayed")
    is_sync = g.host_named(lambda n: n in SYNC_CALLS) & (g.h_kind == CALL)
    dtoh = calls_launching(g, gpu_named(g, DTOH))
    waits = (is_sync | dtoh) & (g.h_wait >= 0)
    own = followers(g, h2d_calls(g), SYNC_CALLS) & waits  # a copy's own sync: non_blocking's
    waits &= ~own
    if not waits.any():
        if own.any():
            raise NotModelled("its waits are the stream syncs right after host-to-device "
                              "copies (copy_ with non_blocking=False): non_blocking=true with "
                              "pinned memory removes them, not moving .item() out of the loop")
        raise NotModelled("no host wait on the GPU in the steps that moving .item()/.cpu() "
                          "out of the loop would remove")
    g = g.copy(*tf.UNBLOCKS)
    tf.unblock(g, waits)
    return g, [f"{plural(int(waits.sum()), 'host wait')} on the GPU (stream/device syncs, "
               "device-to-host copies) no longer block the step: the values are read every "
               "N steps instead"]


MODELS = {"sync": Model(sync_off, lambda v: v == "off", "off")}
