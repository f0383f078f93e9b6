"""A rule is one record: its module's SPEC (diagnose/spec.py) holds everything stallscope says
of it as a rule (its order, compare's quantity, its causes, the verdict's figure, the fix plan's
reasons, the report's flags), and the registry finds the module in the rules package. So a new
rule is its module, its replay model (if it declares a `--what-if` key), its test file and the
generated docs: this test copies the source tree, adds a toy rule there as one module file, and
sees every part of stallscope take it up with no other file changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from stallscope.diagnose.registry import ALL_RULES
from tests.conftest import ROOT

TOY = textwrap.dedent('''
    """A toy rule: every trace with steps has it (tests/test_rule_record.py)."""

    from __future__ import annotations

    from stallscope.diagnose.finding import Assessment, Finding
    from stallscope.diagnose.spec import MS, Cause, Metric, RuleSpec, evidence_key

    RULE_ID = "toy-rule"


    def toy_rule(model, context=None):
        steps = len(model.steps)
        if not steps:
            return Assessment(RULE_ID, "not_assessed", "no steps")
        return Assessment.found(Finding(
            id=RULE_ID, title="a toy finding", evidence={"toy_ms_per_step": 1.5,
                                                          "toy_share_pct": 60.0},
            recommendation="Nothing to do.", snippet="pass", precondition="always",
            estimated_saving_pct=0.5, saving_basis="none"))


    SPEC = RuleSpec(
        id=RULE_ID,
        title="a toy rule that always finds",
        summary="a toy rule",
        check=toy_rule,
        order=15,
        metric=Metric("toy time", MS, evidence_key("toy_ms_per_step"), "toy_share_pct"),
        causes=(Cause("dataloader-bound", "toy_share_pct"),),
        verdict_metric=("toy_share_pct", "toy_pct"),
        loader_pace=True,
    )
''')

PROBE = textwrap.dedent('''
    import json, sys
    from pathlib import Path

    import stallscope
    assert stallscope.__file__.startswith(sys.argv[1]), stallscope.__file__

    from stallscope.commands.compare_metrics import METRICS, measure
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.diagnose import CAUSES, docgen, registry
    from stallscope.diagnose.plan import LOADER_RULES
    from stallscope.report.tensorboard import VERDICT_METRIC

    report = analyze_paths([Path(sys.argv[2])], jobs=1)
    toy = next(f for f in report.findings if f.id == "toy-rule")
    finding = {"evidence": toy.evidence}
    try:
        docgen.render(Path(sys.argv[1]))
        stale_docs = ""
    except docgen.StaleMarkers as exc:
        stale_docs = str(exc)
    print(json.dumps({
        "order": [s.id for s in registry.TRACE_RULES],
        "assessed": [a["rule"] for a in report.assessments],
        "caused_by": toy.caused_by,
        "metric": measure("toy-rule", finding, finding),
        "causes": [list(c) for c in CAUSES if c[0] == "toy-rule"],
        "verdict_metric": list(VERDICT_METRIC.get("toy-rule", ())),
        "loader_pace": "toy-rule" in LOADER_RULES,
        "index": "[`toy-rule`](#toy-rule)" in docgen.rules_index(),
        "heading": docgen.rule_heading(registry.BY_ID["toy-rule"]),
        "stale_docs": stale_docs,
        "gated": "toy-rule" in METRICS,
    }))
''')


def test_a_new_rule_is_one_module_and_every_part_takes_it_up(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src/stallscope", tmp_path / "src/stallscope",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for doc in ("docs/rules.md",):
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    # The one file written: the rule's module.
    (tmp_path / "src/stallscope/diagnose/rules/toy_rule.py").write_text(TOY, encoding="utf-8")
    trace = ROOT / "sample_traces/cpu-loader-bound.pt.trace.json.gz"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), str(trace)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # It runs where its `order` puts it, and the report lists its assessment there.
    assert seen["order"][:2] == ["dataloader-bound", "toy-rule"]
    assert seen["assessed"][:2] == ["dataloader-bound", "toy-rule"]
    # compare judges it by its declared quantity; its cause is attributed; the plan and the
    # TensorBoard verdict read its flags.
    assert seen["gated"]
    assert seen["metric"]["what"] == "toy time" and seen["metric"]["before"] == 1.5
    assert seen["causes"] == [["toy-rule", "toy_share_pct", "dataloader-bound"]]
    assert seen["caused_by"] == "dataloader-bound"
    assert seen["verdict_metric"] == ["toy_share_pct", "toy_pct"] and seen["loader_pace"]
    # The generated docs take it up: the index row and its heading; the committed
    # docs/rules.md lacks its section, which `docgen --write` is then asked to add (the one
    # other file a new rule touches besides its tests).
    assert seen["index"]
    assert "## `toy-rule`: a toy rule that always finds" in seen["heading"]
    assert "toy-rule" in seen["stale_docs"]


def test_the_registry_counts_what_is_in_the_rules_package() -> None:
    """Nothing hard-codes how many rules there are: the registry is what the package holds."""
    modules = sorted(p.stem for p in (ROOT / "src/stallscope/diagnose/rules").glob("*.py")
                     if not p.stem.startswith("_"))
    assert [s.name for s in sorted(ALL_RULES, key=lambda s: s.name)] == modules
    orders = [s.order for s in ALL_RULES]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
