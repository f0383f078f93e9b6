"""report.md as a ticket system shows it: CommonMark (markdown-it-py) and Python-Markdown must
make the same page of it (headings, list nesting and item counts, code spans, code blocks), on
real traces; and the raw file must read well (plain `->`, no escapes, names in code spans,
lines under 200 characters, counts with plurals, the verdict's finding as the top
recommendation)."""

from __future__ import annotations

import functools
import html.parser
import re
from pathlib import Path
from typing import Any

import pytest

from stallscope.report.build import Report
from stallscope.report.markdown import render_markdown
from stallscope.report.md_text import LIMIT, prose, wrap
from tests.conftest import SAMPLES, committed_traces, real_trace, report_of

markdown = pytest.importorskip("markdown")
markdown_it = pytest.importorskip("markdown_it")

KINETO = tuple(sorted((SAMPLES / "public" / "kineto").glob("resnet50_num_workers_0__*")))
CASES: dict[str, tuple[Path, ...]] = {
    "kineto-pair": KINETO,
    "hta-pageable": (real_trace("hta/a100_alexnet_pageable_htod.pt.trace.json.gz"),),
    "hta-queue-len": (real_trace("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"),),
    "hta-two-ranks": (real_trace("hta/rank0of128_sampled.pt.trace.json.gz"),
                      real_trace("hta/rank1of128_sampled.pt.trace.json.gz")),
    "h200": (SAMPLES / "real-h200-r1-w0.pt.trace.json.gz",),
    "cpu": (SAMPLES / "cpu-loader-bound.pt.trace.json.gz",),
    "synthetic-inference": (SAMPLES / "synthetic-inference-serving.pt.trace.json.gz",),
    "cpu-inference": (SAMPLES / "cpu-inference-loop.pt.trace.json.gz",),
}


class _Structure(html.parser.HTMLParser):
    """What a reader sees of a rendered page: headings, lists (depth, kind, items), the text of
    code spans and of code blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.lists: list[list[Any]] = []  # [depth, tag, items], in document order
        self.code_spans: list[str] = []
        self.blocks: list[str] = []
        self._open: list[list[Any]] = []
        self._text: list[str] | None = None
        self._heading: str | None = None
        self._pre = False
        self._code: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("ul", "ol"):
            record = [len(self._open), tag, 0]
            self.lists.append(record)
            self._open.append(record)
        elif tag == "li":
            self._open[-1][2] += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._heading, self._text = tag, []
        elif tag == "pre":
            self._pre = True
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("ul", "ol"):
            self._open.pop()
        elif tag == self._heading and self._text is not None:
            self.headings.append((tag, " ".join("".join(self._text).split())))
            self._heading, self._text = None, None
        elif tag == "code" and self._code is not None:
            text = "".join(self._code)
            if self._pre:
                self.blocks.append(text.strip("\n"))
            else:
                self.code_spans.append(" ".join(text.split()))
            self._code = None
        elif tag == "pre":
            self._pre = False

    def handle_data(self, data: str) -> None:
        if self._heading is not None and self._text is not None:
            self._text.append(data)
        if self._code is not None:
            self._code.append(data)


def structure(page: str) -> dict[str, Any]:
    parser = _Structure()
    parser.feed(page)
    return {"headings": parser.headings, "lists": parser.lists,
            "code_spans": parser.code_spans, "blocks": parser.blocks}


def commonmark(text: str) -> str:
    return markdown_it.MarkdownIt("commonmark").render(text)


def python_markdown(text: str) -> str:
    """Python-Markdown as wikis and ticket systems run it: fenced code is the one extension
    report.md needs (it uses no tables)."""
    return markdown.markdown(text, extensions=["fenced_code"])


@functools.cache
def page(name: str) -> tuple[Report, str]:
    report = report_of(*CASES[name])
    return report, render_markdown(report)


def outside_code(text: str) -> str:
    """The Markdown without its fenced blocks and code spans: the prose a reader reads."""
    text = re.sub(r"^```[a-z]*\n.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`|<https://[^>\s]+>", "", text)


@pytest.mark.parametrize("name", CASES)
def test_commonmark_and_python_markdown_make_the_same_page(name: str):
    report, text = page(name)
    cm, pm = structure(commonmark(text)), structure(python_markdown(text))
    assert cm["headings"] == pm["headings"]
    assert cm["lists"] == pm["lists"]
    assert cm["code_spans"] == pm["code_spans"]
    assert cm["blocks"] == pm["blocks"]
    assert ("h1", "stallscope report") in cm["headings"]
    assert cm["code_spans"] and cm["blocks"]


# The inputs whose fix plan has replayed steps (the others' changes could not be replayed).
PLANNED = ("kineto-pair", "hta-pageable", "hta-queue-len", "h200", "cpu")


@pytest.mark.parametrize("name", PLANNED)
def test_the_fix_plan_nests_its_assumptions_in_both_renderers(name: str):
    """Each plan step is one numbered item with its assumptions as sub-items: Python-Markdown
    used to flatten them into one numbered list of 12 steps."""
    report, text = page(name)
    entries = (report.plan or {}).get("entries") or []
    assert entries
    for page_html in (commonmark(text), python_markdown(text)):
        lists = structure(page_html)["lists"]
        start = next(i for i, (depth, tag, _) in enumerate(lists) if tag == "ol" and depth == 0)
        assert lists[start][2] == len(entries)
        nested = []
        for depth, _, items in lists[start + 1:]:
            if depth == 0:
                break
            nested.append(items)
        assert nested == [len(e["assumptions"]) for e in entries if e["assumptions"]]


@pytest.mark.parametrize("name", CASES)
def test_the_raw_file_is_plain(name: str):
    """No HTML entities or backslash escapes, plain `->`, every line under 200 characters."""
    report, text = page(name)
    assert max(len(line) for line in text.splitlines()) < LIMIT
    assert not re.search(r"&(?:gt|lt|amp|quot|#\d+);", text)
    prose_only = outside_code(text)
    assert "\\" not in prose_only
    if report.plan and report.plan["entries"]:
        verdict = text[text.index("**Verdict:**"): text.index("\n\n", text.index("**Verdict"))]
        assert " -> " in verdict


@pytest.mark.parametrize("name", CASES)
def test_file_names_and_identifiers_are_in_code_spans(name: str):
    report, text = page(name)
    spans = structure(commonmark(text))["code_spans"]
    for t in report.traces:
        if not t["label"].startswith("rank "):
            assert t["label"] in spans or any(t["label"] in s for s in spans), t["label"]
        assert t["path"] in spans
    # No snake_case identifier outside a code span.
    assert not re.findall(r"\b[a-z]+_[a-z_]+\b", outside_code(text))


def test_num_workers_is_a_code_span_on_the_kineto_pair():
    _, text = page("kineto-pair")
    assert "`num_workers=2`" in text.split("\n\n")[1]  # the verdict's fix
    spans = structure(python_markdown(text))["code_spans"]
    assert ".to(device, non_blocking=True)" in spans


@pytest.mark.parametrize("name", CASES)
def test_counts_have_plurals_and_figures_a_sensible_precision(name: str):
    report, text = page(name)
    prose_text = outside_code(text)
    assert not re.search(r"\((?:e?s)\)", prose_text), re.findall(r".{30}\(e?s\)", prose_text)
    assert not re.search(r"\b\d+\.\d{3,} ms\b", prose_text), re.findall(
        r"\S+ ms\b", prose_text)
    assert not re.search(r"\b\d+\.0 (?:kernels|steps|bytes|calls)\b", prose_text)
    assert not re.search(r"\b1 (?:bytes|steps|kernels|cores|workers)\b", prose_text)
    keys = {k for f in report.findings for k in f.evidence if "_" in k}
    assert keys and not [k for k in keys if k in text], keys
    assert not re.search(r"\{['\"]", text)  # no dict printed whole


def test_each_cause_is_listed_once_in_plan_order():
    """12 findings of 6 causes on the kineto pair: 6 numbered items, the plan's order first,
    each with one sub-item per recording."""
    report, text = page("kineto-pair")
    section = text[text.index("## Findings"): text.index("### Top recommendation")]
    causes = re.findall(r"^\d+\. (?:\*\*\w+\*\* )?`([\w-]+)`", section, re.M)
    assert len(causes) == len(set(causes)) == len({f.id for f in report.findings})
    planned = [e["id"] for e in report.plan["entries"]]
    assert causes[: len(planned)] == planned


@pytest.mark.parametrize("name", CASES)
def test_the_top_recommendation_is_the_verdicts_finding(name: str):
    """The finding report.md recommends first is the report's lead: the one the verdict names
    (on an inference trace it used to be a host-device-sync that the banner contradicted)."""
    report, text = page(name)
    lead = report.lead
    assert lead is not None
    found = re.search(r"^### Top recommendation: `([\w-]+)`\n\n\*\*(.+?)\*\*\n\n", text,
                      re.M | re.S)
    assert found, text[text.index("## Findings"):][:2000]
    assert found.group(1) == lead.id
    title = " ".join(found.group(2).replace("`", "").split())
    assert title == lead.title
    assert lead.title.lower() in report.verdict.lower()


@pytest.mark.parametrize("text", [
    "waits 1. then - a list? # heading > quote <img src=x onerror=alert(1)> [link](https://x)",
    "a_b *c* `d` ```e``` | f ~~g~~ \\h &amp; &lt;i&gt; =====",
    "pin_memory helps only with .to(device, non_blocking=True). 2 worker(s) -> 3 ms",
    "quoted `run` and ``doubled`` and `a``b` and a lone ` tick",
])
def test_prose_with_markup_characters_renders_the_same_and_literally(text: str):
    """Rule and trace text with Markdown's special characters, wrapped narrow so block markers
    fall at line starts: both renderers show the words, and no markup comes from them."""
    body = "\n".join(wrap(f"Start: {prose(text)} {prose(text)}", width=24))
    for render in (commonmark, python_markdown):
        out = render(body)
        assert out.count("<p>") == 1 and "<img" not in out and "<a " not in out, out
        assert "<h" not in out and "<li" not in out and "<blockquote" not in out, out
        assert "<em" not in out and "<del" not in out and "<strong" not in out, out
    assert structure(commonmark(body)) == structure(python_markdown(body))


def test_the_no_step_report_renders_alike_and_plainly(tmp_path: Path):
    """`run`'s report.md for a script that ended before the window: the same Markdown rules."""
    from stallscope.report import unrecorded
    from stallscope.runfacts import RunContext

    ctx = RunContext(command=[], target="my_train.py", boundaries_seen=3,
                     unprofiled_steps_us=[91_000.0, 12_500.0],
                     notes=["pin_memory=True was set | a note # with <b>markup</b>"])
    long_dir = "/data/" + "very_long_folder_name/" * 8
    unrecorded.write(tmp_path, ctx, "raised an exception",
                     f"stallscope run --skip 1 --warmup 1 --steps 1 -o {long_dir} my_train.py")
    text = (tmp_path / "report.md").read_text()
    assert structure(commonmark(text)) == structure(python_markdown(text))
    assert max(len(line) for line in text.splitlines()) < LIMIT
    assert "after 3 steps" in text and "`my_train.py`" in text and "\\" not in outside_code(text)
    assert structure(commonmark(text))["lists"] == [[0, "ul", 2], [0, "ul", 1]]


def test_the_what_if_section_renders_alike():
    """`--what-if` adds a list of the user's changes, each alone and all together."""
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.diagnose.fixes import parse_what_if

    report = analyze_paths([KINETO[0]], what_if=parse_what_if(["num_workers=4", "amp=fp16"]))
    text = render_markdown(report)
    section = text[text.index("## What if"): text.index("## Findings")]
    assert structure(commonmark(text)) == structure(python_markdown(text))
    assert structure(commonmark(section))["lists"][0] == [0, "ul", 3]
    assert "- `num_workers=4` alone: about " in section and "- all together: about " in section


@pytest.mark.parametrize("path", committed_traces(), ids=lambda p: p.name.split(".")[0])
def test_every_committed_trace_renders_alike_and_plainly(path: Path):
    """The rules above on every committed trace, one by one: both renderers, the line limit,
    no entity and no backslash escape in the prose."""
    text = render_markdown(report_of(path))
    assert structure(commonmark(text)) == structure(python_markdown(text))
    assert max(len(line) for line in text.splitlines()) < LIMIT
    assert not re.search(r"&(?:gt|lt|amp|quot|#\d+);", text)
    assert "\\" not in outside_code(text)
