"""The one list of rules: each rule module's `SPEC` (diagnose/spec.py), found in the rules
package (diagnose/rules/) and put in the order they run and are reported (`RuleSpec.order`).
Everything said about the rules as a set is read from here: which run on a trace and which over
a job, the `--what-if` vocabulary, each finding's change for the fix plan and why a finding has
none, compare's quantities, the causes, and the generated docs (diagnose/docgen.py). A new rule
is a new module: nothing here names one.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

from stallscope.diagnose import rules as rules_package
from stallscope.diagnose.spec import NO_CHANGE, Change, RuleSpec
from stallscope.trace.model import TraceModel


def discover(package: ModuleType = rules_package) -> tuple[RuleSpec, ...]:
    """Every module's SPEC in `package`, by `order` then id. A module without one is an error:
    a rule the registry did not see would never run."""
    specs = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, RuleSpec):
            raise TypeError(f"{module.__name__} declares no SPEC (diagnose/spec.py RuleSpec)")
        specs.append(spec)
    return tuple(sorted(specs, key=lambda s: (s.order, s.id)))


ALL_RULES: tuple[RuleSpec, ...] = discover()
# The order rules run in on one trace, which is the order the report lists their assessments.
# A rule that reads another's finding (`reads`) comes after it.
TRACE_RULES: tuple[RuleSpec, ...] = tuple(s for s in ALL_RULES if not s.job)
# Rules over all the traces of one job (several ranks) at once.
JOB_RULES: tuple[RuleSpec, ...] = tuple(s for s in ALL_RULES if s.job)
BY_ID: dict[str, RuleSpec] = {spec.id: spec for spec in ALL_RULES}


def spec_of(rule_id: str) -> RuleSpec | None:
    """The rule's declaration; None for an id this stallscope does not know (a report.json
    from another version)."""
    return BY_ID.get(rule_id)


def flagged(rule_id: str, flag: str) -> bool:
    """Whether the rule declares `flag` (a boolean RuleSpec field); False for an unknown id."""
    spec = BY_ID.get(rule_id)
    return bool(getattr(spec, flag)) if spec is not None else False


def what_if_keys() -> list[str]:
    """The `--what-if` keys: every key a rule declares, in rule order, each once."""
    return list(dict.fromkeys(key for spec in ALL_RULES for key in spec.what_if))


def changes_for(finding: Any, model: TraceModel) -> list[Change]:
    """The change a finding recommends, in what-if terms; [] when it has none to replay."""
    spec = BY_ID.get(finding.id)
    return spec.changes_for(finding, model) if spec else []


def no_change_reason(finding: Any, model: TraceModel) -> str:
    """Why `changes_for` gave nothing for this finding, in the report's words."""
    spec = BY_ID.get(finding.id)
    return spec.no_change_reason(finding) if spec else NO_CHANGE
