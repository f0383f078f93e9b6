"""The `--what-if KEY=VALUE` vocabulary and the dispatcher that replays a finding's changes.

Each key's replay model (what the change does to the recorded graph) lives beside the rule
whose change it is, in replay/models/<rule>.py for the first rule in the registry's order that
declares the key; this module finds it through the registry, checks the values a user gives
and applies the changes in order. Every prediction carries the assumptions it rests on; a
change the trace cannot support raises NotModelled with why.
"""

from __future__ import annotations

import importlib

from stallscope.diagnose.registry import ALL_RULES, what_if_keys
from stallscope.diagnose.spec import Change, RuleSpec
from stallscope.errors import StallscopeError
from stallscope.replay.graph import Graph
from stallscope.replay.models.common import Context, Model

__all__ = ["WHAT_IF", "Change", "Context", "apply", "model_owner", "parse_what_if"]

MODELS_PACKAGE = "stallscope.replay.models"


def model_owner(key: str) -> RuleSpec:
    """The rule whose replay model `key` is: the first, in the registry's order, to declare it
    (the others that declare it name it in their docs entry)."""
    return next(spec for spec in ALL_RULES if key in spec.what_if)


def _model(key: str) -> Model:
    module = importlib.import_module(f"{MODELS_PACKAGE}.{model_owner(key).name}")
    found: Model = module.MODELS[key]
    return found


# key -> its replay model, for every --what-if key the rules declare (diagnose/registry.py's
# what_if_keys; tests/test_registry.py checks each is in its owner's replay/models module).
WHAT_IF: dict[str, Model] = {key: _model(key) for key in what_if_keys()}


def parse_what_if(items: list[str]) -> list[Change]:
    """`--what-if KEY=VALUE` options, checked before any work. Raises StallscopeError."""
    out: dict[str, Change] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip().lower()
        if not sep or not key or not value:
            raise StallscopeError(f"--what-if {item!r}: expected KEY=VALUE, e.g. "
                                  "--what-if num_workers=4")
        model = WHAT_IF.get(key)
        if model is None:
            raise StallscopeError(f"--what-if {item!r}: unknown change {key!r}; one of "
                                  f"{', '.join(what_if_keys())}")
        if not model.accepts(value):
            raise StallscopeError(f"--what-if {item!r}: {key} takes {model.values}")
        out[key] = Change(key, value)
    return list(out.values())


def apply(g: Graph, ctx: Context, changes: list[Change]) -> tuple[Graph, list[str]]:
    """`g` with every change made, in order; the assumptions they rest on. NotModelled when
    one of them cannot be replayed on this trace."""
    notes: list[str] = []
    for change in changes:
        g, said = WHAT_IF[change.key].fix(g, ctx, change.value)
        ctx.applied.append(change.key)
        notes.extend(n for n in said if n not in notes)
    return g, notes
