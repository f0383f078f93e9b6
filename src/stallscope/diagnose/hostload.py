"""Other load on the machine, as `stallscope run` measured it (capture/hostload.py): when other
processes took a material share of the cores while the steps were recorded, advice that sizes
CPU work to the cores (DataLoader workers, intra-op threads, the replay's core model) assumed
cores that were not free. The rules then say so in their precondition and basis; their numbers
are not changed, and their severity is not raised by it.

The figures are read from the trace's own `stallscope` metadata (`host`), so `analyze` of a
trace recorded by `run` knows them too; else from the RunContext's environment.
"""

from __future__ import annotations

from typing import Any

from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.trace.otherload import OtherLoad, load_from


def host_facts(model: TraceModel, context: RunContext | None = None) -> dict[str, Any]:
    """The `host` facts `run` recorded: the trace's metadata first, else the run's context."""
    host = model.trace.capture.get("host") if isinstance(model.trace.capture, dict) else None
    if isinstance(host, dict) and "other_cpu_share_pct" in host:
        return host
    env = context.environment.get("host") if context else None
    return env if isinstance(env, dict) else {}


def other_load(model: TraceModel, context: RunContext | None = None) -> OtherLoad | None:
    """The other load when it reaches OTHER_LOAD_PCT, else None (also when not measured)."""
    return load_from(host_facts(model, context))
