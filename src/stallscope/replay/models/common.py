"""What the replay models share: the `Context` they read besides the graph, the `Model` each
`--what-if` key maps to, and the selections of host calls and GPU ops several of them make
(host-to-device copies and their calls, the calls right after them, the optimizer's and
zero_grad's ranges). Which events a change touches is the rules' knowledge; the names it is
read by live in the trace stage (trace/names.py, trace/kernels.py), so the models sit below the
rules and the dependency points down.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallscope.replay import transforms as tf
from stallscope.replay.graph import CALL, Graph
from stallscope.replay.loader import LoaderFacts
from stallscope.trace.model import TraceModel
from stallscope.trace.names import OPTIMIZER_STEP, ZERO_GRAD, name_matches, per_name

HTOD_PAGEABLE = re.compile(r"^Memcpy HtoD \(Pageable")
HTOD_PINNED = re.compile(r"^Memcpy HtoD \(Pinned")
DTOH = re.compile(r"^Memcpy DtoH")
# A sync this close (us) after an HtoD copy call is the copy's own (copy_ with non_blocking=False).
FOLLOW_US = 30.0
# Context.memo key of the plan's ThreadScales (replay/threads.py), None without a probe; and
# of why not.
ONE_THREAD = "one_thread"
ONE_THREAD_WHY = "one_thread_why"


@dataclass
class Context:
    """What the models read besides the graph: the trace model, and what `run` measured."""

    model: TraceModel
    facts: LoaderFacts
    step_us: np.ndarray  # recorded duration of each step
    applied: list[str] = field(default_factory=list)  # keys already applied in this scenario
    # Selections that depend only on what the nodes are (names, threads, ranges), which no
    # model changes: computed once per plan, shared by all its scenarios.
    memo: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


Fix = Callable[[Graph, Context, str], tuple[Graph, list[str]]]


@dataclass(frozen=True)
class Model:
    """One `--what-if` key's replay model: the graph edit, which values it accepts, and those
    values in the words `--what-if`'s error and the README's table use."""

    fix: Fix
    accepts: Callable[[str], bool]
    values: str


def is_whole(text: str, lo: int = 1) -> bool:
    return text.isdigit() and int(text) >= lo


def h2d_bytes_per_step(model: TraceModel) -> float:
    c = model.copies
    h2d = c[(c["direction"] == "HtoD") & (c["step"] >= 0)]
    return float(h2d["bytes"].sum()) / max(len(model.steps), 1)


def gpu_named(g: Graph, pattern: re.Pattern[str]) -> np.ndarray:
    return g.gpu_named(lambda n: bool(pattern.match(n))) & (g.g_step >= 0)


def calls_launching(g: Graph, ops: np.ndarray) -> np.ndarray:
    out = np.zeros(len(g.h_ts), dtype=bool)
    launch = g.g_launch[ops & (g.g_launch >= 0)]
    out[launch] = True
    return out


def h2d_calls(g: Graph) -> np.ndarray:
    return calls_launching(g, g.gpu_named(lambda n: n.startswith("Memcpy HtoD")))


def followers(g: Graph, calls: np.ndarray, names: frozenset[str]) -> np.ndarray:
    """Calls named in `names` that come next on the same thread within FOLLOW_US of a selected
    call (the stream sync `copy_` issues after a blocking copy)."""
    out = np.zeros(len(g.h_ts), dtype=bool)
    every = np.flatnonzero(g.h_kind == CALL)
    chosen = np.flatnonzero(calls & (g.h_kind == CALL))
    k = np.searchsorted(every, chosen) + 1
    ok = k < len(every)
    c, nxt = chosen[ok], every[k[ok]]
    named = g.host_named(lambda n: n in names)
    follow = ((g.h_thread[nxt] == g.h_thread[c]) & named[nxt]
              & (g.h_ts[nxt] - g.h_rec_end[c] <= FOLLOW_US))
    out[nxt[follow]] = True
    return out


def optimizer_nodes(g: Graph, ctx: Context) -> np.ndarray:
    ops = ctx.model.ops
    return ctx.once("optimizer", lambda: tf.within(
        g, ops[name_matches(ops["name"], OPTIMIZER_STEP)]))


def zero_grad_nodes(g: Graph, ctx: Context) -> np.ndarray:
    ops = ctx.model.ops
    return ctx.once("zero_grad", lambda: tf.within(
        g, ops[per_name(ops["name"], is_zero_grad).astype(bool)]))


def is_zero_grad(name: str) -> bool:
    return name.startswith(ZERO_GRAD)
