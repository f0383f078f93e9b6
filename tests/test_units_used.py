"""Every writer prints a share, a duration in milliseconds or a size through stallscope/units.py:
an f-string that formats a number and writes "%" or " ms" after it itself (`f"{x:.1f}%"`,
`f"{x:.0%}"`, `f"{t:.2f} ms"`) is a second formatter that drifts from the first, so this test
names each one it finds outside units.py. The pages' templates print them through the `percent`
and `millis` filters (report/html.py), so a `"%.1f"|format(x) }}%` there is named too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "stallscope"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
# A Jinja printf format whose output the template follows with "%" or " ms" itself.
TEMPLATE_FORMAT = re.compile(r"""\|format\([^{}]*\)\s*\}\}\s?(%|ms\b)""")

# Files whose inline formats stay, each for a reason; a new entry needs one too.
ALLOWED = {
}


def inline_formats(path: Path) -> list[str]:
    """`line: {expr:spec}` for each number formatted with its own "%" or " ms" after it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, after in zip(node.values, [*node.values[1:], None], strict=True):
            if not isinstance(value, ast.FormattedValue) or value.format_spec is None:
                continue
            spec = "".join(str(part.value) for part in ast.walk(value.format_spec)
                           if isinstance(part, ast.Constant))
            text = str(after.value) if isinstance(after, ast.Constant) else ""
            if spec.endswith("%") or text.startswith(("%", " ms")):
                found.append(f"{value.value.lineno}: {{{ast.unparse(value.value)}:{spec}}}")
    return found


def template_formats(path: Path) -> list[str]:
    """`line: text` for each Jinja `"%.1f"|format(x) }}` followed by "%" or " ms"."""
    return [f"{n}: {m.group(0)}" for n, line in enumerate(path.read_text().splitlines(), 1)
            for m in TEMPLATE_FORMAT.finditer(line)]


def test_the_scan_finds_each_kind_of_inline_format(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('a = f"{x:.1f}% of {y:.0%} in {t:.2f} ms"\nb = f"{n:.1f} s, {percent(x)}"\n')
    assert inline_formats(sample) == ["1: {x:.1f}", "1: {y:.0%}", "1: {t:.2f}"]
    page = tmp_path / "page.html.j2"
    page.write_text('{{ "%.1f"|format(a) }}% {{ "%.2f"|format(b) }} ms {{ a|percent }} '
                    '{{ "%.1f"|format(c) }} steps\n')
    assert [hit.split(":")[0] for hit in template_formats(page)] == ["1", "1"]


@pytest.mark.parametrize("allowed", sorted(ALLOWED))
def test_each_allowed_file_still_needs_its_exception(allowed: str) -> None:
    found = (template_formats(TEMPLATES / allowed) if allowed.endswith(".j2")
             else inline_formats(SRC / allowed))
    assert found, f"{allowed} has no inline format left: drop it"


def test_no_writer_formats_a_share_or_milliseconds_itself() -> None:
    found = [f"{path.relative_to(SRC)}:{hit}" for path in sorted(SRC.rglob("*.py"))
             if path.name != "units.py" and str(path.relative_to(SRC)) not in ALLOWED
             for hit in inline_formats(path)]
    assert not found, "format these through stallscope.units (percent, millis, ms):\n" + \
        "\n".join(found)


def test_no_template_formats_a_share_or_milliseconds_itself() -> None:
    found = [f"{path.name}:{hit}" for path in sorted(TEMPLATES.glob("*.j2"))
             if path.name not in ALLOWED for hit in template_formats(path)]
    assert not found, "use the percent and millis filters:\n" + "\n".join(found)
