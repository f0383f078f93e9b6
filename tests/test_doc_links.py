"""The docs hold together: every relative link in README.md, CONTRIBUTING.md and docs/*.md
names a file that exists and, with `#anchor`, a heading (or an `<a id>`) that is there, as
GitHub renders it; and `.ci/run` runs exactly the commands the README's "Tests" section gives, so
the README never promises a check CI does not make. A section renamed or a doc moved without
its links fails here instead of leaving a reader at a dead end."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose(text: str) -> str:
    """The text links are read from: fenced blocks and code spans are code, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed but `-`
    and `_`, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its words
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:, ...


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no such heading in {os.path.relpath(dest, path.parent)}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken(doc) == []


def test_the_checker_finds_a_dead_file_and_a_dead_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Set up: `pip` and more\n\n## Set up: `pip` and more\n\n"
                                   "[ok](#set-up-pip-and-more) [ok](#set-up-pip-and-more-1) "
                                   "[dead](#setup) [gone](b.md) `[code](c.md)` "
                                   "[web](https://example.org/x#y)\n", encoding="utf-8")
    assert broken(tmp_path / "a.md") == ["#setup: no such heading in a.md", "b.md: no such file"]


def _commands(lines: list[str]) -> list[str]:
    return [ln.split("#", 1)[0].strip() for ln in lines
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_ci_runs_exactly_the_readmes_test_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    documented = _commands(block.splitlines())
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    checks = [c for c in _commands(ci)
              if c.startswith(("ruff ", "python -m mypy", "python -m pytest"))]
    assert documented == checks and len(documented) == 5
    assert "pip install -e '.[test,frameworks,jupyter,dask,tbplugin]'" in ci  # installs all
