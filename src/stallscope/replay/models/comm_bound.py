"""comm-bound's change, `comm=overlap`: collectives start as soon as their inputs are ready
(DDP's gradient buckets during backward, FSDP's all-gathers one ahead), except the time a
collective waited for slower ranks (`peer_excess`, which the rule measures by too).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.engine import replay
from stallscope.replay.graph import CALL, FILL, Graph
from stallscope.replay.loader import NotModelled
from stallscope.replay.models.common import Context, Model
from stallscope.text import plural
from stallscope.trace.kernels import COLLECTIVE, COMM_NAME, host_kinds
from stallscope.trace.model import TraceModel
from stallscope.trace.names import per_name
from stallscope.units import millis

# An instance of a collective that takes at least this many times the median instance of the
# same collective (same stream, same place in the step, so the same tensors and bytes) spent
# the excess over that median waiting for slower ranks (an assumption: the same bytes over the
# same link take about the same time, and jitter of the link alone does not double a transfer).
# The median needs PEER_MIN_STEPS steps: with two, one step's sequence may start mid-pattern
# (hta/rank0of128_sampled: step 1's first all-to-all moves 3 KB, step 2's 419 MB) and the
# two cannot be told apart. Only excess of 0.2 ms or more counts (shorter is within launch and
# clock noise). A lower bound: a rank slower by the same amount every step shows no excess.
PEER_FACTOR = 2.0
# Collectives whose bytes are fixed by the model (gradients, parameters, their shards): the same
# one moves the same bytes every step. All-to-all and send/recv move what the batch routes (a
# KJT's lengths, an activation's shape) and are not compared.
FIXED_SIZE = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce")
PEER_MIN_STEPS = 3
PEER_MIN_US = 200.0


def peer_excess(stream: np.ndarray, step: np.ndarray, ts: np.ndarray, dur: np.ndarray,
                kinds: np.ndarray) -> np.ndarray:
    """Per collective of a FIXED_SIZE kind, the time it waited for slower ranks: its duration
    less the median instance of the same collective, where it took PEER_FACTOR times that or
    more (0 elsewhere).

    The same collective is the one at the same place, on the same stream, in another step: a
    stream whose steps (PEER_MIN_STEPS or more) hold the same sequence of kinds repeats the
    same tensors, hence the same bytes, every step. Steps whose sequence differs from the most
    common one are left at 0: without the message sizes (the trace's host ranges carry them,
    the decoded table does not) two different collectives cannot be compared."""
    out = np.zeros(len(dur))
    inside = np.flatnonzero((step >= 0) & np.isin(kinds, FIXED_SIZE))
    for key in np.unique(stream[inside]):
        mine = inside[stream[inside] == key]
        mine = mine[np.lexsort((ts[mine], step[mine]))]
        steps = np.unique(step[mine])
        if len(steps) < PEER_MIN_STEPS:
            continue
        seqs = [mine[step[mine] == s] for s in steps]
        # The steps that repeat the most common sequence (a step whose kernels were launched
        # before the recording began lacks their host names, and is left out).
        pattern = Counter(tuple(kinds[q]) for q in seqs).most_common(1)[0][0]
        seqs = [q for q in seqs if tuple(kinds[q]) == pattern]
        if len(seqs) < PEER_MIN_STEPS:
            continue
        grid = np.stack(seqs)  # steps x position
        d = dur[grid]
        typical = np.median(d, axis=0)
        excess = d - typical
        waited = (d >= PEER_FACTOR * typical) & (excess >= PEER_MIN_US)
        out[grid] = np.where(waited, excess, 0.0)
    return out


def comm(g: Graph, ctx: Context, value: str) -> tuple[Graph, list[str]]:
    comm = g.gpu_named(lambda n: bool(COMM_NAME.search(n))) & (g.g_kind == "kernel")
    if not comm.any():
        raise NotModelled("no collective (NCCL/RCCL) kernels in the steps; CPU collectives "
                          "(gloo/MPI) are not modelled")
    kinds = ctx.once("comm kinds", lambda: _graph_kinds(g, ctx.model))
    bucketed = comm & np.isin(kinds, BUCKETED)
    prefetched = comm & np.isin(kinds, PREFETCHED)
    if not (bucketed | prefetched).any():
        raise NotModelled("the step's collectives are all-to-all or send/recv, whose output the "
                          "next op needs at once: overlap within the step cannot hide them")
    ops = ctx.model.ops
    back = ctx.once("backward", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: n.startswith(BACKWARD)).astype(bool)]))
    calls = ctx.once("collective calls", lambda: tf.within(
        g, ops[per_name(ops["name"], lambda n: bool(COLLECTIVE_CALL.match(n))).astype(bool)]))
    hide = tf.launched_by(g, back & ~calls) & (g.g_kind == "kernel") & ~comm
    wait = ctx.once("peer wait", lambda: _peer_wait(g, comm, kinds))
    before = replay(g)
    g = g.copy(*tf.JOINS, *tf.OVERLAPS, *tf.SCALES_HOST)
    # The stepping thread resumes when the thread that issued the collectives is done (a join
    # the graph's 1 ms release window misses when the hand-back took longer), with the slack
    # it had before this change: what the change takes off that thread reaches the step.
    tf.join_after(g, calls, before.host_start, before.host_end)
    moved = tf.overlap_collectives(g, bucketed, prefetched, hide, wait, BUCKET_US)
    host = calls & ((g.h_kind == FILL) | (g.h_kind == CALL)) & (g.h_wait < 0)
    tf.scale_host(g, host, 0.0)
    notes = [
        f"{plural(moved, 'collective')} start as soon as their inputs are ready: gradient "
        "all-reduce "
        "and reduce-scatter sent in buckets (DDP's default 25 MB, taken as "
        f"{millis(BUCKET_US / 1000, 'whole')} ms each: 25 GB/s assumed) as backward produces "
        "their gradients "
        "(in proportion to their transfer time), all-gathers one ahead (FSDP prefetch); none "
        "starts before the compute it follows, and the optimizer still waits for the last",
        "the per-collective host calls (c10d/nccl ranges) leave the step: DDP and FSDP issue "
        "one call per bucket from C++ hooks (their cost is neglected)",
    ]
    if wait.any():
        per_step = round(float(wait.sum()) / max(g.steps, 1) / 1000.0, 3)  # ms, as rules round
        notes.append(f"{millis(per_step)} ms per step of waiting on "
                     "peers (collective time beyond the same collective's median step) stays "
                     "on the step's last collective: overlap does not remove it")
    return g, notes


# Collective kernels by kind (comm.py's names): those DDP buckets during backward, those FSDP
# prefetches; the rest (send/recv, all-to-all) are not moved.
BUCKETED = ("AllReduce", "ReduceScatter")
PREFETCHED = ("AllGather",)
BACKWARD = "autograd::engine::evaluate_function"
# One DDP bucket's transfer: the default 25 MB at an assumed 25 GB/s (a 200 Gb/s InfiniBand
# link per GPU, the slower side of a multi-node all-reduce; NVLink is faster). An assumption
# from the vendors' link rates: the trace's decoded table has no message sizes to measure it.
BUCKET_US = 1000.0
# Host ranges that issue a collective (what DDP's reducer replaces with one call per bucket).
COLLECTIVE_CALL = re.compile(r"^(?:c10d::|nccl:|rccl:|record_param_comms)")


def _peer_wait(g: Graph, comm: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Per GPU op, the time a collective waited for slower ranks (comm.peer_excess)."""
    out = np.zeros(len(g.g_ts))
    out[comm] = peer_excess(g.g_stream[comm].astype(float), g.g_step[comm], g.g_ts[comm],
                            g.g_dur[comm], kinds[comm])
    return out


def _graph_kinds(g: Graph, model: TraceModel) -> np.ndarray:
    """Per GPU op, its collective: the one its launch's `nccl:<op>` host range names
    (comm.host_kinds), else the kernel name's, else ""."""
    kinds = np.array([_collective_kind(n) for n in g.g_names], dtype=object)[g.g_name]
    named = host_kinds(model)
    has = named != ""
    if has.any():
        gpu = model.gpu
        key = dict(zip(zip(gpu["device"].astype(str).to_numpy(dtype=object)[has].tolist(),
                           gpu["ts"].to_numpy(dtype=float)[has].tolist(), strict=True),
                       named[has].tolist(), strict=True))
        found = [key.get(k, "") for k in zip(g.g_device.tolist(), g.g_ts.tolist(), strict=True)]
        kinds = np.where(np.array(found, dtype=object) != "", np.array(found, dtype=object),
                         kinds)
    return kinds


def _collective_kind(name: str) -> str:
    m = COLLECTIVE.search(name)
    return m.group(1) if m else ""


MODELS = {"comm": Model(comm, lambda v: v == "overlap", "overlap")}
