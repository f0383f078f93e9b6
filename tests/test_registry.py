"""The rule registry (diagnose/registry.py) is the one list of rules: every rule module declares
its SPEC there, the `--what-if` vocabulary is what the rules declare, and the docs generated
from it (docs/rules.md's index, `--what-if` keys and headings) are the committed ones. A rule is
one unit: for any id, its module, its test file and its docs entry are found by its name.
"""

from __future__ import annotations

import importlib

import pytest

from stallscope.diagnose import JOB_RULES, RULES, docgen
from stallscope.diagnose.fixes import WHAT_IF, model_owner, parse_what_if
from stallscope.diagnose.registry import ALL_RULES, BY_ID, TRACE_RULES, what_if_keys
from stallscope.errors import StallscopeError
from tests.conftest import ROOT

RULE_MODULES = sorted(p.stem for p in (ROOT / "src/stallscope/diagnose/rules").glob("*.py")
                      if p.stem != "__init__")


def test_the_committed_docs_are_what_the_registry_generates() -> None:
    stale = [str(p.relative_to(ROOT)) for p in docgen.stale(ROOT)]
    assert stale == [], f"generated docs are stale: run `{docgen.COMMAND}` and commit them"
    assert docgen.unknown_sections(ROOT) == []


def test_every_rule_module_declares_itself_once() -> None:
    assert sorted(spec.name for spec in ALL_RULES) == RULE_MODULES
    assert len(BY_ID) == len(ALL_RULES) == len(RULE_MODULES)
    for spec in ALL_RULES:
        module = importlib.import_module(f"stallscope.diagnose.rules.{spec.name}")
        assert spec.id == module.RULE_ID and module.SPEC is spec
        # The thresholds it declares are the constants it judges by, with their values.
        assert {k: getattr(module, k) for k in spec.thresholds} == dict(spec.thresholds)


@pytest.mark.parametrize("spec", ALL_RULES, ids=lambda s: s.id)
def test_a_rules_module_tests_and_docs_are_found_by_its_id(spec) -> None:
    """What `git grep -l <id>` finds: the module, the test file and the docs entry by name."""
    for path in (spec.module, spec.tests, "docs/rules.md"):
        assert spec.id in (ROOT / path).read_text(encoding="utf-8"), path
    assert f'<a id="{spec.id}"></a>' in (ROOT / "docs/rules.md").read_text(encoding="utf-8")


def test_the_diagnosis_runs_the_registry_in_its_order() -> None:
    assert [spec.check for spec in TRACE_RULES] == RULES
    assert [spec.check for spec in ALL_RULES if spec.job] == JOB_RULES
    order = [spec.id for spec in TRACE_RULES]
    for spec in TRACE_RULES:  # a rule reads only findings made before it
        assert all(order.index(r) < order.index(spec.id) for r in spec.reads), spec.id


def test_the_what_if_vocabulary_is_what_the_rules_declare() -> None:
    assert set(what_if_keys()) == set(WHAT_IF)
    with pytest.raises(StallscopeError) as err:
        parse_what_if(["threads=4"])
    assert f"one of {', '.join(what_if_keys())}" in str(err.value)


MODEL_MODULES = sorted(p.stem for p in (ROOT / "src/stallscope/replay/models").glob("*.py")
                       if p.stem not in ("__init__", "common"))


@pytest.mark.parametrize("key", what_if_keys())
def test_each_change_has_its_model_under_its_rules_name(key) -> None:
    """A change's replay model is in replay/models/<rule>.py of the first rule declaring it,
    and that is the model `--what-if` and the fix plan replay; a rule's docs entry names it."""
    owner = model_owner(key)
    assert owner is next(s for s in ALL_RULES if key in s.what_if)
    module = importlib.import_module(f"stallscope.replay.models.{owner.name}")
    assert (ROOT / owner.replay_models).is_file()
    assert module.MODELS[key] is WHAT_IF[key]
    rules_md = (ROOT / "docs/rules.md").read_text(encoding="utf-8")
    for spec in ALL_RULES:
        if key in spec.what_if:
            entry = rules_md.split(f'<a id="{spec.id}"></a>')[1].split("<a id=")[0]
            assert f"`{owner.replay_models}` (" in entry, spec.id


def test_every_model_module_is_a_rules_and_holds_only_its_changes() -> None:
    """No stray model module: each is named after a rule and holds the keys that rule declares
    first, no more."""
    for name in MODEL_MODULES:
        spec = next((s for s in ALL_RULES if s.name == name), None)
        assert spec is not None, f"replay/models/{name}.py is named after no rule"
        module = importlib.import_module(f"stallscope.replay.models.{name}")
        assert set(module.MODELS) == {k for k in spec.what_if if model_owner(k) is spec}, name
    owners = {model_owner(k).name for k in what_if_keys()}
    assert set(MODEL_MODULES) == owners


def test_a_rule_missing_from_the_docs_is_named(tmp_path) -> None:
    for name in (docgen.RULES_MD,):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    doc = tmp_path / docgen.RULES_MD
    doc.write_text(doc.read_text(encoding="utf-8").replace(docgen.end("rule gpu-bound"), ""),
                   encoding="utf-8")
    with pytest.raises(docgen.StaleMarkers, match="rule gpu-bound"):
        docgen.render(tmp_path)
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1


def test_the_readme_is_a_front_door_with_no_generated_table() -> None:
    """The rule tables are written into docs/rules.md alone; the README links there and stays
    short (at most 300 lines)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- begin generated" not in readme
    assert "docs/rules.md#what-if" in readme
    assert set(docgen.render(ROOT)) == {ROOT / docgen.RULES_MD}
    assert len(readme.splitlines()) <= 300
