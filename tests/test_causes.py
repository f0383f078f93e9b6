"""Cause attribution: a finding whose lost time belongs to another finding points to it, and
follows it through a chain of causes.
"""

from __future__ import annotations

from stallscope.diagnose import _attribute_causes
from stallscope.diagnose.finding import Finding


def _finding(rule: str, **evidence: float) -> Finding:
    return Finding(id=rule, title=rule, evidence=dict(evidence), recommendation="r",
                   snippet="", precondition="", estimated_saving_pct=20.0, saving_basis="")


def test_gpu_idle_while_loading_points_to_dataloader_bound() -> None:
    idle = _finding("gpu-idle", idle_during_dataloader_pct=80.0)
    _attribute_causes([idle, _finding("dataloader-bound")])
    assert idle.caused_by == "dataloader-bound"
    assert idle.recommendation.startswith("80% of this lost time is `dataloader-bound`")


def test_no_cause_without_the_cause_finding_or_below_half() -> None:
    alone = _finding("gpu-idle", idle_during_dataloader_pct=80.0)
    _attribute_causes([alone])
    minor = _finding("gpu-idle", idle_during_dataloader_pct=20.0)
    _attribute_causes([minor, _finding("dataloader-bound")])
    assert alone.caused_by == "" and minor.caused_by == ""


def test_an_effect_follows_its_cause_even_through_a_chain_of_causes() -> None:
    # a is caused by b, b by c; ranked a, b, c (ties fall to the ids). The reader must meet
    # c, then b, then a: each effect after its cause.
    from stallscope.report.build import causes_first

    def f(fid: str, cause: str | None) -> Finding:
        return Finding(id=fid, title=fid, evidence={}, recommendation="", snippet="",
                       precondition="", estimated_saving_pct=10.0, saving_basis="", docs="",
                       trace="rank 0", caused_by=cause)

    order = causes_first([f("a", "b"), f("other", None), f("b", "c"), f("c", None)])
    assert [x.id for x in order] == ["other", "c", "b", "a"]
