"""The docs' rule tables and each rule's heading block, written from the registry
(diagnose/registry.py) so they cannot drift from the code: docs/rules.md's index, its
`--what-if` keys and each rule's heading, module, tests, thresholds, fix and replay model. The
README links there and holds no generated table, so it stays a short front door. Only the
parts between `<!-- begin generated: NAME ... -->` and `<!-- end generated: NAME -->` markers
are written; the prose around them is the maintainers'.

    python -m stallscope.diagnose.docgen --write   # rewrite the generated parts
    python -m stallscope.diagnose.docgen --check   # exit 1 when they are stale

tests/test_docgen.py runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from stallscope.diagnose.fixes import WHAT_IF, model_owner
from stallscope.diagnose.registry import ALL_RULES, BY_ID, what_if_keys
from stallscope.diagnose.spec import RuleSpec

COMMAND = "python -m stallscope.diagnose.docgen --write"
ROOT = Path(__file__).resolve().parents[3]  # the repository, for a source checkout
RULES_MD = "docs/rules.md"


class StaleMarkers(ValueError):
    """A generated part's markers are missing from a doc."""


def begin(name: str) -> str:
    return f"<!-- begin generated: {name} ({COMMAND}) -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with what stands between `name`'s markers replaced by `body`."""
    pattern = re.compile(re.escape(begin(name)) + r"\n.*?" + re.escape(end(name)), re.DOTALL)
    if not pattern.search(text):
        raise StaleMarkers(f"no `{begin(name)}` ... `{end(name)}` markers")
    return pattern.sub(lambda _: f"{begin(name)}\n{body.rstrip()}\n{end(name)}", text, count=1)


def _value(v: float | int) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def _keys(spec: RuleSpec) -> str:
    return ", ".join(f"`{k}`" for k in spec.what_if)


def what_if_table() -> str:
    rows = ["| key | values | the fix of |", "|---|---|---|"]
    for key in what_if_keys():
        rules = ", ".join(f"`{s.id}`" for s in ALL_RULES if key in s.what_if)
        rows.append(f"| `{key}` | {WHAT_IF[key].values} | {rules} |")
    return "\n".join(rows)


def rules_index() -> str:
    rows = ["| id | what it means | `--what-if` |", "|---|---|---|"]
    rows += [f"| [`{s.id}`](#{s.id}) | {s.summary} | {_keys(s) or '-'} |" for s in ALL_RULES]
    return "\n".join(rows)


def replay_models(spec: RuleSpec) -> str:
    """Where the models of a rule's keys live: its own module for the keys it declares first,
    the first declaring rule's module for the others."""
    owners: dict[str, list[str]] = {}
    for key in spec.what_if:
        owners.setdefault(model_owner(key).id, []).append(f"`{key}`")
    parts = []
    for rid, keys in owners.items():
        owner = BY_ID[rid]
        whose = "" if owner is spec else f"; `{rid}`'s change, declared there first"
        parts.append(f"`{owner.replay_models}` ({', '.join(keys)}{whose})")
    return "; ".join(parts)


def rule_heading(spec: RuleSpec) -> str:
    """A rule's anchor, heading and the facts its SPEC declares."""
    thresholds = ", ".join(f"`{k}` = {_value(v)}" for k, v in spec.thresholds.items())
    if spec.what_if and spec.changes:
        fix = f"replayed as `--what-if` {_keys(spec)} (the fix plan picks the change per finding)"
    elif spec.what_if:
        fix = f"offered as `--what-if` {_keys(spec)}; the fix plan does not replay it on its own"
    else:
        fix = "no change the replay models: the saving is the rule's own upper bound"
    scope = " Over all the ranks of one job, not one trace." if spec.job else ""
    return "\n".join([
        f'<a id="{spec.id}"></a>',
        "",
        f"## `{spec.id}`: {spec.title}",
        "",
        f"- **Declared in.** `{spec.module}` (`SPEC`); tests `{spec.tests}`.{scope}",
        f"- **Named thresholds.** {thresholds or 'none: it judges by what it finds, not a share'}.",
        f"- **Fix.** {fix}.",
        *([f"- **Replay model.** {replay_models(spec)}."] if spec.what_if else []),
    ])


def render(root: Path = ROOT) -> dict[Path, str]:
    """Each doc with its generated parts written afresh (path -> text)."""
    rules = (root / RULES_MD).read_text(encoding="utf-8")
    rules = replace_block(rules, "rules-index", rules_index())
    rules = replace_block(rules, "what-if", what_if_table())
    for spec in ALL_RULES:
        rules = replace_block(rules, f"rule {spec.id}", rule_heading(spec))
    return {root / RULES_MD: rules}


def stale(root: Path = ROOT) -> list[Path]:
    """The docs whose generated parts differ from what the registry gives."""
    return [p for p, text in render(root).items() if p.read_text(encoding="utf-8") != text]


def unknown_sections(root: Path = ROOT) -> list[str]:
    """Rule ids docs/rules.md has a generated section for that the registry does not know."""
    text = (root / RULES_MD).read_text(encoding="utf-8")
    named = re.findall(r"<!-- begin generated: rule ([\w-]+) ", text)
    return [rid for rid in named if rid not in BY_ID]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stallscope.diagnose.docgen",
                                     description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="rewrite the generated parts")
    what.add_argument("--check", action="store_true", help="exit 1 when they are stale")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the repository (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        docs = render(args.root)
    except StaleMarkers as exc:
        print(f"docgen: {exc}", file=sys.stderr)
        return 1
    changed = [p for p, text in docs.items() if p.read_text(encoding="utf-8") != text]
    if args.write:
        for p in changed:
            p.write_text(docs[p], encoding="utf-8")
    for p in changed:
        print(f"{'wrote' if args.write else 'stale'}: {p.relative_to(args.root)}")
    return 1 if changed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
